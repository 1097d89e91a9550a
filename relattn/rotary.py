"""Rotary position embedding (Su et al. 2021, RoFormer)."""

from __future__ import annotations

from typing import Any

from . import _checks
from ._namespace import device_of
from ._typing import Array
from .encodings import LAYOUTS, _check_base, _host_frequencies, _sin_cos, _working_dtype

__all__ = ["rotary_position_embedding"]


def rotary_position_embedding(
    x: Array,
    positions: Array = None,
    *,
    base: float = 10000.0,
    layout: str | None = None,
    rotary_dim: int | None = None,
    frequencies: Array = None,
) -> Array:
    r"""Rotate feature pairs of queries or keys by angles proportional to their positions.

    Parameters
    ----------
    x : array of shape (..., L, d), real floating
        Queries or keys, one row per position (any leading batch and head
        dimensions).
    positions : array of shape (L,) or (..., L), integer or real floating, optional
        Position of each row, in token positions; default ``0 … L-1``. A
        decoder with a cache of ``n`` tokens passes ``n + arange(L)``; a batch
        whose rows sit at their own offsets (left padding, a cache filled to a
        different length per row) passes ``(B, 1, L)``: leading dims that
        broadcast to ``x``'s (SPEC §2.15's ``positions=``).
    base : float, optional
        ``θ_k = base^(-2k/r)``, ``k = 0 … r/2 - 1`` (10000 in RoFormer and
        LLaMA; 500000 in LLaMA-3).
    layout : {"concatenated", "interleaved"}
        Required, keyword-only: which features form the pair rotated by
        ``θ_k``. A checkpoint works only with the layout it was trained
        with, and nothing in the arrays tells them apart.

        - ``"concatenated"``: ``(x_k, x_{k+r/2})``, the two halves (Hugging
          Face's ``rotate_half``): GPT-NeoX and Pythia, and LLaMA 1–3,
          Mistral, Mixtral, Qwen, Gemma, Phi-3 and Falcon as Hugging Face
          transformers loads them.
        - ``"interleaved"``: ``(x_2k, x_2k+1)``, neighbouring features: the
          RoFormer paper and code, GPT-J, CodeGen, ChatGLM2 and 3, and Meta's
          own LLaMA code (``torch.view_as_complex``), whose checkpoints
          Hugging Face's conversion permutes into the concatenated layout.
    rotary_dim : int, optional
        ``r``, the number of leading features rotated (even, ``<= d``); the
        features ``r … d-1`` pass unchanged (GPT-NeoX's partial rotary).
        Default ``d``.
    frequencies : array of shape (r/2,), real floating, optional
        ``θ_k`` in radians per position, replacing ``base^(-2k/r)``: position
        interpolation, NTK, LLaMA-3 and YaRN scalings are maps of these.

    Returns
    -------
    array, shape and dtype of ``x``
        ``x`` with each pair ``(a, b)`` of row ``p`` replaced by
        ``(a cos pθ_k - b sin pθ_k, a sin pθ_k + b cos pθ_k)``.

    Raises
    ------
    ValueError
        If ``d`` (or ``rotary_dim``) is odd, ``rotary_dim`` is not in
        ``[0, d]``, ``positions`` is not ``(..., L)`` broadcasting to ``x``'s
        leading dims, ``frequencies`` is not
        ``(r/2,)``, ``base`` is not positive, or ``layout`` is unknown.
    TypeError
        If ``layout`` is not given, ``x`` is not a real floating array,
        ``positions`` not a real or integer array, ``frequencies`` not a real
        floating array, or the arrays come from different libraries.

    See Also
    --------
    inverse_frequencies : The default ``θ_k``.
    complex_order_embedding : RoPE is its special case ``r = 1``, ``ω = θ``, phase 0.
    scaled_dot_product_attention : Attention on the rotated queries and keys.

    Notes
    -----
    Su et al. 2021, eq. (34):

    .. math::

        R^d_{Θ,m} x = \begin{pmatrix} x_1 \\ x_2 \\ \vdots \end{pmatrix} \otimes
        \begin{pmatrix} \cos mθ_1 \\ \cos mθ_1 \\ \vdots \end{pmatrix} +
        \begin{pmatrix} -x_2 \\ x_1 \\ \vdots \end{pmatrix} \otimes
        \begin{pmatrix} \sin mθ_1 \\ \sin mθ_1 \\ \vdots \end{pmatrix},

    so that ``⟨RoPE(q, m), RoPE(k, n)⟩`` depends on ``n - m`` only. The angles
    ``p·θ`` are formed in float64 where the device has it (exactly from
    per-digit rotations where it has not, like
    :func:`sinusoidal_position_encoding`), then cast to ``x``'s dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn import rotary_position_embedding
    >>> x = np.asarray([[1.0, 0.0], [1.0, 0.0]])  # positions 0 and 1, d = 2
    >>> y = rotary_position_embedding(x, base=1.0, layout="interleaved")  # θ_0 = 1 rad
    >>> np.round(y, 4).tolist()
    [[1.0, 0.0], [0.5403, 0.8415]]

    The layouts differ from ``d = 4`` on: pair 0 is features 0 and 1 when
    interleaved, features 0 and 2 when concatenated.

    >>> x = np.asarray([[0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    >>> np.round(rotary_position_embedding(x, base=1.0, layout="interleaved")[1], 4).tolist()
    [0.5403, 0.8415, 0.0, 0.0]
    >>> np.round(rotary_position_embedding(x, base=1.0, layout="concatenated")[1], 4).tolist()
    [0.5403, 0.0, 0.8415, 0.0]
    """
    if layout is None:
        raise TypeError(
            "rotary_position_embedding: layout is required: 'concatenated' (LLaMA, Mistral, "
            "Qwen, GPT-NeoX, HF rotate_half) or 'interleaved' (GPT-J, RoFormer, Meta's LLaMA code)"
        )
    xp = _checks.namespace(x=x, optional={"positions": positions, "frequencies": frequencies})
    _checks.floating(xp, x=x)
    _checks.ndim("x", x, 2, "(..., L, d)")
    _checks.choice("layout", layout, LAYOUTS)
    base = _check_base(base)
    length, d = x.shape[-2:]
    if rotary_dim is None:
        if d % 2:
            raise ValueError(
                "x must have an even feature size d (pairs of features), "
                f"got shape {tuple(x.shape)}"
            )
        r = d
    else:
        r = _checks.length("rotary_dim", rotary_dim, minimum=0)
        if r % 2 or r > d:
            raise ValueError(f"rotary_dim must be even and at most d = {d}, got {r}")
    device = device_of(x)
    if positions is None:
        positions = xp.arange(length, device=device)
    else:
        lead = tuple(x.shape[:-2])
        fits = positions.ndim >= 1 and positions.shape[-1] == length
        if not (fits and _checks.broadcast_shapes(lead, tuple(positions.shape[:-1])) == lead):
            raise ValueError(
                f"positions must have shape (L,) = ({length},), or (..., {length}) with leading "
                f"dims broadcasting to x's {lead}, got shape {tuple(positions.shape)}"
            )
        if not xp.isdtype(positions.dtype, ("real floating", "integral")):
            raise TypeError(
                f"positions must be a real or integer array, got dtype {positions.dtype}"
            )
    half = r // 2
    if frequencies is not None:
        _checks.floating(xp, frequencies=frequencies)
        _checks.exact_shape("frequencies", frequencies, (half,), "(rotary_dim/2,)")
    if r == 0:
        return x
    flat = xp.reshape(positions, (-1,))  # one angle per position: (P, r/2)
    omega = tuple(_host_frequencies(half, base, False)) if frequencies is None else frequencies
    sin, cos = _sin_cos(flat, omega, _working_dtype(xp, device), xp, device)
    sin, cos = (xp.reshape(xp.astype(a, x.dtype), (*positions.shape, half)) for a in (sin, cos))
    rotated = _rotate_pairs(x if r == d else x[..., :r], sin, cos, layout, xp)
    return rotated if r == d else xp.concat((rotated, x[..., r:]), axis=-1)


def _rotate_pairs(x: Any, sin: Any, cos: Any, layout: str, xp: Any) -> Any:
    """Each feature pair ``(a, b)`` of ``x (..., r)`` turned to ``(a cos - b sin, a sin +
    b cos)``, ``sin`` and ``cos`` ``(..., r/2)``; pair ``j`` is features ``(2j, 2j+1)``
    (``"interleaved"``) or ``(j, j + r/2)`` (``"concatenated"``)."""
    half = x.shape[-1] // 2
    if layout == "interleaved":
        pairs = xp.reshape(x, (*x.shape[:-1], half, 2))
        a, b = pairs[..., 0], pairs[..., 1]
        rotated = xp.stack((a * cos - b * sin, a * sin + b * cos), axis=-1)
        return xp.reshape(rotated, x.shape)
    a, b = x[..., :half], x[..., half:]
    return xp.concat((a * cos - b * sin, a * sin + b * cos), axis=-1)
