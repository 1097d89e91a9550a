"""relattn.layers: one attention layer per position scheme against per-pair loop references.

The references below are written here, from the papers, as NumPy float64 loops over
``(batch, head, query, key)``; none calls relattn (the ALiBi slopes, the T5 and DeBERTa
buckets, the sinusoid and RoPE's rotation are all re-derived):

- ``transformer_xl``: Dai et al. 2019, §3.3, ``A_ij = (q_i + u)·k_j + (q_i + v)·W_R
  r_{i-j}``, ``r`` the sinusoid of Vaswani et al. §3.5 (``ω_k = 10000^(-2k/d)``) laid out
  ``[sin | cos]`` as Transformer-XL's code does; scale ``1/√d_head``.
- ``t5``: Raffel et al. 2020, §2.1, Mesh TensorFlow's ``_relative_position_bucket`` of
  ``key - query``; no ``1/√d`` scale.
- ``alibi``: Press et al. 2022, ``-m_h·|i - j|``, the authors' ``get_slopes`` (powers of 2
  and the interleaved rule otherwise).
- ``rope``: Su et al. 2021, eq. (34), in the concatenated (``rotate_half``) layout,
  partial rotary (GPT-NeoX) and linear position interpolation.
- ``deberta``: He et al. 2021, eq. (4): c2p + p2c scaled by ``1/√(3d)``, the v2 log
  buckets of query minus key (``make_log_bucket_position``); both position terms at
  ``φ(i, j)``, as DeBERTa's and Hugging Face's code index them.
- ``shaw``: Shaw et al. 2018, eq. (3)-(5), ``w_clip(j-i, K)`` on keys and values.
- ``swin``: Liu et al. 2021, §3.2, ``B[(Δrow + h-1)(2w-1) + Δcol + w-1]``, query minus key.
- ``decomposed``: Li et al. 2022 (MViTv2) / SAM: ``(q·s)·k + q·R^h[Δrow] + q·R^w[Δcol]``,
  the unscaled ``q`` on the tables.

relattn's layer is compared with them at 1e-12 on NumPy, PyTorch and JAX (float64), and its
gradients (``torch.autograd``, ``jax.grad``) with each other and with central differences.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import relattn
from relattn.layers import (
    SCHEMES,
    LayerConfig,
    Parameter,
    init_parameters,
    layer_attention,
    layer_memory,
)

TOL = 1e-12
BATCH = 2

# ================================================================================================
# The layers under test: name -> (LayerConfig keywords, sequence length)
# ================================================================================================

CASES: dict[str, tuple[dict[str, Any], int]] = {
    "transformer_xl": (dict(scheme="transformer_xl", d_model=8, num_heads=2), 6),
    # bidirectional: 4 buckets a side, 2 exact; the log buckets reached from |δ| = 3 on.
    "t5": (dict(scheme="t5", d_model=8, num_heads=2, num_buckets=8, max_distance=5), 7),
    "alibi_h2": (dict(scheme="alibi", d_model=8, num_heads=2), 6),
    "alibi_h6": (dict(scheme="alibi", d_model=12, num_heads=6), 5),
    "rope": (dict(scheme="rope", d_model=8, num_heads=2, use_bias=True), 6),
    "rope_partial_linear": (
        dict(
            scheme="rope",
            d_model=8,
            num_heads=2,
            head_dim=6,
            rotary_dim=4,
            rope_base=100.0,
            rope_scaling={"scaling": "linear", "factor": 2.0},
        ),
        6,
    ),
    # mid = 3: |i - j| = 4, 5 share log bucket 4, 6 is bucket 5.
    "deberta": (
        dict(
            scheme="deberta", d_model=8, num_heads=2, position_buckets=6, max_relative_positions=10
        ),
        7,
    ),
    "deberta_clipped": (
        dict(
            scheme="deberta", d_model=8, num_heads=2, position_buckets=0, max_relative_positions=3
        ),
        6,
    ),
    "shaw": (dict(scheme="shaw", d_model=8, num_heads=2, head_dim=3, max_relative_position=2), 6),
    "swin": (dict(scheme="swin", d_model=8, num_heads=2, grid=(2, 3)), 6),
    "decomposed": (dict(scheme="decomposed", d_model=8, num_heads=2, grid=(2, 3)), 6),
}
#: Schemes that take a decoder's cache, memory and positions (every one but the grid ones).
SEQUENCE_SCHEMES = ("transformer_xl", "t5", "alibi_h2", "rope", "deberta", "shaw")


def make(name: str, seed: int = 0, **overrides: Any) -> tuple[LayerConfig, dict, np.ndarray]:
    """The case's config, parameters drawn large enough for uneven weights (not the
    reference initialisers' σ = 0.02, whose attention is nearly uniform), and an input."""
    keywords, length = CASES[name]
    config = LayerConfig(**{**keywords, **overrides})
    rng = np.random.default_rng(seed)
    params = {p.name: rng.normal(scale=0.5, size=p.shape) for p in config.parameters()}
    x = rng.normal(size=(BATCH, length, config.d_model))
    return config, params, x


def max_diff(a: Any, b: Any) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


# ================================================================================================
# The references, from the papers
# ================================================================================================


def sinusoid(position: float, d: int) -> np.ndarray:
    """Vaswani et al. §3.5, ``ω_k = 10000^(-2k/d)``, Transformer-XL's ``[sin | cos]``."""
    omega = 10000.0 ** (-np.arange(0, d, 2) / d)
    return np.concatenate([np.sin(position * omega), np.cos(position * omega)])


def t5_bucket(relative: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """Mesh TensorFlow's ``_relative_position_bucket`` of ``key - query``."""
    bucket, n = 0, num_buckets
    if bidirectional:
        n //= 2
        bucket += n if relative > 0 else 0
        a = abs(relative)
    else:
        a = max(-relative, 0)
    exact = n // 2
    if a < exact:
        return bucket + a
    large = exact + int(math.log(a / exact) / math.log(max_distance / exact) * (n - exact))
    return bucket + min(large, n - 1)


def alibi_reference_slopes(heads: int) -> list[float]:
    """Press et al.'s ``get_slopes`` (the authors' repository)."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(heads).is_integer():
        return power_of_2(heads)
    closest = 2 ** math.floor(math.log2(heads))
    return power_of_2(closest) + power_of_2(2 * closest)[0::2][: heads - closest]


def deberta_log_bucket(r: int, bucket_size: int, max_position: int) -> int:
    """DeBERTa-v2's ``make_log_bucket_position`` for one relative position."""
    mid = bucket_size // 2
    if abs(r) <= mid:
        return r
    steps = math.log(abs(r) / mid) / math.log((max_position - 1) / mid) * (mid - 1)
    return int(math.copysign(mid + math.ceil(steps), r))


def rope_rotate(vector: np.ndarray, position: float, rotary_dim: int, theta: np.ndarray):
    """``x cos(pθ) + rotate_half(x) sin(pθ)`` on the first ``rotary_dim`` features."""
    half = rotary_dim // 2
    a, b = vector[:half], vector[half:rotary_dim]
    cos, sin = np.cos(position * theta), np.sin(position * theta)
    return np.concatenate([a * cos - b * sin, a * sin + b * cos, vector[rotary_dim:]])


def _scheme_terms(config, p, q, k, qpos, kpos):
    """``score(b, h, i, j)`` (scaled, with the position terms) and ``value_term(h, i, j)``."""
    heads, dh = config.num_heads, config.dim
    scheme = config.scheme
    default_scale = {"t5": 1.0, "deberta": 1 / math.sqrt(3 * dh)}.get(scheme, 1 / math.sqrt(dh))
    s = default_scale if config.scale is None else config.scale

    def cols(h):
        return slice(h * dh, (h + 1) * dh)

    def proj(t, n):
        y = t @ p[f"w_{n}"]
        return y + p[f"b_{n}"] if config.biased else y

    def no_value(h, i, j):
        return 0.0

    if scheme == "transformer_xl":
        u, vb = p["content_bias"], p["position_bias"]

        def score(b, h, i, j):
            r = sinusoid(qpos[i] - kpos[j], config.d_model) @ p["w_r"]
            c = cols(h)
            return ((q[b, i, c] + u[h]) @ k[b, j, c] + (q[b, i, c] + vb[h]) @ r[c]) * s

    elif scheme == "t5":
        table = p["relative_attention_bias"]

        def score(b, h, i, j):
            bucket = t5_bucket(int(kpos[j] - qpos[i]), not config.causal, config.num_buckets,
                               config.max_distance)  # fmt: skip
            return q[b, i, cols(h)] @ k[b, j, cols(h)] * s + table[bucket, h]

    elif scheme == "alibi":
        slopes = alibi_reference_slopes(heads)

        def score(b, h, i, j):
            c = cols(h)
            return q[b, i, c] @ k[b, j, c] * s - slopes[h] * abs(qpos[i] - kpos[j])

    elif scheme == "rope":
        r = dh if config.rotary_dim is None else config.rotary_dim
        theta = config.rope_base ** (-np.arange(r // 2) * 2.0 / r)
        scaling, factor = dict(config.rope_keywords), 1.0
        if scaling.get("scaling") == "linear":  # position interpolation: θ / s
            theta = theta / scaling["factor"]
        elif scaling.get("scaling") == "longrope":  # θ / λ, λ long beyond L; HF's cos·a, sin·a
            beyond = len(kpos) > scaling["original_max_position"]
            theta = theta / np.asarray(scaling["long_factor" if beyond else "short_factor"])
            factor = scaling["attention_factor"]
        else:
            assert not scaling

        def rotate(vector, position):
            out = rope_rotate(vector, position, r, theta)
            out[:r] *= factor  # HF scales cos and sin: the rotated features only
            return out

        def score(b, h, i, j):
            c = cols(h)
            return rotate(q[b, i, c], qpos[i]) @ rotate(k[b, j, c], kpos[j]) * s

    elif scheme == "deberta":
        span = config.position_buckets or config.max_relative_positions
        rows = p["rel_embeddings"]
        key_rows, query_rows = proj(rows, "k"), proj(rows, "q")

        def score(b, h, i, j):
            r = int(qpos[i] - kpos[j])  # DeBERTa: query minus key
            if config.position_buckets:
                r = deberta_log_bucket(r, config.position_buckets, config.max_relative_positions)
            phi = min(max(r + span, 0), 2 * span - 1)
            c = cols(h)
            return (
                q[b, i, c] @ k[b, j, c] + q[b, i, c] @ key_rows[phi, c]
                + k[b, j, c] @ query_rows[phi, c]
            ) * s  # fmt: skip

    elif scheme == "shaw":
        big_k = config.max_relative_position
        wk, wv = p["key_embeddings"], p["value_embeddings"]

        def index(i, j):
            return min(max(int(kpos[j] - qpos[i]), -big_k), big_k) + big_k

        def score(b, h, i, j):
            c = cols(h)
            return q[b, i, c] @ (k[b, j, c] + wk[index(i, j)]) * s

        def value_term(h, i, j):
            return wv[index(i, j)]

        return score, value_term

    elif scheme == "swin":
        gh, gw = config.grid
        table = p["relative_position_bias_table"]

        def score(b, h, i, j):
            (ri, ci), (rj, cj) = divmod(i, gw), divmod(j, gw)
            row = (ri - rj + gh - 1) * (2 * gw - 1) + (ci - cj + gw - 1)
            return q[b, i, cols(h)] @ k[b, j, cols(h)] * s + table[row, h]

    else:  # decomposed
        gh, gw = config.grid
        rel_h, rel_w = p["rel_pos_h"], p["rel_pos_w"]

        def score(b, h, i, j):
            (ri, ci), (rj, cj) = divmod(i, gw), divmod(j, gw)
            c = cols(h)
            qi = q[b, i, c]
            return (
                (qi * s) @ k[b, j, c] + qi @ rel_h[ri - rj + gh - 1] + qi @ rel_w[ci - cj + gw - 1]
            )

    return score, no_value


def loop_reference(config, p, x, *, memory=None, mask=None, bias=None):
    """The layer, one ``(batch, head, query, key)`` at a time: queries at ``M … M+L-1``
    over the keys of ``[memory; x]`` at ``0 … M+L-1``; ``mask`` True = may attend;
    ``bias`` added to the scores."""
    p = {name: np.asarray(a, dtype=np.float64) for name, a in p.items()}
    x = np.asarray(x, dtype=np.float64)
    heads, dh = config.num_heads, config.dim
    context = x if memory is None else np.concatenate([memory, x], axis=1)
    batch, lq, lk = x.shape[0], x.shape[1], context.shape[1]
    qpos, kpos = np.arange(lk - lq, lk), np.arange(lk)

    def proj(t, n):
        y = t @ p[f"w_{n}"]
        return y + p[f"b_{n}"] if config.biased else y

    q, k, v = proj(x, "q"), proj(context, "k"), proj(context, "v")
    score, value_term = _scheme_terms(config, p, q, k, qpos, kpos)
    allowed_all = np.ones((batch, heads, lq, lk), bool)
    if mask is not None:
        allowed_all = np.broadcast_to(np.asarray(mask, bool), allowed_all.shape)
    added = np.broadcast_to(0.0 if bias is None else bias, allowed_all.shape)
    out = np.zeros((batch, lq, heads * dh))
    for b in range(batch):
        for h in range(heads):
            c = slice(h * dh, (h + 1) * dh)
            for i in range(lq):
                logits, values = np.zeros(lk), v[b, :, c].copy()
                allowed = allowed_all[b, h, i].copy()
                for j in range(lk):
                    if config.causal and kpos[j] > qpos[i]:
                        allowed[j] = False
                    logits[j] = score(b, h, i, j) + added[b, h, i, j]
                    values[j] = values[j] + value_term(h, i, j)
                if allowed.any():
                    w = np.where(allowed, np.exp(logits - logits[allowed].max()), 0.0)
                    out[b, i, c] = w / w.sum() @ values
    return proj(out, "o")


def padding_mask(batch: int, lk: int) -> np.ndarray:
    """A key padding mask ``(B, 1, 1, Lk)``: row ``b`` keeps its first ``Lk - 2b`` keys."""
    lengths = np.maximum(lk - 2 * np.arange(batch), 1)
    return (np.arange(lk)[None, :] < lengths[:, None])[:, None, None, :]


# ================================================================================================
# The references themselves
# ================================================================================================


def test_reference_pieces_against_published_values():
    # ALiBi, Press et al. §3: H = 8 gives 1/2 … 1/2^8; the interleaved rule for H = 6.
    assert alibi_reference_slopes(8) == [2.0**-n for n in range(1, 9)]
    assert alibi_reference_slopes(2) == [2.0**-4, 2.0**-8]
    assert alibi_reference_slopes(6) == [2.0**-n for n in (2, 4, 6, 8, 1, 3)]
    # T5 (HF's doctest-free table, num_buckets=32, max_distance=128, bidirectional).
    assert [t5_bucket(d, True, 32, 128) for d in (-200, -20, -3, 0, 3, 20, 200)] == [
        15, 10, 3, 0, 19, 26, 31,
    ]  # fmt: skip
    assert [t5_bucket(d, False, 32, 128) for d in (3, 0, -3, -16, -17, -127, -128)] == [
        0, 0, 3, 16, 16, 31, 31,
    ]  # fmt: skip
    # DeBERTa-v2's log buckets: exact within mid, odd.
    assert [deberta_log_bucket(r, 256, 512) for r in (0, 5, 128, -128)] == [0, 5, 128, -128]
    assert deberta_log_bucket(129, 256, 512) == 129 and deberta_log_bucket(-511, 256, 512) == -255
    # The sinusoid: PE(1) with d = 4 is [sin 1, sin 0.01, cos 1, cos 0.01].
    np.testing.assert_allclose(sinusoid(1.0, 4), [math.sin(1), math.sin(0.01), math.cos(1),
                                                  math.cos(0.01)], rtol=0, atol=1e-15)  # fmt: skip
    # RoPE is a rotation, and <R(m) q, R(n) k> depends on n - m alone.
    rng = np.random.default_rng(1)
    a, b, theta = rng.normal(size=6), rng.normal(size=6), 10.0 ** -np.arange(3)
    assert abs(np.linalg.norm(rope_rotate(a, 5.0, 6, theta)) - np.linalg.norm(a)) < 1e-14
    dot = rope_rotate(a, 2.0, 6, theta) @ rope_rotate(b, 5.0, 6, theta)
    assert abs(dot - rope_rotate(a, 9.0, 6, theta) @ rope_rotate(b, 12.0, 6, theta)) < 1e-13


# ================================================================================================
# Forward on NumPy float64 against the references
# ================================================================================================

FIGURES: dict[str, float] = {}


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "padding"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", list(CASES))
def test_numpy_matches_loop_reference(name, causal, masked):
    if name == "decomposed" and (causal or masked):
        pytest.skip("decomposed: SAM attends over the whole grid, without mask (errors tested)")
    config, params, x = make(name, causal=causal)
    mask = padding_mask(BATCH, x.shape[1]) if masked else None
    out = layer_attention(config, params, x, mask=mask)
    expected = loop_reference(config, params, x, mask=mask)
    assert out.shape == x.shape and out.dtype == np.float64
    diff = max_diff(out, expected)
    FIGURES[f"numpy/{name}/{'causal' if causal else 'full'}/{masked}"] = diff
    assert diff <= TOL, diff


@pytest.mark.parametrize("variant", ["scale", "blockwise", "bias"])
@pytest.mark.parametrize("name", list(CASES))
def test_options_match_loop_reference(name, variant):
    """``scale=`` replaces the scheme's (DeBERTa's 1/√(3d), T5's 1; SAM's on q·k only);
    ``block_size=2`` runs relattn's blockwise paths; ``bias=`` adds to the scores."""
    causal = _causal_for(name)
    overrides = {"scale": 0.3} if variant == "scale" else {}
    if variant == "blockwise":
        overrides["block_size"] = 2
    config, params, x = make(name, causal=causal, **overrides)
    length = x.shape[1]
    bias = None
    if variant == "bias":
        if config.scheme == "decomposed":
            pytest.skip("decomposed takes no bias (errors tested)")
        bias = np.random.default_rng(7).normal(size=(BATCH, config.num_heads, length, length))
    mask = padding_mask(BATCH, length) if variant == "blockwise" and name != "decomposed" else None
    out = layer_attention(config, params, x, mask=mask, bias=bias)
    if variant == "blockwise":  # the block fold, not the dense path
        plan = relattn.explain(layer_attention, config, params, x, mask=mask)
        assert str(plan).startswith("path: fold"), str(plan)
    diff = max_diff(out, loop_reference(config, params, x, mask=mask, bias=bias))
    FIGURES[f"{variant}/{name}"] = diff
    assert diff <= TOL, diff


@pytest.mark.parametrize("name", list(CASES))
def test_unbatched_and_extra_leading_dims(name):
    """``x`` of shape ``(L, d_model)`` and ``(2, B, L, d_model)`` give the batched rows."""
    config, params, x = make(name, causal=_causal_for(name))
    batched = layer_attention(config, params, x)
    assert max_diff(layer_attention(config, params, x[1]), batched[1]) <= TOL
    stacked = layer_attention(config, params, np.stack([x, x[::-1]]))
    assert stacked.shape == (2, *x.shape)
    assert max_diff(stacked[0], batched) <= TOL and max_diff(stacked[1], batched[::-1]) <= TOL


LONGROPE = {"scaling": "longrope", "original_max_position": 4, "short_factor": [1.0, 2.0],
            "long_factor": [3.0, 0.5], "attention_factor": 1.5}  # fmt: skip


@pytest.mark.parametrize("length", [3, 6], ids=["short", "long"])
@pytest.mark.parametrize(
    "head_dim",
    [
        4,
        6,
    ],
    ids=["full_rotary", "partial_rotary"],
)  # fmt: skip
def test_rope_attention_factor_on_the_rotated_features(head_dim, length):
    """LongRoPE (Phi-3): ``θ/λ`` with the short or the long factors (the sequence beyond
    ``original_max_position = 4``), and cos, sin multiplied by the attention factor."""
    config = LayerConfig(d_model=8, num_heads=2, scheme="rope", head_dim=head_dim, rotary_dim=4,
                         rope_scaling=LONGROPE, causal=True)  # fmt: skip
    rng = np.random.default_rng(9)
    params = {p.name: rng.normal(scale=0.5, size=p.shape) for p in config.parameters()}
    x = rng.normal(size=(BATCH, length, 8))
    diff = max_diff(layer_attention(config, params, x), loop_reference(config, params, x))
    assert diff <= TOL, diff


def test_alibi_slopes_follow_press_et_al():
    """H = 2 (power of 2) and H = 6 (interleaved): one head's bias read off the scores."""
    for heads in (2, 6):
        config = LayerConfig(d_model=2 * heads, num_heads=heads, scheme="alibi", use_bias=False)
        params = {p.name: np.zeros(p.shape) for p in config.parameters()}
        eye = np.eye(2 * heads)
        params["w_o"] = eye
        # Values: head h reads the key position j in its first feature; zero queries and
        # keys leave scores = -m_h |i - j|, so the output of query 0 is Σ_j j e^{-m j} / Σ e^{-m j}.
        length = 4
        x = np.zeros((1, length, 2 * heads))
        x[0, :, 0] = np.arange(length)
        params["w_v"] = np.zeros((2 * heads, 2 * heads))
        params["w_v"][0, 0::2] = 1.0
        out = layer_attention(config, params, x)
        for h, m in enumerate(alibi_reference_slopes(heads)):
            w = np.exp(-m * np.arange(length))
            assert abs(out[0, 0, 2 * h] - (np.arange(length) @ w) / w.sum()) <= TOL


def test_full_causal_and_mask_differ():
    """The cases above are not vacuous: the causal and padding masks change the outputs."""
    config, params, x = make("rope")
    full = layer_attention(config, params, x)
    causal = layer_attention(LayerConfig(**{**CASES["rope"][0], "causal": True}), params, x)
    padded = layer_attention(config, params, x, mask=padding_mask(BATCH, x.shape[1]))
    assert max_diff(full, causal) > 1e-3 and max_diff(full, padded) > 1e-3


# ================================================================================================
# Transformer-XL memory and the decoder cache
# ================================================================================================


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("name", SEQUENCE_SCHEMES)
def test_memory_matches_loop_reference(name, causal):
    """Keys over ``[memory; x]`` at ``0 … M+L-1``, queries at ``M … M+L-1``."""
    config, params, x = make(name, causal=causal)
    memory = np.random.default_rng(5).normal(size=(BATCH, 3, config.d_model))
    out = layer_attention(config, params, x, memory=memory)
    diff = max_diff(out, loop_reference(config, params, x, memory=memory))
    FIGURES[f"memory/{name}/{causal}"] = diff
    assert diff <= TOL, diff
    if causal:  # the memory's rows are the earlier tokens: the tail of one causal call
        whole = layer_attention(config, params, np.concatenate([memory, x], axis=1))
        assert max_diff(out, whole[:, 3:]) <= TOL


def test_transformer_xl_segments_with_layer_memory():
    """Segment by segment with ``layer_memory`` (M = 4) equals the loop over each
    segment's memory; the memory is the last M inputs, cut from autograd."""
    config, params, _ = make("transformer_xl", causal=True, memory_length=4)
    rng = np.random.default_rng(2)
    segments = [rng.normal(size=(BATCH, n, config.d_model)) for n in (3, 5, 2)]
    memory = None
    for segment in segments:
        out = layer_attention(config, params, segment, memory=memory)
        assert max_diff(out, loop_reference(config, params, segment, memory=memory)) <= TOL
        seen = segment if memory is None else np.concatenate([memory, segment], axis=1)
        memory = layer_memory(config, memory, segment)
        np.testing.assert_array_equal(memory, seen[:, -4:])
    assert memory.shape == (BATCH, 4, config.d_model)
    torch = pytest.importorskip("torch")
    hidden = torch.ones((1, 5, config.d_model), dtype=torch.float64, requires_grad=True)
    kept = layer_memory(config, None, hidden * 2)
    assert tuple(kept.shape) == (1, 4, config.d_model) and not kept.requires_grad


@pytest.mark.parametrize("name", SEQUENCE_SCHEMES)
def test_decoder_cache_prefill_and_steps(name):
    """Prefill 3 tokens, a step of 2, then single steps: the full causal call's rows."""
    config, params, x = make(name, causal=True)
    length = x.shape[1]
    full = layer_attention(config, params, x)
    out, cache = layer_attention(config, params, x[:, :3], return_cache=True)
    pieces, start = [out], 3
    for stop in (5, *range(6, length + 1)):
        assert cache[0].shape == (BATCH, config.num_heads, start, config.dim)
        out, cache = layer_attention(config, params, x[:, start:stop], cache=cache,
                                     return_cache=True)  # fmt: skip
        pieces.append(out)
        start = stop
    assert cache[1].shape == (BATCH, config.num_heads, length, config.dim)
    diff = max_diff(np.concatenate(pieces, axis=1), full)
    FIGURES[f"cache/{name}"] = diff
    assert diff <= TOL, diff


@pytest.mark.parametrize("name", SEQUENCE_SCHEMES)
def test_decoder_cache_with_padding_mask(name):
    """A key padding mask over ``cache + new`` keys, sliced per step, as in generation."""
    config, params, x = make(name, causal=True)
    length = x.shape[1]
    mask = np.ones((BATCH, 1, 1, length), bool)
    mask[1, ..., 1] = mask[0, ..., 3] = False  # holes inside the sequence
    full = layer_attention(config, params, x, mask=mask)
    out, cache = layer_attention(config, params, x[:, :4], mask=mask[..., :4], return_cache=True)
    pieces = [out]
    for t in range(4, length):
        out, cache = layer_attention(config, params, x[:, t : t + 1], cache=cache,
                                     mask=mask[..., : t + 1], return_cache=True)  # fmt: skip
        pieces.append(out)
    assert max_diff(np.concatenate(pieces, axis=1), full) <= TOL
    assert max_diff(full, loop_reference(config, params, x, mask=mask)) <= TOL


def test_rope_cache_with_positions_pair():
    """RoPE decoding with positions as data: queries at their positions, keys at the
    whole sequence's (the cache's included), offset by 7 and by a per-row offset."""
    config, params, x = make("rope", causal=True)
    length = x.shape[1]
    for positions in (np.arange(length) + 7, np.arange(length) + np.asarray([[[0]], [[5]]])):
        full = layer_attention(config, params, x, positions=(positions, positions))
        assert max_diff(full, layer_attention(config, params, x)) <= TOL
        out, cache = layer_attention(config, params, x[:, :3],
                                     positions=(positions[..., :3], positions[..., :3]),
                                     return_cache=True)  # fmt: skip
        pieces = [out]
        for t in range(3, length):
            out, cache = layer_attention(
                config, params, x[:, t : t + 1], cache=cache,
                positions=(positions[..., t : t + 1], positions[..., : t + 1]), return_cache=True,
            )  # fmt: skip
            pieces.append(out)
        assert max_diff(np.concatenate(pieces, axis=1), full) <= TOL


# ================================================================================================
# Positions as data
# ================================================================================================


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", SEQUENCE_SCHEMES)
def test_positions_offset_is_invisible_to_relative_schemes(name, causal):
    """Every scheme here reads ``key - query`` only (RoPE: ``<R(m)q, R(n)k>`` depends on
    ``n - m``): positions ``7 … 7+L-1`` give the layer of positions ``0 … L-1``."""
    config, params, x = make(name, causal=causal)
    positions = np.arange(x.shape[1]) + 7
    base = layer_attention(config, params, x)
    shifted = layer_attention(config, params, x, positions=positions)
    assert max_diff(shifted, base) <= TOL
    pair = layer_attention(config, params, x, positions=(positions, positions))
    assert max_diff(pair, base) <= TOL


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", SEQUENCE_SCHEMES)
def test_packed_documents_equal_separate_calls(name, causal):
    """Two documents packed in one row, positions restarting at the boundary and
    ``segment_ids`` keeping them apart, give each document's own layer."""
    config, params, x = make(name, causal=causal)
    first = 4
    length = x.shape[1]
    positions = np.concatenate([np.arange(first), np.arange(length - first)])
    segments = np.asarray([0] * first + [1] * (length - first))
    packed = layer_attention(config, params, x, positions=(positions, positions),
                             segment_ids=segments)  # fmt: skip
    apart = np.concatenate([layer_attention(config, params, x[:, :first]),
                            layer_attention(config, params, x[:, first:])], axis=1)  # fmt: skip
    diff = max_diff(packed, apart)
    FIGURES[f"packed/{name}/{causal}"] = diff
    assert diff <= TOL, diff


# ================================================================================================
# PyTorch and JAX float64: forward and gradients
# ================================================================================================

#: One parameter per case, checked against central differences.
FD_PARAMETER = {
    "transformer_xl": "position_bias", "t5": "relative_attention_bias", "alibi_h2": "b_q",
    "alibi_h6": "w_k", "rope": "w_k", "rope_partial_linear": "w_q",
    "deberta": "rel_embeddings", "deberta_clipped": "rel_embeddings",
    "shaw": "value_embeddings", "swin": "relative_position_bias_table",
    "decomposed": "rel_pos_h",
}  # fmt: skip


def _causal_for(name: str) -> bool:
    return CASES[name][0]["scheme"] in ("transformer_xl", "t5", "alibi", "rope")


@pytest.fixture(scope="module")
def jax_float64():
    jax = pytest.importorskip("jax")
    if jax.numpy.asarray(1.0).dtype != np.float64:
        pytest.skip("JAX without float64 (conftest.py sets JAX_ENABLE_X64 before importing jax)")
    return jax


@pytest.mark.parametrize("name", list(CASES))
def test_torch_and_jax_forward_and_gradients(name, jax_float64):
    torch = pytest.importorskip("torch")
    jax, jnp = jax_float64, jax_float64.numpy
    config, params, x = make(name, causal=_causal_for(name))
    masked = config.scheme != "decomposed"
    mask = padding_mask(BATCH, x.shape[1]) if masked else None
    expected = loop_reference(config, params, x, mask=mask)
    weights = np.random.default_rng(3).normal(size=x.shape)  # loss = Σ out · weights

    # PyTorch: forward and autograd.
    tp = {n: torch.tensor(a, requires_grad=True) for n, a in params.items()}
    tx = torch.tensor(x, requires_grad=True)
    tmask = None if mask is None else torch.tensor(mask)
    out = layer_attention(config, tp, tx, mask=tmask)
    assert out.dtype == torch.float64
    torch_diff = max_diff(out.detach().numpy(), expected)
    (out * torch.tensor(weights)).sum().backward()
    torch_grads = {n: t.grad.numpy() for n, t in tp.items()}
    torch_grads["x"] = tx.grad.numpy()

    # JAX: forward and jax.grad, under one jax.jit (eager JAX dispatches op by op, slower).
    jmask = None if mask is None else jnp.asarray(mask)

    def loss(p, xx):
        out = layer_attention(config, p, xx, mask=jmask)
        return jnp.sum(out * weights), out

    jp = {n: jnp.asarray(a) for n, a in params.items()}
    grad = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))
    (jax_param_grads, jax_x_grad), jout = grad(jp, jnp.asarray(x))
    assert jout.dtype == jnp.float64
    jax_diff = max_diff(jout, expected)
    FIGURES[f"torch/{name}"], FIGURES[f"jax/{name}"] = torch_diff, jax_diff
    assert torch_diff <= TOL and jax_diff <= TOL, (torch_diff, jax_diff)

    # The two libraries' gradients agree; every parameter has a nonzero one.
    FIGURES[f"grad/{name}"] = 0.0
    for n, g in {**jax_param_grads, "x": jax_x_grad}.items():
        g = np.asarray(g)
        scale = max(1.0, float(np.abs(g).max()))
        FIGURES[f"grad/{name}"] = max(FIGURES[f"grad/{name}"], max_diff(g, torch_grads[n]))
        assert max_diff(g, torch_grads[n]) <= TOL * scale, n
        if n not in ("b_k",):  # b_k shifts every score of a query equally: no gradient
            assert np.abs(g).max() > 1e-8, n

    # Central differences on the case's own parameter (NumPy forward).
    target = FD_PARAMETER[name]
    rng = np.random.default_rng(4)
    size = params[target].size
    entries = range(size) if size <= 24 else rng.choice(size, 24, replace=False)
    eps = 1e-5

    def numpy_loss(p):
        return float(np.sum(layer_attention(config, p, x, mask=mask) * weights))

    worst = 0.0
    for e in entries:
        index = np.unravel_index(e, params[target].shape)
        plus, minus = dict(params), dict(params)
        plus[target], minus[target] = params[target].copy(), params[target].copy()
        plus[target][index] += eps
        minus[target][index] -= eps
        numeric = (numpy_loss(plus) - numpy_loss(minus)) / (2 * eps)
        worst = max(worst, abs(numeric - torch_grads[target][index]))
    FIGURES[f"fd/{name}"] = worst
    assert worst <= 1e-7 * max(1.0, float(np.abs(torch_grads[target]).max())), worst


# ================================================================================================
# A property: any length, heads, causality and mask
# ================================================================================================

PROPERTY_SCHEMES = ("transformer_xl", "t5", "alibi", "rope", "deberta", "shaw", "swin")


@settings(max_examples=30, deadline=None)
@given(
    scheme=st.sampled_from(PROPERTY_SCHEMES),
    length=st.integers(1, 6),
    heads=st.integers(1, 3),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_masked_rows_give_the_output_bias(scheme, length, heads, causal, seed):
    """Finite rows; a query with no allowed key has a zero attention row, so its output is
    ``b_o`` exactly; the other rows are the reference's."""
    rng = np.random.default_rng(seed)
    extra = {"grid": (1, length)} if scheme == "swin" else {}
    if scheme == "t5":
        extra = {"num_buckets": 6, "max_distance": 4}
    elif scheme == "deberta":
        extra = {"position_buckets": 4, "max_relative_positions": 6}
    elif scheme == "shaw":
        extra = {"max_relative_position": 2}
    config = LayerConfig(d_model=2 * heads, num_heads=heads, scheme=scheme, causal=causal,
                         use_bias=True, **extra)  # fmt: skip
    params = {p.name: rng.normal(scale=0.5, size=p.shape) for p in config.parameters()}
    x = rng.normal(size=(BATCH, length, config.d_model))
    mask = rng.random((BATCH, 1, length, length)) < 0.6
    mask[:, :, rng.integers(length)] = False  # one query sees nothing
    out = layer_attention(config, params, x, mask=mask)
    assert np.isfinite(out).all()
    allowed = mask & (np.tril(np.ones((length, length), bool)) if causal else True)
    empty = ~allowed.any(axis=-1)[:, 0]  # (B, L)
    assert empty.any()
    np.testing.assert_array_equal(out[empty], np.broadcast_to(params["b_o"], out[empty].shape))
    assert max_diff(out, loop_reference(config, params, x, mask=mask)) <= TOL


# ================================================================================================
# Parameters: the spec of each scheme and the initialisers' statistics
# ================================================================================================

OWN_PARAMETERS = {
    "transformer_xl": {"w_r": ("d", "Hd"), "content_bias": ("H", "d_head"),
                       "position_bias": ("H", "d_head")},
    "t5": {"relative_attention_bias": (8, "H")},
    "alibi": {}, "rope": {},
    "deberta": {"rel_embeddings": (12, "d")},
    "shaw": {"key_embeddings": (5, "d_head"), "value_embeddings": (5, "d_head")},
    "swin": {"relative_position_bias_table": (15, "H")},
    "decomposed": {"rel_pos_h": (3, "d_head"), "rel_pos_w": (5, "d_head")},
}  # fmt: skip
#: The case whose sizes each scheme's parameter spec is checked at.
SPEC_CASE = {scheme: scheme for scheme in SCHEMES} | {"alibi": "alibi_h2"}
AXIS_SIZES = {"embed": ("d",), "heads": ("Hd", "H"), "head_dim": ("d_head",)}


def test_every_scheme_has_a_case():
    assert set(SPEC_CASE) == set(SCHEMES) == set(OWN_PARAMETERS)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_parameter_specs_and_shapes(scheme):
    keywords = dict(CASES[SPEC_CASE[scheme]][0])
    keywords.pop("use_bias", None)  # the reference model's biases
    config = LayerConfig(**keywords)
    sizes = {"d": config.d_model, "H": config.num_heads, "d_head": config.dim,
             "Hd": config.num_heads * config.dim}  # fmt: skip
    expected = {"w_q": ("d", "Hd"), "w_k": ("d", "Hd"), "w_v": ("d", "Hd"), "w_o": ("Hd", "d")}
    if scheme in ("alibi", "deberta", "swin", "decomposed"):
        expected.update(b_q=("Hd",), b_k=("Hd",), b_v=("Hd",), b_o=("d",))
    expected.update(OWN_PARAMETERS[scheme])
    specs = config.parameters()
    assert [s.name for s in specs] == list(expected)
    for spec in specs:
        shape = tuple(sizes.get(n, n) for n in expected[spec.name])
        assert spec.shape == shape, spec
        assert len(spec.axes) == len(spec.shape)
        for axis, n in zip(spec.axes, spec.shape, strict=True):
            if axis is not None:
                assert n in (sizes[a] for a in AXIS_SIZES[axis]), spec
        assert spec.init in ("normal", "truncated_normal", "zeros", "glorot_uniform")
    params = init_parameters(config, np.random.default_rng(0), dtype="float32")
    assert {n: a.shape for n, a in params.items()} == {s.name: s.shape for s in specs}
    assert all(a.dtype == np.float32 for a in params.values())
    # The reference initialisers.
    inits = {s.name: (s.init, s.std) for s in specs}
    for name in ("b_q", "b_k", "b_v", "b_o"):
        if name in inits:
            assert inits[name][0] == "zeros" and not params[name].any()
    if scheme == "t5":  # HF T5's _init_weights, factor 1
        d, dh, h = config.d_model, config.dim, config.num_heads
        assert inits["w_q"] == ("normal", pytest.approx((d * dh) ** -0.5))
        assert inits["w_k"] == inits["w_v"] == ("normal", pytest.approx(d**-0.5))
        assert inits["w_o"] == ("normal", pytest.approx((h * dh) ** -0.5))
        assert inits["relative_attention_bias"] == ("normal", pytest.approx(d**-0.5))
    else:
        for name in ("w_q", "w_k", "w_v", "w_o"):
            assert inits[name] == ("normal", 0.02)
    own = {"transformer_xl": "normal", "deberta": "normal", "shaw": "glorot_uniform",
           "swin": "truncated_normal", "decomposed": "zeros"}  # fmt: skip
    for name in OWN_PARAMETERS[scheme]:
        if scheme in own:
            assert inits[name][0] == own[scheme], name


def test_initialiser_statistics():
    rng = np.random.default_rng(11)
    shape = (300, 200)
    normal = Parameter("n", shape, (None, None), "normal", 0.05).sample(rng)
    assert abs(normal.mean()) < 0.05 * 0.02 and abs(normal.std() / 0.05 - 1) < 0.02
    glorot = Parameter("g", shape, (None, None), "glorot_uniform").sample(rng)
    bound = math.sqrt(6 / (300 + 200))
    assert np.abs(glorot).max() <= bound and np.abs(glorot).max() > 0.99 * bound
    assert abs(glorot.std() / (bound / math.sqrt(3)) - 1) < 0.02
    assert not Parameter("z", shape, (None, None), "zeros").sample(rng).any()
    # init_parameters draws each spec's distribution.
    config = LayerConfig(d_model=128, num_heads=4, scheme="t5")
    params = init_parameters(config, np.random.default_rng(0))
    assert abs(params["w_q"].std() * math.sqrt(128 * 32) - 1) < 0.03
    assert abs(params["w_o"].std() * math.sqrt(128) - 1) < 0.03


def test_truncated_normal_redraws_its_tails():
    trunc = Parameter("t", (300, 200), (None, None), "truncated_normal", 0.05).sample(
        np.random.default_rng(12)
    )
    assert np.abs(trunc).max() <= 0.1
    # Not piled up on the edges: N(0, 1) has P(|z| = 2) = 0.
    assert np.mean(np.abs(trunc) == 0.1) < 1e-4
    # N(0, 1) cut at ±2: variance 1 - 4φ(2) / (2Φ(2) - 1).
    phi2 = math.exp(-2) / math.sqrt(2 * math.pi)
    var = 1 - 4 * phi2 / math.erf(2 / math.sqrt(2))
    assert abs(trunc.std() / (0.05 * math.sqrt(var)) - 1) < 0.02


# ================================================================================================
# Errors
# ================================================================================================


@pytest.mark.parametrize(
    ("keywords", "error", "named"),
    [
        (dict(d_model=8, num_heads=2, scheme="xl"), ValueError, "scheme"),
        (dict(d_model=0, num_heads=2), ValueError, "d_model"),
        (dict(d_model=8.0, num_heads=2), TypeError, "d_model"),
        (dict(d_model=8, num_heads=0), ValueError, "num_heads"),
        (dict(d_model=8, num_heads=True), TypeError, "num_heads"),
        (dict(d_model=10, num_heads=4), ValueError, "d_model"),
        (dict(d_model=8, num_heads=2, head_dim=0), ValueError, "head_dim"),
        (dict(d_model=8, num_heads=2, scheme="swin"), ValueError, "grid"),
        (dict(d_model=8, num_heads=2, scheme="decomposed", grid=(2,)), ValueError, "grid"),
        (dict(d_model=8, num_heads=2, scheme="swin", grid=(2, 0)), ValueError, "grid"),
        (dict(d_model=8, num_heads=2, rotary_dim=3), ValueError, "rotary_dim"),
        (dict(d_model=8, num_heads=2, rotary_dim=6), ValueError, "rotary_dim"),
        (dict(d_model=8, num_heads=2, causal=1), TypeError, "causal"),
        (dict(d_model=8, num_heads=2, num_buckets=1), ValueError, "num_buckets"),
        (dict(d_model=8, num_heads=2, memory_length=-1), ValueError, "memory_length"),
        (dict(d_model=8, num_heads=2, rope_scaling=[("factor", 2.0)]), TypeError, "rope_scaling"),
    ],
)
def test_config_errors_name_the_argument(keywords, error, named):
    with pytest.raises(error, match=rf"^{named}\b"):
        LayerConfig(**keywords)


@pytest.mark.parametrize(
    ("keywords", "named"),
    [
        (dict(scheme="deberta", position_buckets=1), "position_buckets"),
        (dict(scheme="deberta", position_buckets=8, max_relative_positions=4),
         "max_relative_positions"),
        (dict(scheme="t5", causal=True, num_buckets=8, max_distance=3), "max_distance"),
    ],
)  # fmt: skip
def test_config_refuses_sizes_the_buckets_refuse(keywords, named):
    with pytest.raises(ValueError, match=rf"^{named}\b"):
        LayerConfig(d_model=8, num_heads=2, **keywords)


def test_config_accepts_what_it_documents():
    assert LayerConfig(d_model=10, num_heads=4, head_dim=3).dim == 3
    assert LayerConfig(8, 2, "swin", grid=[2, 3]).grid == (2, 3)
    config = LayerConfig(8, 2, rope_scaling={"scaling": "llama3", "factor": 8.0})
    assert config.rope_keywords == {"scaling": "llama3", "factor": 8.0}
    hash(config)  # a static argument of jit
    assert LayerConfig(8, 2, "t5", use_bias=True).biased
    assert not LayerConfig(8, 2, "alibi", use_bias=False).biased


def test_layer_attention_errors_name_the_argument():
    config, params, x = make("swin")
    missing = {n: a for n, a in params.items() if n != "relative_position_bias_table"}
    with pytest.raises(ValueError, match=r"^params: missing \['relative_position_bias_table'\]"):
        layer_attention(config, missing, x)
    with pytest.raises(ValueError, match=r"^x: expected shape"):
        layer_attention(config, params, x[..., :-1])
    with pytest.raises(ValueError, match=r"^x: expected L = h·w = 6"):
        layer_attention(config, params, x[:, :4])
    with pytest.raises(ValueError, match=r"^memory: scheme 'swin'"):
        layer_attention(config, params, x, memory=x)
    cache = (np.zeros((BATCH, 2, 1, 4)), np.zeros((BATCH, 2, 1, 4)))
    with pytest.raises(ValueError, match=r"^cache: scheme 'swin'"):
        layer_attention(config, params, x, cache=cache)
    with pytest.raises(ValueError, match=r"^positions: scheme 'swin'"):
        layer_attention(config, params, x, positions=np.arange(6))
    config, params, x = make("decomposed")
    with pytest.raises(ValueError, match=r"^memory: scheme 'decomposed'"):
        layer_attention(config, params, x, memory=x)
    with pytest.raises(ValueError, match=r"^mask: scheme 'decomposed'"):
        layer_attention(config, params, x, mask=np.ones((6, 6), bool))
    causal = LayerConfig(**{**CASES["decomposed"][0], "causal": True})
    with pytest.raises(ValueError, match=r"^causal: scheme 'decomposed'"):
        layer_attention(causal, params, x)
    config, params, x = make("rope")
    with pytest.raises(ValueError, match=r"^x: expected shape"):
        layer_attention(config, params, x[0, 0])


def test_config_keeps_rope_scaling_and_block_size_hashable():
    """``rope_scaling`` is kept as sorted pairs and ``block_size`` as a tuple: the config
    hashes (a static argument of jit), and ``dataclasses.replace`` keeps the scaling."""
    import dataclasses

    scaling = {"scaling": "longrope", "short_factor": [1.0, 1.5], "long_factor": [2.0, 3.0]}
    config = LayerConfig(d_model=8, num_heads=2, rope_scaling=scaling, block_size=[2, 4])
    assert config.rope_keywords == scaling
    assert config.block_size == (2, 4)
    assert hash(config) == hash(LayerConfig(d_model=8, num_heads=2, rope_scaling=scaling,
                                            block_size=(2, 4)))  # fmt: skip
    replaced = dataclasses.replace(config, causal=True)
    assert replaced.rope_keywords == scaling and replaced.causal
