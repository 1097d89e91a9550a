"""xPos: rotary position embedding with an exponential decay per frequency (Sun et al. 2022)."""

from __future__ import annotations

import math
import numbers
from typing import Any

from . import _checks
from ._namespace import device_of
from ._typing import Array
from .encodings import _working_dtype
from .rotary import rotary_position_embedding

__all__ = ["xpos_embedding"]


def xpos_embedding(
    x: Array,
    positions: Array = None,
    *,
    layout: str | None = None,
    downscale: bool = False,
    scale_base: float = 512.0,
    centre: float = 0.0,
    base: float = 10000.0,
    rotary_dim: int | None = None,
    frequencies: Array = None,
) -> Array:
    r"""Rotate queries or keys as RoPE does and scale each pair by ``ζ_k^(±(n - centre)/γ)``.

    Parameters
    ----------
    x : array of shape (..., L, d), real floating
        Queries (``downscale=False``) or keys (``downscale=True``).
    positions : array of shape (L,) or (..., L), integer or real floating, optional
        Position ``n`` of each row (default ``0 … L-1``); as in
        :func:`rotary_position_embedding`. A decode step passes the queries'
        own positions, ``Lk - Lq + arange(Lq)``, and the cached keys keep
        theirs, ``arange(Lk)``.
    layout : {"concatenated", "interleaved"}
        Required: which features form a pair, as in
        :func:`rotary_position_embedding`. The authors' torchscale and
        rotary-embedding-torch use ``"interleaved"``.
    downscale : bool, optional
        ``False``: multiply pair ``k`` by ``ζ_k^((n - centre)/γ)`` (queries);
        ``True``: by ``ζ_k^(-(n - centre)/γ)`` (keys).
    scale_base : float, optional
        ``γ`` (512 in the paper and in torchscale), ``> 0``.
    centre : float, optional
        The position where the scale is 1. Queries and keys must use the same
        centre; then ``q·k`` depends on the positions' difference only, and
        the centre keeps ``ζ^(n/γ)`` away from under- and overflow in long
        sequences (torchscale centres at ``⌈(L + offset)/2⌉``).
    base : float, optional
        As in :func:`rotary_position_embedding`.
    rotary_dim : int, optional
        As in :func:`rotary_position_embedding`; the scales apply to the
        ``r = rotary_dim`` rotated features only.
    frequencies : array of shape (r/2,), real floating, optional
        As in :func:`rotary_position_embedding`.

    Returns
    -------
    array, shape and dtype of ``x``
        ``RoPE(x, n)`` with pair ``k`` multiplied by ``ζ_k^(±(n - centre)/γ)``,
        ``ζ_k = (2k + 0.4 r) / (1.4 r)``, ``k = 0 … r/2 - 1``.

    Raises
    ------
    ValueError
        As :func:`rotary_position_embedding`, or if ``scale_base`` is not a
        positive finite number or ``centre`` not a finite one.
    TypeError
        As :func:`rotary_position_embedding`, or if ``downscale`` is not a
        bool.

    See Also
    --------
    rotary_position_embedding : The rotation, which xPos scales.
    scaled_dot_product_attention : Attention on the embedded queries and keys.

    Notes
    -----
    Sun et al. 2022, *A Length-Extrapolatable Transformer* (ACL 2023), §3.2:
    with ``ζ_k = (k/(d/2) + γ')/(1 + γ')``, ``γ' = 0.4``,

    .. math::

        \tilde q_n = ζ^{n/γ}\, \mathrm{RoPE}(q, n), \quad
        \tilde k_m = ζ^{-m/γ}\, \mathrm{RoPE}(k, m), \quad
        \tilde q_n^\top \tilde k_m = \sum_k ζ_k^{(n - m)/γ} \ldots,

    so that the score decays with ``n - m`` per frequency: the same
    ``ζ = (2k + 0.4 d)/(1.4 d)`` as torchscale's ``XPOS`` and
    rotary-embedding-torch. The powers are formed in float64 where the
    device has it, then cast to ``x``'s dtype. With a cache, queries and keys
    are scaled at their own positions about one centre: rotary-embedding-torch
    0.9.1's ``rotate_queries_with_cached_keys`` centres the queries at
    ``Lq // 2`` and the keys at ``Lk // 2``, so that its scores differ from
    the full computation's by ``ζ_k^((Lk//2 - Lq//2)/γ)`` per pair.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn import xpos_embedding
    >>> x = np.ones((1, 4))                  # d = 4: ζ = (1.6/5.6, 3.6/5.6)
    >>> no_rotation = np.zeros(2)            # θ = 0: the scales alone, at n = γ = 512
    >>> xpos_embedding(x, np.array([512]), layout="interleaved", frequencies=no_rotation)
    array([[0.28571429, 0.28571429, 0.64285714, 0.64285714]])
    >>> xpos_embedding(x, np.array([512]), layout="interleaved", frequencies=no_rotation,
    ...                downscale=True).round(4)
    array([[3.5   , 3.5   , 1.5556, 1.5556]])
    """
    downscale = _checks.flag("downscale", downscale)
    gamma = _real("scale_base", scale_base, positive=True)
    centre = _real("centre", centre, positive=False)
    rotated = rotary_position_embedding(
        x, positions, base=base, layout=layout, rotary_dim=rotary_dim, frequencies=frequencies
    )
    xp = _checks.namespace(x=x)
    d = x.shape[-1]
    r = d if rotary_dim is None else rotary_dim
    if r == 0:
        return rotated
    half = r // 2
    device = device_of(x)
    work = _working_dtype(xp, device)
    if positions is None:
        positions = xp.arange(x.shape[-2], device=device)
    else:
        positions = _checks.cast_integer(xp, positions)
    sign = -1.0 if downscale else 1.0
    power = (xp.astype(positions, work) - centre) * (sign / gamma)  # (..., L)
    log_zeta = [math.log((2 * k + 0.4 * r) / (1.4 * r)) for k in range(half)]
    zeta = xp.asarray(log_zeta, dtype=work, device=device)
    scale = xp.astype(xp.exp(power[..., None] * zeta), x.dtype)  # (..., L, r/2)
    if layout == "interleaved":
        scale = xp.reshape(xp.stack((scale, scale), axis=-1), (*scale.shape[:-1], r))
    else:
        scale = xp.concat((scale, scale), axis=-1)
    if r == d:
        return rotated * scale
    return xp.concat((rotated[..., :r] * scale, rotated[..., r:]), axis=-1)


def _real(name: str, value: Any, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or (positive and value <= 0):
        what = "a positive finite number" if positive else "a finite number"
        raise ValueError(f"{name} must be {what}, got {value}")
    return value
