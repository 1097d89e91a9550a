"""Attention score functions ``e_ij``."""

from __future__ import annotations

from typing import Any

from . import _checks
from .shift import shift

__all__ = ["relative_scores"]


def check_table(name: str, table: Any, lq: int, lk: int, d: int) -> int:
    """``table`` is ``(..., W, d)`` in the causal or full layout; return ``W``."""
    _checks.ndim(name, table, 2, "(..., W, d)")
    width, table_d = table.shape[-2:]
    if width not in (lk, lq + lk - 1):
        raise ValueError(
            f"{name} must have W = Lk = {lk} rows (causal layout) or W = Lq + Lk - 1 = "
            f"{lq + lk - 1} rows (full layout), got W = {width}"
        )
    if table_d != d:
        raise ValueError(
            f"{name} must have the feature size of q, d = {d}, got shape {tuple(table.shape)}"
        )
    return width


def relative_scores(q: Any, table: Any, key_length: int, *, bias: Any = None) -> Any:
    """Query–position scores, one column per key: ``rel_shift((q + bias) tableᵀ, Lk)``.

    Parameters
    ----------
    q : array of shape (..., Lq, d), real floating
        Queries.
    table : array of shape (..., W, d), real floating
        Position representations in the relative layout (row ``m`` for
        ``δ = m - (Lk - 1)``), ``W = Lk`` (causal) or ``Lq + Lk - 1`` (full).
        Leading dimensions broadcast with those of ``q``.
    key_length : int
        ``Lk >= 1``.
    bias : array, real floating, optional
        Added to every query first (Transformer-XL's position bias ``v``);
        broadcastable to ``q``.

    Returns
    -------
    array of shape (..., Lq, Lk)
        ``out[..., i, j] = (q_i + bias) · table[δ(i, j) + Lk - 1]``; zero for
        ``δ > 0`` in the causal layout. Unscaled.

    Raises
    ------
    ValueError
        If ``table``'s width fits neither layout, or feature sizes or leading
        dimensions do not match.
    TypeError
        If an input is not real floating, a length is not an integer, or the
        arrays come from different libraries.

    Notes
    -----
    Terms (b) and (d) of Dai et al. 2019, section 3.3, with the shift of
    appendix B; Shaw et al. 2018's key term ``x_i W^Q (a^K_ij)ᵀ`` (eq. (5))
    with ``table = relative_table(w^K, Lq, Lk)``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> from relattn import relative_scores, relative_distances
    >>> table = xp.astype(relative_distances(2, 2, xp=xp), xp.float64)[:, None]   # δ itself
    >>> relative_scores(xp.ones((2, 1)), table, 2)
    Array([[ 0.,  1.],
           [-1.,  0.]], dtype=array_api_strict.float64)
    """
    xp = _checks.namespace(q=q, table=table, bias=bias)
    dtype = _checks.floating(xp, q=q, table=table, bias=bias)
    _checks.ndim("q", q, 2, "(..., Lq, d)")
    lk = _checks.length("key_length", key_length)
    lq, d = q.shape[-2:]
    check_table("table", table, lq, lk, d)
    _checks.broadcast(q=q.shape[:-2], table=table.shape[:-2])
    if bias is not None:
        _checks.broadcastable("bias", bias.shape, tuple(q.shape), "q")
    q, table, bias = (_checks.cast(xp, a, dtype) for a in (q, table, bias))
    if bias is not None:
        q = q + bias
    return shift(q @ xp.matrix_transpose(table), lk, xp)
