"""relattn's fused relative-position attention kernel in Triton, for PyTorch tensors.

One FlashAttention-style kernel computes softmax attention whose scores carry
Transformer-XL's content-to-position term ``qp_i·Kʳ[m]``, DeBERTa's
position-to-content term ``ks_j·Qʳ[m]`` and a per-distance bias ``b[m]``, with
``m = j - i + Lq - 1``, inside its tiles: the table product of a tile pair is
one matrix product with the ``BM + BN - 1`` table rows the pair's distances
span, shifted into key columns by a gather along each row (Transformer-XL's
appendix B on a tile), so no ``(Lq, Lk, d)`` or ``(Lq, W)`` array exists in
memory. The backward pass recomputes the probabilities per tile from the saved
log-sum-exp (FlashAttention-2): one kernel per query tile (``dq``, ``dqp``),
one per key tile (``dk``, ``dv``, ``dks``) and one per tile diagonal for the
tables' and the bias's gradients. Document ids (packed sequences) and a key mask
(padding, a cache's unfilled slots) hide pairs as the causal rule does; the masked
keys' rows are never loaded, and tile pairs without a visible pair are skipped.
The decomposed 2-D terms of MViTv2, ViTDet and SAM, ``grid_rows[i, j // kw] +
grid_cols[i, j % kw]`` for keys on a ``kh × kw`` grid, are read per cell from the two
small per-query arrays; their gradients are summed per key-grid row and column by the
query tile's backward program (one-hot products of ``dS``).

Positions as data (``query_positions``, ``key_positions``) take each cell's table row
from them: a tile pair loops over windows of table rows from the smallest row its
visible cells read, a product with each and a one-hot scatter of the cells in it; the
tables' gradients are then added per window with atomic adds. The launches are PyTorch
custom operators (``relattn::triton_relative_attention`` and its backward), so
``torch.compile`` keeps them in its graph.

The kernels are defined once, as plain functions, and jitted twice by
:func:`_kernels`: compiled for GPU tensors and interpreted (``TRITON_INTERPRET``,
which ``triton.jit`` reads when it decorates) for CPU tensors.
"""

from __future__ import annotations

import functools
import os
import types
from dataclasses import dataclass
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the module imports without Triton (a doctest run); the plan refuses
    triton = tl = None

from ._kernel_limits import MAX_GRID, MAX_HEAD_DIM

__all__ = ["relative_attention_kernel"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# -------------------------------------------------------------------------------------------
# Device functions (jitted by _kernels). Each kernel runs one (query tile, key tile, tile
# diagonal) program per (b, h) = divmod(program_id(1), H); per-(b, h) tensors are indexed
# through their strides, so broadcast (stride 0) inputs are never copied. Tiles are BM
# query rows by BN key rows; features are padded to DP (DVP for values) with masked loads.
#
# Only Triton's builtins appear: tl.zeros, tl.max and tl.sum are @triton.jit functions of
# triton.language, jitted once when triton is imported (for the compiler unless
# TRITON_INTERPRET was set then), which an interpreted kernel cannot call. tl.full and
# tl.reduce with tl.max's and tl.sum's own combine functions are the same operations (the
# interpreter maps those reductions to NumPy's).
# -------------------------------------------------------------------------------------------
def _at(ptr, bh, H, stride_b, stride_h):
    """``ptr`` advanced to the ``(b, h)`` slice of program row ``bh = b·H + h``."""
    return ptr + (bh // H) * stride_b + (bh % H) * stride_h


def _tile(ptr, start, n, stride_row, stride_col, cols, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Rows ``start … start + ROWS - 1`` of an ``(n, cols)`` matrix; zero outside it."""
    r = start + tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, COLS)[None, :]
    inside = (r >= 0) & (r < n) & (c < cols)
    return tl.load(ptr + r * stride_row + c * stride_col, mask=inside, other=0.0)


def _key_tile(
    ptr, start, n, stride_row, stride_col, cols, keep,
    HAS_MASK: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr,
):  # fmt: skip
    """:func:`_tile` of key rows, zero where ``keep`` (the ``(ROWS,)`` key mask) is False:
    a masked key's values (an unfilled cache slot, NaN perhaps) are never read, so no
    ``0 · NaN`` of a product reaches the output or a gradient."""
    r = start + tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, COLS)[None, :]
    inside = (r >= 0) & (r < n) & (c < cols)
    if HAS_MASK:
        inside = inside & keep[:, None]
    return tl.load(ptr + r * stride_row + c * stride_col, mask=inside, other=0.0)


def _integers(ptr, start, n, stride, N: tl.constexpr):
    """Entries ``start … start + N - 1`` of a length-``n`` integer vector (segment ids,
    positions), as int64."""
    at = start + tl.arange(0, N)
    return tl.load(ptr + at * stride, mask=at < n, other=0).to(tl.int64)


def _keep(ptr, start, n, stride, N: tl.constexpr):
    """Entries ``start …`` of the key mask (uint8, nonzero = visible); False outside."""
    at = start + tl.arange(0, N)
    return tl.load(ptr + at * stride, mask=at < n, other=0) != 0


def _visible(
    i0, j0, LQ, LK, q_seg, k_seg, keep, q_pos, k_pos,
    CAUSAL: tl.constexpr, HAS_SEG: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_POS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    """``(BM, BN)``: whether query ``i0 + r`` sees key ``j0 + c`` (inside both lengths, the
    causal rule ``δ <= 0`` on the indices or the given positions, the same segment, the key
    not masked)."""
    i = i0 + tl.arange(0, BM)[:, None]
    j = j0 + tl.arange(0, BN)[None, :]
    visible = (i < LQ) & (j < LK)
    if CAUSAL:
        if HAS_POS:
            visible = visible & (k_pos[None, :] <= q_pos[:, None])
        else:
            visible = visible & (j - i <= LK - LQ)
    if HAS_SEG:
        visible = visible & (q_seg[:, None] == k_seg[None, :])
    if HAS_MASK:
        visible = visible & keep[None, :]
    return visible


def _any(visible):
    """Whether any pair of the tile is visible (a scalar)."""
    seen = tl.reduce(visible.to(tl.int32), 1, tl.standard._elementwise_max)
    return tl.reduce(seen, 0, tl.standard._elementwise_max) > 0


def _store(ptr, value, start, n, cols, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Store ``value`` as rows ``start …`` of a contiguous ``(n, cols)`` matrix."""
    r = start + tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, COLS)[None, :]
    inside = (r >= 0) & (r < n) & (c < cols)
    tl.store(ptr + r * cols + c, value.to(ptr.dtype.element_ty), mask=inside)


def _table_rows(q_pos, k_pos, LK, LIMIT):
    """``(BM, BN)``: the table row of each cell at the given positions, ``m = δ + Lk - 1``
    with ``δ = k_pos[c] - q_pos[r]``, clipped to the rows ``[0, LIMIT)`` (SPEC §2.15)."""
    m = k_pos[None, :] - q_pos[:, None] + (LK - 1)
    return tl.minimum(tl.maximum(m, 0), LIMIT - 1)


def _span(m, visible, LIMIT):
    """The smallest and largest table row of the visible cells (``lo > hi`` for none)."""
    lo = tl.reduce(tl.where(visible, m, LIMIT), 1, tl.standard._elementwise_min)
    hi = tl.reduce(tl.where(visible, m, -1), 1, tl.standard._elementwise_max)
    return (
        tl.reduce(lo, 0, tl.standard._elementwise_min),
        tl.reduce(hi, 0, tl.standard._elementwise_max),
    )


def _in_window(m, visible, w0, WIN: tl.constexpr):
    """The window column ``m - w0`` of each visible cell whose row lies in the window
    ``[w0, w0 + WIN)``, -1 for the other cells (int32: a bool tensor broadcast to three
    dims would go through shared memory, which holds no 1-bit elements)."""
    at = m - w0
    return tl.where(visible & (at >= 0) & (at < WIN), at, -1).to(tl.int32)


def _scatter_rows(x, at, WIN: tl.constexpr):
    """``(BM, WIN)``: ``g[r, w] = Σ_c x[r, c]`` over the cells with window column ``at[r, c]
    = w`` (a one-hot sum: at given positions, several keys of a row may share a distance;
    cells at -1 add nowhere)."""
    w = tl.arange(0, WIN)[None, None, :]
    hit = (at[:, :, None] == w).to(x.dtype)  # no 1-bit tensor through shared memory
    return tl.reduce(x[:, :, None] * hit, 1, tl.standard._sum_combine)


def _scatter_cols(x, at, WIN: tl.constexpr):
    """``(WIN, BN)``: ``g[w, c] = Σ_r x[r, c]`` over the cells with window column ``at[r, c]
    = w`` (the key side's :func:`_scatter_rows`)."""
    w = tl.arange(0, WIN)[:, None, None]
    hit = (at[None, :, :] == w).to(x.dtype)
    return tl.reduce(x[None, :, :] * hit, 1, tl.standard._sum_combine)


def _first_column(i0, j0, LQ, BM: tl.constexpr):
    """``m0``: the table row of the smallest distance of the tile pair ``(i0, j0)``
    (query ``i0 + BM - 1``, key ``j0``); the pair reads rows ``m0 … m0 + BM + BN - 2``."""
    return j0 - i0 - (BM - 1) + LQ - 1


def _scores(
    q, k, qp, ks, kr_ptr, kr_sw, kr_sd, qr_ptr, qr_sw, qr_sd, b_ptr, b_sw,
    gr_ptr, gr_sl, gr_sc, gc_ptr, gc_sl, gc_sc, KW, i0, j0, LQ, LK, LIMIT, D, visible,
    q_pos, k_pos,
    HAS_KR: tl.constexpr, HAS_QR: tl.constexpr, HAS_B: tl.constexpr, HAS_GRID: tl.constexpr,
    HAS_POS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, WIN: tl.constexpr,
    DP: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """The ``(BM, BN)`` scores of a tile pair, ``-inf`` where the key is not ``visible``
    (selected, so a NaN or inf of a hidden cell's table row goes nowhere). The grid
    terms ``grid_rows[i, j // KW] + grid_cols[i, j % KW]`` are loaded per visible cell
    (the query's rows of the two ``(Lq, kh)``, ``(Lq, kw)`` arrays, gathered).

    At given positions (``HAS_POS``) the table rows of a tile pair are data: the pair
    takes the windows of ``WIN`` rows from the smallest to the largest row its visible
    cells read, one product per window, each cell gathering its column from the window
    that holds its row."""
    r = tl.arange(0, BM)[:, None]
    c = tl.arange(0, BN)[None, :]
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if HAS_POS:
        m = _table_rows(q_pos, k_pos, LK, LIMIT)
        if HAS_KR or HAS_QR:
            lo, hi = _span(m, visible, LIMIT)
            for w0 in range(lo, hi + 1, WIN):
                at_w = _in_window(m, visible, w0, WIN)
                inside = at_w >= 0
                at_w = tl.maximum(at_w, 0)
                if HAS_KR:
                    window = _tile(kr_ptr, w0, LIMIT, kr_sw, kr_sd, D, WIN, DP)
                    product = tl.dot(qp, tl.trans(window), input_precision=PRECISION)
                    s += tl.where(inside, tl.gather(product, at_w, 1), 0.0)
                if HAS_QR:
                    window = _tile(qr_ptr, w0, LIMIT, qr_sw, qr_sd, D, WIN, DP)
                    product = tl.dot(window, tl.trans(ks), input_precision=PRECISION)
                    s += tl.where(inside, tl.gather(product, at_w, 0), 0.0)
        if HAS_B:
            s += tl.load(b_ptr + m * b_sw).to(s.dtype)  # m is clipped into the table
    else:
        s = _shifted_terms(
            s, qp, ks, kr_ptr, kr_sw, kr_sd, qr_ptr, qr_sw, qr_sd, b_ptr, b_sw, i0, j0, LQ,
            LIMIT, D, HAS_KR, HAS_QR, HAS_B, BM, BN, WIN, DP, PRECISION,
        )  # fmt: skip
    if HAS_GRID:
        i = i0 + r
        j = j0 + c
        rows = tl.load(gr_ptr + i * gr_sl + (j // KW) * gr_sc, mask=visible, other=0.0)
        cols = tl.load(gc_ptr + i * gc_sl + (j % KW) * gc_sc, mask=visible, other=0.0)
        s += rows.to(s.dtype) + cols.to(s.dtype)
    return tl.where(visible, s, float("-inf"))


def _shifted_terms(
    s, qp, ks, kr_ptr, kr_sw, kr_sd, qr_ptr, qr_sw, qr_sd, b_ptr, b_sw, i0, j0, LQ, LIMIT, D,
    HAS_KR: tl.constexpr, HAS_QR: tl.constexpr, HAS_B: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, WIN: tl.constexpr, DP: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """``s`` plus the table terms of a tile pair at contiguous positions: one product with
    the pair's window of ``BM + BN - 1`` rows, shifted to key columns."""
    r = tl.arange(0, BM)[:, None]
    c = tl.arange(0, BN)[None, :]
    # Cell (r, c) has m = m0 + (c - r + BM - 1): row c - r + BM - 1 (0 … BM + BN - 2) of
    # the pair's table window, which starts at m0.
    at = c - r + (BM - 1)
    m0 = _first_column(i0, j0, LQ, BM)
    if HAS_KR:
        window = _tile(kr_ptr, m0, LIMIT, kr_sw, kr_sd, D, WIN, DP)
        # (BM, WIN) products of each query with every row; row r takes its BN columns.
        s += tl.gather(tl.dot(qp, tl.trans(window), input_precision=PRECISION), at, 1)
    if HAS_QR:
        window = _tile(qr_ptr, m0, LIMIT, qr_sw, qr_sd, D, WIN, DP)
        # (WIN, BN) products of every row with each key; column c takes its BM rows.
        s += tl.gather(tl.dot(window, tl.trans(ks), input_precision=PRECISION), at, 0)
    if HAS_B:
        m = m0 + at
        s += tl.load(b_ptr + m * b_sw, mask=(m >= 0) & (m < LIMIT), other=0.0).to(s.dtype)
    return s


def _score_grads(s, lse, do, v, delta, PRECISION: tl.constexpr):
    """``P`` from the saved log-sum-exp and ``dS = P ⊙ (dO vᵀ - D)`` (FlashAttention-2)."""
    p = tl.exp(s - lse[:, None])
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    return p, p * (dp - delta[:, None])


def _window_rows(ds, BM: tl.constexpr, BN: tl.constexpr, WIN: tl.constexpr):
    """``(BM, WIN)``: ``ds[r, c]`` moved to window row ``c - r + BM - 1`` of query row ``r``
    (the inverse of the forward's gather along axis 1); zero where no key lands."""
    c = tl.arange(0, WIN)[None, :] + tl.arange(0, BM)[:, None] - (BM - 1)
    inside = (c >= 0) & (c < BN)
    return tl.where(inside, tl.gather(ds, tl.where(inside, c, 0), 1), 0.0)


def _window_cols(ds, BM: tl.constexpr, BN: tl.constexpr, WIN: tl.constexpr):
    """``(WIN, BN)``: ``ds[r, c]`` moved to window row ``c - r + BM - 1`` of key column ``c``
    (the inverse of the forward's gather along axis 0); zero where no query lands."""
    r = tl.arange(0, BN)[None, :] - tl.arange(0, WIN)[:, None] + (BM - 1)
    inside = (r >= 0) & (r < BM)
    return tl.where(inside, tl.gather(ds, tl.where(inside, r, 0), 0), 0.0)


def _one_hot(j0, KW, BN: tl.constexpr, N: tl.constexpr, ROWS: tl.constexpr):
    """``(BN, N)``: 1 where key ``j0 + c`` lies in grid row (``ROWS``; else grid column)
    ``n``, ``j // KW`` (``j % KW``) = ``n``: ``dS @ one_hot`` sums a tile's ``dS`` per row
    (column) of the key grid."""
    j = j0 + tl.arange(0, BN)[:, None]
    n = tl.arange(0, N)[None, :]
    if ROWS:
        hit = j // KW == n
    else:
        hit = j % KW == n
    return tl.where(hit, 1.0, 0.0)


def _reached(window, visible, BM: tl.constexpr, BN: tl.constexpr, WIN: tl.constexpr):
    """``window`` (a ``(WIN, DP)`` table window) with the rows that no visible pair of the
    tile reads set to 0: with segments or a key mask, some table rows (distances) are met
    by hidden pairs only, and their values must not reach ``dS_rel @ window`` as ``0·NaN``."""
    seen = _window_rows(visible.to(tl.float32), BM, BN, WIN)
    seen = tl.reduce(seen, 0, tl.standard._elementwise_max)
    return tl.where(seen[:, None] > 0, window, 0.0)


def _seen_rows(ptr, start, n, stride_row, stride_col, cols, seen, ROWS: tl.constexpr,
               COLS: tl.constexpr):  # fmt: skip
    """:func:`_tile` with the rows that no visible cell reads (``seen`` False) zero: their
    values (NaN perhaps) must not reach ``g @ window`` as ``0·NaN``. A masked load (a select
    after the load gives sm_80's compiler a 1-bit operand of the product to convert)."""
    r = start + tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, COLS)[None, :]
    inside = (r >= 0) & (r < n) & (c < cols) & seen[:, None]
    return tl.load(ptr + r * stride_row + c * stride_col, mask=inside, other=0.0)


def _position_rows_grads(
    ds, qp, visible, q_pos, k_pos, kr_ptr, kr_sw, kr_sd, dkr_ptr, db_ptr, dqp, LK, LIMIT, D,
    HAS_KR: tl.constexpr, HAS_B: tl.constexpr, WIN: tl.constexpr, DP: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """A tile pair's query-side table gradients at given positions: ``dqp`` plus
    ``Σ_j dS_ij Kʳ[m(i, j)]`` (returned), and ``dKʳ[m] += Σ dS_ij qp_i``, ``db[m] += Σ dS_ij``
    over the pair's cells of row ``m``, added atomically to the ``(LIMIT, D)`` and
    ``(LIMIT,)`` buffers at ``dkr_ptr``, ``db_ptr``; window by window as the forward."""
    m = _table_rows(q_pos, k_pos, LK, LIMIT)
    lo, hi = _span(m, visible, LIMIT)
    features = tl.arange(0, DP)[None, :]
    for w0 in range(lo, hi + 1, WIN):
        at_w = _in_window(m, visible, w0, WIN)
        g = _scatter_rows(ds, at_w, WIN)  # (BM, WIN)
        rows = w0 + tl.arange(0, WIN)
        if HAS_KR:
            seen = _scatter_rows((at_w >= 0).to(tl.float32), at_w, WIN)
            seen = tl.reduce(seen, 0, tl.standard._elementwise_max) > 0
            window = _seen_rows(kr_ptr, w0, LIMIT, kr_sw, kr_sd, D, seen, WIN, DP)
            dqp += tl.dot(g.to(window.dtype), window, input_precision=PRECISION)
            share = tl.dot(tl.trans(g.to(qp.dtype)), qp, input_precision=PRECISION)
            cells = (rows[:, None] < LIMIT) & (features < D)
            tl.atomic_add(dkr_ptr + rows[:, None] * D + features, share, mask=cells)
        if HAS_B:
            share = tl.reduce(g, 0, tl.standard._sum_combine)
            tl.atomic_add(db_ptr + rows, share, mask=rows < LIMIT)
    return dqp


def _position_cols_grads(
    ds, ks, visible, q_pos, k_pos, qr_ptr, qr_sw, qr_sd, dqr_ptr, dks, LK, LIMIT, D,
    WIN: tl.constexpr, DP: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """The key side's :func:`_position_rows_grads`: ``dks`` plus ``Σ_i dS_ij Qʳ[m(i, j)]``
    (returned) and ``dQʳ[m] += Σ dS_ij ks_j``, added atomically at ``dqr_ptr``."""
    m = _table_rows(q_pos, k_pos, LK, LIMIT)
    lo, hi = _span(m, visible, LIMIT)
    features = tl.arange(0, DP)[None, :]
    for w0 in range(lo, hi + 1, WIN):
        at_w = _in_window(m, visible, w0, WIN)
        g = _scatter_cols(ds, at_w, WIN)  # (WIN, BN)
        seen = _scatter_cols((at_w >= 0).to(tl.float32), at_w, WIN)
        seen = tl.reduce(seen, 1, tl.standard._elementwise_max) > 0
        window = _seen_rows(qr_ptr, w0, LIMIT, qr_sw, qr_sd, D, seen, WIN, DP)
        dks += tl.dot(tl.trans(g.to(window.dtype)), window, input_precision=PRECISION)
        share = tl.dot(g.to(ks.dtype), ks, input_precision=PRECISION)
        rows = w0 + tl.arange(0, WIN)
        cells = (rows[:, None] < LIMIT) & (features < D)
        tl.atomic_add(dqr_ptr + rows[:, None] * D + features, share, mask=cells)
    return dks


# -------------------------------------------------------------------------------------------
# Kernels. All take the inputs, their strides and the sizes in one order (see _inputs):
# absent inputs are q itself (never read: their HAS_* flag is off). Outputs, dO, the
# log-sum-exp and D are contiguous buffers of this module's own.
# -------------------------------------------------------------------------------------------
def _forward(
    q_ptr, k_ptr, v_ptr, qp_ptr, ks_ptr, kr_ptr, qr_ptr, gr_ptr, gc_ptr, b_ptr, qseg_ptr, kseg_ptr,
    kmask_ptr, qpos_ptr, kpos_ptr,
    q_sb, q_sh, q_sl, q_sd, k_sb, k_sh, k_sl, k_sd, v_sb, v_sh, v_sl, v_sd,
    qp_sb, qp_sh, qp_sl, qp_sd, ks_sb, ks_sh, ks_sl, ks_sd,
    kr_sb, kr_sh, kr_sw, kr_sd, qr_sb, qr_sh, qr_sw, qr_sd,
    gr_sb, gr_sh, gr_sl, gr_sc, gc_sb, gc_sh, gc_sl, gc_sc, b_sb, b_sh, b_sw,
    qseg_sb, qseg_sh, qseg_sl, kseg_sb, kseg_sh, kseg_sl, kmask_sb, kmask_sh, kmask_sl,
    qpos_sb, qpos_sh, qpos_sl, kpos_sb, kpos_sh, kpos_sl,
    H, LQ, LK, LIMIT, D, DV, KW,
    o_ptr, lse_ptr,
    HAS_KR: tl.constexpr, HAS_QR: tl.constexpr, HAS_B: tl.constexpr, HAS_SEG: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_GRID: tl.constexpr, HAS_POS: tl.constexpr,
    CAUSAL: tl.constexpr, ACC: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, WIN: tl.constexpr, DP: tl.constexpr,
    DVP: tl.constexpr, KHP: tl.constexpr, KWP: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One query tile: stream the key tiles with an online softmax."""
    bh = tl.program_id(1).to(tl.int64)
    i0 = tl.program_id(0) * BM
    k_ptr = _at(k_ptr, bh, H, k_sb, k_sh)
    v_ptr = _at(v_ptr, bh, H, v_sb, v_sh)
    ks_ptr = _at(ks_ptr, bh, H, ks_sb, ks_sh)
    kr_ptr = _at(kr_ptr, bh, H, kr_sb, kr_sh)
    qr_ptr = _at(qr_ptr, bh, H, qr_sb, qr_sh)
    b_ptr = _at(b_ptr, bh, H, b_sb, b_sh)
    gr_ptr = _at(gr_ptr, bh, H, gr_sb, gr_sh)
    gc_ptr = _at(gc_ptr, bh, H, gc_sb, gc_sh)
    kseg_ptr = _at(kseg_ptr, bh, H, kseg_sb, kseg_sh)
    kmask_ptr = _at(kmask_ptr, bh, H, kmask_sb, kmask_sh)
    q = _tile(_at(q_ptr, bh, H, q_sb, q_sh), i0, LQ, q_sl, q_sd, D, BM, DP)
    qp = q
    if HAS_KR:
        qp = _tile(_at(qp_ptr, bh, H, qp_sb, qp_sh), i0, LQ, qp_sl, qp_sd, D, BM, DP)
    q_seg = i0  # a stand-in, never read without HAS_SEG (as k_seg, keep, the positions)
    if HAS_SEG:
        q_seg = _integers(_at(qseg_ptr, bh, H, qseg_sb, qseg_sh), i0, LQ, qseg_sl, BM)
    q_pos = i0
    if HAS_POS:
        q_pos = _integers(_at(qpos_ptr, bh, H, qpos_sb, qpos_sh), i0, LQ, qpos_sl, BM)
    kpos_ptr = _at(kpos_ptr, bh, H, kpos_sb, kpos_sh)
    m_i = tl.full((BM,), float("-inf"), ACC)
    l_i = tl.full((BM,), 0.0, ACC)
    acc = tl.full((BM, DVP), 0.0, ACC)
    stop = LK
    if CAUSAL and not HAS_POS:
        stop = tl.minimum(LK, i0 + BM + LK - LQ)  # later key tiles are wholly masked
    for j0 in range(0, stop, BN):
        k_seg = j0
        if HAS_SEG:
            k_seg = _integers(kseg_ptr, j0, LK, kseg_sl, BN)
        k_pos = j0
        if HAS_POS:
            k_pos = _integers(kpos_ptr, j0, LK, kpos_sl, BN)
        keep = j0
        if HAS_MASK:
            keep = _keep(kmask_ptr, j0, LK, kmask_sl, BN)
        visible = _visible(
            i0, j0, LQ, LK, q_seg, k_seg, keep, q_pos, k_pos, CAUSAL, HAS_SEG, HAS_MASK,
            HAS_POS, BM, BN,
        )  # fmt: skip
        live = True
        if HAS_SEG or HAS_MASK or HAS_POS:
            live = _any(visible)  # skip a tile without a visible pair (other documents)
        if live:
            k = _key_tile(k_ptr, j0, LK, k_sl, k_sd, D, keep, HAS_MASK, BN, DP)
            ks = k
            if HAS_QR:
                ks = _key_tile(ks_ptr, j0, LK, ks_sl, ks_sd, D, keep, HAS_MASK, BN, DP)
            s = _scores(
                q, k, qp, ks, kr_ptr, kr_sw, kr_sd, qr_ptr, qr_sw, qr_sd, b_ptr, b_sw,
                gr_ptr, gr_sl, gr_sc, gc_ptr, gc_sl, gc_sc, KW, i0, j0, LQ, LK, LIMIT, D, visible,
                q_pos, k_pos, HAS_KR, HAS_QR, HAS_B, HAS_GRID, HAS_POS, BM, BN, WIN, DP,
                PRECISION,
            )  # fmt: skip
            m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
            # A row with no visible key so far keeps m = -inf: subtract 0 there, so that
            # exp(-inf - 0) = 0 instead of exp(-inf + inf) = NaN.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            v = _key_tile(v_ptr, j0, LK, v_sl, v_sd, DV, keep, HAS_MASK, BN, DVP)
            l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
    # A row without a visible key has l = 0: output 0 and log-sum-exp 0 (its scores are all
    # -inf, so the backward's P = exp(s - 0) = 0).
    l_i = tl.where(l_i > 0, l_i, 1.0)
    m_i = tl.where(m_i == float("-inf"), 0.0, m_i)
    _store(o_ptr + bh * LQ * DV, acc / l_i[:, None], i0, LQ, DV, BM, DVP)
    rows = i0 + tl.arange(0, BM)
    lse = m_i + tl.log(l_i)
    tl.store(lse_ptr + bh * LQ + rows, lse, mask=rows < LQ)


def _backward_rows(
    q_ptr, k_ptr, v_ptr, qp_ptr, ks_ptr, kr_ptr, qr_ptr, gr_ptr, gc_ptr, b_ptr, qseg_ptr, kseg_ptr,
    kmask_ptr, qpos_ptr, kpos_ptr,
    q_sb, q_sh, q_sl, q_sd, k_sb, k_sh, k_sl, k_sd, v_sb, v_sh, v_sl, v_sd,
    qp_sb, qp_sh, qp_sl, qp_sd, ks_sb, ks_sh, ks_sl, ks_sd,
    kr_sb, kr_sh, kr_sw, kr_sd, qr_sb, qr_sh, qr_sw, qr_sd,
    gr_sb, gr_sh, gr_sl, gr_sc, gc_sb, gc_sh, gc_sl, gc_sc, b_sb, b_sh, b_sw,
    qseg_sb, qseg_sh, qseg_sl, kseg_sb, kseg_sh, kseg_sl, kmask_sb, kmask_sh, kmask_sl,
    qpos_sb, qpos_sh, qpos_sl, kpos_sb, kpos_sh, kpos_sl,
    H, LQ, LK, LIMIT, D, DV, KW,
    do_ptr, lse_ptr, delta_ptr, dq_ptr, dqp_ptr, dgr_ptr, dgc_ptr, dkr_ptr, db_ptr,
    HAS_KR: tl.constexpr, HAS_QR: tl.constexpr, HAS_B: tl.constexpr, HAS_SEG: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_GRID: tl.constexpr, HAS_POS: tl.constexpr,
    CAUSAL: tl.constexpr, ACC: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, WIN: tl.constexpr, DP: tl.constexpr,
    DVP: tl.constexpr, KHP: tl.constexpr, KWP: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One query tile: ``dq = dS k``, ``dqp_i = Σ_j dS_ij Kʳ[m(i, j)]``, and the grid
    terms' ``dgrid_rows[i, a] = Σ_{j // KW = a} dS_ij``, ``dgrid_cols[i, b] = Σ_{j % KW = b}
    dS_ij`` (one-hot products per key tile; the program owns the rows ``i``). At given
    positions also the tile's shares of ``dKʳ`` and ``db``, added atomically."""
    bh = tl.program_id(1).to(tl.int64)
    i0 = tl.program_id(0) * BM
    k_ptr = _at(k_ptr, bh, H, k_sb, k_sh)
    v_ptr = _at(v_ptr, bh, H, v_sb, v_sh)
    ks_ptr = _at(ks_ptr, bh, H, ks_sb, ks_sh)
    kr_ptr = _at(kr_ptr, bh, H, kr_sb, kr_sh)
    qr_ptr = _at(qr_ptr, bh, H, qr_sb, qr_sh)
    b_ptr = _at(b_ptr, bh, H, b_sb, b_sh)
    gr_ptr = _at(gr_ptr, bh, H, gr_sb, gr_sh)
    gc_ptr = _at(gc_ptr, bh, H, gc_sb, gc_sh)
    kseg_ptr = _at(kseg_ptr, bh, H, kseg_sb, kseg_sh)
    kmask_ptr = _at(kmask_ptr, bh, H, kmask_sb, kmask_sh)
    q = _tile(_at(q_ptr, bh, H, q_sb, q_sh), i0, LQ, q_sl, q_sd, D, BM, DP)
    qp = q
    if HAS_KR:
        qp = _tile(_at(qp_ptr, bh, H, qp_sb, qp_sh), i0, LQ, qp_sl, qp_sd, D, BM, DP)
    q_seg = i0
    if HAS_SEG:
        q_seg = _integers(_at(qseg_ptr, bh, H, qseg_sb, qseg_sh), i0, LQ, qseg_sl, BM)
    q_pos = i0
    if HAS_POS:
        q_pos = _integers(_at(qpos_ptr, bh, H, qpos_sb, qpos_sh), i0, LQ, qpos_sl, BM)
    kpos_ptr = _at(kpos_ptr, bh, H, kpos_sb, kpos_sh)
    do = _tile(do_ptr + bh * LQ * DV, i0, LQ, DV, 1, DV, BM, DVP)
    rows = i0 + tl.arange(0, BM)
    lse = tl.load(lse_ptr + bh * LQ + rows, mask=rows < LQ, other=0.0)
    delta = tl.load(delta_ptr + bh * LQ + rows, mask=rows < LQ, other=0.0)
    dq = tl.full((BM, DP), 0.0, ACC)
    dqp = tl.full((BM, DP), 0.0, ACC)
    dgr = tl.full((BM, KHP), 0.0, ACC)
    dgc = tl.full((BM, KWP), 0.0, ACC)
    stop = LK
    if CAUSAL and not HAS_POS:
        stop = tl.minimum(LK, i0 + BM + LK - LQ)
    for j0 in range(0, stop, BN):
        k_seg = j0
        if HAS_SEG:
            k_seg = _integers(kseg_ptr, j0, LK, kseg_sl, BN)
        k_pos = j0
        if HAS_POS:
            k_pos = _integers(kpos_ptr, j0, LK, kpos_sl, BN)
        keep = j0
        if HAS_MASK:
            keep = _keep(kmask_ptr, j0, LK, kmask_sl, BN)
        visible = _visible(
            i0, j0, LQ, LK, q_seg, k_seg, keep, q_pos, k_pos, CAUSAL, HAS_SEG, HAS_MASK,
            HAS_POS, BM, BN,
        )  # fmt: skip
        live = True
        if HAS_SEG or HAS_MASK or HAS_POS:
            live = _any(visible)
        if live:
            k = _key_tile(k_ptr, j0, LK, k_sl, k_sd, D, keep, HAS_MASK, BN, DP)
            ks = k
            if HAS_QR:
                ks = _key_tile(ks_ptr, j0, LK, ks_sl, ks_sd, D, keep, HAS_MASK, BN, DP)
            s = _scores(
                q, k, qp, ks, kr_ptr, kr_sw, kr_sd, qr_ptr, qr_sw, qr_sd, b_ptr, b_sw,
                gr_ptr, gr_sl, gr_sc, gc_ptr, gc_sl, gc_sc, KW, i0, j0, LQ, LK, LIMIT, D, visible,
                q_pos, k_pos, HAS_KR, HAS_QR, HAS_B, HAS_GRID, HAS_POS, BM, BN, WIN, DP,
                PRECISION,
            )  # fmt: skip
            v = _key_tile(v_ptr, j0, LK, v_sl, v_sd, DV, keep, HAS_MASK, BN, DVP)
            _, ds = _score_grads(s, lse, do, v, delta, PRECISION)
            dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
            if HAS_POS and (HAS_KR or HAS_B):
                dqp = _position_rows_grads(
                    ds, qp, visible, q_pos, k_pos, kr_ptr, kr_sw, kr_sd, dkr_ptr + bh * LIMIT * D,
                    db_ptr + bh * LIMIT, dqp, LK, LIMIT, D, HAS_KR, HAS_B, WIN, DP, PRECISION,
                )  # fmt: skip
            elif HAS_KR:
                m0 = _first_column(i0, j0, LQ, BM)
                window = _tile(kr_ptr, m0, LIMIT, kr_sw, kr_sd, D, WIN, DP)
                if HAS_SEG or HAS_MASK:
                    window = _reached(window, visible, BM, BN, WIN)
                ds_rows = _window_rows(ds, BM, BN, WIN).to(window.dtype)
                dqp += tl.dot(ds_rows, window, input_precision=PRECISION)
            if HAS_GRID:
                ds_grid = ds.to(q.dtype)
                to_rows = _one_hot(j0, KW, BN, KHP, True).to(q.dtype)
                dgr += tl.dot(ds_grid, to_rows, input_precision=PRECISION)
                to_cols = _one_hot(j0, KW, BN, KWP, False).to(q.dtype)
                dgc += tl.dot(ds_grid, to_cols, input_precision=PRECISION)
    _store(dq_ptr + bh * LQ * D, dq, i0, LQ, D, BM, DP)
    if HAS_KR:
        _store(dqp_ptr + bh * LQ * D, dqp, i0, LQ, D, BM, DP)
    if HAS_GRID:
        KH = LK // KW
        _store(dgr_ptr + bh * LQ * KH, dgr, i0, LQ, KH, BM, KHP)
        _store(dgc_ptr + bh * LQ * KW, dgc, i0, LQ, KW, BM, KWP)


def _backward_keys(
    q_ptr, k_ptr, v_ptr, qp_ptr, ks_ptr, kr_ptr, qr_ptr, gr_ptr, gc_ptr, b_ptr, qseg_ptr, kseg_ptr,
    kmask_ptr, qpos_ptr, kpos_ptr,
    q_sb, q_sh, q_sl, q_sd, k_sb, k_sh, k_sl, k_sd, v_sb, v_sh, v_sl, v_sd,
    qp_sb, qp_sh, qp_sl, qp_sd, ks_sb, ks_sh, ks_sl, ks_sd,
    kr_sb, kr_sh, kr_sw, kr_sd, qr_sb, qr_sh, qr_sw, qr_sd,
    gr_sb, gr_sh, gr_sl, gr_sc, gc_sb, gc_sh, gc_sl, gc_sc, b_sb, b_sh, b_sw,
    qseg_sb, qseg_sh, qseg_sl, kseg_sb, kseg_sh, kseg_sl, kmask_sb, kmask_sh, kmask_sl,
    qpos_sb, qpos_sh, qpos_sl, kpos_sb, kpos_sh, kpos_sl,
    H, LQ, LK, LIMIT, D, DV, KW,
    do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dks_ptr, dqr_ptr,
    HAS_KR: tl.constexpr, HAS_QR: tl.constexpr, HAS_B: tl.constexpr, HAS_SEG: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_GRID: tl.constexpr, HAS_POS: tl.constexpr,
    CAUSAL: tl.constexpr, ACC: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, WIN: tl.constexpr, DP: tl.constexpr,
    DVP: tl.constexpr, KHP: tl.constexpr, KWP: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One key tile: ``dk = dSᵀ q``, ``dv = Pᵀ dO`` and ``dks_j = Σ_i dS_ij Qʳ[m(i, j)]``; at
    given positions also the tile's share of ``dQʳ``, added atomically."""
    bh = tl.program_id(1).to(tl.int64)
    j0 = tl.program_id(0) * BN
    q_ptr = _at(q_ptr, bh, H, q_sb, q_sh)
    qp_ptr = _at(qp_ptr, bh, H, qp_sb, qp_sh)
    kr_ptr = _at(kr_ptr, bh, H, kr_sb, kr_sh)
    qr_ptr = _at(qr_ptr, bh, H, qr_sb, qr_sh)
    b_ptr = _at(b_ptr, bh, H, b_sb, b_sh)
    gr_ptr = _at(gr_ptr, bh, H, gr_sb, gr_sh)
    gc_ptr = _at(gc_ptr, bh, H, gc_sb, gc_sh)
    qseg_ptr = _at(qseg_ptr, bh, H, qseg_sb, qseg_sh)
    k_seg = j0
    if HAS_SEG:
        k_seg = _integers(_at(kseg_ptr, bh, H, kseg_sb, kseg_sh), j0, LK, kseg_sl, BN)
    keep = j0
    if HAS_MASK:
        keep = _keep(_at(kmask_ptr, bh, H, kmask_sb, kmask_sh), j0, LK, kmask_sl, BN)
    k_pos = j0
    if HAS_POS:
        k_pos = _integers(_at(kpos_ptr, bh, H, kpos_sb, kpos_sh), j0, LK, kpos_sl, BN)
    qpos_ptr = _at(qpos_ptr, bh, H, qpos_sb, qpos_sh)
    k = _key_tile(_at(k_ptr, bh, H, k_sb, k_sh), j0, LK, k_sl, k_sd, D, keep, HAS_MASK, BN, DP)
    ks = k
    if HAS_QR:
        ks_ptr = _at(ks_ptr, bh, H, ks_sb, ks_sh)
        ks = _key_tile(ks_ptr, j0, LK, ks_sl, ks_sd, D, keep, HAS_MASK, BN, DP)
    v_ptr = _at(v_ptr, bh, H, v_sb, v_sh)
    v = _key_tile(v_ptr, j0, LK, v_sl, v_sd, DV, keep, HAS_MASK, BN, DVP)
    dk = tl.full((BN, DP), 0.0, ACC)
    dv = tl.full((BN, DVP), 0.0, ACC)
    dks = tl.full((BN, DP), 0.0, ACC)
    start = 0
    if CAUSAL and not HAS_POS:
        # Query i sees key j0 from i = j0 - (Lk - Lq) on: start at that row's tile.
        start = tl.maximum(0, j0 - (LK - LQ)) // BM * BM
    for i0 in range(start, LQ, BM):
        q_seg = i0
        if HAS_SEG:
            q_seg = _integers(qseg_ptr, i0, LQ, qseg_sl, BM)
        q_pos = i0
        if HAS_POS:
            q_pos = _integers(qpos_ptr, i0, LQ, qpos_sl, BM)
        visible = _visible(
            i0, j0, LQ, LK, q_seg, k_seg, keep, q_pos, k_pos, CAUSAL, HAS_SEG, HAS_MASK,
            HAS_POS, BM, BN,
        )  # fmt: skip
        live = True
        if HAS_SEG or HAS_MASK or HAS_POS:
            live = _any(visible)
        if live:
            q = _tile(q_ptr, i0, LQ, q_sl, q_sd, D, BM, DP)
            qp = q
            if HAS_KR:
                qp = _tile(qp_ptr, i0, LQ, qp_sl, qp_sd, D, BM, DP)
            s = _scores(
                q, k, qp, ks, kr_ptr, kr_sw, kr_sd, qr_ptr, qr_sw, qr_sd, b_ptr, b_sw,
                gr_ptr, gr_sl, gr_sc, gc_ptr, gc_sl, gc_sc, KW, i0, j0, LQ, LK, LIMIT, D, visible,
                q_pos, k_pos, HAS_KR, HAS_QR, HAS_B, HAS_GRID, HAS_POS, BM, BN, WIN, DP,
                PRECISION,
            )  # fmt: skip
            do = _tile(do_ptr + bh * LQ * DV, i0, LQ, DV, 1, DV, BM, DVP)
            rows = i0 + tl.arange(0, BM)
            lse = tl.load(lse_ptr + bh * LQ + rows, mask=rows < LQ, other=0.0)
            delta = tl.load(delta_ptr + bh * LQ + rows, mask=rows < LQ, other=0.0)
            p, ds = _score_grads(s, lse, do, v, delta, PRECISION)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
            if HAS_POS and HAS_QR:
                dks = _position_cols_grads(
                    ds, ks, visible, q_pos, k_pos, qr_ptr, qr_sw, qr_sd, dqr_ptr + bh * LIMIT * D,
                    dks, LK, LIMIT, D, WIN, DP, PRECISION,
                )  # fmt: skip
            elif HAS_QR:
                m0 = _first_column(i0, j0, LQ, BM)
                window = _tile(qr_ptr, m0, LIMIT, qr_sw, qr_sd, D, WIN, DP)
                if HAS_SEG or HAS_MASK:
                    window = _reached(window, visible, BM, BN, WIN)
                ds_cols = _window_cols(ds, BM, BN, WIN).to(window.dtype)
                dks += tl.dot(tl.trans(ds_cols), window, input_precision=PRECISION)
    _store(dk_ptr + bh * LK * D, dk, j0, LK, D, BN, DP)
    _store(dv_ptr + bh * LK * DV, dv, j0, LK, DV, BN, DVP)
    if HAS_QR:
        _store(dks_ptr + bh * LK * D, dks, j0, LK, D, BN, DP)


def _backward_tables(
    q_ptr, k_ptr, v_ptr, qp_ptr, ks_ptr, kr_ptr, qr_ptr, gr_ptr, gc_ptr, b_ptr, qseg_ptr, kseg_ptr,
    kmask_ptr, qpos_ptr, kpos_ptr,
    q_sb, q_sh, q_sl, q_sd, k_sb, k_sh, k_sl, k_sd, v_sb, v_sh, v_sl, v_sd,
    qp_sb, qp_sh, qp_sl, qp_sd, ks_sb, ks_sh, ks_sl, ks_sd,
    kr_sb, kr_sh, kr_sw, kr_sd, qr_sb, qr_sh, qr_sw, qr_sd,
    gr_sb, gr_sh, gr_sl, gr_sc, gc_sb, gc_sh, gc_sl, gc_sc, b_sb, b_sh, b_sw,
    qseg_sb, qseg_sh, qseg_sl, kseg_sb, kseg_sh, kseg_sl, kmask_sb, kmask_sh, kmask_sl,
    qpos_sb, qpos_sh, qpos_sl, kpos_sb, kpos_sh, kpos_sl,
    H, LQ, LK, LIMIT, D, DV, KW,
    do_ptr, lse_ptr, delta_ptr, dkr_ptr, dqr_ptr, db_ptr, NI, NJ, PARITY,
    HAS_KR: tl.constexpr, HAS_QR: tl.constexpr, HAS_B: tl.constexpr, HAS_SEG: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_GRID: tl.constexpr, HAS_POS: tl.constexpr,
    CAUSAL: tl.constexpr, ACC: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, WIN: tl.constexpr, DP: tl.constexpr,
    DVP: tl.constexpr, KHP: tl.constexpr, KWP: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One tile diagonal (square tiles, ``BM == BN``): ``dKʳ[m] = Σ dS_ij qp_i``,
    ``dQʳ[m] = Σ dS_ij ks_j`` and ``db[m] = Σ dS_ij`` over the pairs with ``m(i, j) = m``.

    The pairs ``(I, I + t)`` of key tile minus query tile ``t`` all read the window of
    rows ``m0 … m0 + 2·BM - 1``, ``m0 = t·BM - BM + Lq``: the program sums its pairs'
    window gradients in registers, then adds them to the ``(LIMIT, D)`` buffers. Windows of
    diagonals two apart do not overlap, so the diagonals of one ``PARITY`` (one launch)
    write disjoint rows: a deterministic read-add-write, no atomics.
    """
    bh = tl.program_id(1).to(tl.int64)
    t = 2 * tl.program_id(0) + PARITY - (NI - 1)
    q_ptr = _at(q_ptr, bh, H, q_sb, q_sh)
    k_ptr = _at(k_ptr, bh, H, k_sb, k_sh)
    v_ptr = _at(v_ptr, bh, H, v_sb, v_sh)
    qp_ptr = _at(qp_ptr, bh, H, qp_sb, qp_sh)
    ks_ptr = _at(ks_ptr, bh, H, ks_sb, ks_sh)
    kr_ptr = _at(kr_ptr, bh, H, kr_sb, kr_sh)
    qr_ptr = _at(qr_ptr, bh, H, qr_sb, qr_sh)
    b_ptr = _at(b_ptr, bh, H, b_sb, b_sh)
    gr_ptr = _at(gr_ptr, bh, H, gr_sb, gr_sh)
    gc_ptr = _at(gc_ptr, bh, H, gc_sb, gc_sh)
    qseg_ptr = _at(qseg_ptr, bh, H, qseg_sb, qseg_sh)
    kseg_ptr = _at(kseg_ptr, bh, H, kseg_sb, kseg_sh)
    kmask_ptr = _at(kmask_ptr, bh, H, kmask_sb, kmask_sh)
    dkr = tl.full((WIN, DP), 0.0, ACC)
    dqr = tl.full((WIN, DP), 0.0, ACC)
    db = tl.full((WIN,), 0.0, ACC)
    first = tl.maximum(0, -t)
    last = tl.minimum(NI, NJ - t)
    if CAUSAL:
        # j0 - i0 = t·BM for every pair: the diagonal is visible whole or not at all.
        last = tl.where(t * BM <= BM - 1 + LK - LQ, last, first)
    for tile in range(first, last):
        i0 = tile * BM
        j0 = i0 + t * BM
        q_seg = i0
        k_seg = j0
        if HAS_SEG:
            q_seg = _integers(qseg_ptr, i0, LQ, qseg_sl, BM)
            k_seg = _integers(kseg_ptr, j0, LK, kseg_sl, BN)
        keep = j0
        if HAS_MASK:
            keep = _keep(kmask_ptr, j0, LK, kmask_sl, BN)
        # Never at given positions (the tile kernels sum these gradients then): the indices'
        # causal rule, no positions read.
        visible = _visible(
            i0, j0, LQ, LK, q_seg, k_seg, keep, i0, j0, CAUSAL, HAS_SEG, HAS_MASK, False, BM, BN
        )  # fmt: skip
        live = True
        if HAS_SEG or HAS_MASK:
            live = _any(visible)
        if live:
            q = _tile(q_ptr, i0, LQ, q_sl, q_sd, D, BM, DP)
            k = _key_tile(k_ptr, j0, LK, k_sl, k_sd, D, keep, HAS_MASK, BN, DP)
            qp = q
            if HAS_KR:
                qp = _tile(qp_ptr, i0, LQ, qp_sl, qp_sd, D, BM, DP)
            ks = k
            if HAS_QR:
                ks = _key_tile(ks_ptr, j0, LK, ks_sl, ks_sd, D, keep, HAS_MASK, BN, DP)
            s = _scores(
                q, k, qp, ks, kr_ptr, kr_sw, kr_sd, qr_ptr, qr_sw, qr_sd, b_ptr, b_sw,
                gr_ptr, gr_sl, gr_sc, gc_ptr, gc_sl, gc_sc, KW, i0, j0, LQ, LK, LIMIT, D, visible,
                i0, j0, HAS_KR, HAS_QR, HAS_B, HAS_GRID, False, BM, BN, WIN, DP, PRECISION,
            )  # fmt: skip
            v = _key_tile(v_ptr, j0, LK, v_sl, v_sd, DV, keep, HAS_MASK, BN, DVP)
            do = _tile(do_ptr + bh * LQ * DV, i0, LQ, DV, 1, DV, BM, DVP)
            rows = i0 + tl.arange(0, BM)
            lse = tl.load(lse_ptr + bh * LQ + rows, mask=rows < LQ, other=0.0)
            delta = tl.load(delta_ptr + bh * LQ + rows, mask=rows < LQ, other=0.0)
            _, ds = _score_grads(s, lse, do, v, delta, PRECISION)
            if HAS_KR:
                ds_rows = _window_rows(ds, BM, BN, WIN).to(qp.dtype)
                dkr += tl.dot(tl.trans(ds_rows), qp, input_precision=PRECISION)
            if HAS_QR:
                ds_cols = _window_cols(ds, BM, BN, WIN).to(ks.dtype)
                dqr += tl.dot(ds_cols, ks, input_precision=PRECISION)
            if HAS_B:
                db += tl.reduce(_window_rows(ds, BM, BN, WIN), 0, tl.standard._sum_combine)
    m = _first_column(0, t * BM, LQ, BM) + tl.arange(0, WIN)
    inside = (m >= 0) & (m < LIMIT)
    cells = m[:, None] * D + tl.arange(0, DP)[None, :]
    in_cells = inside[:, None] & (tl.arange(0, DP)[None, :] < D)
    if HAS_KR:
        at = dkr_ptr + bh * LIMIT * D + cells
        tl.store(at, tl.load(at, mask=in_cells, other=0.0) + dkr, mask=in_cells)
    if HAS_QR:
        at = dqr_ptr + bh * LIMIT * D + cells
        tl.store(at, tl.load(at, mask=in_cells, other=0.0) + dqr, mask=in_cells)
    if HAS_B:
        at = db_ptr + bh * LIMIT + m
        tl.store(at, tl.load(at, mask=inside, other=0.0) + db, mask=inside)


_DEVICE_FUNCTIONS = (
    _at, _tile, _key_tile, _integers, _keep, _visible, _any, _store, _table_rows, _span,
    _in_window, _scatter_rows, _scatter_cols, _first_column, _scores, _shifted_terms,
    _score_grads, _window_rows, _window_cols, _one_hot, _reached, _position_rows_grads,
    _position_cols_grads, _seen_rows,
)  # fmt: skip
_KERNELS = (_forward, _backward_rows, _backward_keys, _backward_tables)


@functools.cache
def _kernels(interpret: bool) -> types.SimpleNamespace:
    """The kernels jitted for Triton's interpreter or compiler.

    ``triton.jit`` reads ``TRITON_INTERPRET`` when it decorates, so each build sets it
    for its decorations and restores it. Each build gives the functions a namespace of
    their own, where the kernels find their own build of the device functions.
    """
    namespace: dict[str, Any] = {"__name__": __name__, "tl": tl, "triton": triton}
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        for fn in (*_DEVICE_FUNCTIONS, *_KERNELS):
            own = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__)
            own.__qualname__ = fn.__qualname__
            own.__annotations__ = fn.__annotations__  # which parameters are tl.constexpr
            namespace[fn.__name__] = triton.jit(own)
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous
    return types.SimpleNamespace(**{fn.__name__: namespace[fn.__name__] for fn in _KERNELS})


def _language_interpreted() -> bool:
    """Whether triton.language was imported with TRITON_INTERPRET=1: its own jit functions
    (the reductions' combine functions) are then interpreted, and no kernel compiles."""
    return not isinstance(tl.standard._sum_combine, triton.JITFunction)


# -------------------------------------------------------------------------------------------
# Launches and autograd
# -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Config:
    """The static choices of a call (the autograd function's last input)."""

    causal: bool
    block_q: int
    block_k: int
    interpret: bool


def _limit(lq: int, lk: int, causal: bool) -> int:
    """The table rows the kernels read: in a causal problem rows ``m >= Lk`` (``δ > 0``)
    only meet masked cells."""
    return lk if causal else lq + lk - 1


def _accumulator(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _or(x: torch.Tensor | None, stand_in: torch.Tensor) -> torch.Tensor:
    """``x``, or for an absent one a stand-in pointer that the kernels never read nor write
    (the flag of its term is off)."""
    return stand_in if x is None else x


def _inputs(
    q, k, v, qp, ks, kr, qr, bias, grows, gcols, qseg, kseg, kmask, qpos, kpos, config: _Config
) -> tuple[list[Any], dict[str, Any]]:
    """The kernels' shared leading arguments, and the keyword arguments of every launch
    (``meta``): the constexpr flags and tile sizes, and Triton's launch options."""
    if kmask is not None:
        kmask = kmask.view(torch.uint8)  # the same bytes and strides, read as 0 / 1
    given = (q, k, v, qp, ks, kr, qr, grows, gcols, bias, qseg, kseg, kmask, qpos, kpos)
    tensors = [_or(x, q) for x in given]
    # Four strides each, three for the bias (B, H, W), the segments, the key mask and the
    # positions (B, H, L).
    strides = [s for x in tensors[:9] for s in x.stride()]
    strides += [s for x in tensors[9:] for s in x.stride()[:3]]
    _, heads, lq, d = q.shape
    lk, dv = v.shape[2:]
    kh, kw = (1, 1) if grows is None or gcols is None else (grows.shape[3], gcols.shape[3])
    sizes = [heads, lq, lk, _limit(lq, lk, config.causal), d, dv, kw]
    bm, bn = config.block_q, config.block_k
    meta = {
        "HAS_KR": kr is not None, "HAS_QR": qr is not None, "HAS_B": bias is not None,
        "HAS_SEG": qseg is not None, "HAS_MASK": kmask is not None,
        "HAS_GRID": grows is not None, "HAS_POS": qpos is not None,
        "CAUSAL": config.causal, "ACC": tl.float64 if q.dtype == torch.float64 else tl.float32,
        "BM": bm, "BN": bn, "WIN": triton.next_power_of_2(bm + bn - 1),
        "DP": max(16, triton.next_power_of_2(d)), "DVP": max(16, triton.next_power_of_2(dv)),
        "KHP": max(16, triton.next_power_of_2(kh)), "KWP": max(16, triton.next_power_of_2(kw)),
        # float32 products as three TF32 ones on tensor cores (float32 accuracy; "ieee"
        # runs without tensor cores, in more shared memory than a GPU has at these tiles).
        "PRECISION": "tf32x3" if q.dtype == torch.float32 else "ieee",
        # No software pipelining (its buffers overflow shared memory with float32 tiles);
        # FMA contraction stated (Triton 3.9 warns where it is left to its default).
        "num_stages": 1, "enable_fp_fusion": True,
    }  # fmt: skip
    return [*tensors, *strides, *sizes], meta


#: The custom operators' inputs (each kernel's operands, then the static choices): tables
#: expanded to ``(B, H, W, …)``, grid terms to ``(B, H, Lq, kh)`` and ``(B, H, Lq, kw)``;
#: the segments, the key mask and the positions ``(B, H, L)`` have no gradient.
_OPERANDS = (
    "Tensor q, Tensor k, Tensor v, Tensor? qp, Tensor? kr, Tensor? ks, Tensor? qr, "
    "Tensor? bias, Tensor? grows, Tensor? gcols, Tensor? qseg, Tensor? kseg, Tensor? kmask, "
    "Tensor? qpos, Tensor? kpos, bool causal, int block_q, int block_k, bool interpret"
)
_DIFFERENTIABLE = 10  # q … gcols


def _forward_launch(
    q, k, v, qp, kr, ks, qr, bias, grows, gcols, qseg, kseg, kmask, qpos, kpos,
    causal: bool, block_q: int, block_k: int, interpret: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The forward kernel: the output and each row's log-sum-exp."""
    config = _Config(causal, block_q, block_k, interpret)
    batch, heads, lq, _ = q.shape
    tensors = (q, k, v, qp, ks, kr, qr, bias, grows, gcols, qseg, kseg, kmask, qpos, kpos)
    args, meta = _inputs(*tensors, config)
    out = torch.empty((batch, heads, lq, v.shape[3]), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, lq), dtype=_accumulator(q.dtype), device=q.device)
    grid = (triton.cdiv(lq, config.block_q), batch * heads)
    _kernels(config.interpret)._forward[grid](*args, out, lse, **meta)
    return out, lse


def _forward_shapes(
    q, k, v, qp, kr, ks, qr, bias, grows, gcols, qseg, kseg, kmask, qpos, kpos,
    causal: bool, block_q: int, block_k: int, interpret: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """What :func:`_forward_launch` returns, as empty tensors (for tracing)."""
    batch, heads, lq, _ = q.shape
    out = q.new_empty((batch, heads, lq, v.shape[3]))
    return out, q.new_empty((batch, heads, lq), dtype=_accumulator(q.dtype))


def _backward_launch(
    grad_out, out, lse, q, k, v, qp, kr, ks, qr, bias, grows, gcols, qseg, kseg, kmask, qpos,
    kpos, causal: bool, block_q: int, block_k: int, interpret: bool, tables: bool,
) -> list[torch.Tensor]:  # fmt: skip
    """The gradients of ``(q, k, v, qp, Kʳ, ks, Qʳ, b, grid_rows, grid_cols)``, an empty
    tensor for an absent input (and for the tables where ``tables`` is False)."""
    config = _Config(causal, block_q, block_k, interpret)
    batch, heads, lq, _ = q.shape
    lk = k.shape[2]
    tensors = (q, k, v, qp, ks, kr, qr, bias, grows, gcols, qseg, kseg, kmask, qpos, kpos)
    args, meta = _inputs(*tensors, config)
    kernels = _kernels(config.interpret)
    do = grad_out.to(q.dtype).contiguous()
    acc = _accumulator(q.dtype)
    delta = (do.to(acc) * out.to(acc)).sum(-1)  # D_i = rowsum(dO_i ⊙ O_i)
    # Contiguous gradients (the kernels store them so), whatever the inputs' strides.
    dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))
    dqp = None if qp is None else torch.empty_like(dq)
    dks = None if ks is None else torch.empty_like(dk)
    dgrows = None if grows is None else torch.empty(grows.shape, dtype=q.dtype, device=q.device)
    dgcols = None if gcols is None else torch.empty(gcols.shape, dtype=q.dtype, device=q.device)
    given = (kr, qr, bias)
    # At given positions the tile kernels add the tables' gradients into these buffers;
    # else the tile-diagonal kernel fills them (_table_grads).
    buffers = _table_buffers(q, k, given, config) if qpos is not None else [None] * 3
    dkr_sums, dqr_sums, db_sums = (_or(x, delta) for x in buffers)
    grid = (triton.cdiv(lq, config.block_q), batch * heads)
    grads = (dq, _or(dqp, dq), _or(dgrows, dq), _or(dgcols, dq), dkr_sums, db_sums)
    kernels._backward_rows[grid](*args, do, lse, delta, *grads, **meta)
    grid = (triton.cdiv(lk, config.block_k), batch * heads)
    dkv = (dk, dv, _or(dks, dk), dqr_sums)
    kernels._backward_keys[grid](*args, do, lse, delta, *dkv, **meta)
    dkr = dqr = dbias = None
    if qpos is not None:
        dkr, dqr, dbias = _full_width(given, buffers)
    elif tables:
        dkr, dqr, dbias = _table_grads(q, k, given, args, meta, do, lse, delta, config)
    result = (dq, dk, dv, dqp, dkr, dks, dqr, dbias, dgrows, dgcols)
    return [q.new_empty(0) if g is None else g for g in result]


def _backward_shapes(
    grad_out, out, lse, q, k, v, qp, kr, ks, qr, bias, grows, gcols, qseg, kseg, kmask, qpos,
    kpos, causal: bool, block_q: int, block_k: int, interpret: bool, tables: bool,
) -> list[torch.Tensor]:  # fmt: skip
    """What :func:`_backward_launch` returns, as empty tensors (for tracing)."""
    inputs = (q, k, v, qp, kr, ks, qr, bias, grows, gcols)
    no_grad = (kr, qr, bias) if not tables and qpos is None else ()
    return [
        q.new_empty(0) if x is None or any(x is t for t in no_grad) else x.new_empty(x.shape)
        for x in inputs
    ]


def _save(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    ctx.save_for_backward(*inputs[:15], *output)
    ctx.options = inputs[15:]


def _differentiate(ctx: Any, grad_out: torch.Tensor, _grad_lse: Any) -> tuple[Any, ...]:
    *inputs, out, lse = ctx.saved_tensors
    tables = any(ctx.needs_input_grad[i] for i in (4, 6, 7))  # Kʳ, Qʳ, b
    grads = _BACKWARD(grad_out, out, lse, *inputs, *ctx.options, tables)
    given = inputs[:_DIFFERENTIABLE]
    grads = [
        None if x is None or g.numel() != x.numel() else g
        for x, g in zip(given, grads, strict=True)
    ]
    return (*grads, *[None] * (len(inputs) - _DIFFERENTIABLE + len(ctx.options)))


# The kernels as PyTorch operators: opaque to torch.compile (which traces their shapes from
# the *_shapes functions and calls them in its graph), differentiable by _differentiate.
_FORWARD = torch.library.custom_op(
    "relattn::triton_relative_attention", _forward_launch, mutates_args=(),
    schema=f"({_OPERANDS}) -> (Tensor, Tensor)",
)  # fmt: skip
_FORWARD.register_fake(_forward_shapes)
_BACKWARD = torch.library.custom_op(
    "relattn::triton_relative_attention_backward", _backward_launch, mutates_args=(),
    schema=f"(Tensor grad_out, Tensor out, Tensor lse, {_OPERANDS}, bool tables) -> Tensor[]",
)  # fmt: skip
_BACKWARD.register_fake(_backward_shapes)
_FORWARD.register_autograd(_differentiate, setup_context=_save)


def _table_buffers(q, k, tables, config: _Config) -> list[Any]:
    """Zeroed accumulators ``(B, H, LIMIT, …)`` of the gradients of ``tables = (Kʳ, Qʳ,
    b)`` (``None`` for an absent one), in the accumulation dtype."""
    batch, heads, lq = q.shape[:3]
    limit = _limit(lq, k.shape[2], config.causal)
    return [
        None if x is None else torch.zeros((batch, heads, limit, *x.shape[3:]),
                                           dtype=_accumulator(q.dtype), device=q.device)
        for x in tables
    ]  # fmt: skip


def _full_width(tables, buffers) -> list[Any]:
    """The accumulated gradients ``buffers`` in the ``(B, H, W, …)`` shape and dtype of
    their ``tables``: a full-layout table in a causal problem has no gradient in its rows
    ``m >= Lk``."""
    grads = []
    for table, buffer in zip(tables, buffers, strict=True):
        if table is not None and buffer is not None:
            missing = table.shape[2] - buffer.shape[2]
            pad = (0, 0, 0, missing) if table.ndim == 4 else (0, missing)
            buffer = torch.nn.functional.pad(buffer, pad).to(table.dtype)
        grads.append(buffer)
    return grads


def _table_grads(q, k, tables, args, meta, do, lse, delta, config: _Config) -> list[Any]:
    """The gradients of ``tables = (Kʳ, Qʳ, b)`` (``None`` for an absent one) from the
    tile-diagonal kernel, each in the ``(B, H, W, …)`` shape and dtype of its table."""
    batch, heads, lq = q.shape[:3]
    lk = k.shape[2]
    buffers = _table_buffers(q, k, tables, config)
    tile = min(config.block_q, config.block_k)  # square tiles: one window per tile diagonal
    ni, nj = triton.cdiv(lq, tile), triton.cdiv(lk, tile)
    square = {**meta, "BM": tile, "BN": tile, "WIN": 2 * tile}
    outputs = [_or(x, delta) for x in buffers]
    kernels = _kernels(config.interpret)
    diagonals = ni + nj - 1  # t = -(ni - 1) … nj - 1, program 2·pid + parity
    for parity in (0, 1):
        grid = ((diagonals - parity + 1) // 2, batch * heads)
        kernels._backward_tables[grid](*args, do, lse, delta, *outputs, ni, nj, parity, **square)
    return _full_width(tables, buffers)


# -------------------------------------------------------------------------------------------
# The public function
# -------------------------------------------------------------------------------------------
def _tensor(name: str, x: Any) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def _rows(name: str, x: Any, shape: tuple[int, ...], dims: str) -> None:
    _tensor(name, x)
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {dims} = {shape}, got {tuple(x.shape)}")


def _broadcasts(name: str, head: tuple[int, ...], lead: tuple[int, int]) -> None:
    if any(s not in (1, t) for s, t in zip(reversed(head), reversed(lead), strict=False)):
        raise ValueError(f"{name}'s leading dims {head} do not broadcast to (B, H) = {lead}")


def _table(name: str, x: Any, lead: tuple[int, int], lq: int, lk: int, d: int | None,
           causal: bool) -> Any:  # fmt: skip
    """A table ``(..., W, d)`` (a bias ``(..., W)`` for ``d=None``) checked and expanded to
    ``(B, H, W, …)``: the expansion is in the autograd graph, which sums the gradient back
    to the given shape."""
    if x is None:
        return None
    _tensor(name, x)
    n = 1 if d is None else 2
    shape = tuple(x.shape)
    if not n <= x.ndim <= n + 2 or (d is not None and shape[-1] != d):
        dims = "(..., W)" if d is None else f"(..., W, d) with d = {d}"
        raise ValueError(f"{name} must have shape {dims}, at most 2 leading dims, got {shape}")
    width, full = shape[-n], lq + lk - 1
    if width not in (full, lk) or (width != full and not causal):
        raise ValueError(
            f"{name} must have W = Lq + Lk - 1 = {full} (full layout) or W = Lk = {lk} "
            f"(causal layout, with causal=True), got W = {width}"
        )
    _broadcasts(name, shape[:-n], lead)
    return x.expand(*lead, *shape[-n:])


def _per_key(name: str, x: Any, lead: tuple[int, int], length: int, axis: str) -> Any:
    """Segments or a key mask ``(..., L)`` checked and expanded to ``(B, H, L)`` (a view)."""
    if x is None:
        return None
    _tensor(name, x)
    shape = tuple(x.shape)
    if not 1 <= x.ndim <= 3 or shape[-1] != length:
        raise ValueError(
            f"{name} must have shape (..., {axis}) = (..., {length}), at most 2 leading dims, "
            f"got {shape}"
        )
    _broadcasts(name, shape[:-1], lead)
    if name == "key_mask" and x.dtype != torch.bool:
        raise TypeError(f"key_mask must be torch.bool (True: the key is seen), got {x.dtype}")
    if name != "key_mask" and (x.dtype.is_floating_point or x.dtype.is_complex
                               or x.dtype == torch.bool):  # fmt: skip
        what = "positions" if name.endswith("positions") else "document ids"
        raise TypeError(f"{name} must have an integer dtype ({what}), got {x.dtype}")
    return x.expand(*lead, length)


def _key_grid(grid_width: Any, lk: int) -> tuple[int, int]:
    """``(kh, kw)``: the key grid of ``Lk = kh·kw`` keys, ``kw = grid_width``."""
    if grid_width is None:
        raise ValueError("grid_rows and grid_cols need grid_width (kw, the key grid's width)")
    if isinstance(grid_width, bool) or not hasattr(grid_width, "__index__"):
        raise TypeError(f"grid_width must be an int, got {type(grid_width).__name__}")
    kw = int(grid_width)
    if kw < 1 or lk % kw:
        raise ValueError(
            f"grid_width must divide Lk = {lk} (kw of a kh × kw key grid), got {grid_width}"
        )
    kh = lk // kw
    if max(kh, kw) > MAX_GRID:
        raise ValueError(
            f"grid_width = {kw} gives a key grid kh × kw = {kh} × {kw}: the kernel takes "
            f"kh, kw <= {MAX_GRID} (it holds (block_q, kh) and (block_q, kw) gradients)"
        )
    return kh, kw


def _grid(name: str, x: Any, lead: tuple[int, int], lq: int, size: int, axis: str) -> Any:
    """A grid term ``(..., Lq, kh)`` or ``(..., Lq, kw)`` checked and expanded to
    ``(B, H, Lq, …)`` in the autograd graph (the gradient comes back in the given shape)."""
    _tensor(name, x)
    shape = tuple(x.shape)
    if not 2 <= x.ndim <= 4 or shape[-2:] != (lq, size):
        raise ValueError(
            f"{name} must have shape (..., Lq, {axis}) = (..., {lq}, {size}), at most 2 leading "
            f"dims, got {shape}"
        )
    _broadcasts(name, shape[:-2], lead)
    return x.expand(*lead, lq, size)


def relative_attention_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    qp: torch.Tensor | None = None,
    key_table: torch.Tensor | None = None,
    ks: torch.Tensor | None = None,
    query_table: torch.Tensor | None = None,
    relative_bias: torch.Tensor | None = None,
    query_segments: torch.Tensor | None = None,
    key_segments: torch.Tensor | None = None,
    key_mask: torch.Tensor | None = None,
    grid_rows: torch.Tensor | None = None,
    grid_cols: torch.Tensor | None = None,
    grid_width: int | None = None,
    query_positions: torch.Tensor | None = None,
    key_positions: torch.Tensor | None = None,
    causal: bool = False,
    block_q: int | None = None,
    block_k: int | None = None,
    interpret: bool | None = None,
) -> torch.Tensor:
    """Softmax attention with relative-position terms, in one fused Triton kernel.

    The score of query ``i`` and key ``j``, with table row ``m = j - i + Lq - 1`` (at given
    positions ``m = δ + Lk - 1`` clipped to the table's rows), is ::

        s_ij = q_i·k_j + qp_i·Kʳ[m] + ks_j·Qʳ[m] + b[m] + R[i, j // kw] + C[i, j % kw]

    (each term present only if its inputs are given; ``R``, ``C``: ``grid_rows``,
    ``grid_cols``); ``out_i = Σ_j softmax_j(s_i·) v_j``
    over the visible keys: those the causal rule, the segments and the key mask all let
    query ``i`` see.

    Parameters
    ----------
    q : Tensor of shape (B, H, Lq, d)
        Content queries, already ``(q + u)·scale`` (``u``: the content bias).
    k : Tensor of shape (B, H, Lk, d)
        Keys.
    v : Tensor of shape (B, H, Lk, dv)
        Values.
    qp : Tensor of shape (B, H, Lq, d), optional
        Position queries, already ``(q + v)·scale``; given iff ``key_table`` is.
    key_table : Tensor of shape (..., W, d), optional
        ``Kʳ``: row ``m`` encodes the distance ``δ = m - (Lk - 1)`` (key minus query).
        ``W = Lq + Lk - 1`` (full layout) or ``W = Lk`` (causal layout, ``δ <= 0``, only
        with ``causal``). Leading dims ``()``, ``(H,)``, ``(B, H)`` or dims of 1 broadcast
        to ``(B, H)``; any strides, 0 included.
    ks : Tensor of shape (B, H, Lk, d), optional
        Keys times ``scale``; given iff ``query_table`` is.
    query_table : Tensor of shape (..., W, d), optional
        ``Qʳ``, DeBERTa's position-to-content table, in the layouts of ``key_table``.
    relative_bias : Tensor of shape (..., W), optional
        ``b``, one value per distance (T5, ALiBi), in the layouts of ``key_table``.
    query_segments, key_segments : Tensor of shape (..., Lq) and (..., Lk), optional
        Integer document ids (any integer dtype; both or neither): query ``i`` sees key
        ``j`` only where ``query_segments[i] == key_segments[j]`` (packed documents).
        Leading dims broadcasting to ``(B, H)`` as the tables'; any strides, 0 included.
    key_mask : Tensor of shape (..., Lk), optional
        torch.bool, True where the key may be seen (key padding, a cache's unfilled
        slots); leading dims and strides as the segments'. A masked key's ``k``, ``v``
        and ``ks`` rows are never read (they may be NaN or inf).
    grid_rows, grid_cols : Tensor of shape (..., Lq, kh) and (..., Lq, kw), optional
        The decomposed 2-D relative terms of MViTv2 / ViTDet / SAM (both or neither), for
        keys on a ``kh × kw`` grid flattened row-major (key ``j`` at row ``j // kw``,
        column ``j % kw``): ``grid_rows[i, a] = q_i·Rʸ[..]`` and ``grid_cols[i, b] =
        q_i·Rˣ[..]``, formed outside (:func:`relattn.decomposed.decomposed_relative_terms`),
        added to the scores as they are. Dtype of ``q``; leading dims and strides as the
        tables'; differentiable (gradients in the given shapes).
    grid_width : int, optional
        ``kw``, the key grid's width (a divisor of ``Lk``; ``kh = Lk / kw``; both at most
        256); given iff the grid terms are.
    query_positions, key_positions : Tensor of shape (..., Lq) and (..., Lk), optional
        Integer positions of the queries and keys (both or neither; by default query ``i``
        at ``i + Lk - Lq``, key ``j`` at ``j``): the distance is ``δ = key_positions[j] -
        query_positions[i]`` and the table row ``m = δ + Lk - 1``, clipped to the rows
        ``[0, W)`` (SPEC §2.15: a cache's offset, packed documents restarting at 0, any
        order). Leading dims and strides as the segments'.
    causal : bool
        Mask the keys with ``δ = j - i - (Lk - Lq) > 0`` (at given positions, ``δ > 0``).
    block_q, block_k : int, optional
        Tile sizes (query rows, key rows), powers of two >= 16. By default the largest
        of 16 … 64 whose tile of padded features takes at most 8 KiB: 64 for float16 and
        bfloat16 with ``d, dv <= 64``, 32 up to 128, 16 above; float32 32, 16, 16 (with
        the grid terms, ``kh`` and ``kw`` count as features, and at most 32).
    interpret : bool, optional
        Run in Triton's interpreter (NumPy, slow: for tests); ``None``: where the tensors
        are on the CPU, or everywhere when ``TRITON_INTERPRET=1`` was set as Triton was
        imported (as Triton's own kernels do).

    Returns
    -------
    Tensor of shape (B, H, Lq, dv), dtype of ``q``
        A row without a visible key (causal with ``Lq > Lk``: the first ``Lq - Lk``; a
        query whose keys are all masked or of other documents) is 0, and its gradients
        are 0. Differentiable with respect to every tensor input (a
        ``torch.autograd.Function``); the gradients of broadcast tables are summed over
        the broadcast dims.

    Raises
    ------
    TypeError
        If an input is not a tensor, the dtypes differ, the dtype is not float16,
        bfloat16, float32 or float64, the segments or positions are not integers, the key
        mask is not
        torch.bool, ``grid_width`` is not an int, or ``causal`` is not a bool.
    ValueError
        If the shapes do not match, a table comes without its queries or keys (or the
        reverse), only one of the segments or of the grid terms is given (or
        ``grid_width`` alone, or not with them), ``grid_width`` does not divide ``Lk``
        (or makes ``kh`` or ``kw`` exceed 256), a grid term is not ``(..., Lq, kh)`` /
        ``(..., Lq, kw)``, a segment or mask length is not
        ``Lq``/``Lk``, ``W`` fits neither layout (or is ``Lk`` without ``causal``), ``Lq`` or
        ``Lk`` is 0, ``d`` or ``dv`` exceeds 256, a tile size is not a power of two >= 16,
        only one of the positions is given or their lengths are not ``Lq``/``Lk``,
        the tensors are on different devices, or ``interpret=False`` for CPU tensors.

    Notes
    -----
    The content-to-position term is Transformer-XL's (Dai et al. 2019, eq. (3), terms
    (b) and (d) with the ``u``/``v`` biases folded into ``q``/``qp``), computed as in
    their appendix B: one product with the ``BM + BN - 1`` table rows of a tile pair,
    then a per-row shift (here a ``tl.gather``). The position-to-content term is
    DeBERTa's (He et al. 2021, eqs. (2)–(4)), the same from the keys' side. The forward
    pass streams key tiles with an online softmax and keeps the per-row log-sum-exp; the
    backward pass recomputes the probabilities per tile (Dao 2023, FlashAttention-2,
    algorithm 2), and sums the tables' gradients per tile diagonal, without an
    ``(Lq, W, d)`` intermediate. Accumulation is float32 (float64 for float64 inputs).
    With segments or a key mask, the tile pairs without a visible pair (other documents)
    are skipped. The decomposed terms are Li et al. 2022 (MViTv2), §3.1, eq. (4), in
    SAM's and ViTDet's decomposed form: read per cell, never an ``(Lq, Lk)`` array;
    their gradients are ``dS`` summed over the keys of each grid row (column), as
    ``dS @ one_hot(j // kw)`` per key tile in the query tile's program (deterministic).
    At given positions a tile pair's table rows are data: it takes the windows of
    ``BM + BN - 1`` rows (padded to a power of two) from the smallest to the largest row its
    visible cells read, one product and one gather per window, so its cost grows with the
    spread of its distances (one or two windows for contiguous positions and for packed
    documents' own pairs). The backward moves ``dS`` to window rows by one-hot sums (several
    keys of a row may share a row) and adds the tables' gradients atomically, so their
    float32 sums are not bitwise reproducible on a GPU; causal tile skipping is by index
    and is off.
    The interpreter has no bfloat16 ``tl.dot`` (triton-lang/triton#11584): it computes
    bfloat16 inputs in float32 and rounds the output.
    """
    dims = {"q": "(B, H, Lq, d)", "k": "(B, H, Lk, d)", "v": "(B, H, Lk, dv)"}
    for name, x in (("q", q), ("k", k), ("v", v)):
        _tensor(name, x)
        if x.ndim != 4:
            raise ValueError(f"{name} must have shape {dims[name]}, got {tuple(x.shape)}")
    batch, heads, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[3]
    _rows("k", k, (batch, heads, lk, d), dims["k"])
    _rows("v", v, (batch, heads, lk, dv), dims["v"])
    if 0 in (lq, lk):
        raise ValueError(f"Lq and Lk must be at least 1, got Lq = {lq}, Lk = {lk}")
    if max(d, dv) > MAX_HEAD_DIM:
        raise ValueError(f"d and dv must be at most {MAX_HEAD_DIM}, got d = {d}, dv = {dv}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    for table, rows, table_name, rows_name in (
        (key_table, qp, "key_table", "qp"), (query_table, ks, "query_table", "ks")
    ):  # fmt: skip
        if (table is None) != (rows is None):
            alone, missing = (table_name, rows_name) if rows is None else (rows_name, table_name)
            raise ValueError(f"{alone} is given without {missing}: give both or neither")
    if qp is not None:
        _rows("qp", qp, (batch, heads, lq, d), dims["q"])
    if ks is not None:
        _rows("ks", ks, (batch, heads, lk, d), dims["k"])
    if (query_segments is None) != (key_segments is None):
        alone, missing = (
            ("query_segments", "key_segments") if key_segments is None
            else ("key_segments", "query_segments")
        )  # fmt: skip
        raise ValueError(f"{alone} is given without {missing}: give both or neither")
    lead = (batch, heads)
    if (grid_rows is None) != (grid_cols is None):
        alone, missing = (
            ("grid_rows", "grid_cols") if grid_cols is None else ("grid_cols", "grid_rows")
        )
        raise ValueError(f"{alone} is given without {missing}: give both or neither")
    grows = gcols = None
    if grid_rows is not None:
        kh, kw = _key_grid(grid_width, lk)
        grows = _grid("grid_rows", grid_rows, lead, lq, kh, "kh")
        gcols = _grid("grid_cols", grid_cols, lead, lq, kw, "kw")
    elif grid_width is not None:
        raise ValueError("grid_width is given without grid_rows and grid_cols")
    qseg = _per_key("query_segments", query_segments, lead, lq, "Lq")
    kseg = _per_key("key_segments", key_segments, lead, lk, "Lk")
    kmask = _per_key("key_mask", key_mask, lead, lk, "Lk")
    if (query_positions is None) != (key_positions is None):
        alone, missing = (
            ("query_positions", "key_positions") if key_positions is None
            else ("key_positions", "query_positions")
        )  # fmt: skip
        raise ValueError(f"{alone} is given without {missing}: give both or neither")
    qpos = _per_key("query_positions", query_positions, lead, lq, "Lq")
    kpos = _per_key("key_positions", key_positions, lead, lk, "Lk")
    kr = _table("key_table", key_table, lead, lq, lk, d, causal)
    qr = _table("query_table", query_table, lead, lq, lk, d, causal)
    bias = _table("relative_bias", relative_bias, lead, lq, lk, None, causal)
    if q.dtype not in _DTYPES:
        raise TypeError(f"q must be float16, bfloat16, float32 or float64, got {q.dtype}")
    given = {"k": k, "v": v, "qp": qp, "ks": ks, "key_table": kr, "query_table": qr,
             "relative_bias": bias, "grid_rows": grows, "grid_cols": gcols}  # fmt: skip
    for name, x in given.items():
        if x is not None and x.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {x.dtype}")
    given.update(query_segments=qseg, key_segments=kseg, key_mask=kmask, query_positions=qpos,
                 key_positions=kpos)  # fmt: skip
    for name, x in given.items():
        if x is not None and x.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {x.device}")
    # Tiles of at most 8 KiB per (tile, padded features) input: 64 rows for 16-bit
    # d <= 64, down to 16 (with every term, at most ~100 KiB of shared memory on sm_90 but
    # float32 with d > 128 and float64 with d > 64). The grid terms' sides count as
    # features, and take at most 32 rows: their per-cell loads and (BM, kh), (BM, kw)
    # gradients spill registers at 64 (ptxas, sm_90, float16 d = 64, a 64 × 64 grid).
    sides = (1, 1) if grows is None or gcols is None else (grows.shape[3], gcols.shape[3])
    features = max(16, triton.next_power_of_2(max(d, dv, *sides)))
    # At given positions the backward's one-hot sums hold (tile, tile, window) temporaries.
    largest = 64 if grows is None and qpos is None else 32
    default = max(16, min(largest, 8192 // (features * q.element_size())))
    block_q = default if block_q is None else block_q
    block_k = default if block_k is None else block_k
    for name, block in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(block, int) or block < 16 or block & (block - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {block!r}")
    if interpret is None:
        interpret = q.device.type == "cpu" or _language_interpreted()
    if not interpret and q.device.type == "cpu":
        raise ValueError("interpret=False needs GPU tensors: Triton compiles for GPUs only")
    if interpret and q.dtype == torch.bfloat16:
        # The interpreter multiplies bfloat16's raw bits in tl.dot (triton-lang/triton#11584):
        # compute in float32 there; the casts are in the autograd graph.
        def up(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.float()

        out = relative_attention_kernel(
            q.float(), k.float(), v.float(), qp=up(qp), key_table=up(key_table), ks=up(ks),
            query_table=up(query_table), relative_bias=up(relative_bias),
            query_segments=query_segments, key_segments=key_segments, key_mask=key_mask,
            grid_rows=up(grid_rows), grid_cols=up(grid_cols), grid_width=grid_width,
            query_positions=query_positions, key_positions=key_positions, causal=causal,
            block_q=block_q, block_k=block_k, interpret=True,
        )  # fmt: skip
        return out.to(torch.bfloat16)
    out, _ = _FORWARD(
        q, k, v, qp, kr, ks, qr, bias, grows, gcols, qseg, kseg, kmask, qpos, kpos, causal,
        block_q, block_k, interpret,
    )  # fmt: skip
    return out
