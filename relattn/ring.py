"""Sequence-parallel relative attention on a ring of devices (Liu et al. 2023)."""

from __future__ import annotations

import dataclasses
from typing import Any

from . import _checks, problem
from ._typing import Array
from .backends import backend_for
from .fold import KeyBlock, block_finish, fold_keys, rows_of
from .problem import Problem, check_qkv

__all__ = ["ring_attention"]


def ring_attention(
    q: Array,
    k: Array,
    v: Array,
    position_table: Array = None,
    *,
    axis_name: Any,
    content_bias: Array = None,
    position_bias: Array = None,
    query_position_table: Array = None,
    value_table: Array = None,
    mask: Array = None,
    bias: Array = None,
    relative_bias: Array = None,
    causal: bool = False,
    scale: Any = None,
    block_size: Any = None,
    positions: Array = None,
    segment_ids: Array = None,
    score_mod: Any = None,
    mask_mod: Any = None,
) -> Array:
    """Relative attention over a sequence sharded across devices, key blocks passed round a ring.

    Called inside ``jax.shard_map`` on each device's shard of the sequence:
    device ``p`` of ``n`` holds queries ``[p·bq, (p+1)·bq)`` and keys and values
    ``[p·bk, (p+1)·bk)`` (shards in device order along ``axis_name``). In ``n``
    steps each device scores its queries against every key block, the key and
    value blocks moving one device along the ring per step (``lax.ppermute``),
    and combines the steps with the online softmax. The result equals the
    single-device attention of the whole sequence.

    Parameters
    ----------
    q : array of shape (..., bq, d), real floating
        This device's query shard; the whole sequence has ``Lq = n·bq``
        queries.
    k : array of shape (..., bk, d), real floating
        This device's key shard, ``Lk = n·bk``.
    v : array of shape (..., bk, d_v), real floating
        Its values.
    position_table : array of shape (..., W, d), real floating, optional
        The **whole** sequence's content-to-position table (Transformer-XL,
        XLNet, TENER, Shaw keys, DeBERTa c2p), replicated on every device:
        ``W = Lk`` (causal layout) or ``Lq + Lk - 1`` (full). Each step reads
        the ``bq + bk - 1`` columns of its block pair.
    axis_name : hashable
        The mesh axis the sequence is sharded over (as in ``shard_map``).
    content_bias, position_bias : array, real floating, optional
        Transformer-XL's ``u`` and ``v``, broadcastable to ``q``.
    query_position_table : array of shape (..., W, d), real floating, optional
        The whole sequence's position-to-content table (DeBERTa's p2c).
    value_table : array of shape (..., W, d_v), real floating, optional
        The whole sequence's value table (Shaw et al.).
    mask : array, bool, optional
        ``True`` = may attend, broadcastable to the **whole** scores
        ``(..., Lq, Lk)`` (e.g. a key-padding mask ``(B, 1, 1, Lk)``),
        replicated; each step slices its block.
    bias : array, real floating, optional
        Added to the scaled scores; broadcastable to the **whole** scores,
        replicated; each step slices its block.
    relative_bias : array of shape (..., W), real floating, optional
        The whole sequence's per-distance bias (T5, ALiBi).
    causal : bool, optional
        Mask ``δ > 0``. The steps whose key block lies wholly after this
        device's queries are skipped (``lax.cond``): less work, not less time,
        since the ring moves in lockstep (no load balancing).
    scale : float or 0-d array, optional
        Score scale, ``1/√d`` by default.
    block_size : int or (int, int), optional
        Fold each key shard in blocks of this many keys (the second of a pair),
        for memory ``O(bq·block)`` per step instead of ``O(bq·bk)``; default:
        the whole shard at once.
    positions, segment_ids, score_mod, mask_mod : optional
        Positions as data, document ids and the caller's score and mask
        functions; see :func:`scaled_dot_product_attention`. ``positions`` and
        ``segment_ids`` are this device's shards, like ``q`` and ``k``: the keys'
        travel round the ring with them.

    Returns
    -------
    array of shape (..., bq, d_v)
        This device's rows of the whole sequence's attention output, in the
        promoted input dtype; queries with no allowed key give zero rows.

    Raises
    ------
    TypeError
        If the arrays are not JAX arrays (the ring needs ``jax.shard_map``),
        an input is not real floating, or ``mask`` is not boolean.
    ValueError
        If shapes do not match: table widths for ``Lq = n·bq``, ``Lk = n·bk``,
        a mask that does not broadcast to the whole scores, or an unknown
        ``axis_name`` (JAX's own ``NameError`` is turned into this).

    See Also
    --------
    relative_attention : The same attention on one device.
    attention_block, merge_block_states : The block step the ring runs.

    Notes
    -----
    Liu et al. 2023 (Ring Attention): key/value blocks rotate over the devices
    while each keeps its query block; Dao et al. 2022's online softmax
    combines the steps. Each step's relative terms are the shift of Dai et al.
    2019, appendix B, on the table columns ``m0 … m0 + bq + bk - 2`` of its
    block pair, ``m0 = j0 - i0 - (bq - 1) + Lq - 1``. Memory per device:
    ``O(bq·d + bk·d + bq·bk + W·d)``. Lengths that ``n`` does not divide: pad
    ``q``, ``k``, ``v`` to a multiple, mask the padded keys, and drop the padded
    queries' rows (relative distances keep their meaning when ``Lq = Lk`` are
    padded alike).

    Examples
    --------
    This example needs JAX, an optional extra: ``pip install "relattn[jax]"``.

    >>> import jax, jax.numpy as jnp, numpy as np
    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> from relattn import ring_attention, relative_attention
    >>> mesh = Mesh(np.array(jax.devices()[:1]), ("seq",))
    >>> x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 4)), dtype=jnp.float32)
    >>> ring = jax.shard_map(
    ...     lambda q, k, v: ring_attention(q, k, v, axis_name="seq", causal=True),
    ...     mesh=mesh, in_specs=(P("seq"), P("seq"), P("seq")), out_specs=P("seq"))
    >>> bool(jnp.allclose(ring(x, x, x), relative_attention(x, x, x, None, causal=True), atol=1e-6))
    True
    """
    xp = _checks.namespace(q=q, k=k, v=v)
    collective = backend_for(xp).collective
    if collective is None:
        raise TypeError(
            "ring_attention needs JAX arrays inside jax.shard_map (its collective is "
            f"lax.ppermute), got {xp.__name__} arrays"
        )
    check_qkv(q, k, v)
    devices = collective.axis_size(axis_name)
    bq, bk = q.shape[-2], k.shape[-2]
    p = problem.check(
        q, k, v, position_table=position_table, query_position_table=query_position_table,
        value_table=value_table, content_bias=content_bias, position_bias=position_bias,
        relative_bias=relative_bias, bias=bias, mask=mask, causal=causal, scale=scale,
        block_size=block_size, lengths=(devices * bq, devices * bk),
        positions=positions, segment_ids=segment_ids, score_mod=score_mod,
        mask_mod=mask_mod,
    )  # fmt: skip
    return _ring(p, collective, axis_name, devices)


def _ring(p: Problem, collective: Any, axis_name: Any, devices: int) -> Any:
    """The ring driver of the block fold: ``n`` steps, each folding the key shard at hand
    (in sub-blocks of ``p.block_size``) and passing it on to the next device."""
    xp, backend = p.xp, backend_for(p.xp)
    bq, bk = p.q.shape[-2], p.k.shape[-2]
    # Every operand varies over the ring's axis: replicated tables, masks and biases are
    # cast to varying here, once, so that their cotangents are summed over the devices
    # here too (a psum), and not inside a lax.cond branch that some devices skip.
    inputs = (p.q, p.k, p.v)
    p = p.with_arrays(tuple(backend.align(x, inputs, (axis_name,)) for x in p.arrays()))
    me = collective.axis_index(axis_name)
    i0 = me * bq
    # This device's rows of the whole-sequence mask and bias.
    rows = dataclasses.replace(
        p, bias=_local_rows(p.bias, i0, bq, backend), mask=_local_rows(p.mask, i0, bq, backend)
    )
    sub = bk if p.block_size is None else min(p.block_size[1], bk)
    parts = -(-bk // sub)

    def key_block_at(step: int, held: tuple[Any, ...]) -> tuple[KeyBlock, Any]:
        shard, part = divmod(step, parts)
        *moving, j0 = held
        if part == 0 and shard > 0:
            # The shard at hand moves on (with its keys' positions and segment ids); the
            # previous device's arrives.
            moving = list(collective.rotate(tuple(moving), axis_name))
            j0 = ((me - shard) % devices) * bk  # it started on device me - shard
        keys, values, positions, segments = moving
        a, b = part * sub, min(part * sub + sub, bk)
        k, v = rows_of(keys, a, b, -2), rows_of(values, a, b, -2)
        start = j0 + a
        # DeBERTa's position-to-content term reads the scaled keys: scaled here, not
        # passed round the ring beside the keys.
        ks = None if p.ks is None else k * p.scale
        kb = KeyBlock(
            start, k, v, ks, _local_keys(rows.bias, start, b - a, backend),
            _local_keys(rows.mask, start, b - a, backend), rows_of(positions, a, b, -1),
            rows_of(segments, a, b, -1),
        )  # fmt: skip
        return kb, (keys, values, positions, segments, j0)

    held = (p.k, p.v, p.key_positions, p.key_segments, me * bk)
    state = fold_keys(p, rows, i0, devices * parts, key_block_at, held, cond=backend.cond)
    return block_finish(state, p.dtype, xp)


def _local_rows(x: Any, i0: Any, size: int, backend: Any) -> Any:
    """Rows ``[i0, i0 + size)`` of a whole-scores ``mask`` or ``bias`` (``None`` stays)."""
    return backend.dynamic_slice(x, i0, size, -2)


def _local_keys(x: Any, j0: Any, size: int, backend: Any) -> Any:
    """Columns ``[j0, j0 + size)`` of a mask or bias's rows (``None`` stays)."""
    return backend.dynamic_slice(x, j0, size, -1)
