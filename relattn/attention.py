"""Masked softmax, scaled dot-product attention and relative attention."""

from __future__ import annotations

import math
from typing import Any

import array_api_compat

from . import _checks
from .backends import backend_for
from .masks import causal_mask
from .scores import check_table, position_term

__all__ = ["masked_softmax", "relative_attention", "scaled_dot_product_attention"]


def check_mask(mask: Any, scores_shape: tuple[int, ...], xp: Any) -> None:
    """``mask`` is boolean and broadcasts to the scores ``(..., Lq, Lk)``."""
    if mask is not None:
        _checks.boolean("mask", mask, xp)
        _checks.broadcastable("mask", mask.shape, scores_shape, "the scores (..., Lq, Lk)")


def softmax(scores: Any, mask: Any, axis: int, xp: Any) -> Any:
    """:func:`masked_softmax` without argument checks."""
    device = array_api_compat.device(scores)
    if mask is not None:
        # -inf, not the dtype's lowest value: exp gives exactly 0 for masked keys,
        # with no overflow in ``scores - peak`` even in float16.
        scores = xp.where(mask, scores, xp.full((), -math.inf, dtype=scores.dtype, device=device))
    peak = xp.max(scores, axis=axis, keepdims=True)
    # A row with no finite score (fully masked, or a -inf bias) would give
    # inf - inf; shift it by 0 instead, so its weights are exp(-inf) = 0.
    peak = xp.where(xp.isfinite(peak), peak, xp.zeros((), dtype=scores.dtype, device=device))
    weights = xp.exp(scores - peak)
    total = xp.sum(weights, axis=axis, keepdims=True)
    # A fully masked row sums to 0: divide by 1 so it stays 0, never 0/0.
    return weights / xp.where(total > 0, total, xp.ones_like(total))


def attend(q: Any, k: Any, v: Any, bias: Any, mask: Any, scale: float, xp: Any) -> Any:
    """``softmax(q kᵀ · scale + bias, mask) v`` on inputs already checked and cast.

    The backend's fused kernel runs it where there is one and the inputs fit
    (:attr:`relattn.backends.Backend.fused_attention`); :func:`attend_generic`
    is the reference it is tested against.
    """
    fused = backend_for(xp).fused_attention
    if fused is not None:
        out = fused(q, k, v, bias=bias, mask=mask, scale=scale)
        if out is not None:
            return out
    return attend_generic(q, k, v, bias, mask, scale, xp)


def attend_generic(q: Any, k: Any, v: Any, bias: Any, mask: Any, scale: float, xp: Any) -> Any:
    """:func:`attend` in array-API calls only."""
    # Scaling q, not the scores, saves a pass over the (..., Lq, Lk) array.
    scores = (q * scale) @ xp.matrix_transpose(k)
    if bias is not None:
        scores = scores + bias
    return softmax(scores, mask, -1, xp) @ v


def masked_softmax(scores: Any, mask: Any = None, *, axis: int = -1) -> Any:
    """Softmax over the keys that may be attended; fully masked rows give zeros.

    Parameters
    ----------
    scores : array of shape (..., Lq, Lk), real floating
        Attention logits ``e_ij``.
    mask : array, bool, optional
        ``True`` = may attend; broadcastable to ``scores``.
    axis : int, optional
        Axis to normalise over (the key axis, last by default).

    Returns
    -------
    array, shape and dtype of ``scores``
        ``α_ij = exp(e_ij) / Σ_{j' allowed} exp(e_ij')`` for allowed ``j`` and
        ``0`` for masked ones. A row with no allowed key (or only ``-inf``
        scores) is all zeros, never NaN, in every dtype.

    Raises
    ------
    TypeError
        If ``scores`` is not real floating, ``mask`` is not boolean, or they
        come from different libraries.
    ValueError
        If ``mask`` does not broadcast to ``scores``.

    Notes
    -----
    Vaswani et al. 2017, eq. (1), with the masking of section 3.2.3 done by
    selection rather than by adding ``-inf``, so that the gradient of a fully
    masked row is zero as well.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> from relattn import masked_softmax
    >>> scores = xp.zeros((2, 2))
    >>> masked_softmax(scores, xp.asarray([[True, True], [False, False]]))
    Array([[0.5, 0.5],
           [0. , 0. ]], dtype=array_api_strict.float64)
    """
    xp = _checks.namespace(scores=scores, mask=mask)
    _checks.floating(xp, scores=scores)
    check_mask(mask, tuple(scores.shape), xp)
    return softmax(scores, mask, axis, xp)


def check_qkv(q: Any, k: Any, v: Any) -> tuple[int, int, int]:
    _checks.query_key(q, k)
    _checks.ndim("v", v, 2, "(..., Lk, d_v)")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v must have one row per key, Lk = {k.shape[-2]}, got v of shape {tuple(v.shape)}"
        )
    return q.shape[-2], k.shape[-2], q.shape[-1]


def scaled_dot_product_attention(
    q: Any, k: Any, v: Any, *, mask: Any = None, bias: Any = None, scale: Any = None
) -> Any:
    """Scaled dot-product attention with an optional mask and additive bias.

    Parameters
    ----------
    q : array of shape (..., Lq, d), real floating
        Queries.
    k : array of shape (..., Lk, d), real floating
        Keys.
    v : array of shape (..., Lk, d_v), real floating
        Values. Leading dimensions of ``q``, ``k`` and ``v`` broadcast.
    mask : array, bool, optional
        ``True`` = may attend; broadcastable to the scores ``(..., Lq, Lk)``.
    bias : array, real floating, optional
        Added to the scaled scores; broadcastable to ``(..., Lq, Lk)``.
    scale : float, optional
        Score scale, ``1/√d`` by default.

    Returns
    -------
    array of shape (..., Lq, d_v)
        ``softmax(q kᵀ · scale + bias, mask) v`` in the promoted input dtype.
        Queries with no allowed key give zero rows.

    Raises
    ------
    ValueError
        If shapes do not match (``q``/``k`` feature size, ``k``/``v`` length,
        leading dimensions, ``mask`` or ``bias`` shape).
    TypeError
        If an input is not real floating, ``mask`` is not boolean, or the
        arrays come from different libraries.

    Notes
    -----
    Vaswani et al. 2017, eq. (1): ``Attention(Q, K, V) = softmax(QKᵀ/√d_k) V``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> from relattn import scaled_dot_product_attention, causal_mask
    >>> q = k = xp.ones((3, 4))
    >>> v = xp.reshape(xp.arange(6.0), (3, 2))
    >>> scaled_dot_product_attention(q, k, v, mask=causal_mask(3, 3, xp=xp))
    Array([[0., 1.],
           [1., 2.],
           [2., 3.]], dtype=array_api_strict.float64)
    """
    xp = _checks.namespace(q=q, k=k, v=v, mask=mask, bias=bias)
    dtype = _checks.floating(xp, q=q, k=k, v=v, bias=bias)
    lq, lk, d = check_qkv(q, k, v)
    lead = _checks.broadcast(q=q.shape[:-2], k=k.shape[:-2], v=v.shape[:-2])
    scores_shape = (*lead, lq, lk)
    check_mask(mask, scores_shape, xp)
    if bias is not None:
        _checks.broadcastable("bias", bias.shape, scores_shape, "the scores (..., Lq, Lk)")
    q, k, v, bias = (_checks.cast(xp, a, dtype) for a in (q, k, v, bias))
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    return attend(q, k, v, bias, mask, scale, xp)


def relative_attention(
    q: Any,
    k: Any,
    v: Any,
    position_table: Any,
    *,
    content_bias: Any = None,
    position_bias: Any = None,
    mask: Any = None,
    scale: Any = None,
) -> Any:
    """Attention with Transformer-XL relative position scores.

    Parameters
    ----------
    q : array of shape (..., Lq, d), real floating
        Queries ``q_i = W_q h_i`` of the current segment.
    k : array of shape (..., Lk, d), real floating
        Keys ``k_j = W_{k,E} h̃_j`` over memory and segment, ``Lk >= Lq``
        (memory first) or any ``Lk`` with the full layout.
    v : array of shape (..., Lk, d_v), real floating
        Values.
    position_table : array of shape (..., W, d), real floating
        Projected position encodings in the relative layout: row ``m`` encodes
        distance ``δ = m - (Lk - 1)`` (key minus query). ``W = Lk``: the
        causal layout (``δ <= 0``; Transformer-XL's ``r_{i-j}`` for
        ``i - j = -δ = Lk-1 … 0``); keys with ``δ > 0`` are then masked.
        ``W = Lq + Lk - 1``: the full layout (XLNet, Conformer), no implied
        mask. Leading dimensions broadcast with those of ``q`` (one table, or
        one per head ``(H, W, d)``).
    content_bias : array, real floating, optional
        ``u``, the global content bias, broadcastable to ``q`` (per head:
        ``u[:, None, :]`` for ``u`` of shape ``(H, d)``).
    position_bias : array, real floating, optional
        ``v``, the global position bias, broadcastable to ``q``.
    mask : array, bool, optional
        ``True`` = may attend; broadcastable to the scores ``(..., Lq, Lk)``;
        combined with the causal-layout mask.
    scale : float, optional
        Score scale, ``1/√d`` by default; TENER uses ``1``.

    Returns
    -------
    array of shape (..., Lq, d_v)
        ``softmax(A · scale, mask) v`` in the promoted input dtype; queries
        with no allowed key give zero rows.

    Raises
    ------
    ValueError
        If shapes do not match, including a table width ``W`` that fits
        neither layout or a bias that does not broadcast to ``q``.
    TypeError
        If an input is not real floating, ``mask`` is not boolean, or the
        arrays come from different libraries.

    Notes
    -----
    Dai et al. 2019, section 3.3:

    .. math::

        A_{ij} = \\underbrace{(q_i + u)^\\top k_j}_{(a) + (c)}
               + \\underbrace{(q_i + v)^\\top r_{i-j}}_{(b) + (d)}

    Term (b)+(d) is computed once per distance, ``(q + v) Rᵀ`` of shape
    ``(..., Lq, W)``, and moved to key columns by :func:`relattn.rel_shift`
    (appendix B): ``O(Lq·W·d)`` work, no ``(Lq, Lk, d)`` tensor. TENER (Yan et
    al. 2019, eq. (15)–(17)) is this function with the unprojected signed
    sinusoid as table and ``scale=1``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> from relattn import relative_attention, relative_distances, sinusoidal_position_encoding
    >>> q = xp.ones((2, 4)); kv = xp.ones((3, 4))       # 2 queries, 1 memory slot
    >>> dist = -relative_distances(2, 3, causal=True, xp=xp)   # i - j = 2, 1, 0
    >>> r = sinusoidal_position_encoding(dist, 4, layout="concatenated")
    >>> relative_attention(q, kv, kv, r).shape
    (2, 4)
    """
    xp = _checks.namespace(
        q=q, k=k, v=v, position_table=position_table,
        content_bias=content_bias, position_bias=position_bias, mask=mask,
    )  # fmt: skip
    dtype = _checks.floating(
        xp, q=q, k=k, v=v, position_table=position_table,
        content_bias=content_bias, position_bias=position_bias,
    )  # fmt: skip
    lq, lk, d = check_qkv(q, k, v)
    width = check_table("position_table", position_table, lq, lk, d)
    lead = _checks.broadcast(
        q=q.shape[:-2], k=k.shape[:-2], v=v.shape[:-2], position_table=position_table.shape[:-2]
    )
    for name, b in (("content_bias", content_bias), ("position_bias", position_bias)):
        if b is not None:
            _checks.broadcastable(name, b.shape, tuple(q.shape), "q")
    check_mask(mask, (*lead, lq, lk), xp)

    q, k, v, table, u, pos_bias = (
        _checks.cast(xp, a, dtype) for a in (q, k, v, position_table, content_bias, position_bias)
    )
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    # Terms (b) + (d), scaled. In the causal layout (W = Lk) the absent cells
    # δ > 0 are -inf: the position term is then the causal mask as well.
    position = position_term(q, pos_bias, table, lk, xp, scale=scale, fill=-math.inf)
    if width != lq + lk - 1 and lq > lk:
        # The first Lq - Lk queries have no key at all: the mask keeps their rows
        # zero whatever the fused kernel makes of a row of -inf.
        blocked = causal_mask(lq, lk, xp=xp, device=array_api_compat.device(q))
        mask = blocked if mask is None else mask & blocked
    # Terms (a) + (c) and the softmax: attention with the position term as a bias.
    return attend(q if u is None else q + u, k, v, position, mask, scale, xp)
