"""Luong et al. 2015's local attention (section 3.2).

Local-m keeps the keys within ``D`` of the aligned position: that is the mask
:func:`relattn.local_window_mask`. Local-p predicts a real position ``p_i`` per
query (:func:`predicted_positions`) and weights the keys around it by a
Gaussian (:func:`local_p_weights`).
"""

from __future__ import annotations

import numbers
from typing import Any

from . import _checks
from ._activations import sigmoid
from ._namespace import device_of, is_array
from ._typing import Array
from .core import softmax
from .problem import check_mask

__all__ = ["local_p_weights", "predicted_positions"]


def predicted_positions(q: Array, weight: Array, v: Array, key_length: Any) -> Array:
    """Luong's local-p aligned positions ``p_i = S · sigmoid(v_pᵀ tanh(W_p q_i))``.

    Parameters
    ----------
    q : array of shape (..., Lq, d), real floating
        Queries (Luong's target hidden states ``h_t``).
    weight : array of shape (d, d_p), real floating
        ``W_p`` transposed (it acts as ``q @ weight``).
    v : array of shape (d_p,), real floating
        ``v_p``.
    key_length : int or array
        ``S``, Luong's source sentence length: an int ``>= 1`` (the key length
        ``Lk``), or a real or integer array broadcastable to ``(..., Lq)``,
        e.g. ``lengths[:, None]`` for per-sentence lengths ``(B,)`` in a padded
        batch.

    Returns
    -------
    array of shape (..., Lq), real floating
        ``p_i`` in ``[0, S]``, in key-position units (key ``j`` sits at ``j``),
        in the promoted dtype of ``q``, ``weight``, ``v`` (and a floating
        ``key_length``). Differentiable: Luong train ``W_p`` and ``v_p``
        through the Gaussian of :func:`local_p_weights`.

    Raises
    ------
    ValueError
        If ``q`` has fewer than 2 dimensions, ``weight`` or ``v`` has the
        wrong shape, an int ``key_length`` is below 1, or an array
        ``key_length`` does not broadcast to ``(..., Lq)``.
    TypeError
        If an input is not a real floating array, ``key_length`` is neither
        an integer nor a real or integer array, or the arrays come from
        different libraries.

    Notes
    -----
    Luong et al. 2015, section 3.2, eq. (9): ``p_t = S · sigmoid(v_pᵀ
    tanh(W_p h_t))``, "S is the source sentence length", so ``p_t ∈ [0, S]``.
    The sigmoid is evaluated as ``(1 + tanh(x/2))/2``, which never overflows.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import predicted_positions
    >>> predicted_positions(xp.ones((2, 4)), xp.zeros((4, 3)), xp.ones(3), 6)   # 6 · sigmoid(0)
    array([3., 3.])
    """
    length_array = not isinstance(key_length, numbers.Integral) and is_array(key_length)
    if length_array:
        xp = _checks.namespace(q=q, weight=weight, v=v, key_length=key_length)
        if not xp.isdtype(key_length.dtype, ("real floating", "integral")):
            raise TypeError(
                f"key_length must be an integer or a real or integer array, "
                f"got dtype {key_length.dtype}"
            )
        floating_length = key_length if xp.isdtype(key_length.dtype, "real floating") else None
        dtype = _checks.floating(xp, q=q, weight=weight, v=v, key_length=floating_length)
    else:
        xp = _checks.namespace(q=q, weight=weight, v=v)
        dtype = _checks.floating(xp, q=q, weight=weight, v=v)
        key_length = _checks.length("key_length", key_length)
    _checks.ndim("q", q, 2, "(..., Lq, d)")
    _checks.ndim("weight", weight, 2, "(d, d_p)")
    d_p = weight.shape[-1]
    _checks.exact_shape("weight", weight, (q.shape[-1], d_p), "(d, d_p)")
    _checks.exact_shape("v", v, (d_p,), "(d_p,)")
    if length_array:
        _checks.broadcastable(
            "key_length", tuple(key_length.shape), tuple(q.shape[:-1]), "(..., Lq)"
        )
        key_length = _checks.cast(xp, key_length, dtype)
    q, weight, v = (_checks.cast(xp, a, dtype) for a in (q, weight, v))
    return key_length * sigmoid(xp.tanh(q @ weight) @ v, xp)


def local_p_weights(scores: Array, positions: Array, window: int, *, mask: Array = None) -> Array:
    """Luong's local-p attention weights: a windowed softmax times a Gaussian.

    Parameters
    ----------
    scores : array of shape (..., Lq, Lk), real floating
        Scores ``e_ij`` from any score function (Luong use dot, general or
        concat).
    positions : array of shape (..., Lq), real floating
        Aligned positions ``p_i`` in key units (key ``j`` sits at ``j``), e.g.
        from :func:`predicted_positions`. Leading dimensions broadcast with
        those of ``scores``.
    window : int
        Half-width ``D >= 0``: query ``i`` attends to the keys with
        ``|j - p_i| <= D``.
    mask : array, bool, optional
        ``True`` = may attend, broadcastable to the weights ``(..., Lq, Lk)``
        (e.g. a padding mask); combined with the window.

    Returns
    -------
    array of shape (..., Lq, Lk)
        ``softmax_j(e_ij over the window) · exp(-(j - p_i)² / (2σ²))``,
        ``σ = D/2``, in the promoted input dtype; 0 outside the window. A
        query whose window holds no key (``p_i`` beyond the keys) gets a zero
        row, never NaN. The rows do not sum to 1 (Luong's Gaussian is not
        renormalised).

    Raises
    ------
    ValueError
        If ``scores`` has fewer than 2 or ``positions`` fewer than 1
        dimensions, ``positions`` has not one entry per query, leading
        dimensions do not broadcast, ``mask`` does not broadcast to the
        weights, or ``window`` is negative.
    TypeError
        If ``scores`` or ``positions`` is not real floating, ``mask`` is not
        boolean, ``window`` is not an integer, or the arrays come from
        different libraries.

    Notes
    -----
    Luong et al. 2015, section 3.2, eq. (10): ``a_t(s) = align(h_t, h̄_s)
    exp(-(s - p_t)² / (2σ²))`` with ``σ = D/2``, ``align`` the softmax of
    eq. (7) over the window ``[p_t - D, p_t + D]``. The mask is a comparison,
    so ``positions`` receive their gradient through the Gaussian alone.

    ``D = 0``: the window keeps only a key at distance exactly 0 (``p_i`` an
    integer), whose Gaussian factor is ``exp(0) = 1`` for any ``σ``; ``σ = 1``
    is used there instead of 0 to avoid dividing by zero.
    Local-m attention (Luong's other kind, ``p_t = t``) needs no Gaussian: it
    is the mask :func:`relattn.local_window_mask`.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import local_p_weights
    >>> w = local_p_weights(xp.zeros((1, 5)), xp.asarray([2.0]), 1)   # keys 1, 2, 3; σ = 1/2
    >>> [round(float(a), 4) for a in w[0, :]]                         # (1/3)·exp(-2) at ±1
    [0.0, 0.0451, 0.3333, 0.0451, 0.0]
    """
    xp = _checks.namespace(scores=scores, positions=positions, optional={"mask": mask})
    dtype = _checks.floating(xp, scores=scores, positions=positions)
    window = _checks.length("window", window, minimum=0)
    _checks.ndim("scores", scores, 2, "(..., Lq, Lk)")
    _checks.ndim("positions", positions, 1, "(..., Lq)")
    lq, lk = scores.shape[-2:]
    if positions.shape[-1] != lq:
        raise ValueError(
            f"positions must have one entry per query, Lq = {lq}, "
            f"got positions of shape {tuple(positions.shape)}"
        )
    lead = _checks.broadcast(scores=scores.shape[:-2], positions=positions.shape[:-1])
    check_mask(mask, (*lead, lq, lk), xp)
    scores, positions = (_checks.cast(xp, a, dtype) for a in (scores, positions))

    keys = xp.arange(lk, dtype=dtype, device=device_of(scores))
    distance = keys - positions[..., None]  # j - p_i, (..., Lq, Lk)
    inside = xp.abs(distance) <= window
    mask = inside if mask is None else inside & mask
    sigma = window / 2 if window > 0 else 1.0
    gaussian = xp.exp(distance * distance * (-1.0 / (2.0 * sigma**2)))
    return softmax(scores, mask, -1, xp) * gaussian
