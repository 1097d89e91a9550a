"""Complex-order embeddings, complex linear maps and complex attention (Wang et al. 2020).

A word is a continuous function of its position: per dimension an amplitude
``r``, a frequency ``ω`` and an initial phase ``θ`` give
``f(pos) = r ⊙ exp(i(ω·pos + θ))``. Moving a word by ``n`` positions multiplies
its embedding by the diagonal ``exp(iωn)``, whatever ``pos`` is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _checks
from ._namespace import device_of
from ._typing import Array
from .core import softmax
from .problem import check_mask, check_qkv

__all__ = ["complex_attention", "complex_linear", "complex_order_embedding"]

REDUCTIONS = ("real", "modulus")


def _complex_floating(name: str, x: Any, xp: Any) -> None:
    if not xp.isdtype(x.dtype, "complex floating"):
        raise TypeError(f"{name} must have a complex floating dtype, got {x.dtype}")


def _floating(name: str, x: Any, xp: Any) -> None:
    if not xp.isdtype(x.dtype, ("real floating", "complex floating")):
        raise TypeError(f"{name} must have a real or complex floating dtype, got {x.dtype}")


def _complex_dtype(xp: Any, real: Any, device: Any) -> tuple[Any, Any]:
    """The complex dtype holding ``real`` parts, and the real dtype to compute in.

    float64 gives complex128; float32 (and float16, bfloat16, which have no
    complex counterpart in the standard) give complex64. ``TypeError`` where the
    library or device has no such complex dtype (e.g. TPUs lack complex128).
    """
    name = "complex128" if real == xp.float64 else "complex64"
    available = xp.__array_namespace_info__().dtypes(kind="complex floating", device=device)
    if name not in available:
        found = ", ".join(available) or "none"
        raise TypeError(
            f"complex_order_embedding needs {name} for {real} inputs, but {xp.__name__} "
            f"has no {name} on device {device} (its complex dtypes: {found})"
        )
    return available[name], (xp.float64 if name == "complex128" else xp.float32)


def _combine(re: Any, im: Any, dtype: Any, xp: Any) -> Any:
    """``re + i·im`` as ``dtype``.

    The standard leaves a Python complex scalar with a real array unspecified,
    so both parts become complex first; ``1j`` then meets a complex array.
    """
    return xp.astype(re, dtype) + xp.astype(im, dtype) * 1j


def complex_order_embedding(
    amplitude: Array, frequency: Array, phase: Array, positions: Array
) -> Array:
    r"""Complex-order embedding ``r ⊙ exp(i(ω·pos + θ))`` of words at positions.

    Parameters
    ----------
    amplitude : array of shape (..., L, d), real floating
        ``r``, each token's amplitude vector (the per-word table already
        gathered by token id).
    frequency : array of shape (..., L, d), real floating
        ``ω``, in radians per token position. A frequency shared by all words
        is an array of shape ``(d,)``.
    phase : array of shape (..., L, d), real floating
        ``θ``, the initial phase in radians. ``amplitude``, ``frequency`` and
        ``phase`` broadcast with each other.
    positions : array of shape (..., L), integer or real floating
        Each token's position, in token positions; its leading dimensions
        broadcast with those of the tables.

    Returns
    -------
    array of shape (..., L, d), complex floating
        ``f[..., l, k] = r[..., l, k] · exp(i(ω[..., l, k]·pos[..., l] + θ[..., l, k]))``,
        the broadcast shape of the inputs. complex128 for float64 inputs,
        complex64 for float32 ones (float16 and bfloat16 are computed in
        float32 and give complex64: the standard has no smaller complex
        dtype). Real floating ``positions`` take part in the promotion.

    Raises
    ------
    TypeError
        If a table is not real floating, ``positions`` is neither integer nor
        real floating, the arrays come from different libraries, or the
        library or device has no complex dtype of the needed precision.
    ValueError
        If an input has no dimension, or the shapes do not broadcast.

    Notes
    -----
    Wang et al. 2020, the complex-order embedding (their general bounded
    solution ``g(pos) = z₂ z₁^pos`` with ``|z₁| = 1``, per word and dimension):

    .. math::

        f(j, pos) = [r_{j,1} e^{i(ω_{j,1} pos + θ_{j,1})}, \dots,
                     r_{j,d} e^{i(ω_{j,d} pos + θ_{j,d})}]

    It has the paper's position-free offset transformation:
    ``f(j, pos + n) = f(j, pos) ⊙ exp(iω_j n)``, a diagonal linear map that
    depends on ``n`` and not on ``pos``. The value is built from ``cos`` and
    ``sin`` of the angle (no complex ``exp``), so that it is exact where the
    angle is and works on every array-API library.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import complex_order_embedding
    >>> r = xp.asarray([[1.0, 2.0]])            # one word, d = 2
    >>> w = xp.asarray([[0.5, -1.0]])
    >>> theta = xp.asarray([[0.0, 0.25]])
    >>> f = complex_order_embedding(r, w, theta, xp.arange(4.0))   # the word at 0 … 3
    >>> f.shape, f.dtype
    ((4, 2), dtype('complex128'))
    >>> bool(xp.all(xp.abs(xp.abs(f) - r) < 1e-12))   # |f| = r at every position
    True
    >>> step = complex_order_embedding(xp.ones((1, 2)), w, xp.zeros((1, 2)), xp.asarray([2.0]))
    >>> bool(xp.all(xp.abs(f[3, :] - f[1, :] * step[0, :]) < 1e-12))   # f(1 + 2) = f(1) ⊙ e^{2iω}
    True
    """
    xp = _checks.namespace(
        amplitude=amplitude, frequency=frequency, phase=phase, positions=positions
    )
    real = _checks.floating(xp, amplitude=amplitude, frequency=frequency, phase=phase)
    if xp.isdtype(positions.dtype, "real floating"):
        real = xp.result_type(real, positions.dtype)
    elif not xp.isdtype(positions.dtype, "integral"):
        raise TypeError(
            f"positions must have an integer or real floating dtype, got {positions.dtype}"
        )
    for name, a in (("amplitude", amplitude), ("frequency", frequency), ("phase", phase)):
        _checks.ndim(name, a, 1, "(..., L, d)")
    _checks.ndim("positions", positions, 1, "(..., L)")
    shapes = {
        "amplitude": tuple(amplitude.shape),
        "frequency": tuple(frequency.shape),
        "phase": tuple(phase.shape),
        "positions": (*positions.shape, 1),
    }
    try:
        np.broadcast_shapes(*shapes.values())
    except ValueError:
        found = ", ".join(f"{name} {s}" for name, s in shapes.items())
        raise ValueError(
            "amplitude, frequency and phase (..., L, d) and positions (..., L) must "
            f"broadcast together (positions as (..., L, 1)), got {found}"
        ) from None
    cdtype, real = _complex_dtype(xp, real, device_of(amplitude))
    r, w, theta, pos = (_checks.cast(xp, a, real) for a in (amplitude, frequency, phase, positions))
    angle = w * xp.expand_dims(pos, axis=-1) + theta
    return _combine(r * xp.cos(angle), r * xp.sin(angle), cdtype, xp)


def complex_linear(x: Array, weight: Array, *, bias: Array = None) -> Array:
    """Complex linear map ``y = x W + b`` with ``W = W_r + i W_i``.

    Parameters
    ----------
    x : array of shape (..., d_in), real or complex floating
        Inputs ``x = x_r + i x_i`` (real ``x`` has ``x_i = 0``).
    weight : array of shape (d_in, d_out), complex floating
        ``W = W_r + i W_i``, applied on the right: ``y = x @ weight``.
    bias : array, real or complex floating, optional
        ``b``, broadcastable to the output ``(..., d_out)``.

    Returns
    -------
    array of shape (..., d_out), complex floating
        ``x @ weight (+ bias)`` in the promoted complex dtype of the inputs.

    Raises
    ------
    TypeError
        If ``weight`` is not complex, ``x`` or ``bias`` is not floating, or
        the arrays come from different libraries.
    ValueError
        If ``weight`` is not 2-D, its ``d_in`` differs from the last
        dimension of ``x``, or ``bias`` does not broadcast to the output.

    Notes
    -----
    Wang et al. 2020, the complex-valued linear layer of their complex
    CNN, RNN and Transformer:

    .. math::

        (W_r + i W_i)(x_r + i x_i) = (W_r x_r - W_i x_i) + i (W_r x_i + W_i x_r),

    written here for row vectors, ``x W``. The authors' code stores real and
    imaginary parts as separate real tensors and computes these four real
    products; one complex matrix product gives the same numbers.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import complex_linear
    >>> x = xp.asarray([[1.0 + 1.0j, 2.0 + 0.0j]])
    >>> w = xp.asarray([[1j], [1.0 + 0j]])      # d_in = 2, d_out = 1
    >>> complex_linear(x, w)
    array([[1.+1.j]])
    >>> complex_linear(xp.asarray([[1.0, 2.0]]), w, bias=xp.asarray([0.5]))
    array([[2.5+1.j]])
    """
    xp = _checks.namespace(x=x, weight=weight, optional={"bias": bias})
    _floating("x", x, xp)
    _complex_floating("weight", weight, xp)
    if bias is not None:
        _floating("bias", bias, xp)
    _checks.ndim("x", x, 1, "(..., d_in)")
    if weight.ndim != 2:
        raise ValueError(f"weight must have shape (d_in, d_out), got shape {tuple(weight.shape)}")
    if weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"weight must have d_in = {x.shape[-1]} rows (the last dimension of x), "
            f"got shape {tuple(weight.shape)}"
        )
    out_shape = (*x.shape[:-1], weight.shape[1])
    if bias is not None:
        _checks.broadcastable("bias", tuple(bias.shape), out_shape, "the output (..., d_out)")
    dtype = xp.result_type(*(a for a in (x, weight, bias) if a is not None))
    x, weight, bias = (_checks.cast(xp, a, dtype) for a in (x, weight, bias))
    y = x @ weight
    return y if bias is None else y + bias


def complex_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    conjugate: bool = True,
    reduction: str = "real",
    mask: Array = None,
    scale: Any = None,
) -> Array:
    r"""Attention over complex queries and keys: real scores, complex output.

    Parameters
    ----------
    q : array of shape (..., Lq, d), complex floating
        Queries.
    k : array of shape (..., Lk, d), complex floating
        Keys.
    v : array of shape (..., Lk, d_v), complex or real floating
        Values. Leading dimensions of ``q``, ``k`` and ``v`` broadcast.
    conjugate : bool, optional
        Score with ``conj(k)`` (``True``, the Hermitian product) or with ``k``
        itself (``False``, the authors' code).
    reduction : {"real", "modulus"}, optional
        How the complex score becomes a real logit: its real part or its
        modulus.
    mask : array, bool, optional
        ``True`` = may attend; broadcastable to the scores ``(..., Lq, Lk)``.
    scale : float, optional
        Score scale, ``1/√d`` by default.

    Returns
    -------
    array of shape (..., Lq, d_v), complex floating
        ``softmax(reduce(s) · scale, mask) v`` in the promoted complex dtype of
        the inputs (real ``v`` is promoted to complex). Queries with no allowed
        key give zero rows, never NaN.

    Raises
    ------
    TypeError
        If ``q`` or ``k`` is not complex, ``v`` is not floating, ``mask`` is
        not boolean, ``conjugate`` is not a bool, or the arrays come from
        different libraries.
    ValueError
        If shapes do not match (``q``/``k`` feature size, ``k``/``v`` length,
        leading dimensions, ``mask`` shape) or ``reduction`` is unknown.

    Notes
    -----
    The complex score of query ``i`` and key ``j`` is

    .. math::

        s_{ij} = \sum_k q_{ik} \, \overline{k_{jk}}  \quad (\texttt{conjugate=True}), \qquad
        s_{ij} = \sum_k q_{ik} \, k_{jk}  \quad (\texttt{conjugate=False}),

    and the logit is ``Re(s_ij)`` (``reduction="real"``) or ``|s_ij|``
    (``reduction="modulus"``), times ``scale``; Vaswani et al. 2017, eq. (1)
    follows. Two named variants:

    - ``conjugate=True, reduction="real"``: ``Re(q · k̄)``, the real inner
      product of the two vectors seen in ``ℝ^{2d}``. For complex-order
      embeddings ``q = a ⊙ e^{iω p_q}``, ``k = b ⊙ e^{iω p_k}`` with the
      frequencies ``ω`` shared per dimension (or any diagonal complex map of
      them), ``Re(Σ a b̄ e^{iω(p_q - p_k)})`` depends on the positions only
      through ``p_q - p_k``: the relative property. Rotary position embedding
      is its real special case (pairs of real features as one complex
      number). Projections ``q = x W_q``, ``k = y W_k`` keep it when
      ``W_q W_kᴴ`` commutes with ``diag(e^{iωn})`` (e.g. is diagonal); dense
      ones generally break it.
    - ``conjugate=False, reduction="modulus"``: ``|q · k| / √d_k``, what the
      authors' Transformer code computes (Wang et al. 2020, released code,
      ``attention_complex.py``: ``scores_real = q_r k_rᵀ - q_i k_iᵀ``,
      ``scores_imag = q_r k_iᵀ + q_i k_rᵀ``, logit the modulus). Shifting every
      position by ``n`` turns each term into ``… e^{iω(p_q + p_k + 2n)}``, so
      these logits change with the absolute positions.

    The output is ``P v = P v_r + i P v_i`` with the real weights ``P``, as in
    the authors' code.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import complex_attention
    >>> q = xp.asarray([[1j, 0j]])                       # Lq = 1, d = 2
    >>> k = xp.asarray([[1j, 0j], [1.0 + 0j, 0j]])       # Lk = 2
    >>> v = xp.asarray([[1.0 + 0j], [0j]])
    >>> complex_attention(q, k, v, scale=100.0)          # Re(q·k̄) = 1, 0: picks key 0
    array([[1.+0.j]])
    >>> complex_attention(q, k, v, conjugate=False, reduction="modulus", scale=100.0)
    array([[0.5+0.j]])
    """
    xp = _checks.namespace(q=q, k=k, v=v, optional={"mask": mask})
    _complex_floating("q", q, xp)
    _complex_floating("k", k, xp)
    _floating("v", v, xp)
    conjugate = _checks.flag("conjugate", conjugate)
    _checks.choice("reduction", reduction, REDUCTIONS)
    lq, lk, d = check_qkv(q, k, v)
    lead = _checks.broadcast(q=q.shape[:-2], k=k.shape[:-2], v=v.shape[:-2])
    check_mask(mask, (*lead, lq, lk), xp)

    dtype = xp.result_type(q, k, v)
    q, k, v = (_checks.cast(xp, a, dtype) for a in (q, k, v))
    scale = _checks.scale(scale, d, xp)
    s = q @ xp.matrix_transpose(xp.conj(k) if conjugate else k)
    logits = (xp.real(s) if reduction == "real" else xp.abs(s)) * scale
    weights = softmax(logits, mask, -1, xp)
    # Real weights times each part: two real products instead of a complex one.
    return _combine(weights @ xp.real(v), weights @ xp.imag(v), dtype, xp)
