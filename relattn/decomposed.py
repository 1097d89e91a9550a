"""Decomposed relative positions of MViTv2, ViTDet and SAM: one table per image axis.

An image's tokens lie on a grid of ``h × w`` patches, flattened row-major
(token ``t = row·w + col``). MViTv2 (Li et al. 2022, §3.1) adds to the score of
query ``i`` and key ``j`` a content-to-position term per axis,
``q_i · Rʰ[Δrow] + q_i · Rʷ[Δcol]``, rather than one embedding per 2-D
distance: ``O(L·(h + w)·d)`` work and memory, never ``O(L²·d)``. ViTDet and
Segment Anything (Kirillov et al. 2023) use the same term, with SAM's
``get_rel_pos`` resizing a table learned at one resolution to another by
linear interpolation (:func:`resize_relative_table`).
:func:`decomposed_relative_terms` gives the two per-axis terms and
:func:`decomposed_relative_attention` attends with them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from . import _checks, core, problem
from ._namespace import device_of
from ._typing import Array

__all__ = [
    "decomposed_relative_attention",
    "decomposed_relative_terms",
    "resize_relative_table",
]


# -------------------------------------------------------------------------------------------
# Host-side index arithmetic (static shapes: computed once per size, no device work)
# -------------------------------------------------------------------------------------------
_INTERPOLATION: dict[tuple[int, int], tuple[list[int], list[int], list[float]]] = {}
_DISTANCE_INDEX: dict[tuple[int, int], list[int]] = {}


def _interpolation(width: int, size: int) -> tuple[list[int], list[int], list[float]]:
    """Rows ``i0``, ``i1`` and weight ``λ`` of each output row: ``(1 - λ)·T[i0] + λ·T[i1]``.

    PyTorch's ``upsample_linear1d`` with ``align_corners=False`` and no scale factor:
    ``src = (o + 0.5)·W/size - 0.5``, clamped at 0; ``i0 = ⌊src⌋``,
    ``i1 = min(i0 + 1, W - 1)``, ``λ = src - i0``.
    """
    key = (width, size)
    found = _INTERPOLATION.get(key)
    if found is None:
        ratio = width / size
        low, high, weight = [], [], []
        for o in range(size):
            src = max(ratio * (o + 0.5) - 0.5, 0.0)
            i0 = min(math.floor(src), width - 1)
            low.append(i0)
            high.append(min(i0 + 1, width - 1))
            weight.append(min(max(src - i0, 0.0), 1.0))
        found = _INTERPOLATION[key] = (low, high, weight)
    return found


def _distance_index(q_size: int, k_size: int) -> list[int]:
    """SAM's row of the resized table for each (query, key) pair of one axis, ``(q, k)``
    flattened: ``⌊q_c·max(k/q, 1) - k_c·max(q/k, 1) + (k - 1)·max(q/k, 1)⌋``.

    In float32, as SAM's and MViTv2's ``torch.arange(n) * ratio`` compute it (PyTorch's
    default dtype): with a ratio such as 10/6 the float32 sum of an integer-valued
    distance can fall just below it and truncate one row lower than exact arithmetic
    would, and the reference models were trained with those rows.
    """
    key = (q_size, k_size)
    found = _DISTANCE_INDEX.get(key)
    if found is None:
        f32 = np.float32
        q_ratio = f32(max(k_size / q_size, 1.0))
        k_ratio = max(q_size / k_size, 1.0)
        q_coords = np.arange(q_size, dtype=f32)[:, None] * q_ratio
        k_coords = np.arange(k_size, dtype=f32)[None, :] * f32(k_ratio)
        rows = (q_coords - k_coords) + f32((k_size - 1) * k_ratio)
        found = _DISTANCE_INDEX[key] = [int(r) for r in rows.astype(np.int64).reshape(-1)]
    return found


# -------------------------------------------------------------------------------------------
# Checks
# -------------------------------------------------------------------------------------------
def _grid(name: str, grid: Any) -> tuple[int, int]:
    if not isinstance(grid, (tuple, list)) or len(grid) != 2:
        raise TypeError(
            f"{name} must be a pair of integers (height, width), got {type(grid).__name__} {grid!r}"
        )
    height = _checks.length(f"{name}[0] (height)", grid[0])
    width = _checks.length(f"{name}[1] (width)", grid[1])
    return height, width


def _table(name: str, table: Any, d: int) -> None:
    if table.ndim != 2 or table.shape[0] < 1:
        raise ValueError(
            f"{name} must have shape (W, d) with W >= 1 (one row per distance), "
            f"got shape {tuple(table.shape)}"
        )
    if table.shape[1] != d:
        raise ValueError(
            f"{name} must have the feature size of q, d = {d}, got shape {tuple(table.shape)}"
        )


def _tokens(name: str, x: Any, grid_name: str, grid: tuple[int, int], length: str) -> None:
    if x.shape[-2] != grid[0] * grid[1]:
        raise ValueError(
            f"{grid_name} {grid} holds {grid[0] * grid[1]} tokens, but {name} has "
            f"{length} = {x.shape[-2]} (shape {tuple(x.shape)})"
        )


# -------------------------------------------------------------------------------------------
# Public functions
# -------------------------------------------------------------------------------------------
def resize_relative_table(table: Array, size: int) -> Array:
    """Resize a relative-position table along its distance axis by linear interpolation.

    Parameters
    ----------
    table : array of shape (..., W, d), real floating
        One row per relative distance (``W >= 1``), e.g. SAM's ``rel_pos_h``
        ``(2h - 1, d)`` learned for a grid of height ``h``.
    size : int
        The number of rows wanted, ``>= 1`` (``2·max(q, k) - 1`` for a query and
        a key axis of ``q`` and ``k`` patches).

    Returns
    -------
    array of shape (..., size, d), dtype of ``table``
        ``out[o] = (1 - λ_o)·table[i0_o] + λ_o·table[i1_o]`` with
        ``src = (o + ½)·W/size - ½`` clamped at 0, ``i0 = ⌊src⌋``,
        ``i1 = min(i0 + 1, W - 1)``, ``λ = src - i0``. ``table`` itself when
        ``W == size``. Differentiable in ``table``.

    Raises
    ------
    ValueError
        If ``table`` has fewer than two dimensions or no row, or ``size < 1``.
    TypeError
        If ``table`` is not a real floating array or ``size`` not an integer.

    See Also
    --------
    decomposed_relative_terms : Resizes each axis's table to ``2·max(q, k) - 1``.

    Notes
    -----
    Kirillov et al. 2023 (Segment Anything), ``get_rel_pos``: "Interpolate rel
    pos" with ``torch.nn.functional.interpolate(..., mode="linear")``
    (``align_corners=False``), which this reproduces with two gathers and a
    weighted sum; the rows and weights are computed on the host in float64
    (the shapes are static), so it traces under ``jax.jit`` and
    ``torch.compile``.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn.decomposed import resize_relative_table
    >>> table = xp.reshape(xp.asarray([0.0, 4.0, 8.0]), (3, 1))
    >>> resize_relative_table(table, 5)[:, 0]
    array([0. , 1.6, 4. , 6.4, 8. ])
    """
    xp = _checks.namespace(table=table)
    _checks.floating(xp, table=table)
    size = _checks.length("size", size)
    _checks.ndim("table", table, 2, "(..., W, d)")
    width = table.shape[-2]
    if width < 1:
        raise ValueError(
            f"table must have at least one row (W >= 1), got shape {tuple(table.shape)}"
        )
    if width == size:
        return table
    low, high, weight = _interpolation(width, size)
    device = device_of(table)
    index = _checks.index_dtype(xp, device)
    axis = table.ndim - 2
    # (1 - λ)·T[i0] + λ·T[i1], PyTorch's order of operations (h0lambda, h1lambda)
    keep = xp.reshape(
        xp.asarray([1.0 - w for w in weight], dtype=table.dtype, device=device), (size, 1)
    )
    lam = xp.reshape(xp.asarray(weight, dtype=table.dtype, device=device), (size, 1))
    first = xp.take(table, xp.asarray(low, dtype=index, device=device), axis=axis)
    second = xp.take(table, xp.asarray(high, dtype=index, device=device), axis=axis)
    return keep * first + lam * second


def decomposed_relative_terms(
    q: Array,
    table_h: Array,
    table_w: Array,
    query_grid: tuple[int, int],
    key_grid: tuple[int, int] | None = None,
) -> tuple[Array, Array]:
    """The per-axis content-to-position terms of MViTv2 / SAM: ``q_i · Rʰ`` and ``q_i · Rʷ``.

    Parameters
    ----------
    q : array of shape (..., Lq, d), real floating
        Queries of a ``(qh, qw)`` grid flattened row-major (``Lq = qh·qw``,
        token ``t = row·qw + col``), **unscaled** (SAM adds the terms to
        ``(q·scale)·kᵀ`` but forms them from ``q`` itself).
    table_h, table_w : arrays of shape (Wh, d) and (Ww, d), real floating
        The learned tables of the row and the column distance (SAM's
        ``rel_pos_h``, ``rel_pos_w``). Any width ``>= 1``: each is resized to
        ``2·max(qh, kh) - 1`` (``2·max(qw, kw) - 1``) rows by
        :func:`resize_relative_table` where it has another.
    query_grid : (int, int)
        ``(qh, qw)``, both ``>= 1``.
    key_grid : (int, int), optional
        ``(kh, kw)`` of the keys (MViTv2 pools keys and values to a coarser
        grid); ``query_grid`` by default.

    Returns
    -------
    rel_h : array of shape (..., Lq, kh)
        ``rel_h[..., (y, x), ky] = q_(y,x) · Rʰ[r(y, ky)]``.
    rel_w : array of shape (..., Lq, kw)
        ``rel_w[..., (y, x), kx] = q_(y,x) · Rʷ[r(x, kx)]``.
        The score of query ``(y, x)`` and key ``(ky, kx)`` gets
        ``rel_h[..., i, ky] + rel_w[..., i, kx]``. Both in the promoted dtype.

    Raises
    ------
    ValueError
        If ``Lq != qh·qw``, a grid size is below 1, or a table is not 2-D with
        ``d`` features and at least one row.
    TypeError
        If an input is not a real floating array (``None``, a list), a grid is
        not a pair of integers, or the arrays come from different libraries.

    See Also
    --------
    decomposed_relative_attention : Attention with these terms.
    resize_relative_table : SAM's interpolation of a table.

    Notes
    -----
    Li et al. 2022 (MViTv2), §3.1, eq. (4): ``R_{p(i),p(j)} = Rʰ_{h(i),h(j)} +
    Rʷ_{w(i),w(j)}``, and the score ``q_i · R_{p(i),p(j)}``. The row of a pair on
    one axis of ``q`` query and ``k`` key patches is SAM's and MViTv2's
    ``r(a, b) = ⌊a·max(k/q, 1) - b·max(q/k, 1) + (k - 1)·max(q/k, 1)⌋``
    (computed in float32 as their code does): it grows with **query minus
    key**, ``-δ`` in relattn's sign; with ``q = k``, row ``m`` holds
    ``a - b = m - (k - 1)``. The gathered ``(q, k, d)`` tables are multiplied
    by the queries axis by axis: ``O(L·(kh + kw)·d)``, no ``(Lq, Lk)`` array.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn.decomposed import decomposed_relative_terms
    >>> q = xp.ones((4, 1))                                   # a 2 × 2 grid
    >>> table_h = xp.reshape(xp.asarray([-1.0, 0.0, 1.0]), (3, 1))  # value = row - col
    >>> table_w = 10 * table_h
    >>> rel_h, rel_w = decomposed_relative_terms(q, table_h, table_w, (2, 2))
    >>> rel_h                                                 # query row minus key row
    array([[ 0., -1.],
           [ 0., -1.],
           [ 1.,  0.],
           [ 1.,  0.]])
    >>> rel_w                                                 # 10 · (column minus column)
    array([[  0., -10.],
           [ 10.,   0.],
           [  0., -10.],
           [ 10.,   0.]])
    """
    xp = _checks.namespace(q=q, table_h=table_h, table_w=table_w)
    dtype = _checks.floating(xp, q=q, table_h=table_h, table_w=table_w)
    _checks.ndim("q", q, 2, "(..., Lq, d)")
    qgrid = _grid("query_grid", query_grid)
    kgrid = qgrid if key_grid is None else _grid("key_grid", key_grid)
    _tokens("q", q, "query_grid", qgrid, "Lq")
    d = q.shape[-1]
    _table("table_h", table_h, d)
    _table("table_w", table_w, d)
    return _terms(xp, dtype, q, table_h, table_w, qgrid, kgrid)


def _terms(
    xp: Any,
    dtype: Any,
    q: Any,
    table_h: Any,
    table_w: Any,
    qgrid: tuple[int, int],
    kgrid: tuple[int, int],
) -> tuple[Any, Any]:
    (qh, qw), (kh, kw) = qgrid, kgrid
    q = _checks.cast(xp, q, dtype)
    lead, d = tuple(q.shape[:-2]), q.shape[-1]
    gathered_h = _gathered(xp, _checks.cast(xp, table_h, dtype), qh, kh, device_of(q))
    gathered_w = _gathered(xp, _checks.cast(xp, table_w, dtype), qw, kw, device_of(q))
    grid = xp.reshape(q, (*lead, qh, qw, d))
    # rows: (..., qh, qw, d) @ (qh, d, kh), one product per query row
    rel_h = xp.reshape(grid @ xp.matrix_transpose(gathered_h), (*lead, qh * qw, kh))
    # columns: the query grid transposed to (..., qw, qh, d) @ (qw, d, kw)
    n = len(lead)
    swap = (*range(n), n + 1, n, n + 2)
    by_column = xp.permute_dims(grid, swap) @ xp.matrix_transpose(gathered_w)
    rel_w = xp.reshape(xp.permute_dims(by_column, swap), (*lead, qh * qw, kw))
    return rel_h, rel_w


def _gathered(xp: Any, table: Any, q_size: int, k_size: int, device: Any) -> Any:
    """``R[r(a, b)]`` for every query ``a`` and key ``b`` of one axis: ``(q, k, d)``."""
    resized = resize_relative_table(table, 2 * max(q_size, k_size) - 1)
    rows = xp.asarray(
        _distance_index(q_size, k_size), dtype=_checks.index_dtype(xp, device), device=device
    )
    return xp.reshape(xp.take(resized, rows, axis=0), (q_size, k_size, table.shape[-1]))


def decomposed_relative_attention(
    q: Array,
    k: Array,
    v: Array,
    table_h: Array,
    table_w: Array,
    *,
    query_grid: tuple[int, int],
    key_grid: tuple[int, int] | None = None,
    scale: Any = None,
    block_size: Any = None,
) -> Array:
    """Attention with MViTv2 / ViTDet / SAM decomposed relative positions.

    Parameters
    ----------
    q : array of shape (..., Lq, d), real floating
        Queries of a ``(qh, qw)`` grid flattened row-major (``Lq = qh·qw``).
        ``(B, H, Lq, d)``, ``(N, Lq, d)``, ``(Lq, d)`` or more leading
        dimensions.
    k : array of shape (..., Lk, d), real floating
        Keys of the ``(kh, kw)`` grid (``Lk = kh·kw``).
    v : array of shape (..., Lk, d_v), real floating
        Values. Leading dimensions of ``q``, ``k`` and ``v`` broadcast.
    table_h, table_w : arrays of shape (Wh, d) and (Ww, d), real floating
        The row and column tables (SAM's ``rel_pos_h``, ``rel_pos_w``),
        resized to ``2·max(q, k) - 1`` rows per axis where they have another
        width. Gradients reach both.
    query_grid : (int, int)
        ``(qh, qw)``.
    key_grid : (int, int), optional
        ``(kh, kw)``; ``query_grid`` by default.
    scale : float or 0-d array, optional
        Scale of ``q·kᵀ``, ``1/√d`` by default (SAM's ``head_dim ** -0.5``).
        The relative terms are not scaled.
    block_size : int or (int, int), optional
        Run blockwise with blocks of this size (memory ``O(L·(kh + kw))`` per
        head for the terms, no ``(Lq, Lk)`` array). ``None``: the call's plan
        chooses (:func:`relattn.explain`): the dense path with the whole
        ``(Lq, Lk)`` bias while it fits ``relattn.config.max_score_bytes``,
        else the block fold with the device's blocks.

    Returns
    -------
    array of shape (..., Lq, d_v)
        ``softmax((q·scale)·kᵀ + rel_h[i, ky(j)] + rel_w[i, kx(j)]) v``, with
        ``rel_h``, ``rel_w`` of :func:`decomposed_relative_terms`, ``ky(j) =
        j // kw`` and ``kx(j) = j % kw``, in the promoted input dtype.

    Raises
    ------
    ValueError
        If ``Lq != qh·qw`` or ``Lk != kh·kw``, a grid size is below 1, a table
        is not ``(W, d)`` with ``W >= 1``, shapes do not match (``q``/``k``
        feature size, ``k``/``v`` length, leading dimensions) or a block size
        is below 1.
    TypeError
        If an input is not a real floating array, a grid is not a pair of
        integers, ``scale`` is not a real number, or the arrays come from
        different libraries.

    See Also
    --------
    decomposed_relative_terms : The two per-axis terms.
    scaled_dot_product_attention : Attention with a bias or ``score_mod``.

    Notes
    -----
    Li et al. 2022 (MViTv2), §3.1; Li et al. 2022 (ViTDet) and Kirillov et al.
    2023 (SAM) ``Attention.forward``: ``attn = (q * scale) @ k.transpose(-2,
    -1)``, then ``add_decomposed_rel_pos(attn, q, rel_pos_h, rel_pos_w, (qh,
    qw), (kh, kw))`` with the unscaled ``q``, softmax, ``@ v``; equal to HF
    transformers' ``SamVisionAttention``. The two per-axis terms are the core's
    grid terms (:class:`relattn.problem.Problem`): each path forms
    ``rel_h[i, ky] + rel_w[i, kx]`` where it forms its scores, as one broadcast
    sum over the key grid's rows (the whole ``(Lq, Lk)`` bias on the dense
    path and the library's attention kernel, a block's slice of it in the
    fold), never an ``(Lq, Lk, d)`` array. Measured at a 64 × 64 grid
    (``L = 4096``, 4 heads, ``d = 64``, float32, 2 shared CPU cores,
    ``asv_bench/compare.py --only vision``) against SAM's code written
    natively, which builds the whole ``(B·H, L, L)`` scores: see
    ``docs/guide/decomposed.md``.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn.decomposed import decomposed_relative_attention
    >>> q = k = xp.zeros((4, 2))                              # a 2 × 2 grid
    >>> v = xp.reshape(xp.arange(8.0), (4, 2))
    >>> table = xp.zeros((3, 2))
    >>> decomposed_relative_attention(q, k, v, table, table, query_grid=(2, 2))
    array([[3., 4.],
           [3., 4.],
           [3., 4.],
           [3., 4.]])
    """
    xp = _checks.namespace(q=q, k=k, v=v, table_h=table_h, table_w=table_w)
    dtype = _checks.floating(xp, q=q, k=k, v=v, table_h=table_h, table_w=table_w)
    _checks.query_key(q, k)
    _checks.ndim("v", v, 2, "(..., Lk, d_v)")
    qgrid = _grid("query_grid", query_grid)
    kgrid = qgrid if key_grid is None else _grid("key_grid", key_grid)
    _tokens("q", q, "query_grid", qgrid, "Lq")
    _tokens("k", k, "key_grid", kgrid, "Lk")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v must have one row per key, Lk = {k.shape[-2]}, got v of shape {tuple(v.shape)}"
        )
    d = q.shape[-1]
    _table("table_h", table_h, d)
    _table("table_w", table_w, d)
    q, k, v = (_checks.cast(xp, a, dtype) for a in (q, k, v))  # the tables' dtype too
    p = problem.check(q, k, v, scale=scale, block_size=block_size)
    rel_h, rel_w = _terms(p.xp, p.dtype, q, table_h, table_w, qgrid, kgrid)
    # The per-axis terms are the core's grid terms: each plan forms them where it forms
    # its scores (the dense path's one broadcast sum, a block's columns in the fold).
    return core.attention(dataclasses.replace(p, grid_rows=rel_h, grid_cols=rel_w))
