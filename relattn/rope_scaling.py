"""RoPE frequencies scaled for contexts longer than the pretraining one.

Each scaling is a map of the rotary frequencies ``θ_k = base^(-2k/r)`` (and, for
YaRN and LongRoPE, a factor on the rotated queries and keys), as Hugging Face
transformers' ``ROPE_INIT_FUNCTIONS`` (``transformers.modeling_rope_utils``)
computes it for LLaMA, Mistral, Qwen, Phi-3, DeepSeek and the other models it
loads. The maps are computed on the host in float64 and returned as an array of
the caller's library, for :func:`relattn.rotary_position_embedding`'s
``frequencies=``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import array_api_extra as xpx
import numpy as np

from . import _checks
from ._typing import Array, Namespace
from .encodings import _check_base

__all__ = ["rope_frequencies"]

#: The scalings, by Hugging Face's ``rope_type`` names.
SCALINGS = ("linear", "dynamic", "yarn", "longrope", "llama3")

#: Options each scaling needs (``True``) or accepts (``False``), besides ``base``.
_OPTIONS: dict[str | None, dict[str, bool]] = {
    None: {},
    "linear": {"factor": True},
    "dynamic": {"factor": True, "original_max_position": True, "sequence_length": True},
    "yarn": {
        "factor": True,
        "original_max_position": True,
        "beta_fast": False,
        "beta_slow": False,
        "attention_factor": False,
        "mscale": False,
        "mscale_all_dim": False,
        "truncate": False,
    },
    "longrope": {
        "short_factor": True,
        "long_factor": True,
        "original_max_position": True,
        "factor": False,
        "attention_factor": False,
        "sequence_length": False,
    },
    "llama3": {
        "factor": True,
        "original_max_position": True,
        "low_freq_factor": True,
        "high_freq_factor": True,
    },
}


def rope_frequencies(
    rotary_dim: int,
    *,
    base: float = 10000.0,
    scaling: str | None = None,
    factor: float | None = None,
    original_max_position: int | None = None,
    sequence_length: int | None = None,
    low_freq_factor: float | None = None,
    high_freq_factor: float | None = None,
    beta_fast: float | None = None,
    beta_slow: float | None = None,
    truncate: bool | None = None,
    attention_factor: float | None = None,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    short_factor: Sequence[float] | None = None,
    long_factor: Sequence[float] | None = None,
    xp: Namespace = None,
    dtype: Any = None,
    device: Any = None,
) -> tuple[Array, float]:
    r"""RoPE frequencies ``θ_k``, scaled as Hugging Face's ``ROPE_INIT_FUNCTIONS`` scale them.

    Parameters
    ----------
    rotary_dim : int
        ``r``, the number of rotated features (even, ``>= 0``): the head
        dimension times Hugging Face's ``partial_rotary_factor``.
    base : float, optional
        ``θ_k = base^(-2k/r)`` before scaling (Hugging Face's ``rope_theta``).
    scaling : {None, "linear", "dynamic", "yarn", "longrope", "llama3"}, optional
        The scaling (Hugging Face's ``rope_type``); ``None``: plain ``θ_k``.
    factor : float, optional
        ``s > 0``, the context extension (``factor``). Needed by ``"linear"``,
        ``"dynamic"``, ``"yarn"`` and ``"llama3"``; for ``"longrope"`` it sets
        the default ``attention_factor`` only (Phi-3 has none in its
        ``rope_scaling``: pass ``max_position_embeddings /
        original_max_position_embeddings``, as Hugging Face does; so for
        DeepSeek's YaRN without ``factor``).
    original_max_position : int, optional
        ``L``, the pretraining context (``original_max_position_embeddings``).
        Needed by ``"yarn"``, ``"longrope"`` and ``"llama3"``; for
        ``"dynamic"`` it is the config's ``max_position_embeddings``, as in
        Hugging Face.
    sequence_length : int, optional
        The current sequence length ``n`` (the largest position + 1): needed
        by ``"dynamic"``, which grows ``base`` once ``n > L``; ``"longrope"``
        takes ``long_factor`` when ``n > L``, else (and when not given)
        ``short_factor``.
    low_freq_factor, high_freq_factor : float, optional
        ``"llama3"``: wavelengths above ``L / low_freq_factor`` are divided by
        ``s``, below ``L / high_freq_factor`` kept, between them interpolated
        (``0 < low_freq_factor < high_freq_factor``; 1 and 4 in Llama 3.1).
    beta_fast, beta_slow : float, optional
        ``"yarn"``: the numbers of rotations over ``L`` at which the ramp
        between extrapolated and interpolated frequencies starts and ends
        (default 32 and 1).
    truncate : bool, optional
        ``"yarn"``: round the ramp's ends to whole dimensions (default
        ``True``; ``False`` for gpt-oss).
    attention_factor : float, optional
        ``"yarn"``, ``"longrope"``: the returned factor, replacing its default.
    mscale, mscale_all_dim : float, optional
        ``"yarn"``, given together (DeepSeek-V2/V3): the default attention
        factor becomes ``m(s, mscale) / m(s, mscale_all_dim)``.
    short_factor, long_factor : sequence of r/2 floats, optional
        ``"longrope"``: the rescale factor of each frequency within and
        beyond ``L``; both needed.
    xp : module, optional
        Array library of the result (default NumPy).
    dtype : dtype, optional
        Real floating dtype of the result (default: the library's default).
    device : device, optional
        Device of the result.

    Returns
    -------
    frequencies : array of shape (r/2,)
        The scaled ``θ_k``, radians per position: pass them as
        ``rotary_position_embedding(..., frequencies=)``.
    attention_factor : float
        The factor Hugging Face multiplies ``cos`` and ``sin`` by (1 but for
        YaRN and LongRoPE). Multiply both rotated queries and keys by it —
        equivalently the logits by its square — before the softmax. Features
        beyond ``rotary_dim`` are not scaled by Hugging Face (they do not
        pass through ``cos``/``sin``): scale the rotated ones only.

    Raises
    ------
    ValueError
        If ``rotary_dim`` is odd or negative, ``scaling`` unknown, ``base``,
        ``factor``, a length, a beta or a factor not positive,
        ``low_freq_factor >= high_freq_factor``, ``short_factor`` or
        ``long_factor`` not of length ``r/2``.
    TypeError
        If an option ``scaling`` needs is missing, one it does not use is
        given, a number is not a number, ``dtype`` is not a real floating
        dtype of the library, or ``xp`` not an array library.

    See Also
    --------
    rotary_position_embedding : Rotations by ``p·θ_k``.
    inverse_frequencies : ``θ_k`` unscaled.

    Notes
    -----
    With ``θ_k = base^(-2k/r)``, ``s`` the factor and ``L`` the pretraining
    context:

    - ``"linear"``, position interpolation (Chen et al. 2023, *Extending
      context window of large language models via positional
      interpolation*): ``θ'_k = θ_k / s``, positions squeezed into ``[0, L)``.
    - ``"dynamic"``, dynamic NTK-aware scaling (bloc97 2023, "NTK-aware
      scaled RoPE", Reddit r/LocalLLaMA; dynamic as in Hugging Face): the
      base grows with the sequence, ``base' = base·(s·n'/L - (s - 1))^(r/(r-2))``,
      ``n' = max(n, L)``, and ``θ'_k = base'^(-2k/r)``.
    - ``"yarn"``, YaRN (Peng et al. 2023, *YaRN: Efficient context window
      extension of large language models*, eq. (17)–(23)): with the
      dimension ``d(β) = r·ln(L / (2πβ)) / (2 ln base)`` at which ``θ_k``
      turns ``β`` times over ``L``, ``lo = max(⌊d(β_fast)⌋, 0)``,
      ``hi = min(⌈d(β_slow)⌉, r - 1)`` and the ramp
      ``γ_k = clip((k - lo)/(hi - lo), 0, 1)``,
      ``θ'_k = (1 - γ_k)·θ_k + γ_k·θ_k / s``: high frequencies kept, low ones
      interpolated. The attention factor is ``m(s) = 0.1·ln s + 1`` (``1`` for
      ``s <= 1``), the paper's ``√(1/t)``; with ``mscale`` and
      ``mscale_all_dim`` it is ``m(s, a)/m(s, b)``, ``m(s, a) = 0.1·a·ln s + 1``
      (DeepSeek-V2).
    - ``"longrope"``, LongRoPE (Ding et al. 2024, *LongRoPE: Extending LLM
      context window beyond 2 million tokens*; Phi-3): ``θ'_k = θ_k / λ_k``,
      ``λ`` the searched ``long_factor`` when ``n > L``, else
      ``short_factor``; attention factor ``√(1 + ln s / ln L)`` (1 for
      ``s <= 1``).
    - ``"llama3"`` (Meta 2024, *The Llama 3 herd of models*; Llama 3.1's
      released ``apply_scaling``): with the wavelength ``λ_k = 2π/θ_k``,
      ``θ'_k = θ_k`` for ``λ_k < L/high_freq_factor``, ``θ_k/s`` for
      ``λ_k > L/low_freq_factor``, and between them
      ``(1 - μ)·θ_k/s + μ·θ_k``,
      ``μ = (L/λ_k - low_freq_factor)/(high_freq_factor - low_freq_factor)``.

    Hugging Face computes these in float32; relattn in float64, then casts
    to ``dtype``.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn import rope_frequencies
    >>> theta, _ = rope_frequencies(4, base=100.0)
    >>> theta.tolist()
    [1.0, 0.1]
    >>> theta, a = rope_frequencies(4, base=100.0, scaling="linear", factor=4.0)
    >>> theta.tolist(), a
    ([0.25, 0.025], 1.0)
    >>> theta, a = rope_frequencies(8, scaling="yarn", factor=4.0, original_max_position=2048)
    >>> np.round(theta, 6).tolist(), round(a, 6)
    ([1.0, 0.1, 0.00625, 0.00025], 1.138629)
    """
    xp = _checks.creation_namespace(xp)
    r = _checks.length("rotary_dim", rotary_dim, minimum=0)
    if r % 2:
        raise ValueError(f"rotary_dim must be even (pairs of features), got {r}")
    base = _check_base(base)
    scaling = _checks.choice("scaling", scaling, (None, *SCALINGS))
    given = {
        "factor": factor,
        "original_max_position": original_max_position,
        "sequence_length": sequence_length,
        "low_freq_factor": low_freq_factor,
        "high_freq_factor": high_freq_factor,
        "beta_fast": beta_fast,
        "beta_slow": beta_slow,
        "truncate": truncate,
        "attention_factor": attention_factor,
        "mscale": mscale,
        "mscale_all_dim": mscale_all_dim,
        "short_factor": short_factor,
        "long_factor": long_factor,
    }
    options = _OPTIONS[scaling]
    for name, value in given.items():
        if value is None and options.get(name):
            raise TypeError(f"scaling={scaling!r} needs {name}")
        if value is not None and name not in options:
            raise TypeError(f"{name} does not apply to scaling={scaling!r}")
    half = r // 2
    theta = [base ** (-2 * k / r) for k in range(half)]
    factor = None if factor is None else _positive("factor", factor)
    if original_max_position is not None:
        original_max_position = _checks.length("original_max_position", original_max_position)
    if sequence_length is not None:
        sequence_length = _checks.length("sequence_length", sequence_length, minimum=0)
    if attention_factor is not None:
        attention_factor = _positive("attention_factor", attention_factor)
    scale = 1.0
    if scaling == "linear":
        assert factor is not None
        theta = [t / factor for t in theta]
    elif scaling == "dynamic":
        assert factor is not None and original_max_position is not None
        assert sequence_length is not None
        theta = _dynamic(r, base, factor, original_max_position, sequence_length)
    elif scaling == "yarn":
        assert factor is not None and original_max_position is not None
        theta, scale = _yarn(
            theta, r, base, factor, original_max_position,
            beta_fast=32.0 if beta_fast is None else _positive("beta_fast", beta_fast),
            beta_slow=1.0 if beta_slow is None else _positive("beta_slow", beta_slow),
            truncate=True if truncate is None else _checks.flag("truncate", truncate),
            mscale=_mscales(mscale, mscale_all_dim),
        )  # fmt: skip
    elif scaling == "longrope":
        assert original_max_position is not None
        if original_max_position < 2:  # its attention factor divides by ln L
            raise ValueError(
                f"original_max_position must be >= 2 for scaling='longrope', "
                f"got {original_max_position}"
            )
        if attention_factor is None and factor is None:
            raise TypeError(
                "scaling='longrope' needs factor (max_position_embeddings / "
                "original_max_position_embeddings) or attention_factor"
            )
        short = _factors("short_factor", short_factor, half)
        long = _factors("long_factor", long_factor, half)
        beyond = sequence_length is not None and sequence_length > original_max_position
        theta = [t / f for t, f in zip(theta, long if beyond else short, strict=True)]
        if factor is not None and factor > 1:
            scale = math.sqrt(1 + math.log(factor) / math.log(original_max_position))
    elif scaling == "llama3":
        assert factor is not None and original_max_position is not None
        low = _positive("low_freq_factor", low_freq_factor)
        high = _positive("high_freq_factor", high_freq_factor)
        if not low < high:
            raise ValueError(
                f"low_freq_factor must be less than high_freq_factor, got {low} and {high}"
            )
        theta = [_llama3(t, factor, original_max_position, low, high) for t in theta]
    if attention_factor is not None:
        scale = attention_factor
    dtype = (
        xpx.default_dtype(xp, device=device) if dtype is None else _checks.dtype("dtype", dtype, xp)
    )
    return xp.asarray(theta, dtype=dtype, device=device), scale


def _real(name: str, value: Any) -> float:
    """A finite real number, as a Python float."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def _positive(name: str, value: Any) -> float:
    """A positive, finite real number, as a Python float."""
    value = _real(name, value)
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def _factors(name: str, values: Any, half: int) -> list[float]:
    """LongRoPE's per-frequency rescale factors: ``r/2`` positive numbers."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"{name} must be a sequence of rotary_dim/2 numbers, got {values!r}")
    if len(values) != half:
        raise ValueError(f"{name} must have rotary_dim/2 = {half} entries, got {len(values)}")
    return [_positive(f"{name}[{k}]", float(v)) for k, v in enumerate(values)]


def _mscales(mscale: Any, mscale_all_dim: Any) -> tuple[float, float] | None:
    """DeepSeek's pair of YaRN magnitude coefficients, or ``None`` (the paper's factor)."""
    if (mscale is None) != (mscale_all_dim is None):
        missing = "mscale_all_dim" if mscale_all_dim is None else "mscale"
        raise TypeError(f"mscale and mscale_all_dim go together: {missing} is missing")
    if mscale is None:
        return None
    pair = _real("mscale", mscale), _real("mscale_all_dim", mscale_all_dim)
    # Hugging Face falls back to the paper's factor when either is 0.
    return pair if pair[0] and pair[1] else None


def _dynamic(r: int, base: float, factor: float, original: int, length: int) -> list[float]:
    """Dynamic NTK: ``θ_k`` of the base grown for ``length`` positions."""
    if r <= 2:  # θ_0 = base^0 = 1 whatever the base
        return [1.0] * (r // 2)
    n = max(length, original)
    grown = base * (factor * n / original - (factor - 1)) ** (r / (r - 2))
    return [grown ** (-2 * k / r) for k in range(r // 2)]


def _yarn_magnitude(scale: float, coefficient: float = 1.0) -> float:
    """YaRN's ``m(s, a) = 0.1·a·ln s + 1`` (1 for ``s <= 1``)."""
    return 1.0 if scale <= 1 else 0.1 * coefficient * math.log(scale) + 1.0


def _yarn(
    theta: list[float],
    r: int,
    base: float,
    factor: float,
    original: int,
    *,
    beta_fast: float,
    beta_slow: float,
    truncate: bool,
    mscale: tuple[float, float] | None,
) -> tuple[list[float], float]:
    """YaRN's frequencies (NTK-by-parts) and attention factor."""

    def dimension(rotations: float) -> float:
        # The k (in units of features, 2k/r) at which θ_k turns `rotations` times over L.
        return r * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dimension(beta_fast), dimension(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, r - 1)
    if low == high:
        high += 0.001  # as Hugging Face: no division by 0
    ramp = [min(max((k - low) / (high - low), 0.0), 1.0) for k in range(len(theta))]
    scaled = [(1 - g) * t + g * t / factor for t, g in zip(theta, ramp, strict=True)]
    if mscale is None:
        return scaled, _yarn_magnitude(factor)
    return scaled, _yarn_magnitude(factor, mscale[0]) / _yarn_magnitude(factor, mscale[1])


def _llama3(theta: float, factor: float, original: int, low: float, high: float) -> float:
    """Llama 3.1's scaling of one frequency, by its wavelength."""
    wavelength = 2 * math.pi / theta
    if wavelength < original / high:
        return theta
    if wavelength > original / low:
        return theta / factor
    mix = (original / wavelength - low) / (high - low)
    return (1 - mix) * theta / factor + mix * theta
