"""Sequence-parallel relative attention on a ring of devices (Liu et al. 2023)."""

from __future__ import annotations

import dataclasses
from typing import Any

from . import _checks, problem
from ._typing import Array
from .backends import backend_for
from .fold import KeyBlock, block_finish, fold_keys, query_rows, rows_of, static_slice
from .problem import Problem, check_qkv

__all__ = ["ring_attention", "zigzag_shard", "zigzag_unshard"]


def ring_attention(
    q: Array,
    k: Array,
    v: Array,
    position_table: Array = None,
    *,
    axis_name: Any = None,
    group: Any = None,
    sharding: str = "contiguous",
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

    Each device (a JAX device inside ``jax.shard_map``, or a rank of a
    ``torch.distributed`` process group) holds a shard of the sequence's queries, keys
    and values. In ``n`` steps each device scores its queries against every key shard,
    the shards moving one device along the ring per step (JAX's ``lax.ppermute``;
    torch's ``batch_isend_irecv``, the next shard's transfer running while this one is
    folded), and combines the steps with the online softmax. The result equals the
    single-device attention of the whole sequence, every relative term included: each
    block pair's terms come from its global positions.

    Shardings: ``"contiguous"``, device ``p`` of ``n`` holds queries ``[p·bq, (p+1)·bq)``
    and keys ``[p·bk, (p+1)·bk)``; ``"zigzag"``, the sequence is cut into ``2n`` equal
    chunks and device ``p`` holds chunks ``p`` and ``2n - 1 - p`` (lay a whole array out
    so with :func:`zigzag_shard`). With ``causal`` the key blocks wholly after a query
    block are skipped: contiguous, device ``p`` folds ``p + 1`` of the ``n`` shards (the
    last device sets the pace); zig-zag, every device folds ``2n + 1`` of the ``4n``
    chunk pairs.

    Parameters
    ----------
    q : array of shape (..., bq, d), real floating
        This device's query shard; the whole sequence has ``Lq = n·bq``
        queries. JAX arrays or torch tensors.
    k : array of shape (..., bk, d), real floating
        This device's key shard, ``Lk = n·bk``.
    v : array of shape (..., bk, d_v), real floating
        Its values.
    position_table : array of shape (..., W, d), real floating, optional
        The **whole** sequence's content-to-position table (Transformer-XL,
        XLNet, TENER, Shaw keys, DeBERTa c2p), replicated on every device:
        ``W = Lk`` (causal layout) or ``Lq + Lk - 1`` (full). Each step reads
        the ``bq + bk - 1`` columns of its block pair.
    axis_name : hashable, optional
        JAX: the mesh axis the sequence is sharded over (as in ``shard_map``);
        required for JAX arrays, not given for torch tensors.
    group : torch.distributed.ProcessGroup, optional
        The torch process group whose ranks form the ring, in rank order
        (``None``: the default group; a subgroup uses its own ranks). Not given
        for JAX arrays.
    sharding : {"contiguous", "zigzag"}, optional
        How the sequence lies over the devices (above). ``"zigzag"`` needs even
        ``bq`` and ``bk``.
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
        Mask ``δ > 0``. The block pairs whose keys lie wholly after their
        queries are skipped (``lax.cond`` on JAX, a branch on torch); the ring
        moves in lockstep, so the most loaded device sets the time: balanced
        with ``sharding="zigzag"``.
    scale : float or 0-d array, optional
        Score scale, ``1/√d`` by default.
    block_size : int or (int, int), optional
        Fold each key shard in blocks of this many keys (the second of a pair),
        for memory ``O(bq·block)`` per step instead of ``O(bq·bk)``; default:
        the whole shard at once.
    positions, segment_ids, score_mod, mask_mod : optional
        Positions as data, document ids and the caller's score and mask
        functions; see :func:`scaled_dot_product_attention`. ``positions`` and
        ``segment_ids`` are this device's shards, like ``q`` and ``k`` (zig-zag:
        of the whole arrays laid out by :func:`zigzag_shard`): the keys' travel
        round the ring with them.

    Returns
    -------
    array of shape (..., bq, d_v)
        This device's rows of the whole sequence's attention output, in the
        promoted input dtype, in the order of its ``q`` (zig-zag: gather the
        shards and :func:`zigzag_unshard`); queries with no allowed key give
        zero rows. Gradients: on JAX, ``shard_map`` sums the replicated inputs'
        (tables, biases, ``u``, ``v``) over the devices; on torch each rank's
        gradient of a replicated input is **partial**, its own queries' share:
        sum them over the group (``torch.distributed.all_reduce``), as for any
        parameter under sequence parallelism. The keys' and values' gradients
        travel back round the ring to the rank that holds them.

    Raises
    ------
    TypeError
        If the arrays are neither JAX arrays nor torch tensors, ``group`` is not
        a process group, an input is not real floating, or ``mask`` is not
        boolean.
    ValueError
        If shapes do not match: table widths for ``Lq = n·bq``, ``Lk = n·bk``,
        a mask that does not broadcast to the whole scores; an unknown
        ``axis_name`` (JAX's own ``NameError`` is turned into this), a missing
        one for JAX or one given for torch (``group`` likewise), no initialized
        ``torch.distributed``; an unknown ``sharding``, or odd ``bq`` or ``bk``
        with ``"zigzag"``.

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
    padded alike). Zig-zag sharding (Zhu 2024, ring-flash-attention; Brandon
    et al. 2023 stripe instead): each of a device's two query chunks folds
    each of the two key chunks at hand, four block pairs a step, each with its
    own global offsets, so the relative terms stay exact.

    On torch the ring runs eagerly, one Python step per device; its sends are a
    ``torch.autograd.Function`` whose backward sends the gradients the other
    way round. Every rank must call it with the same shapes and options.

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

    On torch, each rank of an initialized process group calls it on its shards
    (here a group of one, gloo on the loopback interface):

    >>> import tempfile, torch, torch.distributed as dist
    >>> store = f"file://{tempfile.NamedTemporaryFile().name}"  # a path, for a file store
    >>> dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    >>> t = torch.tensor(np.array(x))
    >>> out = ring_attention(t, t, t, causal=True, sharding="zigzag")
    >>> bool(torch.allclose(out, relative_attention(t, t, t, None, causal=True), atol=1e-6))
    True
    >>> dist.destroy_process_group()
    """
    xp = _checks.namespace(q=q, k=k, v=v)
    collective, axis = collective_for(xp, axis_name, group, "ring_attention")
    _checks.choice("sharding", sharding, SHARDINGS)
    check_qkv(q, k, v)
    devices = collective.axis_size(axis)
    bq, bk = q.shape[-2], k.shape[-2]
    chunks = 2 if sharding == "zigzag" else 1
    if bq % chunks or bk % chunks:
        raise ValueError(
            "sharding='zigzag' splits each rank's shard into two chunks: q and k need an "
            f"even length along axis -2, got {bq} and {bk}"
        )
    p = problem.check(
        q, k, v, position_table=position_table, query_position_table=query_position_table,
        value_table=value_table, content_bias=content_bias, position_bias=position_bias,
        relative_bias=relative_bias, bias=bias, mask=mask, causal=causal, scale=scale,
        block_size=block_size, lengths=(devices * bq, devices * bk),
        positions=positions, segment_ids=segment_ids, score_mod=score_mod,
        mask_mod=mask_mod,
    )  # fmt: skip
    return _ring(p, collective, axis, devices, chunks)


#: The layouts of the sequence over the ring's devices (see :func:`ring_attention`).
SHARDINGS = ("contiguous", "zigzag")


def collective_for(xp: Any, axis_name: Any, group: Any, name: str) -> tuple[Any, Any]:
    """The backend's collective for ``xp`` and the axis it runs over: JAX's mesh axis
    ``axis_name``, or torch's process group ``group``."""
    backend = backend_for(xp)
    if backend.collective is None:
        raise TypeError(
            f"{name} needs JAX arrays inside jax.shard_map (axis_name=) or torch tensors on "
            f"a torch.distributed process group (group=), got {xp.__name__} arrays"
        )
    if backend.name == "torch":
        if axis_name is not None:
            raise ValueError(
                f"axis_name names a JAX mesh axis; torch tensors run over group= (a "
                f"torch.distributed process group, None: the default), got "
                f"axis_name={axis_name!r}"
            )
        return backend.collective, group
    if group is not None:
        raise ValueError(
            f"group is a torch.distributed process group; JAX arrays run over axis_name= "
            f"(a mesh axis of the enclosing jax.shard_map), got group={group!r}"
        )
    if axis_name is None:
        raise ValueError(
            "axis_name: JAX arrays need the mesh axis of the enclosing jax.shard_map that "
            "the sequence is sharded over, got None"
        )
    return backend.collective, axis_name


def chunk_indices(rank: Any, devices: int, chunks: int) -> tuple[Any, ...]:
    """The chunks of the whole sequence that ``rank`` holds, in order: ``rank`` of
    ``devices`` (contiguous, ``chunks = 1``), or ``rank`` and ``2n - 1 - rank`` of ``2n``
    (zig-zag, ``chunks = 2``)."""
    return (rank,) if chunks == 1 else (rank, 2 * devices - 1 - rank)


def _ring(p: Problem, collective: Any, axis: Any, devices: int, chunks: int) -> Any:
    """The ring driver of the block fold: ``n`` steps; in each, every query chunk of this
    device folds every key chunk of the shard at hand (in sub-blocks of ``p.block_size``)
    while that shard moves on to the next device."""
    xp, backend = p.xp, backend_for(p.xp)
    bq, bk = p.q.shape[-2] // chunks, p.k.shape[-2] // chunks
    # Every operand varies over the ring's axis (JAX): replicated tables, masks and biases
    # are cast to varying here, once, so that their cotangents are summed over the devices
    # here too (a psum), and not inside a lax.cond branch that some devices skip.
    inputs = (p.q, p.k, p.v)
    p = p.with_arrays(tuple(backend.align(x, inputs, (axis,)) for x in p.arrays()))
    me = collective.axis_index(axis)
    # Slices at a traced start (JAX's device index) or at an int (torch's rank).
    cut = backend.dynamic_slice or static_slice
    queries = []  # (i0, the chunk's rows, its state) per query chunk
    for c, index in enumerate(chunk_indices(me, devices, chunks)):
        i0 = index * bq
        rows = query_rows(p, c * bq, (c + 1) * bq)
        # The whole-sequence mask and bias: this chunk's rows of them.
        rows = dataclasses.replace(rows, bias=cut(p.bias, i0, bq, -2), mask=cut(p.mask, i0, bq, -2))
        queries.append([i0, rows, None])
    sub = bk if p.block_size is None else min(p.block_size[1], bk)
    parts = -(-bk // sub)

    held = (p.k, p.v, p.key_positions, p.key_segments)
    arrived: list[Any] = []  # every shard received, for the backward (collective.depend)
    for step in range(devices):
        # Start passing the shard at hand on (with its keys' positions and segment ids)
        # before folding it: the transfer runs during the fold.
        receive = collective.rotate(held, axis) if step < devices - 1 else None
        source = (me - step) % devices  # the device the shard at hand started on
        for c, index in enumerate(chunk_indices(source, devices, chunks)):
            k, v, positions, segments = held
            keys = (
                rows_of(k, c * bk, (c + 1) * bk, -2), rows_of(v, c * bk, (c + 1) * bk, -2),
                rows_of(positions, c * bk, (c + 1) * bk, -1),
                rows_of(segments, c * bk, (c + 1) * bk, -1),
            )  # fmt: skip
            for query in queries:
                i0, rows, state = query
                query[2] = fold_keys(
                    p, rows, i0, parts, _key_blocks(p, rows, keys, index * bk, sub, cut),
                    None, cond=backend.cond, state=state,
                )  # fmt: skip
        if receive is not None:
            held = receive()
            arrived += held[:2]
    outs = [block_finish(state, p.dtype, xp) for _, _, state in queries]
    out = outs[0] if chunks == 1 else xp.concat(outs, axis=-2)
    return collective.depend(out, arrived)


def _key_blocks(p: Problem, rows: Problem, keys: tuple[Any, ...], j0: Any, sub: int,
                cut: Any) -> Any:  # fmt: skip
    """``key_block(part, _)`` for :func:`fold_keys`: sub-block ``part`` of the key chunk
    ``keys`` (keys, values, positions, segment ids) whose first key is ``j0``."""
    k, v, positions, segments = keys
    bk = k.shape[-2]

    def key_block(part: int, source: Any) -> tuple[KeyBlock, Any]:
        a, b = part * sub, min(part * sub + sub, bk)
        start = j0 + a
        kb = rows_of(k, a, b, -2)
        # DeBERTa's position-to-content term reads the scaled keys: scaled here, not
        # passed round the ring beside the keys.
        ks = None if p.ks is None else kb * p.scale
        block = KeyBlock(
            start, kb, rows_of(v, a, b, -2), ks, cut(rows.bias, start, b - a, -1),
            cut(rows.mask, start, b - a, -1), rows_of(positions, a, b, -1),
            rows_of(segments, a, b, -1),
        )  # fmt: skip
        return block, source

    return key_block


def zigzag_shard(x: Array, num_shards: int, *, axis: int) -> Array:
    """Reorder a whole sequence so that contiguous shards of it are zig-zag pairs of chunks.

    The sequence along ``axis`` is cut into ``2n`` equal chunks (``n = num_shards``) and
    laid out as chunks ``0, 2n - 1, 1, 2n - 2, …, n - 1, n``: sharded contiguously over
    ``n`` devices (``jax.shard_map``'s ``PartitionSpec``, ``torch.chunk`` by rank), rank
    ``r`` holds chunks ``r`` and ``2n - 1 - r``, the layout of
    ``ring_attention(..., sharding="zigzag")``. Under a causal mask each rank then folds
    the same number of key blocks (``2n + 1`` chunk pairs of ``4n``), where the plain
    layout leaves the last rank ``n`` times the first's work.

    Parameters
    ----------
    x : array
        The whole sequence: ``q``, ``k``, ``v`` (``axis=-2``), their positions or segment
        ids (``axis=-1``); any dtype.
    num_shards : int
        ``n``, the number of ranks, at least 1.
    axis : int
        The sequence axis; its length must be a multiple of ``2n``.

    Returns
    -------
    array
        ``x`` reordered along ``axis`` (a new array; same shape, dtype and device).

    Raises
    ------
    TypeError
        If ``x`` is not an array, or ``num_shards`` or ``axis`` is not an integer.
    ValueError
        If ``num_shards < 1``, ``axis`` is out of range, or the length along ``axis`` is
        not a multiple of ``2·num_shards``.

    See Also
    --------
    zigzag_unshard : The inverse.
    ring_attention : The ring that takes this layout with ``sharding="zigzag"``.

    Notes
    -----
    The load-balanced layout of ring-flash-attention's zig-zag ring (Zhu 2024) and of
    Brandon et al. 2023 (striped attention balances by striping tokens instead); relattn's
    ring computes every relative term exactly from each chunk's global positions.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn import zigzag_shard, zigzag_unshard
    >>> x = np.arange(8)
    >>> zigzag_shard(x, 2, axis=0)
    array([0, 1, 6, 7, 2, 3, 4, 5])
    >>> np.array_equal(zigzag_unshard(zigzag_shard(x, 2, axis=0), 2, axis=0), x)
    True
    """
    return _reorder(x, num_shards, axis, inverse=False)


def zigzag_unshard(x: Array, num_shards: int, *, axis: int) -> Array:
    """The inverse of :func:`zigzag_shard`: a zig-zag layout back in sequence order.

    Parameters
    ----------
    x : array
        The concatenated shards (``ring_attention(..., sharding="zigzag")``'s outputs
        gathered in rank order), or any array laid out by :func:`zigzag_shard`.
    num_shards, axis : int
        As for :func:`zigzag_shard`.

    Returns
    -------
    array
        ``x`` in sequence order along ``axis`` (same shape, dtype and device).

    Raises
    ------
    TypeError, ValueError
        As :func:`zigzag_shard`.

    See Also
    --------
    zigzag_shard : The layout.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn import zigzag_unshard
    >>> zigzag_unshard(np.array([0, 1, 6, 7, 2, 3, 4, 5]), 2, axis=0)
    array([0, 1, 2, 3, 4, 5, 6, 7])
    """
    return _reorder(x, num_shards, axis, inverse=True)


def _reorder(x: Any, num_shards: Any, axis: Any, *, inverse: bool) -> Any:
    xp = _checks.namespace(x=x)
    _checks.ndim("x", x, 1, "(..., L, ...)")
    n = _checks.length("num_shards", num_shards)
    dim = _checks.axis("axis", axis, x.ndim)
    length = x.shape[dim]
    if length % (2 * n):
        raise ValueError(
            f"x: its length along axis {axis} must be a multiple of 2·num_shards = {2 * n} "
            f"(two chunks per shard), got {length}"
        )
    size = length // (2 * n)
    order = [c for r in range(n) for c in chunk_indices(r, n, 2)]
    if inverse:
        order = sorted(range(2 * n), key=order.__getitem__)
    # Slices and one concatenation: no index array, so nothing is placed on a device that
    # the input is not on (a JAX array stays uncommitted, a Dask array keeps its chunks).
    cut = [slice(None)] * x.ndim

    def chunk(c: int) -> Any:
        cut[dim] = slice(c * size, (c + 1) * size)
        return x[tuple(cut)]

    return xp.concat([chunk(c) for c in order], axis=dim)
