"""The per-distance terms of one block pair: a slice of each table, moved to key columns.

For a query block ``[i0, i0 + bq)`` and a key block ``[j0, j0 + bk)`` of a
problem of ``Lq`` queries and ``Lk`` keys, the distances
``δ = j - (i + Lk - Lq)`` form ``bq + bk - 1`` contiguous columns of the
relative layout, from ``m0 = j0 - i0 - (bq - 1) + Lq - 1``. Each term is the
shift of Transformer-XL's appendix B (:mod:`relattn.shift`) on that slice. The
offsets are Python integers in a loop over static blocks (slices) and may be
traced integers in a compiled loop or on a ring of devices (clipped gathers,
whose out-of-range cells the caller masks).
"""

from __future__ import annotations

from typing import Any

import array_api_compat

from .problem import Problem
from .shift import extend, shift

__all__ = ["relative_term", "value_slice", "visible_mask", "window"]

#: A block pair: ``(i0, bq, j0, bk)``, offsets static (int) or traced.
Block = tuple[Any, int, Any, int]


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
        return x[..., start:end] if axis == -1 else x[..., start:end, :]
    n = x.shape[axis]
    rows = xp.arange(width, device=array_api_compat.device(x)) + start
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
        total = shift(xp.matmul(qp, xp.matrix_transpose(table)), bk, xp, fill=fill)
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
        term = xp.matrix_transpose(shift(ks @ xp.matrix_transpose(flipped), bq, xp))
        total = term if total is None else total + term
    return total


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
