"""The per-distance terms of one block pair: a slice of each table, moved to key columns.

For a query block ``[i0, i0 + bq)`` and a key block ``[j0, j0 + bk)`` of a
problem of ``Lq`` queries and ``Lk`` keys, the distances
``δ = j - (i + Lk - Lq)`` form ``bq + bk - 1`` contiguous columns of the
relative layout, from ``m0 = j0 - i0 - (bq - 1) + Lq - 1``. Each term is the
shift of Transformer-XL's appendix B (:mod:`relattn.shift`) on that slice. The
offsets are Python integers in a loop over static blocks (slices) and may be
traced integers in a compiled loop or on a ring of devices (clipped gathers,
whose out-of-range cells the caller masks).

With explicit positions (SPEC §2.15) the distances of a block pair are data,
``δ = key_position - query_position``: each term gathers its columns
(:func:`relative_term_at`), clipped to the input's edge columns.
"""

from __future__ import annotations

import math
from typing import Any

from ._checks import broadcast_shapes, index_dtype
from ._namespace import device_of
from .backends import backend_for
from .problem import Problem
from .shift import extend, shift

__all__ = [
    "block_positions",
    "gather_columns",
    "grid_term",
    "matmul_transposed",
    "relative_term",
    "relative_term_at",
    "value_rows_at",
    "value_slice",
    "visible_mask",
    "window",
]

#: A block pair: ``(i0, bq, j0, bk)``, offsets static (int) or traced.
Block = tuple[Any, int, Any, int]


def matmul_transposed(a: Any, b: Any, xp: Any) -> Any:
    """``a @ bᵀ`` over the feature axis (the scores' products), as the backend computes it
    best (:attr:`relattn.backends.Backend.matmul_transposed`)."""
    product = backend_for(xp).matmul_transposed
    if product is not None:
        return product(a, b)
    # The standard's ``mT`` attribute: a view, without the function call of
    # ``matrix_transpose`` (which a short call feels); Dask arrays lack it.
    transposed = getattr(b, "mT", None)
    return a @ (xp.matrix_transpose(b) if transposed is None else transposed)


def is_static(*offsets: Any) -> bool:
    return all(isinstance(o, int) for o in offsets)


def window(x: Any, start: Any, width: int, stop: int, axis: int, xp: Any) -> Any:
    """``x[start : start + width]`` along ``axis`` (-1 or -2).

    A static ``start`` gives a slice that ends at ``stop`` at most (a prefix of
    the window, which the shift completes with its fill). A traced ``start``
    gives all ``width`` rows, gathered at indices clipped into ``x``: the cells
    that read a clipped row are masked by the caller.
    """
    if isinstance(start, int):
        end = min(start + width, stop)
        if start == 0 and end >= x.shape[axis]:
            return x  # the whole input (a problem in one block): no slicing call
        return x[..., start:end] if axis == -1 else x[..., start:end, :]
    n = x.shape[axis]
    rows = xp.arange(width, device=device_of(x)) + start
    rows = xp.clip(rows, 0, n - 1)
    return xp.take(x, rows, axis=x.ndim + axis)


def first_column(p: Problem, block: Block) -> Any:
    """``m0``: the relative-layout column of the block's smallest distance."""
    i0, bq, j0, _ = block
    return j0 - i0 - (bq - 1) + p.lq - 1


def relative_term(p: Problem, qp: Any, ks: Any, block: Block, *, fill: float) -> Any:
    """The per-distance scores of one block pair, or ``None`` when the problem has none.

    ``qp (..., bq, d)`` are the block's position queries ``(q + v) · scale``
    (read with a ``key_table``), ``ks (..., bk, d)`` its keys times ``scale``
    (read with a ``query_table``). With static offsets in a causal problem the
    slices stop at column ``Lk - 1`` (``δ = 0``) and the shift fills the absent
    ``δ > 0`` cells with ``fill`` (``-inf``: the term is then the causal mask
    too).
    """
    if not p.has_terms:
        return None
    xp = p.xp
    _, bq, _, bk = block
    width = bq + bk - 1
    m0 = first_column(p, block)
    stop = p.lk if p.causal else p.lq + p.lk - 1
    total = None
    if p.key_table is not None:
        table = window(p.key_table, m0, width, stop, -2, xp)
        total = shift(matmul_transposed(qp, table, xp), bk, xp, fill=fill)
    if p.relative_bias is not None:
        values = window(p.relative_bias, m0, width, stop, -1, xp)
        values = xp.broadcast_to(values[..., None, :], (*values.shape[:-1], bq, values.shape[-1]))
        term = shift(values, bk, xp, fill=fill)
        total = term if total is None else total + term
    if p.query_table is not None:
        # p2c[i, j] = k_j · Qʳ[m(i, j)]: the keys play the queries' part in a problem of
        # bk "queries" and bq "keys", over the flipped slice (He et al. 2021, eq. (4)).
        table = window(p.query_table, m0, width, p.query_table.shape[-2], -2, xp)
        if table.shape[-2] < width:
            # Causal layout: the δ > 0 rows are absent and their cells masked; zeros stand in.
            table = extend(table, -2, 0, width - table.shape[-2], xp)
        flipped = xp.flip(table, axis=-2)
        term = xp.matrix_transpose(shift(matmul_transposed(ks, flipped, xp), bq, xp))
        total = term if total is None else total + term
    return total


def grid_term(p: Problem, rows: Problem, block: Block) -> Any:
    """The decomposed 2-D terms of one block pair, ``(..., bq, bk)``, or ``None``.

    ``rows.grid_rows (..., bq, kh)`` and ``rows.grid_cols (..., bq, kw)`` are the query
    block's rows; key ``j0 + c`` reads row ``(j0 + c) // kw`` of the first and column
    ``(j0 + c) % kw`` of the second (``kw``, the width of ``grid_cols``). Static offsets slice a
    broadcast sum over the grid rows the block spans; traced ones take the block's
    columns (clipped into the grid: the padding keys of a traced loop are masked, and
    JAX fills an out-of-range take with NaN, whose gradient would leak through it).
    """
    if rows.grid_rows is None:
        return None
    xp = p.xp
    height, width = rows.grid_rows.shape[-1], rows.grid_cols.shape[-1]
    _, _, j0, bk = block
    if isinstance(j0, int):
        # The grid rows the block's keys lie on, as one broadcast sum, then the block's
        # columns of it: a slice, no gather (a take along the last axis is slow on CPUs).
        first, last = j0 // width, min(-(-(j0 + bk) // width), height)
        by_row = rows.grid_rows[..., :, first:last, None] + rows.grid_cols[..., :, None, :]
        flat = xp.reshape(by_row, (*by_row.shape[:-2], (last - first) * width))
        start = j0 - first * width
        return flat if start == 0 and bk == flat.shape[-1] else flat[..., start : start + bk]
    keys = xp.arange(bk, device=device_of(rows.grid_rows)) + j0
    keys = xp.clip(keys, 0, height * width - 1)
    term = xp.take(rows.grid_rows, keys // width, axis=rows.grid_rows.ndim - 1)
    return term + xp.take(rows.grid_cols, keys % width, axis=rows.grid_cols.ndim - 1)


def value_slice(p: Problem, block: Block) -> Any:
    """The block's columns of the value table (a prefix in a causal problem), or ``None``."""
    table = p.value_table
    if table is None:
        return None
    _, bq, _, bk = block
    return window(table, first_column(p, block), bq + bk - 1, table.shape[-2], -2, p.xp)


def visible_mask(
    p: Problem, block: Block, device: Any, *, causal: bool, key_limit: Any = None
) -> Any:
    """``δ <= 0`` (with ``causal``) and ``j < key_limit`` over one block; ``None`` where all pass.

    Static offsets skip the mask where the whole block passes; traced ones
    always build it (``bq × bk`` booleans from two ranges).
    """
    xp = p.xp
    i0, bq, j0, bk = block
    offset = p.lk - p.lq
    causal = causal and not (is_static(i0, j0) and j0 + bk - 1 <= i0 + offset)
    if not causal and key_limit is None:
        return None
    cols = xp.arange(bk, device=device) + j0
    out = None
    if causal:
        rows = xp.arange(bq, device=device) + (i0 + offset)
        out = cols[None, :] <= rows[:, None]
    if key_limit is not None:
        keep = (cols < key_limit)[None, :]
        out = keep if out is None else out & keep
    return out


# -------------------------------------------------------------------------------------------
# Explicit positions: the distances are data
# -------------------------------------------------------------------------------------------
def block_positions(p: Problem, qpos: Any, kpos: Any, block: Block, device: Any) -> tuple[Any, Any]:
    """The block's query and key positions as ``(..., bq, 1)`` and ``(..., 1, bk)``.

    ``qpos (..., bq)`` and ``kpos (..., bk)`` are the block's slices of explicit
    positions, or ``None``: then query ``i`` sits at ``i + Lk - Lq`` and key ``j``
    at ``j`` (the contiguous default).
    """
    xp = p.xp
    i0, bq, j0, bk = block
    if qpos is None:
        qpos = xp.arange(bq, device=device) + (i0 + p.lk - p.lq)
    if kpos is None:
        kpos = xp.arange(bk, device=device) + j0
    return qpos[..., :, None], kpos[..., None, :]


def gather_columns(a: Any, columns: Any, xp: Any) -> Any:
    """``out[..., r, c] = a[..., r, columns[..., r, c]]``, leading dims broadcast."""
    lead = _lead(a.shape[:-1], columns.shape[:-1])
    a = xp.broadcast_to(a, (*lead, a.shape[-1]))
    columns = xp.broadcast_to(columns, (*lead, columns.shape[-1]))
    take = backend_for(xp).take_along_axis or xp.take_along_axis
    return take(a, columns, axis=-1)


def _lead(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The broadcast leading dims of a block's operands (checked to broadcast already)."""
    lead = broadcast_shapes(*shapes)
    assert lead is not None
    return lead


def _columns(p: Problem, table: Any, delta: Any, axis: int) -> tuple[Any, Any]:
    """``table`` (or the window of its columns that ``delta`` reaches) and the column of
    each distance in it, clipped to the edge columns (SPEC §2.15)."""
    xp = p.xp
    width = table.shape[axis]
    m = xp.clip(delta + (p.lk - 1), 0, width - 1)
    index = index_dtype(xp, device_of(m))
    if m.dtype != index:
        m = xp.astype(m, index)
    if backend_for(xp).has_values(m) and math.prod(m.shape) > 0:
        # Values at hand: the window of columns the block reaches, not the whole table.
        lo, hi = int(xp.min(m)), int(xp.max(m))
        if hi - lo + 1 < width:
            table = table[..., lo : hi + 1] if axis == -1 else table[..., lo : hi + 1, :]
            m = m - lo
    return table, m


def relative_term_at(p: Problem, qp: Any, ks: Any, delta: Any) -> Any:
    """:func:`relative_term` at explicit distances ``delta (..., bq, bk)``, or ``None``.

    Each table's product with the block's queries (keys, for ``Qʳ``) is taken over
    the columns the block's distances reach, then gathered per pair: ``O(bq·w·d)``
    for ``w`` columns, never a ``(bq, bk, d)`` tensor.
    """
    if not p.has_terms:
        return None
    xp = p.xp
    total = None
    if p.key_table is not None:
        table, m = _columns(p, p.key_table, delta, -2)
        total = gather_columns(matmul_transposed(qp, table, xp), m, xp)
    if p.relative_bias is not None:
        values, m = _columns(p, p.relative_bias, delta, -1)
        term = gather_columns(values[..., None, :], m, xp)
        total = term if total is None else total + term
    if p.query_table is not None:
        # p2c[i, j] = k_j · Qʳ[m(i, j)]: row j of ks Qʳᵀ, at the column of each query.
        table, m = _columns(p, p.query_table, delta, -2)
        product = matmul_transposed(ks, table, xp)  # (..., bk, w)
        term = xp.matrix_transpose(gather_columns(product, xp.matrix_transpose(m), xp))
        total = term if total is None else total + term
    return total


def value_rows_at(p: Problem, delta: Any) -> Any:
    """``Vʳ[m(i, j)]`` for each pair of the block, ``(..., bq, bk, d_v)``, or ``None``."""
    if p.value_table is None:
        return None
    xp = p.xp
    table, m = _columns(p, p.value_table, delta, -2)
    *lead, bq, bk = m.shape
    flat = xp.reshape(m, (*lead, bq * bk))
    # One take per leading index is what the standard offers: take rows along -2.
    rows = _take_rows(table, flat, xp)  # (..., bq·bk, d_v)
    return xp.reshape(rows, (*rows.shape[:-2], bq, bk, rows.shape[-1]))


def _take_rows(table: Any, index: Any, xp: Any) -> Any:
    """``table[..., index[..., n], :]`` with broadcast leading dims."""
    if index.ndim == 1:
        return xp.take(table, index, axis=table.ndim - 2)
    d = table.shape[-1]
    lead = _lead(table.shape[:-2], index.shape[:-1])
    n = index.shape[-1]
    columns = xp.broadcast_to(index[..., :, None], (*lead, n, d))
    # Gather whole rows: along the width axis of the table, one column per feature.
    table = xp.broadcast_to(table, (*lead, *table.shape[-2:]))
    take = backend_for(xp).take_along_axis or xp.take_along_axis
    return take(table, columns, axis=-2)
