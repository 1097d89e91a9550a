"""DiSAN (Shen et al. 2018): directional multi-dimensional self-attention.

Multi-dimensional ("feature-wise") attention gives every feature ``k`` of every
key its own weight: the logits are ``(..., Lq, Lk, d)``, not ``(..., Lq, Lk)``,
and the softmax runs over the keys separately for each feature. Token2token
attention (one output per token, with DiSAN's positional masks and fusion gate)
and source2token attention (one vector per sequence) are the two forms.

Parameters are row-vector matrices, as in the authors' code: the paper's
``W¹ h_i`` is ``h_i @ query_weight`` here, i.e. ``query_weight = (W¹)ᵀ``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from . import _checks
from ._activations import elu, sigmoid
from ._namespace import device_of
from ._typing import Array
from .core import softmax
from .masks import backward_mask, diagonal_disabled_mask, forward_mask
from .problem import check_mask

__all__ = ["LOGIT_BUDGET", "multi_dimensional_attention", "source2token_attention"]

#: Most feature-wise logits ``(..., chunk, L, d)`` one query chunk holds when
#: ``chunk_size`` is not given (2**22 elements: 16 MiB in float32).
LOGIT_BUDGET = 2**22

_DIRECTIONS = {"forward": forward_mask, "backward": backward_mask, "diag": diagonal_disabled_mask}
_FUSION_NAMES = ("w_s (fusion[0])", "w_h (fusion[1])", "b_f (fusion[2])")


def _check_tokens(h: Any) -> tuple[int, int]:
    """``h`` is ``(..., L, d)``; return ``(L, d)`` (``L = 0`` gives empty results)."""
    _checks.ndim("h", h, 2, "(..., L, d)")
    length, d = h.shape[-2:]
    return length, d


def _check_matrix(name: str, w: Any, d: int) -> None:
    if tuple(w.shape) != (d, d):
        raise ValueError(
            f"{name} must have shape (d, d) = ({d}, {d}) for h with d = {d} features, "
            f"got shape {tuple(w.shape)}"
        )


def _check_vector(name: str, b: Any, d: int) -> None:
    if tuple(b.shape) != (d,):
        raise ValueError(
            f"{name} must have shape (d,) = ({d},) for h with d = {d} features, "
            f"got shape {tuple(b.shape)}"
        )


def _check_c(c: Any) -> float:
    if isinstance(c, bool) or not isinstance(c, numbers.Real):
        raise TypeError(f"c must be a real number (a Python float), got {type(c).__name__}")
    value = float(c)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"c must be positive and finite, got {c}")
    return value


def _fusion_arrays(fusion: Any) -> dict[str, Any]:
    """``{name: array}`` for the three fusion-gate parameters (empty without a gate)."""
    if fusion is None:
        return {}
    if not isinstance(fusion, (tuple, list)):
        raise TypeError(
            f"fusion must be a tuple (w_s, w_h, b_f) of arrays, got {type(fusion).__name__}"
        )
    if len(fusion) != 3:
        raise ValueError(
            f"fusion must be a tuple (w_s, w_h, b_f) of 3 arrays, got {len(fusion)} items"
        )
    return dict(zip(_FUSION_NAMES, fusion, strict=True))


def _mask_rows(allowed: Any, mask: Any, start: int, stop: int) -> Any:
    """The query rows ``start:stop`` of ``allowed & mask`` (either may be None)."""
    rows = None if allowed is None else allowed[start:stop, :]
    if mask is not None:
        # A mask with a length-1 (or no) query axis is the same for every row.
        sliced = mask.ndim >= 2 and mask.shape[-2] != 1
        user = mask[..., start:stop, :] if sliced else mask
        rows = user if rows is None else rows & user
    return rows


def multi_dimensional_attention(
    h: Array,
    query_weight: Array,
    key_weight: Array,
    bias: Array,
    *,
    direction: str | None = None,
    mask: Array = None,
    c: float = 5.0,
    fusion: Any = None,
    chunk_size: int | None = None,
) -> Array:
    """DiSAN's directional multi-dimensional token2token self-attention.

    Parameters
    ----------
    h : array of shape (..., L, d), real floating
        Tokens, already transformed (DiSAN's ``h = σ_h(W^(h) x + b^(h))``);
        they are queries, keys and values at once. ``L >= 1``.
    query_weight : array of shape (d, d), real floating
        ``W¹`` in row-vector form: the query term is ``h_i @ query_weight``.
    key_weight : array of shape (d, d), real floating
        ``W²``: the key term is ``h_j @ key_weight``.
    bias : array of shape (d,), real floating
        ``b¹``.
    direction : {None, "forward", "backward", "diag"}, optional
        Positional mask (query ``i``, key ``j``): ``"forward"`` keeps ``j < i``,
        ``"backward"`` ``j > i``, ``"diag"`` every ``j != i`` (DiSAN's
        diag-disabled mask), ``None`` every key.
    mask : array, bool, optional
        ``True`` = may attend; broadcastable to ``(..., L, L)`` and combined
        with the positional mask. For padding, a key mask of shape
        ``(B, 1, L)``: ``relattn.padding_mask(lengths, L)[:, None, :]``.
    c : float, optional
        Scale of the logits' ``tanh``, ``> 0`` (DiSAN uses 5); logits lie in
        ``(-c, c)``.
    fusion : tuple (w_s, w_h, b_f), optional
        Fusion-gate parameters of shapes ``(d, d)``, ``(d, d)`` and ``(d,)``.
        Given, the result is ``u = F ⊙ h + (1 - F) ⊙ s`` with
        ``F = sigmoid(s @ w_s + h @ w_h + b_f)``; otherwise ``s``.
    chunk_size : int, optional
        Queries per chunk, ``>= 1``. By default as many as keep one chunk's
        logits within :data:`LOGIT_BUDGET` elements (at least 1). The result
        does not depend on it.

    Returns
    -------
    array of shape (..., L, d)
        ``s`` (or ``u`` with ``fusion``) in the promoted input dtype. A query
        with no allowed key (the first token under ``"forward"``, the last
        under ``"backward"``, a fully padded row) has ``s_i = 0`` exactly, and
        ``u_i = F_i ⊙ h_i``; never NaN. Padded query rows are computed like
        any other: multiply by the token mask to zero them, as the authors'
        code does.

    Raises
    ------
    ValueError
        If ``h`` is not ``(..., L, d)`` with ``L >= 1``, a parameter has the
        wrong shape, ``mask`` does not broadcast to ``(..., L, L)``,
        ``direction`` is unknown, ``c`` is not positive and finite, ``fusion``
        does not hold 3 arrays, or ``chunk_size < 1``.
    TypeError
        If an input is not a real floating array, ``mask`` is not boolean,
        ``c`` is not a real number, ``fusion`` is not a tuple or ``chunk_size``
        not an integer, or the arrays come from different libraries.

    Notes
    -----
    Shen et al. 2018 (DiSAN), section 3.1 ("Directional Self-Attention"): the
    DiSA block's score function with positional mask ``M``, and its fusion
    gate; with ``k`` a feature,

    .. math::

        f(h_i, h_j) = c \\tanh\\big((W^{(1)} h_i + W^{(2)} h_j + b^{(1)}) / c\\big)
                      + M_{ij} \\mathbf{1}, \\qquad
        P^k_{ij} = \\frac{\\exp f^k(h_i, h_j)}{\\sum_{j'} \\exp f^k(h_i, h_{j'})},
        \\qquad s_i = \\sum_j P_{ij} \\odot h_j,

    .. math::

        F = \\operatorname{sigmoid}(W^{(f1)} s + W^{(f2)} h + b^{(f)}), \\qquad
        u = F \\odot h + (1 - F) \\odot s.

    This is the multi-dimensional token2token attention of section 2
    (``f(x_i, x_j) = Wᵀ σ(W¹ x_i + W² x_j + b¹) + b``) with ``W`` and ``σ``
    replaced by the scalar ``c`` and ``tanh(·/c)``. The masks ``M_ij`` (0 or
    ``-∞``) are applied by selection, not by adding ``-∞``: masked keys get
    weight 0 exactly and a row with no allowed key gives ``s_i = 0`` (the
    authors' code, ``directional_attention_with_dense``, gets the same zero
    by multiplying the weights by the mask after the softmax). ``M_ij`` is
    indexed ``[query i, key j]`` as in that code; "forward" lets each token
    attend to the tokens before it.

    Memory: the feature-wise logits are ``O(B·L²·d)``. They are computed for
    ``chunk_size`` queries at a time, so a chunk's temporaries hold
    ``prod(leading dims)·chunk_size·L·d`` elements each (a few such arrays
    are alive at once: logits, weights, weighted values), plus ``O(B·L·d)``
    for the projections and the result; the default ``chunk_size`` keeps the
    first term within :data:`LOGIT_BUDGET`. The loop runs over static chunk
    boundaries, so ``jax.jit`` and ``torch.compile`` trace it with static
    shapes. Chunking bounds the forward pass only: reverse-mode autodiff
    (``torch`` autograd, ``jax.grad``) keeps every chunk's intermediates for
    the backward pass, ``O(B·L²·d)`` as in the authors' code.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import multi_dimensional_attention
    >>> h = xp.reshape(xp.arange(6.0), (3, 2))
    >>> w, b = xp.zeros((2, 2)), xp.zeros(2)        # equal logits: uniform weights
    >>> multi_dimensional_attention(h, w, w, b, direction="forward")
    array([[0., 0.],
           [0., 1.],
           [1., 2.]])
    >>> multi_dimensional_attention(h, w, w, b, direction="forward", fusion=(w, w, b))  # F = 1/2
    array([[0. , 0.5],
           [1. , 2. ],
           [2.5, 3.5]])
    """
    gate = _fusion_arrays(fusion)
    xp = _checks.namespace(
        h=h, query_weight=query_weight, key_weight=key_weight, bias=bias, **gate,
        optional={"mask": mask},
    )  # fmt: skip
    dtype = _checks.floating(
        xp, h=h, query_weight=query_weight, key_weight=key_weight, bias=bias, **gate
    )
    length, d = _check_tokens(h)
    _check_matrix("query_weight", query_weight, d)
    _check_matrix("key_weight", key_weight, d)
    _check_vector("bias", bias, d)
    if gate:
        w_s, w_h, b_f = gate.values()
        _check_matrix(_FUSION_NAMES[0], w_s, d)
        _check_matrix(_FUSION_NAMES[1], w_h, d)
        _check_vector(_FUSION_NAMES[2], b_f, d)
    direction = _checks.choice("direction", direction, (None, *_DIRECTIONS))
    c = _check_c(c)
    lead = tuple(h.shape[:-2])
    check_mask(mask, (*lead, length, length), xp)
    if chunk_size is None:
        chunk = max(1, LOGIT_BUDGET // max(1, math.prod(lead) * length * d))
    else:
        chunk = _checks.length("chunk_size", chunk_size)

    h, query_weight, key_weight, bias = (
        _checks.cast(xp, a, dtype) for a in (h, query_weight, key_weight, bias)
    )
    query = h @ query_weight + bias  # W¹ h_i + b¹: once per token, not per pair
    key = h @ key_weight  # W² h_j
    device = device_of(h)
    allowed = None if direction is None else _DIRECTIONS[direction](length, xp=xp, device=device)
    values = h[..., None, :, :]  # (..., 1, L, d)
    parts = []
    for start in range(0, max(length, 1), chunk):  # one empty chunk when L = 0
        stop = min(start + chunk, length)
        logits = c * xp.tanh((query[..., start:stop, None, :] + key[..., None, :, :]) / c)
        rows = _mask_rows(allowed, mask, start, stop)  # (..., n, L): one per key
        weights = softmax(logits, None if rows is None else rows[..., None], -2, xp)
        parts.append(xp.sum(weights * values, axis=-2))  # (..., n, d)
    s = parts[0] if len(parts) == 1 else xp.concat(parts, axis=-2)
    if not gate:
        return s
    w_s, w_h, b_f = (_checks.cast(xp, a, dtype) for a in gate.values())
    f = sigmoid(s @ w_s + h @ w_h + b_f, xp)
    return f * h + (1 - f) * s


def source2token_attention(
    h: Array, weight1: Array, bias1: Array, weight: Array, bias: Array, *, mask: Array = None
) -> Array:
    """DiSAN's multi-dimensional source2token attention: one vector per sequence.

    Parameters
    ----------
    h : array of shape (..., L, d), real floating
        Tokens (in DiSAN, the concatenated forward and backward DiSA outputs).
        ``L >= 1``.
    weight1 : array of shape (d, d), real floating
        ``W¹`` in row-vector form: the hidden layer is ``elu(h_i @ weight1 + bias1)``.
    bias1 : array of shape (d,), real floating
        ``b¹``.
    weight : array of shape (d, d), real floating
        ``W``: the feature-wise logits are ``hidden @ weight + bias``.
    bias : array of shape (d,), real floating
        ``b``.
    mask : array, bool, optional
        ``True`` for real tokens, ``False`` for padding; broadcastable to
        ``(..., L)`` (e.g. ``relattn.padding_mask(lengths, L)``).

    Returns
    -------
    array of shape (..., d)
        ``s = Σ_i P_i ⊙ h_i`` in the promoted input dtype; ``0`` for a
        sequence whose every token is masked, never NaN.

    Raises
    ------
    ValueError
        If ``h`` is not ``(..., L, d)`` with ``L >= 1``, a parameter has the
        wrong shape, or ``mask`` does not broadcast to ``(..., L)``.
    TypeError
        If an input is not a real floating array, ``mask`` is not boolean, or
        the arrays come from different libraries.

    Notes
    -----
    Shen et al. 2018 (DiSAN), section 2 (multi-dimensional source2token
    self-attention) and section 3.2 (the sentence encoder after the forward
    and backward DiSA blocks): with ``σ`` = ELU and ``k`` a feature,

    .. math::

        f(h_i) = W^\\top \\sigma(W^{(1)} h_i + b^{(1)}) + b, \\qquad
        P^k_i = \\frac{\\exp f^k(h_i)}{\\sum_{i'} \\exp f^k(h_{i'})}, \\qquad
        s = \\sum_i P_i \\odot h_i.

    Masked tokens are excluded by selection (weight 0 exactly); the memory is
    ``O(B·L·d)``.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import source2token_attention
    >>> h = xp.reshape(xp.arange(6.0), (3, 2))
    >>> w, b = xp.zeros((2, 2)), xp.zeros(2)        # equal logits: the mean token
    >>> source2token_attention(h, w, b, w, b, mask=xp.asarray([True, True, False]))
    array([1., 2.])
    """
    xp = _checks.namespace(
        h=h, weight1=weight1, bias1=bias1, weight=weight, bias=bias, optional={"mask": mask}
    )
    dtype = _checks.floating(xp, h=h, weight1=weight1, bias1=bias1, weight=weight, bias=bias)
    _, d = _check_tokens(h)
    _check_matrix("weight1", weight1, d)
    _check_vector("bias1", bias1, d)
    _check_matrix("weight", weight, d)
    _check_vector("bias", bias, d)
    if mask is not None:
        _checks.boolean("mask", mask, xp)
        _checks.broadcastable("mask", tuple(mask.shape), tuple(h.shape[:-1]), "the tokens (..., L)")
    h, weight1, bias1, weight, bias = (
        _checks.cast(xp, a, dtype) for a in (h, weight1, bias1, weight, bias)
    )
    logits = elu(h @ weight1 + bias1, xp) @ weight + bias  # (..., L, d)
    weights = softmax(logits, None if mask is None else mask[..., None], -2, xp)
    return xp.sum(weights * h, axis=-2)
