"""Blockwise relative attention: block steps combined with the online softmax.

For a query block ``[i0, i0 + bq)`` and a key block ``[j0, j0 + bk)`` the
distances form ``bq + bk - 1`` contiguous columns of the relative layout (from
``m0 = j0 - i0 - (bq - 1) + Lq - 1``), so the block's relative terms are the
shift of :mod:`relattn.shift` on a small slice of each table
(:func:`relattn.core.relative_term`). Blocks are combined with the online
softmax (Milakov & Gimelshein 2018; Dao et al. 2022): a running row maximum, a
running sum of ``exp(score - max)`` and a rescaled accumulator, so that memory
is ``O(Lq·d + bq·bk)`` per head instead of ``O(Lq·Lk)``.

The same block step and merge serve the ring of :func:`relattn.ring_attention`,
whose key blocks arrive from the other devices.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import array_api_compat

from .core import Relative, relative_term

__all__ = ["BlockState", "block_finish", "block_merge", "block_start", "block_step", "blockwise"]


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
    columns of its relative layout), or ``None``. The scores are promoted to
    the state's dtype (float32 accumulators for half-precision inputs).
    """
    dtype = state.accumulator.dtype
    if scores.dtype != dtype:
        scores = xp.astype(scores, dtype)
    peak = xp.maximum(state.peak, xp.max(scores, axis=-1, keepdims=True))
    safe = _finite_or_zero(peak, xp)
    weights = xp.exp(scores - safe)
    rescale = xp.exp(state.peak - safe)
    if v.dtype != dtype:
        v = xp.astype(v, dtype)
    update = weights @ v
    if value_table is not None:
        from .core import value_term

        if value_table.dtype != dtype:
            value_table = xp.astype(value_table, dtype)
        update = update + value_term(weights, value_table, xp)
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


def _rows(x: Any, start: int, stop: int, axis: int) -> Any:
    """``x[..., start:stop, (:)]`` along ``axis`` (-2 or -1), unless that axis broadcasts."""
    if x.shape[axis] == 1:
        return x
    return x[..., start:stop, :] if axis == -2 else x[..., start:stop]


def _block(x: Any, i0: int, i1: int, j0: int, j1: int) -> Any:
    """The ``[i0:i1, j0:j1]`` block of an array broadcastable to the scores, not expanded."""
    if x is None:
        return None
    if x.ndim >= 2:
        x = _rows(x, i0, i1, -2)
    return _rows(x, j0, j1, -1)


def causal_block_mask(rel: Relative, block: tuple[int, int, int, int], device: Any, xp: Any) -> Any:
    """``δ <= 0`` over one block, or ``None`` where the whole block is visible."""
    i0, bq, j0, bk = block
    offset = rel.lk - rel.lq
    if j0 + bk - 1 <= i0 + offset:  # the block's largest δ is <= 0
        return None
    rows = xp.arange(i0 + offset, i0 + offset + bq, device=device)
    cols = xp.arange(j0, j0 + bk, device=device)
    return cols[None, :] <= rows[:, None]


def blockwise(
    q: Any,
    k: Any,
    v: Any,
    rel: Relative,
    qp: Any,
    ks: Any,
    xp: Any,
    *,
    scale: Any,
    value_table: Any,
    bias: Any,
    mask: Any,
    block_size: int,
) -> Any:
    """The core's attention, a query block and a key block at a time.

    ``q`` are the content queries ``q + u``; ``qp`` and ``ks`` as in
    :func:`relattn.core.relative_term`. Key blocks wholly after a causal
    query block (every ``δ > 0``) are skipped; masks and biases are sliced per
    block, never expanded.
    """
    lq, lk = rel.lq, rel.lk
    dtype = xp.result_type(q, v)
    work = accumulator_dtype(dtype, xp)
    device = array_api_compat.device(q)
    qc = q * scale
    offset = lk - lq
    lead = _lead(q, k, v, qp, ks, value_table)
    outputs = []
    for i0 in range(0, lq, block_size):
        i1 = min(i0 + block_size, lq)
        bq = i1 - i0
        state = block_start((*lead, bq, v.shape[-1]), work, device, xp)
        # Under a causal mask, key j is visible to some query of the block only if
        # j <= i1 - 1 + offset.
        last_key = min(lk, i1 + offset) if rel.causal else lk
        for j0 in range(0, max(last_key, 0), block_size):
            j1 = min(j0 + block_size, last_key)
            block = (i0, bq, j0, j1 - j0)
            s = _rows(qc, i0, i1, -2) @ xp.matrix_transpose(_rows(k, j0, j1, -2))
            term = relative_term(
                rel,
                None if qp is None else _rows(qp, i0, i1, -2),
                None if rel.query_table is None else _rows(ks, j0, j1, -2),
                block,
                xp,
            )
            if term is not None:
                s = s + term
            if bias is not None:
                s = s + _block(bias, i0, i1, j0, j1)
            blocked = _block(mask, i0, i1, j0, j1)
            if rel.causal and not rel.masks_itself:
                causal = causal_block_mask(rel, block, device, xp)
                if causal is not None:
                    blocked = causal if blocked is None else blocked & causal
            if blocked is not None:
                s = xp.where(blocked, s, xp.full((), -math.inf, dtype=s.dtype, device=device))
            table = None
            if value_table is not None:
                m0 = j0 - i0 - (bq - 1) + lq - 1
                table = value_table[..., m0 : min(m0 + bq + j1 - j0 - 1, value_table.shape[-2]), :]
            state = block_step(state, s, _rows(v, j0, j1, -2), xp, value_table=table)
        outputs.append(block_finish(state, dtype, xp))
    return outputs[0] if len(outputs) == 1 else xp.concat(outputs, axis=-2)


def _lead(*arrays: Any) -> tuple[int, ...]:
    """The broadcast leading shape (all but the last two axes) of the non-``None`` arrays."""
    shapes = [tuple(a.shape[:-2]) for a in arrays if a is not None]
    ndim = max(len(s) for s in shapes)
    out = []
    for axis in range(-ndim, 0):
        sizes = {s[axis] for s in shapes if len(s) >= -axis} - {1}
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)
