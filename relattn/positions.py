"""Relative distances, the relative layout, and relative tables.

Convention (relattn everywhere): query ``i`` sits at key position
``i + offset`` with ``offset = Lk - Lq``, and the relative distance is
``δ(i, j) = j - (i + offset)``, key minus query: ``δ < 0`` means the key is in
the past. The *relative layout* of a ``(Lq, Lk)`` problem enumerates every
distance once, ascending: column ``m`` holds ``δ = m - (Lk - 1)`` for
``m = 0 … Lq + Lk - 2`` (the full layout, width ``Lq + Lk - 1``); the causal
layout keeps ``δ <= 0`` only (width ``Lk``).
"""

from __future__ import annotations

from typing import Any

from . import _checks
from ._namespace import device_of, is_array
from ._typing import Array, Namespace

__all__ = ["relative_distances", "relative_positions", "relative_table"]

OUT_OF_RANGE = ("clip", "zero")


def _start(name: str, value: Any) -> Any:
    """A block's start: a Python integer, or a traced/0-d integer array (under a jit)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool")
    if is_array(value):
        if getattr(value, "ndim", None) != 0:
            raise ValueError(f"{name} must be a scalar, got shape {tuple(value.shape)}")
        return value
    return _checks.length(name, value, minimum=0)


def _is_zero(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value == 0


def _offsets(
    query_length: int, key_length: int, query_start: Any, key_start: Any, offset: Any
) -> tuple[Any, Any, Any]:
    """Checked ``(query_start, key_start, offset)``; ``offset`` defaults to ``Lk - Lq``."""
    query_start = _start("query_start", query_start)
    key_start = _start("key_start", key_start)
    if offset is None:
        offset = key_length - query_length
    elif isinstance(offset, bool) or not isinstance(offset, int):
        offset = _start("offset", offset)
    return query_start, key_start, offset


def relative_distances(
    query_length: int,
    key_length: int,
    *,
    causal: bool = False,
    query_start: Any = 0,
    key_start: Any = 0,
    offset: Any = None,
    xp: Namespace = None,
    device: Any = None,
) -> Array:
    """The distance ``δ`` held by each column of the relative layout (of a problem or a block).

    Parameters
    ----------
    query_length, key_length : int
        ``Lq`` and ``Lk``, both ``>= 0``. With ``Lk > Lq`` the first
        ``Lk - Lq`` keys are memory preceding the queries.
    causal : bool, optional
        Keep only ``δ <= 0`` (the causal layout, width ``Lk``). Default: the
        full layout, width ``Lq + Lk - 1``. Not with a block's starts.
    query_start, key_start : int or 0-d integer array, optional
        Position of the first query and of the first key of a block of a
        larger problem (default 0; traced integers are allowed under a jit).
    offset : int or 0-d integer array, optional
        The larger problem's alignment ``Lk_total - Lq_total`` (query ``i``
        sits at key position ``i + offset``); default ``Lk - Lq``.
    xp : module, optional
        Array library of the result (default NumPy).
    device : device, optional
        Device of the result.

    Returns
    -------
    array of shape (W,), default integer dtype
        ``-(Lk - 1), …, Lq - 1`` (full) or ``-(Lk - 1), …, 0`` (causal),
        ascending. Unit: token positions, key minus query. For a block: the
        ``Lq + Lk - 1`` distances from ``key_start - (query_start + Lq - 1 +
        offset)`` on, the columns of the larger problem's relative layout that
        the block's pairs use.

    Raises
    ------
    ValueError
        If a length or start is negative, or ``causal`` comes with starts.
    TypeError
        If a length or start is not an integer, or ``causal`` is not a bool.

    See Also
    --------
    relative_positions : The distance of every query–key pair.
    relative_table : A clipped table expanded over these distances.

    Notes
    -----
    The ``2T - 1`` distances of a length-``T`` self-attention (Shaw et al.
    2018, section 3; Dai et al. 2019, appendix B); Transformer-XL encodes
    ``-δ``. A block of queries ``[i0, i0 + bq)`` and keys ``[j0, j0 + bk)``
    uses ``bq + bk - 1`` contiguous columns of its problem's layout (Dao et al.
    2022's blocks, in relattn's relative layout).

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import relative_distances
    >>> relative_distances(2, 3, xp=xp)
    array([-2, -1,  0,  1])
    >>> relative_distances(2, 3, causal=True, xp=xp)
    array([-2, -1,  0])
    >>> relative_distances(2, 2, query_start=4, key_start=0, offset=0, xp=xp)   # a block
    array([-5, -4, -3])
    """
    xp = _checks.creation_namespace(xp)
    lq = _checks.length("query_length", query_length, minimum=0)
    lk = _checks.length("key_length", key_length, minimum=0)
    if _checks.flag("causal", causal):
        if not (_is_zero(query_start) and _is_zero(key_start) and offset is None):
            raise ValueError(
                "causal=True gives a whole problem's causal layout: it takes no starts"
            )
        return xp.arange(-(lk - 1), 1, device=device)
    query_start, key_start, offset = _offsets(lq, lk, query_start, key_start, offset)
    smallest = key_start - (query_start + lq - 1 + offset)
    return xp.arange(max(lq + lk - 1, 0), device=device) + smallest


def relative_positions(
    query_length: int,
    key_length: int,
    *,
    query_start: Any = 0,
    key_start: Any = 0,
    offset: Any = None,
    xp: Namespace = None,
    device: Any = None,
) -> Array:
    """Relative distance ``δ(i, j) = j - (i + Lk - Lq)`` of every query–key pair.

    Parameters
    ----------
    query_length, key_length : int
        ``Lq`` and ``Lk``, both ``>= 0``.
    query_start, key_start : int or 0-d integer array, optional
        Position of the first query and of the first key of a block of a
        larger problem (default 0; traced integers are allowed under a jit).
    offset : int or 0-d integer array, optional
        The larger problem's alignment ``Lk_total - Lq_total``; default
        ``Lk - Lq``.
    xp : module, optional
        Array library of the result (default NumPy).
    device : device, optional
        Device of the result.

    Returns
    -------
    array of shape (Lq, Lk), default integer dtype
        Entry ``[i, j]`` is key position minus query position:
        ``(key_start + j) - (query_start + i + offset)``.

    Raises
    ------
    ValueError
        If a length or start is negative.
    TypeError
        If a length or start is not an integer.

    See Also
    --------
    relative_distances : One distance per column of the relative layout.
    causal_mask : ``δ <= 0``.

    Notes
    -----
    Shaw et al. 2018, eq. (3)–(4) index relative representations by
    ``j - i``; relattn aligns the last query with the last key when
    ``Lk > Lq`` (Transformer-XL memory).

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import relative_positions
    >>> relative_positions(2, 3, xp=xp)
    array([[-1,  0,  1],
           [-2, -1,  0]])
    >>> relative_positions(2, 2, query_start=2, key_start=0, offset=0, xp=xp)   # a block
    array([[-2, -1],
           [-3, -2]])
    """
    xp = _checks.creation_namespace(xp)
    lq = _checks.length("query_length", query_length, minimum=0)
    lk = _checks.length("key_length", key_length, minimum=0)
    query_start, key_start, offset = _offsets(lq, lk, query_start, key_start, offset)
    keys = xp.arange(lk, device=device) + key_start
    queries = xp.arange(lq, device=device) + (query_start + offset)
    return keys[None, :] - queries[:, None]


def clip_radius(name: str, radius: Any, rows: int) -> tuple[int, int]:
    """``(K_past, K_future)`` of a clipped table of ``rows`` rows, from ``radius``.

    ``None``: symmetric, ``rows = 2K + 1``. An int ``K``: the same, checked. A
    pair ``(K_past, K_future)``: ``rows = K_past + K_future + 1``, row
    ``δ + K_past`` for ``-K_past <= δ <= K_future`` (WeNet clips at ``-64 … 8``).
    """
    if radius is None:
        if rows % 2 == 0:
            raise ValueError(
                f"{name} must have an odd number 2K+1 of rows (distances -K … K), got {rows} "
                "rows (pass radius=(K_past, K_future) for an asymmetric table)"
            )
        return rows // 2, rows // 2
    if isinstance(radius, (tuple, list)):
        if len(radius) != 2:
            raise ValueError(
                f"radius must be an int K or a pair (K_past, K_future), got {radius!r}"
            )
        past = _checks.length("radius[0] (K_past)", radius[0], minimum=0)
        future = _checks.length("radius[1] (K_future)", radius[1], minimum=0)
    else:
        past = future = _checks.length("radius", radius, minimum=0)
    if rows != past + future + 1:
        raise ValueError(
            f"{name} must have K_past + K_future + 1 = {past + future + 1} rows for "
            f"radius = {radius!r}, got {rows}"
        )
    return past, future


def relative_table(
    table: Array,
    query_length: int,
    key_length: int,
    *,
    causal: bool = False,
    out_of_range: str = "clip",
    radius: Any = None,
) -> Array:
    """Expand a clipped table of ``2K + 1`` distances to the relative layout.

    Parameters
    ----------
    table : array of shape (..., 2K+1, d)
        Row ``δ + K`` holds the representation of distance ``δ``,
        ``-K <= δ <= K`` (Shaw et al.'s ``w_{-K} … w_K``). Any dtype.
    query_length, key_length : int
        ``Lq`` and ``Lk``, both ``>= 0``.
    causal : bool, optional
        Produce the causal layout (width ``Lk``) instead of the full one.
    out_of_range : {"clip", "zero"}, optional
        ``"clip"``: distances beyond ``±K`` share the edge row (Shaw et al.
        2018, eq. (3)–(4)). ``"zero"``: they get a zero row (Music
        Transformer's relative embeddings, Huang et al. 2018).
    radius : int or (int, int), optional
        ``K``, or ``(K_past, K_future)`` for an asymmetric table of
        ``K_past + K_future + 1`` rows, row ``δ + K_past`` for
        ``-K_past <= δ <= K_future``. Default: symmetric, from the rows.

    Returns
    -------
    array of shape (..., W, d), dtype of ``table``
        Row ``m`` is the representation of ``δ = m - (Lk - 1)``;
        ``W = Lq + Lk - 1``, or ``Lk`` with ``causal``.

    Raises
    ------
    ValueError
        If the table has fewer than 2 dimensions, a number of rows that does
        not fit ``radius`` (an even number without it), a length or radius is
        negative, or ``out_of_range`` is unknown.
    TypeError
        If ``table`` is not an array, a length or radius is not an integer,
        or ``causal`` is not a bool.

    See Also
    --------
    relative_distances : The distance ``δ`` of each row of the result.
    shaw_attention : Attention with such tables on keys and values.
    rel_shift : Moves scores against the result to key columns.

    Notes
    -----
    ``O(W·d)``: one gather of ``W`` rows, never one per ``(i, j)`` pair
    (Shaw et al. 2018, eq. (3)–(4): ``a_ij = w_clip(j - i, K)`` depends on
    ``j - i`` alone). Shift scores computed against it with
    :func:`relattn.rel_shift`.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import relative_table
    >>> table = xp.reshape(xp.arange(1.0, 4.0), (3, 1))   # rows for δ = -1, 0, 1
    >>> relative_table(table, 2, 3)[:, 0]                  # δ = -2 … 1
    array([1., 1., 2., 3.])
    >>> relative_table(table, 2, 3, out_of_range="zero")[:, 0]
    array([0., 1., 2., 3.])
    >>> relative_table(table, 2, 3, radius=(2, 0))[:, 0]   # rows for δ = -2, -1, 0
    array([1., 2., 3., 3.])
    """
    xp = _checks.namespace(table=table)
    _checks.ndim("table", table, 2, "(..., 2K+1, d)")
    _checks.choice("out_of_range", out_of_range, OUT_OF_RANGE)
    past, future = clip_radius("table", radius, table.shape[-2])
    device = device_of(table)
    delta = relative_distances(query_length, key_length, causal=causal, xp=xp, device=device)
    expanded = xp.take(table, xp.clip(delta, -past, future) + past, axis=table.ndim - 2)
    if out_of_range == "zero":
        inside = (delta >= -past) & (delta <= future)
        expanded = xp.where(inside[:, None], expanded, xp.zeros_like(expanded))
    return expanded
