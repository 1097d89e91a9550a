"""rope_frequencies: RoPE scalings for long contexts (SPEC §2.18).

Each scaling against ``_reference``, a float64 loop over the frequencies written
from the papers' (and Hugging Face's) formulas, sharing no code with relattn; then
against Hugging Face transformers' own ``ROPE_INIT_FUNCTIONS`` and, end to end,
``LlamaRotaryEmbedding`` and ``apply_rotary_pos_emb`` at decoding positions
(float32, the precision Hugging Face computes in). The result is an array of
the caller's library on every backend; bad options raise naming the argument.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

import relattn

R = 16  # rotary_dim of the cases: 8 frequencies
BASE = 10000.0
LONG = [1.0 + 0.5 * k for k in range(R // 2)]
SHORT = [1.0 + 0.05 * k for k in range(R // 2)]

#: name -> (relattn's keywords, Hugging Face's rope_parameters, HF's seq_len or None).
#: The lengths are chosen so that each scaling's regimes all occur among 8 frequencies.
CASES = {
    "default": ({}, {"rope_type": "default"}, None),
    "linear": ({"scaling": "linear", "factor": 4.0}, {"rope_type": "linear", "factor": 4.0}, None),
    "dynamic": (
        {"scaling": "dynamic", "factor": 2.0, "original_max_position": 64, "sequence_length": 200},
        {"rope_type": "dynamic", "factor": 2.0},
        200,
    ),
    "dynamic[within]": (
        {"scaling": "dynamic", "factor": 2.0, "original_max_position": 64, "sequence_length": 30},
        {"rope_type": "dynamic", "factor": 2.0},
        30,
    ),
    "yarn": (
        {"scaling": "yarn", "factor": 4.0, "original_max_position": 64},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        None,
    ),
    "yarn[betas,no-truncate]": (
        {
            "scaling": "yarn",
            "factor": 8.0,
            "original_max_position": 256,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
            "truncate": False,
        },
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 256,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
            "truncate": False,
        },
        None,
    ),
    "yarn[mscale]": (
        {
            "scaling": "yarn",
            "factor": 4.0,
            "original_max_position": 64,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
        },
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
        },
        None,
    ),
    "yarn[attention_factor]": (
        {"scaling": "yarn", "factor": 4.0, "original_max_position": 64, "attention_factor": 1.3},
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "attention_factor": 1.3,
        },
        None,
    ),
    "longrope[short]": (
        {
            "scaling": "longrope",
            "factor": 4.0,
            "original_max_position": 64,
            "short_factor": SHORT,
            "long_factor": LONG,
            "sequence_length": 64,
        },
        {
            "rope_type": "longrope",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "short_factor": SHORT,
            "long_factor": LONG,
        },
        64,
    ),
    "longrope[long]": (
        {
            "scaling": "longrope",
            "factor": 4.0,
            "original_max_position": 64,
            "short_factor": SHORT,
            "long_factor": LONG,
            "sequence_length": 65,
        },
        {
            "rope_type": "longrope",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "short_factor": SHORT,
            "long_factor": LONG,
        },
        65,
    ),
    "llama3": (
        {
            "scaling": "llama3",
            "factor": 8.0,
            "original_max_position": 64,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "original_max_position_embeddings": 64,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },
        None,
    ),
}
#: Hugging Face's max_position_embeddings where the scaling has no original_max_position.
MAX_POSITIONS = 64


# ===============================================================================================
# The reference: one frequency at a time, float64
# ===============================================================================================


def _reference(
    r: int,
    base: float = BASE,
    scaling: str | None = None,
    factor: float | None = None,
    original_max_position: int | None = None,
    sequence_length: int | None = None,
    low_freq_factor: float | None = None,
    high_freq_factor: float | None = None,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
    attention_factor: float | None = None,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    short_factor: list[float] | None = None,
    long_factor: list[float] | None = None,
) -> tuple[np.ndarray, float]:
    """θ'_k and the attention factor, from the papers' formulas, one k at a time."""
    s, big_l = factor, original_max_position
    if scaling == "dynamic":  # bloc97's NTK-aware base, grown with the sequence
        n = max(sequence_length, big_l)
        base = base * (s * n / big_l - (s - 1)) ** (r / (r - 2))
    out = np.empty(r // 2)
    for k in range(r // 2):
        theta = base ** (-2.0 * k / r)
        if scaling == "linear":  # Chen et al. 2023: positions m -> m / s
            theta /= s
        elif scaling == "yarn":  # Peng et al. 2023, eq. (17)-(20): NTK-by-parts
            # the (feature-unit) dimension at which θ turns β times over L
            def dim(beta):
                return r * math.log(big_l / (2 * math.pi * beta)) / (2 * math.log(base))

            lo, hi = dim(beta_fast), dim(beta_slow)
            if truncate:
                lo, hi = math.floor(lo), math.ceil(hi)
            lo, hi = max(lo, 0), min(hi, r - 1)
            if hi == lo:
                hi += 0.001
            gamma = np.clip((k - lo) / (hi - lo), 0.0, 1.0)  # 1: interpolate fully
            theta = gamma * theta / s + (1 - gamma) * theta
        elif scaling == "longrope":  # Ding et al. 2024: a searched factor per frequency
            lam = (
                long_factor
                if sequence_length is not None and sequence_length > big_l
                else short_factor
            )
            theta /= lam[k]
        elif scaling == "llama3":  # by the wavelength 2π/θ
            wave = 2 * math.pi / theta
            if wave > big_l / low_freq_factor:
                theta /= s
            elif wave >= big_l / high_freq_factor:
                mu = (big_l / wave - low_freq_factor) / (high_freq_factor - low_freq_factor)
                theta = (1 - mu) * theta / s + mu * theta
        out[k] = theta
    if attention_factor is not None:
        return out, attention_factor
    if scaling == "yarn":

        def m(scale, a=1.0):  # YaRN's sqrt(1/t) = 0.1 ln s + 1
            return 1.0 if scale <= 1 else 0.1 * a * math.log(scale) + 1

        if mscale and mscale_all_dim:
            return out, m(s, mscale) / m(s, mscale_all_dim)
        return out, m(s)
    if scaling == "longrope":
        return out, 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(big_l))
    return out, 1.0


@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_the_reference_in_float64(name):
    options = CASES[name][0]
    got, factor = relattn.rope_frequencies(R, base=BASE, **options)
    want, want_factor = _reference(R, BASE, **options)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64 and got.shape == (R // 2,)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert isinstance(factor, float)
    assert factor == pytest.approx(want_factor, rel=1e-12)


def test_cases_reach_every_regime():
    """The cases are not vacuous: scaled, kept and in-between frequencies all occur."""
    plain = _reference(R)[0]
    for name in ("yarn", "llama3"):
        ratio = relattn.rope_frequencies(R, **CASES[name][0])[0] / plain
        factor = CASES[name][0]["factor"]
        assert np.isclose(ratio, 1).any() and np.isclose(ratio, 1 / factor).any()
        assert ((ratio < 1 - 1e-9) & (ratio > 1 / factor + 1e-9)).any(), name
    dynamic, _ = relattn.rope_frequencies(R, **CASES["dynamic"][0])
    assert (dynamic[1:] < plain[1:]).all()
    within, _ = relattn.rope_frequencies(R, **CASES["dynamic[within]"][0])
    np.testing.assert_allclose(within, plain, rtol=1e-15)


def test_rotary_dim_2_and_0():
    options = {"factor": 2.0, "original_max_position": 4, "sequence_length": 100}
    theta, _ = relattn.rope_frequencies(2, scaling="dynamic", **options)
    assert theta.tolist() == [1.0]
    theta, factor = relattn.rope_frequencies(0, scaling="linear", factor=2.0)
    assert theta.shape == (0,) and factor == 1.0


# ===============================================================================================
# Hugging Face transformers
# ===============================================================================================

_HF = importlib.util.find_spec("transformers") is not None and (
    importlib.util.find_spec("torch") is not None
)
needs_hf = pytest.mark.skipif(not _HF, reason="transformers (and torch) not installed")


def _config(parameters: dict):
    import transformers

    # "dynamic" reads L from max_position_embeddings; the others have their own, and
    # max_position_embeddings = factor·L (YaRN warns of any other).
    original = parameters.get("original_max_position_embeddings")
    return transformers.LlamaConfig(
        hidden_size=2 * R,
        num_attention_heads=2,
        head_dim=R,
        max_position_embeddings=MAX_POSITIONS
        if original is None
        else int(parameters["factor"] * original),
        rope_parameters={"rope_theta": BASE, **parameters},
    )


@needs_hf
@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_transformers_rope_init_functions(name):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    options, parameters, seq_len = CASES[name]
    kind = parameters["rope_type"]
    if kind == "default":
        inv_freq = 1.0 / BASE ** (np.arange(0, R, 2, dtype=np.float32) / R)  # HF's default
        hf_factor = 1.0
    else:
        hf, hf_factor = ROPE_INIT_FUNCTIONS[kind](_config(dict(parameters)), "cpu", seq_len=seq_len)
        inv_freq = hf.numpy()
    got, factor = relattn.rope_frequencies(R, base=BASE, **options)
    assert inv_freq.dtype == np.float32
    # HF works in float32: rounding of base ** (2k/r) and a few products.
    np.testing.assert_allclose(got, inv_freq.astype(np.float64), rtol=2e-6, atol=0)
    assert factor == pytest.approx(float(hf_factor), rel=1e-12)


@needs_hf
@pytest.mark.parametrize("name", sorted(CASES))
def test_rotated_queries_equal_transformers_at_decoding_positions(name):
    """``rotary_position_embedding(q, positions, frequencies=θ')·a`` is Hugging Face's
    ``apply_rotary_pos_emb`` with the ``cos``/``sin`` of its ``LlamaRotaryEmbedding``."""
    import torch
    from transformers.models.llama.modeling_llama import (
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    options, parameters, seq_len = CASES[name]
    length = 4
    # positions end at seq_len - 1 (dynamic and longrope choose by the largest position)
    last = (seq_len or 3 * MAX_POSITIONS) - 1
    positions = np.arange(last - length + 1, last + 1)
    rotary = LlamaRotaryEmbedding(_config(dict(parameters)))
    rng = np.random.default_rng(0)
    q = rng.normal(size=(1, 2, length, R)).astype(np.float32)
    k = rng.normal(size=(1, 2, length, R)).astype(np.float32)
    tq, tk = torch.asarray(q), torch.asarray(k)
    cos, sin = rotary(tq, torch.asarray(positions)[None])
    hf_q, hf_k = (a.numpy() for a in apply_rotary_pos_emb(tq, tk, cos, sin))

    theta, factor = relattn.rope_frequencies(R, base=BASE, **options, dtype=np.float32)
    got_q, got_k = (
        relattn.rotary_position_embedding(x, positions, layout="concatenated", frequencies=theta)
        * np.float32(factor)
        for x in (q, k)
    )
    assert got_q.dtype == np.float32
    # angles up to ~200 rad: HF's float32 angle p·θ is off by ulp(200) ~ 1.5e-5 rad
    np.testing.assert_allclose(got_q, hf_q, rtol=0, atol=5e-5)
    np.testing.assert_allclose(got_k, hf_k, rtol=0, atol=5e-5)


# ===============================================================================================
# Every backend: the caller's library, device and dtype
# ===============================================================================================


@pytest.mark.parametrize("name", ["default", "yarn", "llama3", "longrope[long]"])
def test_result_in_callers_library_device_and_dtype(backend, dtype, name):
    try:
        dt = backend.dtype(dtype)
    except LookupError as e:
        pytest.skip(str(e))
    options = CASES[name][0]
    got, factor = relattn.rope_frequencies(
        R, **options, xp=backend.lib, dtype=dt, device=backend.device
    )
    assert backend.is_array(got)
    assert got.dtype == dt and got.shape == (R // 2,)
    if backend.device is not None:
        import array_api_compat

        assert array_api_compat.device(got) == backend.device
    assert isinstance(factor, float)
    want, _ = _reference(R, BASE, **options)
    backend.assert_close(got, want, dtype)


def test_default_dtype_of_the_library(backend):
    got, _ = relattn.rope_frequencies(R, xp=backend.lib, device=backend.device)
    info = backend.xp.__array_namespace_info__()
    assert got.dtype == info.default_dtypes(device=backend.device)["real floating"]


# ===============================================================================================
# Errors name the argument
# ===============================================================================================

_YARN = {"scaling": "yarn", "factor": 4.0, "original_max_position": 64}
_LLAMA3 = {"scaling": "llama3", "factor": 8.0, "original_max_position": 64,
           "low_freq_factor": 1.0, "high_freq_factor": 4.0}  # fmt: skip
_LONGROPE = {"scaling": "longrope", "factor": 4.0, "original_max_position": 64,
             "short_factor": SHORT, "long_factor": LONG}  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rotary_dim": 7}, ValueError, r"rotary_dim must be even"),
        ({"rotary_dim": -2}, ValueError, r"rotary_dim must be >= 0"),
        ({"rotary_dim": 8.0}, TypeError, r"rotary_dim must be an integer"),
        ({"scaling": "ntk"}, ValueError, r"scaling must be one of .*'ntk'"),
        ({"scaling": "default"}, ValueError, r"scaling must be one of"),
        ({"base": 0.0}, ValueError, r"base must be positive"),
        ({"scaling": "linear"}, TypeError, r"scaling='linear' needs factor"),
        ({"scaling": "linear", "factor": 0.0}, ValueError, r"factor must be positive"),
        ({"scaling": "linear", "factor": -2.0}, ValueError, r"factor must be positive"),
        ({"scaling": "linear", "factor": "2"}, TypeError, r"factor must be a real number"),
        ({"scaling": "linear", "factor": math.inf}, ValueError, r"factor must be finite"),
        ({"factor": 2.0}, TypeError, r"factor does not apply to scaling=None"),
        ({"scaling": "linear", "factor": 2.0, "original_max_position": 8}, TypeError,
         r"original_max_position does not apply to scaling='linear'"),
        ({"scaling": "dynamic", "factor": 2.0, "original_max_position": 64}, TypeError,
         r"scaling='dynamic' needs sequence_length"),
        ({"scaling": "dynamic", "factor": 2.0, "sequence_length": 64}, TypeError,
         r"scaling='dynamic' needs original_max_position"),
        ({"scaling": "dynamic", "factor": 2.0, "original_max_position": 0,
          "sequence_length": 9}, ValueError, r"original_max_position must be >= 1"),
        ({"scaling": "yarn", "factor": 4.0}, TypeError,
         r"scaling='yarn' needs original_max_position"),
        ({**_YARN, "beta_fast": 0.0}, ValueError, r"beta_fast must be positive"),
        ({**_YARN, "beta_slow": -1.0}, ValueError, r"beta_slow must be positive"),
        ({**_YARN, "truncate": 1}, TypeError, r"truncate must be a bool"),
        ({**_YARN, "mscale": 1.0}, TypeError, r"mscale_all_dim is missing"),
        ({**_YARN, "mscale_all_dim": 1.0}, TypeError, r"mscale is missing"),
        ({**_YARN, "attention_factor": 0.0}, ValueError, r"attention_factor must be positive"),
        ({**_YARN, "low_freq_factor": 1.0}, TypeError,
         r"low_freq_factor does not apply to scaling='yarn'"),
        ({**_LLAMA3, "low_freq_factor": None}, TypeError,
         r"scaling='llama3' needs low_freq_factor"),
        ({**_LLAMA3, "high_freq_factor": None}, TypeError,
         r"scaling='llama3' needs high_freq_factor"),
        ({**_LLAMA3, "high_freq_factor": 1.0}, ValueError,
         r"low_freq_factor must be less than high_freq_factor"),
        ({**_LLAMA3, "low_freq_factor": 0.0}, ValueError, r"low_freq_factor must be positive"),
        ({**_LONGROPE, "short_factor": None}, TypeError, r"scaling='longrope' needs short_factor"),
        ({**_LONGROPE, "long_factor": None}, TypeError, r"scaling='longrope' needs long_factor"),
        ({**_LONGROPE, "short_factor": SHORT[:-1]}, ValueError,
         r"short_factor must have rotary_dim/2 = 8 entries, got 7"),
        ({**_LONGROPE, "long_factor": [*LONG, 1.0]}, ValueError,
         r"long_factor must have rotary_dim/2 = 8 entries, got 9"),
        ({**_LONGROPE, "long_factor": 2.0}, TypeError, r"long_factor must be a sequence"),
        ({**_LONGROPE, "short_factor": [0.0] * 8}, ValueError,
         r"short_factor\[0\] must be positive"),
        ({**_LONGROPE, "factor": None}, TypeError, r"needs factor .* or attention_factor"),
        ({**_LONGROPE, "original_max_position": 1}, ValueError,
         r"original_max_position must be >= 2"),
        ({"dtype": np.int64}, TypeError, r"dtype must be a real floating dtype"),
        ({"xp": "numpy"}, TypeError, r"xp must be an array library module"),
    ],
)  # fmt: skip
def test_bad_options_name_the_argument(kwargs, error, match):
    kwargs = {"rotary_dim": R, **kwargs}
    with pytest.raises(error, match=match):
        relattn.rope_frequencies(kwargs.pop("rotary_dim"), **kwargs)


def test_longrope_without_factor_takes_the_given_attention_factor():
    options = {**_LONGROPE, "factor": None, "attention_factor": 1.25}
    assert relattn.rope_frequencies(R, **options)[1] == 1.25
