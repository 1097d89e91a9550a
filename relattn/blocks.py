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

from .backends import backend_for
from .shift import shift, unshift

__all__ = [
    "BlockState",
    "Blocks",
    "Relative",
    "block_finish",
    "block_merge",
    "block_start",
    "block_step",
    "blockwise",
    "dense_in_query_blocks",
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
        # bk "queries" and bq "keys", over the flipped slice (SPEC §2.12).
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

    ``accumulator (..., bq, d_v)``: ``Σ_j exp(s_ij - peak_i) (v_j + Vʳ[m(i, j)])``;
    ``peak (..., bq, 1)``: the largest score seen per row (``-inf`` while every
    key seen is masked); ``total (..., bq, 1)``: ``Σ_j exp(s_ij - peak_i)``.
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


def blockwise(blocks: Blocks, xp: Any, *, block_size: int, dtype: Any) -> Any:
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
        blocks, xp, query_block=block_size, key_block=block_size, dtype=dtype, recompute=True
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
