"""Sequence-parallel relative attention on a ring of devices (Liu et al. 2023)."""

from __future__ import annotations

from typing import Any

from . import _checks, core
from ._typing import Array
from .backends import backend_for

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
    relative_bias: Array = None,
    mask: Array = None,
    causal: bool = False,
    scale: Any = None,
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
    relative_bias : array of shape (..., W), real floating, optional
        The whole sequence's per-distance bias (T5, ALiBi).
    mask : array, bool, optional
        ``True`` = may attend, broadcastable to the **whole** scores
        ``(..., Lq, Lk)`` (e.g. a key-padding mask ``(B, 1, 1, Lk)``),
        replicated; each step slices its block.
    causal : bool, optional
        Mask ``δ > 0``. The steps whose key block lies wholly after this
        device's queries are skipped (``lax.cond``): less work, not less time,
        since the ring moves in lockstep (no load balancing).
    scale : float or 0-d array, optional
        Score scale, ``1/√d`` by default.

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
    xp = _checks.namespace(
        q=q, k=k, v=v,
        optional={
            "position_table": position_table, "content_bias": content_bias,
            "position_bias": position_bias, "query_position_table": query_position_table,
            "value_table": value_table, "relative_bias": relative_bias, "mask": mask,
        },
    )  # fmt: skip
    ring = backend_for(xp).ring_attention
    if ring is None:
        raise TypeError(
            "ring_attention needs JAX arrays inside jax.shard_map (its collective is "
            f"lax.ppermute), got {xp.__name__} arrays"
        )
    dtype = _checks.floating(
        xp, q=q, k=k, v=v, position_table=position_table, content_bias=content_bias,
        position_bias=position_bias, query_position_table=query_position_table,
        value_table=value_table, relative_bias=relative_bias,
    )  # fmt: skip
    bq, bk, d = core.check_qkv(q, k, v)
    devices = ring.axis_size(axis_name)
    lq, lk = devices * bq, devices * bk
    leads = {"q": q.shape[:-2], "k": k.shape[:-2], "v": v.shape[:-2]}
    for name, table, features, what in (
        ("position_table", position_table, d, "d"),
        ("query_position_table", query_position_table, d, "d"),
        ("value_table", value_table, v.shape[-1], "d_v"),
    ):
        if table is not None:
            core.check_table(name, table, lq, lk, features, what)
            leads[name] = table.shape[:-2]
    lead = _checks.broadcast(**leads)
    if position_bias is not None and position_table is None:
        raise ValueError("position_bias needs a position_table: it is added to q before q Rᵀ")
    for name, b in (("content_bias", content_bias), ("position_bias", position_bias)):
        if b is not None:
            _checks.broadcastable(name, b.shape, tuple(q.shape), "q")
    scale, causal, _ = core.check_options(
        xp, (*lead, lq, lk), d, mask=mask, bias=None, relative_bias=relative_bias,
        causal=causal, scale=scale, block_size=None,
    )  # fmt: skip
    arrays = (
        q, k, v, position_table, content_bias, position_bias, query_position_table,
        value_table, relative_bias,
    )  # fmt: skip
    q, k, v, table, u, p_bias, q_table, value_table, relative_bias = (
        _checks.cast(xp, a, dtype) for a in arrays
    )
    return ring.attend(
        q, k, v, xp, axis_name=axis_name, scale=scale, content_bias=u, position_bias=p_bias,
        key_table=table, query_table=q_table, value_table=value_table,
        relative_bias=relative_bias, mask=mask, causal=causal,
    )  # fmt: skip
