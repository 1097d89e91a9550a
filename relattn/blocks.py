"""Blockwise relative attention: the relative terms of one block, the block step and the merge.

For a query block ``[i0, i0 + bq)`` and a key block ``[j0, j0 + bk)`` the
distances form ``bq + bk - 1`` contiguous columns of the relative layout, from
``m0 = j0 - i0 - (bq - 1) + Lq - 1``, so the block's relative terms are the
shift of :mod:`relattn.shift` on a small slice of each table
(:func:`relative_term`). Blocks are combined with the online softmax (Milakov &
Gimelshein 2018; Dao et al. 2022): a running row maximum, a running sum of
``exp(score - max)`` and a rescaled accumulator (:class:`BlockState`), so that
memory is ``O(Lq·d + bq·bk)`` per head instead of ``O(Lq·Lk)``.

The offsets ``i0`` and ``j0`` are Python integers in the loop of this module
(static slices; key blocks wholly after a causal query block are never
visited) and may be traced integers in a backend's own loop (JAX's
``lax.fori_loop``, :mod:`relattn.backends._jax`) or on a ring of devices:
then the slices are ``take``s with clipped indices and the causal and
out-of-range cells are masked from the block's distances.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import array_api_compat
import array_api_extra as xpx

from ._typing import Array
from .backends import backend_for
from .shift import shift, unshift

__all__ = [
    "BlockState",
    "Blocks",
    "Relative",
    "attention_block",
    "block_finish",
    "block_merge",
    "block_start",
    "block_step",
    "blockwise",
    "dense_in_query_blocks",
    "finish_block_state",
    "merge_block_states",
    "relative_term",
    "static_blocks",
]

NEGATIVE_INFINITY = -math.inf


@dataclass(frozen=True)
class Relative:
    """The per-distance terms of one problem, checked and cast.

    ``key_table`` ``Kʳ (..., W, d)``, ``query_table`` ``Qʳ (..., W, d)``,
    ``relative_bias`` ``b (..., W)``; each in the full or causal layout, or
    ``None``. ``lq``, ``lk``: the whole problem's lengths. ``causal``: ``δ > 0``
    is masked (the flag, or a table in the causal layout).
    """

    lq: int
    lk: int
    causal: bool
    key_table: Any = None
    query_table: Any = None
    relative_bias: Any = None

    @property
    def empty(self) -> bool:
        return self.key_table is None and self.query_table is None and self.relative_bias is None

    @property
    def masks_itself(self) -> bool:
        """With static offsets, a causal term whose absent cells are ``-inf`` is the causal mask."""
        return self.causal and (self.key_table is not None or self.relative_bias is not None)


def _static(*offsets: Any) -> bool:
    return all(isinstance(o, int) for o in offsets)


def _window(x: Any, start: Any, width: int, stop: int, axis: int, xp: Any) -> Any:
    """``x[start : start + width]`` along ``axis`` (-1 or -2).

    A static ``start`` gives a slice that ends at ``stop`` at most (a prefix of
    the window, which the shift completes with its fill). A traced ``start``
    gives all ``width`` rows, gathered at indices clipped into ``x``: the cells
    that read a clipped row are masked by the caller.
    """
    if isinstance(start, int):
        end = min(start + width, stop)
        return x[..., start:end] if axis == -1 else x[..., start:end, :]
    n = x.shape[axis]
    rows = xp.arange(width, device=array_api_compat.device(x)) + start
    rows = xp.clip(rows, 0, n - 1)
    return xp.take(x, rows, axis=x.ndim + axis)


def relative_term(
    rel: Relative,
    qp: Any,
    ks: Any,
    block: tuple[Any, int, Any, int],
    xp: Any,
    *,
    fill: float = NEGATIVE_INFINITY,
) -> Any:
    """The relative scores of the query block ``[i0, i0 + bq)`` and key block ``[j0, j0 + bk)``.

    ``block = (i0, bq, j0, bk)``. ``qp (..., bq, d)`` are the block's position
    queries ``(q + v) · scale`` (read when there is a ``key_table``) and
    ``ks (..., bk, d)`` its keys times ``scale`` (read when there is a
    ``query_table``). The block's distances are the ``bq + bk - 1`` columns of
    the relative layout from ``m0 = j0 - i0 - (bq - 1) + Lq - 1``: each term is
    the shift of Transformer-XL's appendix B on that slice. With static
    offsets in a causal problem the slice stops at column ``Lk - 1``
    (``δ = 0``) and the shift fills the absent ``δ > 0`` cells with ``fill``
    (``-inf``: the term is then the causal mask too). ``None`` when the problem
    has no relative term.
    """
    if rel.empty:
        return None
    i0, bq, j0, bk = block
    width = bq + bk - 1
    m0 = j0 - i0 - (bq - 1) + rel.lq - 1
    stop = rel.lk if rel.causal else rel.lq + rel.lk - 1
    terms = []
    if rel.key_table is not None:
        table = _window(rel.key_table, m0, width, stop, -2, xp)
        terms.append(shift(qp @ xp.matrix_transpose(table), bk, xp, fill=fill))
    if rel.relative_bias is not None:
        values = _window(rel.relative_bias, m0, width, stop, -1, xp)
        values = xp.broadcast_to(values[..., None, :], (*values.shape[:-1], bq, values.shape[-1]))
        terms.append(shift(values, bk, xp, fill=fill))
    if rel.query_table is not None:
        # p2c[i, j] = k_j · Qʳ[m(i, j)]: the keys play the queries' part in a problem of
        # bk "queries" and bq "keys", over the flipped slice (He et al. 2021, eq. (4)).
        table = _window(rel.query_table, m0, width, rel.query_table.shape[-2], -2, xp)
        if table.shape[-2] < width:
            # Causal layout: the δ > 0 rows are absent and their cells masked; zeros stand in.
            rows = [(0, 0)] * (table.ndim - 2) + [(0, width - table.shape[-2]), (0, 0)]
            table = xpx.pad(table, rows, xp=xp)
        flipped = xp.flip(table, axis=-2)
        terms.append(xp.matrix_transpose(shift(ks @ xp.matrix_transpose(flipped), bq, xp)))
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


# -------------------------------------------------------------------------------------------
# The online softmax
# -------------------------------------------------------------------------------------------
class BlockState(NamedTuple):
    """The unnormalised statistics of the online softmax for a block of queries.

    Parameters
    ----------
    accumulator : array of shape (..., bq, d_v)
        ``Σ_j exp(s_ij - peak_i) (v_j + Vʳ[m(i, j)])`` over the keys seen.
    peak : array of shape (..., bq, 1)
        The largest score seen per row (``-inf`` while every key seen is
        masked).
    total : array of shape (..., bq, 1)
        ``Σ_j exp(s_ij - peak_i)``.

    See Also
    --------
    attention_block : Fold a key block into a state.
    merge_block_states : Combine two states.
    finish_block_state : The output of a state.

    Notes
    -----
    Milakov & Gimelshein 2018; Dao et al. 2022, algorithm 1: the statistics
    ``(O, m, ℓ)`` kept per query block.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> from relattn import attention_block
    >>> state = attention_block(xp.zeros((1, 2)), xp.zeros((3, 2)), xp.ones((3, 1)),
    ...                         query_start=0, key_start=0, query_length=1, key_length=3)
    >>> state.total          # three keys, equal scores: exp(0) each
    Array([[3.]], dtype=array_api_strict.float64)
    """

    accumulator: Any
    peak: Any
    total: Any


def _finite_or_zero(peak: Any, xp: Any) -> Any:
    # A row whose keys are all masked so far has peak -inf: shift it by 0, so that
    # exp(-inf - 0) = 0 and no inf - inf appears.
    return xp.where(xp.isfinite(peak), peak, xp.zeros_like(peak))


def block_start(shape: tuple[int, ...], dtype: Any, device: Any, xp: Any) -> BlockState:
    """The state before any key block: zero accumulator ``shape``, peak ``-inf``, total 0."""
    rows = (*shape[:-1], 1)
    return BlockState(
        xp.zeros(shape, dtype=dtype, device=device),
        xp.full(rows, -math.inf, dtype=dtype, device=device),
        xp.zeros(rows, dtype=dtype, device=device),
    )


def block_step(
    state: BlockState, scores: Any, v: Any, xp: Any, *, value_table: Any = None
) -> BlockState:
    """Fold one key block into ``state``.

    ``scores (..., bq, bk)`` are the block's finished scores, ``-inf`` where a
    key is masked; ``v (..., bk, d_v)`` its values; ``value_table
    (..., w, d_v)`` the block's slice of a value table (``w <= bq + bk - 1``
    columns of its relative layout), or ``None``. Scores and values are
    promoted to the state's dtype (float32 accumulators for half-precision
    inputs).
    """
    dtype = state.accumulator.dtype
    if scores.dtype != dtype:
        scores = xp.astype(scores, dtype)
    peak = xp.maximum(state.peak, xp.max(scores, axis=-1, keepdims=True))
    safe = _finite_or_zero(peak, xp)
    weights = xp.exp(scores - safe)
    rescale = xp.exp(state.peak - safe)
    update = weights @ (v if v.dtype == dtype else xp.astype(v, dtype))
    if value_table is not None:
        spread = unshift(weights, xp)[..., : value_table.shape[-2]]
        table = value_table if value_table.dtype == dtype else xp.astype(value_table, dtype)
        update = update + spread @ table
    total = state.total * rescale + xp.sum(weights, axis=-1, keepdims=True)
    return BlockState(state.accumulator * rescale + update, peak, total)


def block_merge(a: BlockState, b: BlockState, xp: Any) -> BlockState:
    """Two states of the same queries over disjoint key sets, as one state.

    Rows that no key of either set reaches keep a zero accumulator and total.
    """
    peak = xp.maximum(a.peak, b.peak)
    safe = _finite_or_zero(peak, xp)
    scale_a, scale_b = xp.exp(a.peak - safe), xp.exp(b.peak - safe)
    return BlockState(
        a.accumulator * scale_a + b.accumulator * scale_b,
        peak,
        a.total * scale_a + b.total * scale_b,
    )


def block_finish(state: BlockState, dtype: Any, xp: Any) -> Any:
    """The attention output ``accumulator / total``; rows with no key stay exactly 0."""
    total = state.total
    out = state.accumulator / xp.where(total > 0, total, xp.ones_like(total))
    return out if out.dtype == dtype else xp.astype(out, dtype)


def accumulator_dtype(dtype: Any, xp: Any) -> Any:
    """float32 for half-precision inputs (float16, bfloat16), else the inputs' dtype."""
    return xp.float32 if xp.finfo(dtype).bits < 32 else dtype


# -------------------------------------------------------------------------------------------
# One problem, block by block
# -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Blocks:
    """A checked, cast attention problem of the core, ready to be run a block pair at a time.

    ``q`` are the content queries ``(q + u) · scale``, ``qp`` the position
    queries ``(q + v) · scale`` (or ``None``), ``ks`` the keys times ``scale``
    for a position-to-content term (or ``None``); ``mask`` and ``bias``
    broadcast to the scores ``(..., Lq, Lk)`` and are sliced per block, never
    expanded.
    """

    q: Any
    k: Any
    v: Any
    rel: Relative
    qp: Any = None
    ks: Any = None
    value_table: Any = None
    bias: Any = None
    mask: Any = None

    @property
    def lead(self) -> tuple[int, ...]:
        """The broadcast leading shape of the scores and the output."""
        shapes = [
            tuple(a.shape[:-2])
            for a in (
                self.q,
                self.k,
                self.v,
                self.qp,
                self.ks,
                self.value_table,
                self.rel.key_table,
                self.rel.query_table,
            )
            if a is not None
        ]
        ndim = max(len(s) for s in shapes)
        out = []
        for axis in range(-ndim, 0):
            sizes = {s[axis] for s in shapes if len(s) >= -axis} - {1}
            out.append(sizes.pop() if sizes else 1)
        return tuple(out)


def _rows(x: Any, start: int, stop: int, axis: int) -> Any:
    """``x[..., start:stop, (:)]`` along ``axis`` (-2 or -1), unless that axis broadcasts."""
    if x is None or x.shape[axis] == 1:
        return x
    return x[..., start:stop, :] if axis == -2 else x[..., start:stop]


def _pair_block(x: Any, i0: int, i1: int, j0: int, j1: int) -> Any:
    """The ``[i0:i1, j0:j1]`` block of an array broadcastable to the scores, not expanded."""
    if x is None:
        return None
    if x.ndim >= 2:
        x = _rows(x, i0, i1, -2)
    return _rows(x, j0, j1, -1)


def visible_mask(
    rel: Relative, block: tuple[Any, int, Any, int], device: Any, xp: Any, *, key_limit: Any = None
) -> Any:
    """``δ <= 0`` (when causal) and ``j < key_limit`` over one block; ``None`` where all pass.

    Static offsets skip the mask where the whole block passes; traced ones
    always build it (``bq × bk`` booleans from two ranges).
    """
    i0, bq, j0, bk = block
    static = _static(i0, j0)
    offset = rel.lk - rel.lq
    causal = rel.causal and not (static and j0 + bk - 1 <= i0 + offset)
    limited = key_limit is not None
    if not (causal or limited):
        return None
    cols = xp.arange(bk, device=device) + j0
    out = None
    if causal:
        rows = xp.arange(bq, device=device) + (i0 + offset)
        out = cols[None, :] <= rows[:, None]
    if limited:
        keep = (cols < key_limit)[None, :]
        out = keep if out is None else out & keep
    return out


def pair_scores(
    blocks: Blocks,
    q: Any,
    k: Any,
    qp: Any,
    ks: Any,
    block: tuple[Any, int, Any, int],
    xp: Any,
    *,
    bias: Any = None,
    mask: Any = None,
    key_limit: Any = None,
) -> Any:
    """The finished scores of one block pair: content, relative terms, bias; ``-inf`` where masked.

    ``q``, ``k``, ``qp``, ``ks``, ``bias`` and ``mask`` are the block's slices;
    ``block = (i0, bq, j0, bk)`` its offsets (static or traced). Keys from
    ``key_limit`` on (padding added by a backend's loop) are masked.
    """
    s = q @ xp.matrix_transpose(k)
    term = relative_term(blocks.rel, qp, ks, block, xp)
    if term is not None:
        s = s + term
    if bias is not None:
        s = s + bias
    rel = blocks.rel
    static = _static(block[0], block[2])
    device = array_api_compat.device(s)
    need_causal = rel.causal and not (static and rel.masks_itself)
    visible = visible_mask(
        rel if need_causal else Relative(rel.lq, rel.lk, False), block, device, xp,
        key_limit=key_limit,
    )  # fmt: skip
    blocked = visible if mask is None else (mask if visible is None else mask & visible)
    if blocked is not None:
        s = xp.where(blocked, s, xp.full((), -math.inf, dtype=s.dtype, device=device))
    return s


def value_slice(blocks: Blocks, block: tuple[Any, int, Any, int], xp: Any) -> Any:
    """The block's columns of the value table (a prefix in a causal problem), or ``None``."""
    table = blocks.value_table
    if table is None:
        return None
    i0, bq, j0, bk = block
    m0 = j0 - i0 - (bq - 1) + blocks.rel.lq - 1
    return _window(table, m0, bq + bk - 1, table.shape[-2], -2, xp)


#: The arrays of a :class:`Blocks` problem, in the order :func:`_arrays` lists them.
_FIELDS = ("q", "k", "v", "qp", "ks", "value_table", "bias", "mask")
_TABLES = ("key_table", "query_table", "relative_bias")


def _arrays(blocks: Blocks) -> tuple[Any, ...]:
    rel = blocks.rel
    return tuple(getattr(blocks, f) for f in _FIELDS) + tuple(getattr(rel, f) for f in _TABLES)


def _rebuild(blocks: Blocks, arrays: tuple[Any, ...]) -> Blocks:
    """``blocks`` with its arrays replaced by ``arrays`` (as :func:`_arrays` lists them)."""
    n = len(_FIELDS)
    rel = dataclasses.replace(blocks.rel, **dict(zip(_TABLES, arrays[n:], strict=True)))
    return dataclasses.replace(blocks, rel=rel, **dict(zip(_FIELDS, arrays[:n], strict=True)))


def query_rows(blocks: Blocks, i0: int, i1: int) -> Blocks:
    """The problem restricted to the query rows ``[i0, i1)`` (static), keys and tables whole."""
    mask = blocks.mask
    bias = blocks.bias
    return dataclasses.replace(
        blocks,
        q=_rows(blocks.q, i0, i1, -2),
        qp=_rows(blocks.qp, i0, i1, -2),
        bias=_rows(bias, i0, i1, -2) if bias is not None and bias.ndim >= 2 else bias,
        mask=_rows(mask, i0, i1, -2) if mask is not None and mask.ndim >= 2 else mask,
    )


def blockwise(blocks: Blocks, xp: Any, *, block_size: tuple[int, int], dtype: Any) -> Any:
    """The core's attention, a query block and a key block at a time.

    The backend's own loop runs it where it has one (``Backend.blockwise``:
    JAX's ``lax.map`` and ``lax.fori_loop``, so that a jit compiles one block
    step); otherwise Python loops over static blocks (:func:`static_blocks`).
    Each query block is recomputed in the backward pass
    (``Backend.checkpoint``) instead of keeping its key blocks' probabilities:
    memory ``O(Lq·d + block_size·Lk)`` for gradients too.
    """
    backend = backend_for(xp)
    if backend.blockwise is not None:
        return backend.blockwise(blocks, xp, block_size=block_size, dtype=dtype)
    return static_blocks(
        blocks,
        xp,
        query_block=block_size[0],
        key_block=block_size[1],
        dtype=dtype,
        recompute=True,
    )


#: Scores computed at once by the dense path of a library that runs one operation at a
#: time: a block of queries against every key (float32: 64 MiB).
DENSE_CHUNK_ELEMENTS = 1 << 24


def dense_in_query_blocks(blocks: Blocks, xp: Any, *, dtype: Any) -> Any:
    """The dense path a block of queries at a time, every key at once.

    For libraries that run one operation at a time (``Backend.query_chunks``):
    the same work as one ``(Lq, Lk)`` softmax, but the relative terms'
    ``(Lq, W)`` intermediates and the scores exist for one block of queries
    only, and the causal queries read only the keys they see.
    """
    lq, lk = blocks.rel.lq, blocks.rel.lk
    per_query = math.prod(blocks.lead) * lk
    rows = max(1, min(lq, DENSE_CHUNK_ELEMENTS // max(per_query, 1)))
    return static_blocks(
        blocks, xp, query_block=rows, key_block=max(lk, 1), dtype=dtype, recompute=False
    )


def static_blocks(
    blocks: Blocks, xp: Any, *, query_block: int, key_block: int, dtype: Any, recompute: bool
) -> Any:
    """Python loops over static query and key blocks; key blocks wholly after a causal
    query block are skipped. ``recompute``: each query block under ``Backend.checkpoint``.
    """
    backend = backend_for(xp)
    lq, lk = blocks.rel.lq, blocks.rel.lk
    offset = lk - lq
    outputs = []
    for i0 in range(0, lq, query_block):
        i1 = min(i0 + query_block, lq)
        # Under a causal mask, key j is visible to some query of the block only if
        # j <= i1 - 1 + offset.
        last_key = min(lk, i1 + offset) if blocks.rel.causal else lk
        rows = query_rows(blocks, i0, i1)

        def run(*arrays: Any, rows: Blocks = rows, i0: int = i0, last: int = last_key) -> Any:
            return _query_block(_rebuild(rows, arrays), i0, last, key_block, dtype, xp)

        if recompute:
            outputs.append(backend.checkpoint(run, *_arrays(rows)))
        else:
            outputs.append(run(*_arrays(rows)))
    return outputs[0] if len(outputs) == 1 else xp.concat(outputs, axis=-2)


def _query_block(
    blocks: Blocks, i0: int, last_key: int, block_size: int, dtype: Any, xp: Any
) -> Any:
    """The query rows of ``blocks`` (from ``i0``) over the key blocks of ``[0, last_key)``."""
    bq = blocks.q.shape[-2]
    state = block_start(
        (*blocks.lead, bq, blocks.v.shape[-1]),
        accumulator_dtype(dtype, xp),
        array_api_compat.device(blocks.q),
        xp,
    )
    for j0 in range(0, max(last_key, 0), block_size):
        j1 = min(j0 + block_size, last_key)
        block = (i0, bq, j0, j1 - j0)
        s = pair_scores(
            blocks, blocks.q, _rows(blocks.k, j0, j1, -2), blocks.qp,
            _rows(blocks.ks, j0, j1, -2), block, xp,
            bias=_rows(blocks.bias, j0, j1, -1), mask=_rows(blocks.mask, j0, j1, -1),
        )  # fmt: skip
        v = _rows(blocks.v, j0, j1, -2)
        state = block_step(state, s, v, xp, value_table=value_slice(blocks, block, xp))
    return block_finish(state, dtype, xp)


# -------------------------------------------------------------------------------------------
# The public block primitives
# -------------------------------------------------------------------------------------------
def attention_block(
    q: Array,
    k: Array,
    v: Array,
    position_table: Array = None,
    *,
    query_start: Any,
    key_start: Any,
    query_length: int,
    key_length: int,
    content_bias: Array = None,
    position_bias: Array = None,
    query_position_table: Array = None,
    value_table: Array = None,
    relative_bias: Array = None,
    mask: Array = None,
    causal: bool = False,
    scale: Any = None,
    state: BlockState | None = None,
) -> BlockState:
    """One query block against one key block of a larger problem: the online softmax's step.

    Parameters
    ----------
    q : array of shape (..., bq, d), real floating
        The queries ``[query_start, query_start + bq)`` of a problem with
        ``query_length`` queries.
    k : array of shape (..., bk, d), real floating
        The keys ``[key_start, key_start + bk)`` of ``key_length`` keys.
    v : array of shape (..., bk, d_v), real floating
        Their values.
    position_table : array of shape (..., W, d), real floating, optional
        The **whole** problem's content-to-position table ``Kʳ``
        (Transformer-XL's projected ``R``) in its relative layout,
        ``W = key_length`` (causal) or ``query_length + key_length - 1``
        (full); the block reads its ``bq + bk - 1`` columns.
    query_start, key_start : int or 0-d integer array
        The block's first query and key; traced integers are allowed (a ring
        step under ``jax.jit``: the table columns are then gathered).
    query_length, key_length : int
        ``Lq`` and ``Lk`` of the whole problem (query ``i`` sits at key
        position ``i + Lk - Lq``).
    content_bias, position_bias : array, real floating, optional
        ``u`` and ``v`` of Transformer-XL, broadcastable to ``q``.
    query_position_table : array of shape (..., W, d), real floating, optional
        The whole problem's position-to-content table ``Qʳ`` (DeBERTa).
    value_table : array of shape (..., W, d_v), real floating, optional
        The whole problem's value table ``Vʳ`` (Shaw et al.).
    relative_bias : array of shape (..., W), real floating, optional
        The whole problem's per-distance bias (T5, ALiBi).
    mask : array, bool, optional
        ``True`` = may attend, broadcastable to the **block's** scores
        ``(..., bq, bk)``.
    causal : bool, optional
        Mask ``δ > 0`` (implied by a causal-layout table).
    scale : float or 0-d array, optional
        Score scale, ``1/√d`` by default.
    state : BlockState, optional
        The statistics of the key blocks seen so far for these queries
        (default: none yet).

    Returns
    -------
    BlockState
        ``state`` with this key block folded in: the unnormalised
        ``accumulator (..., bq, d_v)``, the running ``peak (..., bq, 1)`` and
        ``total (..., bq, 1)``, float32 for half-precision inputs.
        :func:`finish_block_state` turns it into the output.

    Raises
    ------
    ValueError
        If shapes do not match (feature sizes, table widths for the whole
        problem, a block outside it, a mask that does not broadcast to the
        block), or ``d = 0`` with the default scale.
    TypeError
        If an input is not a real floating array, ``mask`` is not boolean, or
        the arrays come from different libraries.

    See Also
    --------
    merge_block_states : Combine states of the same queries over other keys.
    finish_block_state : The attention output of a state.
    ring_attention : These blocks on a ring of devices.
    relative_attention : The whole problem at once (its ``block_size=`` runs these steps).

    Notes
    -----
    The online softmax of Milakov & Gimelshein 2018, as blocked by Dao et al.
    2022 (FlashAttention), over relattn's relative terms: the block's position
    scores are the shift of Dai et al. 2019, appendix B, on the table columns
    ``m0 … m0 + bq + bk - 2``, ``m0 = key_start - query_start - (bq - 1) +
    Lq - 1``. A row whose keys are all masked keeps peak ``-inf`` and a zero
    total, and finishes as a zero row.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> from relattn import attention_block, finish_block_state, merge_block_states
    >>> q = xp.ones((2, 4)); k = xp.ones((4, 4)); v = xp.reshape(xp.arange(8.0), (4, 2))
    >>> first = attention_block(q, k[:2, :], v[:2, :], query_start=2, key_start=0,
    ...                         query_length=4, key_length=4)
    >>> second = attention_block(q, k[2:, :], v[2:, :], query_start=2, key_start=2,
    ...                          query_length=4, key_length=4)
    >>> finish_block_state(merge_block_states(first, second))      # the mean of v's rows
    Array([[3., 4.],
           [3., 4.]], dtype=array_api_strict.float64)
    """
    from . import _checks, core

    xp = _checks.namespace(
        q=q, k=k, v=v,
        optional={
            "position_table": position_table, "content_bias": content_bias,
            "position_bias": position_bias, "query_position_table": query_position_table,
            "value_table": value_table, "relative_bias": relative_bias, "mask": mask,
        },
    )  # fmt: skip
    dtype = _checks.floating(
        xp, q=q, k=k, v=v, position_table=position_table, content_bias=content_bias,
        position_bias=position_bias, query_position_table=query_position_table,
        value_table=value_table, relative_bias=relative_bias,
    )  # fmt: skip
    bq, bk, d = core.check_qkv(q, k, v)
    lq = _checks.length("query_length", query_length, minimum=0)
    lk = _checks.length("key_length", key_length, minimum=0)
    for name, start, size, total in (
        ("query_start", query_start, bq, lq),
        ("key_start", key_start, bk, lk),
    ):
        if isinstance(start, bool) or not (isinstance(start, int) or hasattr(start, "ndim")):
            raise TypeError(f"{name} must be an integer, got {type(start).__name__}")
        if isinstance(start, int) and not 0 <= start <= total - size:
            raise ValueError(
                f"{name} must place the block inside the problem, 0 <= {name} <= {total - size}, "
                f"got {start}"
            )
    tables = {
        "position_table": (position_table, d), "query_position_table": (query_position_table, d),
        "value_table": (value_table, v.shape[-1]),
    }  # fmt: skip
    leads = {"q": q.shape[:-2], "k": k.shape[:-2], "v": v.shape[:-2]}
    for name, (table, features) in tables.items():
        if table is not None:
            core.check_table(name, table, lq, lk, features, "d" if features == d else "d_v")
            leads[name] = table.shape[:-2]
    lead = _checks.broadcast(**leads)
    if position_bias is not None and position_table is None:
        raise ValueError("position_bias needs a position_table: it is added to q before q Rᵀ")
    for name, b in (("content_bias", content_bias), ("position_bias", position_bias)):
        if b is not None:
            _checks.broadcastable(name, b.shape, tuple(q.shape), "q")
    scale, causal, _ = core.check_options(
        xp, (*lead, bq, bk), d, mask=mask, bias=None, relative_bias=None, causal=causal,
        scale=scale, block_size=None,
    )  # fmt: skip
    core.check_relative_bias(relative_bias, lq, lk, (*lead, bq, bk))
    q, k, v, table, u, p_bias, q_table, value_table, relative_bias = (
        _checks.cast(xp, a, dtype)
        for a in (
            q, k, v, position_table, content_bias, position_bias, query_position_table,
            value_table, relative_bias,
        )
    )  # fmt: skip
    blocks = problem(
        q, k, v, xp, scale=scale, lq=lq, lk=lk, content_bias=u, position_bias=p_bias,
        key_table=table, query_table=q_table, value_table=value_table,
        relative_bias=relative_bias, causal=causal,
    )  # fmt: skip
    block = (query_start, bq, key_start, bk)
    if state is None:
        state = block_start(
            (*lead, bq, v.shape[-1]), accumulator_dtype(dtype, xp), array_api_compat.device(q), xp
        )
    else:
        _check_state(state, (*lead, bq, v.shape[-1]), xp)
    s = pair_scores(blocks, blocks.q, k, blocks.qp, blocks.ks, block, xp, mask=mask)
    return block_step(state, s, v, xp, value_table=value_slice(blocks, block, xp))


def problem(
    q: Any,
    k: Any,
    v: Any,
    xp: Any,
    *,
    scale: Any,
    lq: int,
    lk: int,
    content_bias: Any = None,
    position_bias: Any = None,
    key_table: Any = None,
    query_table: Any = None,
    value_table: Any = None,
    relative_bias: Any = None,
    bias: Any = None,
    mask: Any = None,
    causal: bool = False,
) -> Blocks:
    """The :class:`Blocks` of checked, cast inputs: scaled content and position queries.

    ``lq``, ``lk`` are the whole problem's lengths (``q`` and ``k`` may be one
    block of it). A table or ``relative_bias`` of width ``lk`` (the causal
    layout, where it differs from ``lq + lk - 1``) implies ``causal``.
    """
    full = lq + lk - 1
    widths = [t.shape[-2] for t in (key_table, query_table, value_table) if t is not None]
    if relative_bias is not None:
        widths.append(relative_bias.shape[-1])
    rel = Relative(lq, lk, causal or any(w != full for w in widths), key_table, query_table,
                   relative_bias)  # fmt: skip
    content = (q if content_bias is None else q + content_bias) * scale
    qp = None
    if key_table is not None:
        qp = (q if position_bias is None else q + position_bias) * scale
    ks = k * scale if query_table is not None else None
    return Blocks(content, k, v, rel, qp, ks, value_table, bias, mask)


def _check_state(state: Any, shape: tuple[int, ...], xp: Any) -> None:
    if not isinstance(state, BlockState):
        raise TypeError(f"state must be a BlockState, got {type(state).__name__}")
    if tuple(state.accumulator.shape) != shape:
        raise ValueError(
            f"state must hold these queries' statistics, accumulator of shape {shape}, "
            f"got {tuple(state.accumulator.shape)}"
        )


def merge_block_states(a: BlockState, b: BlockState) -> BlockState:
    """Combine the statistics of the same queries over two disjoint sets of keys.

    Parameters
    ----------
    a, b : BlockState
        States of :func:`attention_block` for the same queries (equal shapes).

    Returns
    -------
    BlockState
        The state over both key sets: ``peak = max(peak_a, peak_b)``, the
        accumulators and totals rescaled to it and added. Rows that no key of
        either set reaches stay at zero.

    Raises
    ------
    TypeError
        If an argument is not a BlockState, or the states come from different
        libraries.
    ValueError
        If the shapes differ.

    See Also
    --------
    attention_block : The state of one block pair.
    finish_block_state : The output of a state.

    Notes
    -----
    Milakov & Gimelshein 2018, the merge of two partial softmax
    normalisations; Liu et al. 2023 combine ring steps with it.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> from relattn import attention_block, finish_block_state, merge_block_states
    >>> q = k = xp.ones((1, 2)); v1, v2 = xp.asarray([[0.0]]), xp.asarray([[2.0]])
    >>> a = attention_block(q, k, v1, query_start=0, key_start=0, query_length=1, key_length=2)
    >>> b = attention_block(q, k, v2, query_start=0, key_start=1, query_length=1, key_length=2)
    >>> finish_block_state(merge_block_states(a, b))
    Array([[1.]], dtype=array_api_strict.float64)
    """
    from . import _checks

    for name, s in (("a", a), ("b", b)):
        if not isinstance(s, BlockState):
            raise TypeError(f"{name} must be a BlockState, got {type(s).__name__}")
    xp = _checks.namespace(a=a.accumulator, b=b.accumulator)
    if tuple(a.accumulator.shape) != tuple(b.accumulator.shape):
        raise ValueError(
            "a and b must hold the same queries' statistics, got accumulators of shapes "
            f"{tuple(a.accumulator.shape)} and {tuple(b.accumulator.shape)}"
        )
    return block_merge(a, b, xp)


def finish_block_state(state: BlockState, *, dtype: Any = None) -> Array:
    """The attention output ``accumulator / total`` of a state; rows with no key are 0.

    Parameters
    ----------
    state : BlockState
        The statistics of every key block for these queries.
    dtype : dtype, optional
        Real floating dtype of the result (default: the accumulator's; pass the
        inputs' half-precision dtype to cast back).

    Returns
    -------
    array of shape (..., bq, d_v)
        ``softmax(scores) (v + Vʳ)`` over every key folded into ``state``;
        exactly 0 for rows whose keys were all masked, never NaN.

    Raises
    ------
    TypeError
        If ``state`` is not a BlockState or ``dtype`` not a real floating
        dtype of its library.

    See Also
    --------
    attention_block : The state of one block pair.
    merge_block_states : The state over two key sets.

    Notes
    -----
    Dao et al. 2022, algorithm 1, line 12.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> from relattn import attention_block, finish_block_state
    >>> q = k = xp.ones((1, 2)); v = xp.asarray([[5.0]])
    >>> state = attention_block(q, k, v, query_start=0, key_start=0, query_length=1,
    ...                         key_length=1, mask=xp.asarray([[False]]))
    >>> finish_block_state(state)                     # a fully masked row
    Array([[0.]], dtype=array_api_strict.float64)
    """
    from . import _checks

    if not isinstance(state, BlockState):
        raise TypeError(f"state must be a BlockState, got {type(state).__name__}")
    xp = _checks.namespace(accumulator=state.accumulator)
    dtype = state.accumulator.dtype if dtype is None else _checks.dtype("dtype", dtype, xp)
    return block_finish(state, dtype, xp)
