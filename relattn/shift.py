"""The shifted relative-score algorithm (Transformer-XL, appendix B).

Scores against a relative table come out in the relative layout
``(..., Lq, W)``, row ``i`` holding every distance; attention needs them per key,
``(..., Lq, Lk)``. Row ``i`` of the result is row ``i`` of the input moved left
by ``Lq - 1 - i`` columns. Both directions are done with pad, reshape and slice
(a flat view with row stride ``W - 1``), never with a gather, so the cost is one
``O(Lq·W)`` copy at most (none for ``rel_shift`` of a contiguous full-layout
array where the library returns views).
"""

from __future__ import annotations

from typing import Any

from . import _checks
from ._memo import memo
from ._namespace import device_of
from ._typing import Array
from .backends import backend_for

__all__ = ["rel_shift", "rel_unshift"]


def extend(x: Any, axis: int, before: int, after: int, xp: Any, fill: float = 0.0) -> Any:
    """``x`` with ``before`` and ``after`` cells of ``fill`` added along ``axis`` (negative).

    One ``concat`` with constant blocks: cheaper per call than a general pad (which
    small decode-size calls feel), and plain to every tracer.
    """
    if not (before or after):
        return x
    dtype, device, dims = x.dtype, device_of(x), tuple(x.shape)  # torch.Size slices are slow
    backend = backend_for(xp)
    eager = backend.has_values(x)

    def block(size: int) -> Any:
        shape = (*dims[:axis], size, *dims[axis:][1:])
        made = memo(
            xp, eager, ("fill", shape, fill, dtype, device),
            lambda: xp.full(shape, fill, dtype=dtype, device=device),
        )  # fmt: skip
        return backend.join(made, x)  # a DTensor x takes a replicated block

    pieces = [block(before)] if before else []
    pieces.append(x)
    if after:
        pieces.append(block(after))
    return xp.concat(pieces, axis=axis)


def shift(x: Any, key_length: int, xp: Any, *, fill: float = 0.0) -> Any:
    """:func:`rel_shift` without argument checks.

    ``x.shape[-1]`` is at most ``Lq + Lk - 1``: the full layout, or a prefix of
    it (the causal layout, width ``Lk``, or a block's slice that stops at
    ``δ = 0``). ``fill`` is the value of the absent columns: ``-inf`` turns the
    result into a causally masked additive bias, so that the caller needs no
    boolean mask and no separate masking pass.
    """
    *batch, lq, width = x.shape
    if lq == 0 or key_length == 0:
        return xp.reshape(x[..., :0], (*batch, lq, key_length))
    full = lq + key_length - 1
    given = x
    if width != full:
        x = extend(x, -1, 0, full - width, xp, fill)
    if lq == 1:
        return backend_for(xp).rechunk_like(x, given)
    # Element [i, j - i + Lq - 1] sits at flat index i·(W - 1) + j + Lq - 1.
    flat = xp.reshape(x, (*batch, lq * full))
    flat = flat[..., lq - 1 : lq - 1 + lq * (full - 1)]
    out = xp.reshape(flat, (*batch, lq, full - 1))[..., :key_length]
    # Chunked libraries (Dask): the chunks of ``x`` again, not those the flat reshape left.
    return backend_for(xp).rechunk_like(out, given)


def unshift(x: Any, xp: Any) -> Any:
    """:func:`rel_unshift` without argument checks."""
    *batch, lq, lk = x.shape
    full = lq + lk - 1
    if lq == 0 or lk == 0:
        # No pair: every column of the relative layout is zero (or there is no row).
        shape = (*batch, lq, max(full, 0))
        return xp.zeros(shape, dtype=x.dtype, device=device_of(x))
    if lq == 1:
        return x
    # Inverse of ``shift`` with a single padded copy: with one zero row above and
    # below and rows widened to W - 1, x[i, j] sits at flat (i + 1)·(W - 1) + j,
    # which is Lk - 1 + i·W + (j - i + Lq - 1): read rows of stride W from there.
    padded = extend(extend(x, -1, 0, lq - 2, xp), -2, 1, 1, xp)
    flat = xp.reshape(padded, (*batch, (lq + 2) * (full - 1)))
    out = xp.reshape(flat[..., lk - 1 : lk - 1 + lq * full], (*batch, lq, full))
    return backend_for(xp).rechunk_like(out, x)


def rel_shift(x: Array, key_length: int) -> Array:
    """Move scores from the relative layout to one column per key.

    Parameters
    ----------
    x : array of shape (..., Lq, W)
        Scores in the relative layout: column ``m`` belongs to distance
        ``δ = m - (Lk - 1)``. ``W = Lq + Lk - 1`` (full layout) or ``W = Lk``
        (causal layout, ``δ <= 0`` only). Any dtype.
    key_length : int
        ``Lk >= 1``, the number of keys (memory included).

    Returns
    -------
    array of shape (..., Lq, Lk), dtype of ``x``
        ``out[..., i, j] = x[..., i, j - i + Lq - 1]``; zero where that column
        is absent (``δ > 0`` in the causal layout). A view of ``x`` where the
        library allows it.

    Raises
    ------
    ValueError
        If ``x`` has fewer than 2 dimensions or ``W`` fits neither layout.
    TypeError
        If ``x`` is not an array or ``key_length`` is not an integer.

    Notes
    -----
    Dai et al. 2019, appendix B: row ``i`` of the result is row ``i`` of the
    relative scores from column ``Lq - 1 - i`` on. With row stride ``W - 1`` the
    element wanted for ``(i, j)`` sits at flat offset ``Lq - 1 + i·(W-1) + j``,
    so a reshape and two slices replace a gather.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import rel_shift, relative_distances
    >>> x = xp.stack([relative_distances(2, 3, xp=xp)] * 2)   # each cell holds its δ
    >>> rel_shift(x, 3)
    array([[-1,  0,  1],
           [-2, -1,  0]])
    """
    xp = _checks.namespace(x=x)
    _checks.ndim("x", x, 2, "(..., Lq, W)")
    lk = _checks.length("key_length", key_length, minimum=0)
    lq, width = x.shape[-2:]
    if width not in (lq + lk - 1, lk):
        raise ValueError(
            f"x must have width W = Lq + Lk - 1 = {lq + lk - 1} (full layout) or "
            f"Lk = {lk} (causal layout) for Lq = {lq}, Lk = {lk}, got W = {width}"
        )
    return shift(x, lk, xp)


def rel_unshift(x: Array) -> Array:
    """Move per-key values back to the relative layout (inverse of :func:`rel_shift`).

    Parameters
    ----------
    x : array of shape (..., Lq, Lk)
        One column per key, e.g. attention weights. Any dtype.

    Returns
    -------
    array of shape (..., Lq, Lq + Lk - 1), dtype of ``x``
        ``out[..., i, j - i + Lq - 1] = x[..., i, j]``: column ``m`` belongs
        to distance ``δ = m - (Lk - 1)``; columns no key of row ``i`` reaches
        are zero.

    Raises
    ------
    ValueError
        If ``x`` has fewer than 2 dimensions.
    TypeError
        If ``x`` is not an array.

    Notes
    -----
    Lets a relative *value* table act without an ``(Lq, Lk, d)`` tensor:
    ``Σ_j α_ij a^V_ij = rel_unshift(α) @ T_V`` (Shaw et al. 2018, eq. (3)).
    ``rel_shift(rel_unshift(x), Lk) == x``.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import rel_unshift
    >>> rel_unshift(xp.asarray([[1, 2], [3, 4]]))
    array([[0, 1, 2],
           [3, 4, 0]])
    """
    xp = _checks.namespace(x=x)
    _checks.ndim("x", x, 2, "(..., Lq, Lk)")
    return unshift(x, xp)
