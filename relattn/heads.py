"""Splitting features into attention heads and merging them back."""

from __future__ import annotations

from . import _checks
from ._typing import Array

__all__ = ["merge_heads", "split_heads"]


def split_heads(x: Array, num_heads: int) -> Array:
    """Split the feature axis into heads: ``(..., L, H·d_head) -> (..., H, L, d_head)``.

    Parameters
    ----------
    x : array of shape (..., L, H·d_head)
        Projected sequence, any dtype.
    num_heads : int
        ``H >= 1``; must divide the last dimension.

    Returns
    -------
    array of shape (..., H, L, d_head), dtype of ``x``
        Head ``h`` holds features ``h·d_head … (h+1)·d_head - 1``.

    Raises
    ------
    ValueError
        If ``x`` has fewer than 2 dimensions or ``num_heads`` does not divide
        its last dimension.
    TypeError
        If ``x`` is not an array or ``num_heads`` not an integer.

    Notes
    -----
    ``head_i`` of Vaswani et al. 2017, section 3.2.2, in the
    ``(batch, heads, length, head dim)`` layout of
    ``torch.nn.functional.scaled_dot_product_attention``.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import split_heads
    >>> split_heads(xp.zeros((2, 5, 12)), 3).shape
    (2, 3, 5, 4)
    """
    xp = _checks.namespace(x=x)
    _checks.ndim("x", x, 2, "(..., L, H·d_head)")
    heads = _checks.length("num_heads", num_heads)
    *batch, length, features = x.shape
    if features % heads:
        raise ValueError(
            f"num_heads must divide the last dimension of x, got num_heads = {heads} "
            f"for x of shape {tuple(x.shape)}"
        )
    x = xp.reshape(x, (*batch, length, heads, features // heads))
    return xp.permute_dims(x, (*range(len(batch)), x.ndim - 2, x.ndim - 3, x.ndim - 1))


def merge_heads(x: Array) -> Array:
    """Concatenate heads: ``(..., H, L, d_head) -> (..., L, H·d_head)``.

    Parameters
    ----------
    x : array of shape (..., H, L, d_head)
        Per-head outputs, any dtype.

    Returns
    -------
    array of shape (..., L, H·d_head), dtype of ``x``
        ``Concat(head_1, …, head_H)``; the inverse of :func:`split_heads`.

    Raises
    ------
    ValueError
        If ``x`` has fewer than 3 dimensions.
    TypeError
        If ``x`` is not an array.

    Notes
    -----
    Vaswani et al. 2017, section 3.2.2, before the output projection ``Wᴼ``.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import merge_heads
    >>> merge_heads(xp.zeros((2, 3, 5, 4))).shape
    (2, 5, 12)
    """
    xp = _checks.namespace(x=x)
    _checks.ndim("x", x, 3, "(..., H, L, d_head)")
    *batch, heads, length, d_head = x.shape
    nb = len(batch)
    x = xp.permute_dims(x, (*range(nb), nb + 1, nb, nb + 2))
    return xp.reshape(x, (*batch, length, heads * d_head))
