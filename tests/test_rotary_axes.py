"""Rotary embeddings over several position axes (SPEC §2.18): relattn.rotary_axes.

References written here from the formulas, sharing no code with relattn:

- ``_rotate_loop`` turns one feature pair of one row at a time by an angle
  ``angle(lead, i, j)`` (pair ``j`` = ``(2j, 2j+1)`` interleaved, ``(j, j + d/2)``
  concatenated);
- M-RoPE (Wang et al. 2024, Qwen2-VL §2.1): pair ``j`` turns by
  ``p[i, a(j)]·base^(-2j/d)``, ``a(j)`` the section of ``j``;
- RoPE-Axial (Heo et al. 2024, §3.2): pair ``j = a·n + k`` by ``p[i, a]·base^(-k/n)``;
- RoPE-Mixed (Heo et al. 2024, §3.3): pair ``j`` of head ``h`` by ``Σ_a p[i, a]·f[a, h, j]``;
- ``_released_rope_index``: Qwen's released ``get_rope_index`` walked token by token.

Against Hugging Face transformers (Qwen2-VL, Qwen2.5-VL: the rotary classes'
section recomposition, ``apply_rotary_pos_emb``, the vision tower's rotary
embedding and position ids, ``get_rope_index``) in float64 on torch, and timm
where it is installed.
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
from array_api_extra.testing import lazy_xp_function
from hypothesis import given, settings
from hypothesis import strategies as st

import relattn
from relattn import rotary_axes
from relattn.grid import grid_positions
from relattn.rotary_axes import (
    axial_rotary_embedding,
    mixed_rotary_embedding,
    mixed_rotary_frequencies,
    multimodal_rotary_embedding,
    rope_index,
)

# Traced under jax.jit on JAX and lazy on Dask, for every backend test.
for _function in (axial_rotary_embedding, mixed_rotary_embedding, multimodal_rotary_embedding):
    lazy_xp_function(_function)

LAYOUTS = ("interleaved", "concatenated")
IMAGE, VIDEO, START, END = 151655, 151656, 151652, 151653


# ===============================================================================================
# references
# ===============================================================================================


def _pair(layout, d, j):
    return (2 * j, 2 * j + 1) if layout == "interleaved" else (j, j + d // 2)


def _rotate_loop(x, angle, layout):
    """``(a, b) -> (a cos - b sin, a sin + b cos)`` of ``angle(lead, i, j)`` per pair."""
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()
    length, d = x.shape[-2:]
    for lead in np.ndindex(x.shape[:-2]):
        for i in range(length):
            for j in range(d // 2):
                a, b = _pair(layout, d, j)
                c, s = math.cos(angle(lead, i, j)), math.sin(angle(lead, i, j))
                out[lead][i, a] = x[lead][i, a] * c - x[lead][i, b] * s
                out[lead][i, b] = x[lead][i, a] * s + x[lead][i, b] * c
    return out


def _at(p, lead, i):
    """Row ``i`` of positions ``(..., L, A)`` broadcast against ``lead``."""
    p = np.asarray(p, dtype=np.float64)
    k = p.ndim - 2
    idx = tuple(0 if p.shape[n] == 1 else lead[len(lead) - k + n] for n in range(k))
    return p[idx][i]


def _mrope_loop(x, p, section, base=10000.0, freqs=None, layout="concatenated"):
    d = x.shape[-1]
    owner = np.repeat(np.arange(len(section)), section)
    theta = base ** (-2.0 * np.arange(d // 2) / d) if freqs is None else freqs
    return _rotate_loop(x, lambda lead, i, j: _at(p, lead, i)[owner[j]] * theta[j], layout)


def _axial_loop(x, p, layout, base=10000.0, freqs=None, prefix=0):
    d, axes = x.shape[-1], np.shape(p)[-1]
    n = d // (2 * axes)

    def angle(lead, i, j):
        a, k = divmod(j, n)
        if freqs is None:
            theta = base ** (-k / n)
        else:
            theta = freqs[k] if np.ndim(freqs) == 1 else freqs[a, k]
        return _at(p, lead, i)[a] * theta

    return np.concatenate((x[..., :prefix, :], _rotate_loop(x[..., prefix:, :], angle, layout)), -2)


def _mixed_loop(x, p, f, layout, prefix=0):
    def angle(lead, i, j):
        h = lead[-1]
        return float(sum(_at(p, lead[:-1], i)[a] * f[a, h, j] for a in range(f.shape[0])))

    return np.concatenate((x[..., :prefix, :], _rotate_loop(x[..., prefix:, :], angle, layout)), -2)


def _released_rope_index(ids, images, videos, m, mask=None, seconds=None, tps=None):
    """Qwen's released ``get_rope_index`` (transformers 4.45–4.5x), token by token: text ids
    count on from the largest id so far + 1; a block's ``(t, h, w)`` start there."""
    batch, length = ids.shape
    mask = np.ones((batch, length), bool) if mask is None else mask.astype(bool)
    out = np.ones((batch, length, 3), np.int64)
    deltas = np.zeros((batch, 1), np.int64)
    grids = {IMAGE: list(images), VIDEO: list(videos)}
    used = {IMAGE: 0, VIDEO: 0}
    for b in range(batch):
        toks = [int(t) for t, k in zip(ids[b], mask[b], strict=True) if k]
        rows, nxt, i = [], 0, 0
        while i < len(toks):
            tok = toks[i]
            if tok not in (IMAGE, VIDEO):
                rows.append([nxt] * 3)
                nxt += 1
                i += 1
                continue
            t, h, w = grids[tok][used[tok]]
            start, block = nxt, []
            for ti in range(t):
                if tps is None:
                    tt = ti
                elif tok == IMAGE:
                    tt = 0
                else:
                    s = seconds[used[VIDEO]]
                    tt = int(np.float32(ti) * s * np.float32(tps))
                for hi in range(h // m):
                    for wi in range(w // m):
                        block.append([start + tt, start + hi, start + wi])
            used[tok] += 1
            rows += block
            nxt = max(max(r) for r in block) + 1
            i += len(block)
        out[b, mask[b]] = np.array(rows).reshape(-1, 3)
        deltas[b, 0] = max(max(r) for r in rows) + 1 - length
    return out, deltas


def _sequence(parts):
    """Token ids of ``parts``: ints are text runs, ``("image"|"video", t, h, w)`` blocks
    (merge size 2) framed by <vision_start>/<vision_end>."""
    ids, images, videos = [], [], []
    for part in parts:
        if isinstance(part, int):
            ids += list(range(100, 100 + part))
        else:
            kind, t, h, w = part
            ids += [START] + [IMAGE if kind == "image" else VIDEO] * (t * h * w // 4) + [END]
            (images if kind == "image" else videos).append([t, h, w])
    return ids, images, videos


# ===============================================================================================
# values, on every backend
# ===============================================================================================


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", ["plain", "lead-dims", "frequencies", "real", "empty-section"])
def test_mrope_matches_loop(backend, dtype, rng, case, layout):
    length, d = 5, 12
    section = [1, 2, 3]
    shape = (2, 3, length, d) if case == "lead-dims" else (length, d)
    x = rng.normal(size=shape)
    p = rng.integers(0, 40, size=(2, 1, length, 3) if case == "lead-dims" else (length, 3))
    kwargs, freqs = {}, None
    if case == "real":
        p = rng.uniform(-50, 50, size=p.shape)
        p = p.astype(dtype).astype(np.float64)
    if case == "frequencies":
        freqs = (rng.uniform(0.01, 1.0, size=d // 2)).astype(dtype).astype(np.float64)
        kwargs["frequencies"] = backend.asarray(freqs, dtype)
    if case == "empty-section":
        section = [0, 6, 0]
    positions = backend.asarray(p, dtype if case == "real" else None)
    out = multimodal_rotary_embedding(
        backend.asarray(x, dtype), positions, mrope_section=section, layout=layout, **kwargs
    )
    expected = _mrope_loop(x, p, section, freqs=freqs, layout=layout)
    assert tuple(out.shape) == shape
    backend.assert_close(out, expected, dtype)


def test_mrope_text_reduces_to_rope(backend, dtype, rng):
    """t = h = w: M-RoPE is RoPE with θ_k = base^(-2k/d), whatever the sections."""
    x = rng.normal(size=(2, 6, 16))
    p = np.arange(30, 36)
    for section in ([2, 3, 3], [8, 0, 0], [0, 4, 4]):
        out = multimodal_rotary_embedding(
            backend.asarray(x, dtype),
            backend.asarray(np.stack([p] * 3, -1)),
            mrope_section=section,
            base=1e6,
        )
        rope = relattn.rotary_position_embedding(
            backend.asarray(x, dtype), backend.asarray(p), base=1e6, layout="concatenated"
        )
        backend.assert_close(out, backend.to_numpy(rope), dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", ["2d", "3d-lead", "frequencies", "per-axis", "prefix", "eva"])
def test_axial_matches_loop(backend, dtype, rng, case, layout):
    d, prefix, freqs, kwargs = 8, 0, None, {}
    if case == "3d-lead":  # (t, row, col) of a 2x2x2 video, d = 12: two pairs per axis
        d = 12
        p = np.stack(np.meshgrid(*(np.arange(2),) * 3, indexing="ij"), -1).reshape(-1, 3)
        shape = (2, 3, 8, d)
    elif case == "eva":  # a 3x3 fine-tuning grid on a 4x4 reference grid, a class token
        p = grid_positions(3, 3, reference_shape=(4, 4), dtype=np.float64)
        prefix = 1
        shape = (2, 10, d)
    else:
        p = np.stack(np.meshgrid(np.arange(2), np.arange(3), indexing="ij"), -1).reshape(-1, 2)
        prefix = 2 if case == "prefix" else 0
        shape = (6 + prefix, d)
    x = rng.normal(size=shape)
    if case == "frequencies":
        freqs = rng.uniform(0.1, 1.0, size=2).astype(dtype).astype(np.float64)
    if case == "per-axis":
        freqs = rng.uniform(0.1, 1.0, size=(2, 2)).astype(dtype).astype(np.float64)
    if freqs is not None:
        kwargs["frequencies"] = backend.asarray(freqs, dtype)
    p_dtype = dtype if case == "eva" else None
    p = p.astype(p_dtype).astype(np.float64) if p_dtype else p
    out = axial_rotary_embedding(
        backend.asarray(x, dtype),
        backend.asarray(p, p_dtype),
        layout=layout,
        base=100.0,
        prefix_tokens=prefix,
        **kwargs,
    )
    backend.assert_close(out, _axial_loop(x, p, layout, 100.0, freqs, prefix), dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("prefix", [0, 1])
def test_mixed_matches_loop(backend, dtype, rng, layout, prefix):
    heads, d = 3, 8
    p = np.stack(np.meshgrid(np.arange(3), np.arange(2), indexing="xy"), -1).reshape(-1, 2)
    x = rng.normal(size=(2, heads, 6 + prefix, d))
    f = mixed_rotary_frequencies(d, heads, angles=rng.uniform(0, 2 * np.pi, heads))
    f = f.astype(dtype).astype(np.float64)
    out = mixed_rotary_embedding(
        backend.asarray(x, dtype),
        backend.asarray(p),
        backend.asarray(f, dtype),
        layout=layout,
        prefix_tokens=prefix,
    )
    backend.assert_close(out, _mixed_loop(x, p, f, layout, prefix), dtype)


def test_mixed_with_zero_angles_is_axial(backend, dtype, rng):
    """φ = 0: f_x turns the first d/4 pairs, f_y the rest: RoPE-Axial on (x, y)."""
    x = rng.normal(size=(2, 6, 8))
    p = backend.asarray(grid_positions(2, 3)[:, ::-1].copy())
    f = mixed_rotary_frequencies(8, 2, base=100.0, xp=backend.xp, dtype=backend.dtype(dtype))
    mixed = mixed_rotary_embedding(backend.asarray(x, dtype), p, f, layout="interleaved")
    axial = axial_rotary_embedding(backend.asarray(x, dtype), p, layout="interleaved", base=100.0)
    backend.assert_close(mixed, backend.to_numpy(axial), dtype)


def test_mixed_rotary_frequencies_formula():
    """Heo et al. §3.3: f_x = μ[cos φ, cos(φ + π/2)], f_y = μ[sin φ, sin(φ + π/2)]."""
    phi = np.array([0.3, 2.0])
    f = mixed_rotary_frequencies(8, 2, angles=phi)
    for h in range(2):
        for k in range(2):
            mu = 10.0 ** (-4 * k / 8)
            np.testing.assert_allclose(f[:, h, k], mu * np.array([np.cos(phi[h]), np.sin(phi[h])]))
            np.testing.assert_allclose(
                f[:, h, k + 2],
                mu * np.array([np.cos(phi[h] + np.pi / 2), np.sin(phi[h] + np.pi / 2)]),
            )


def test_angles_without_float64_are_exact():
    """Where the device lacks float64 (JAX without x64, Apple MPS), the angles of the
    default frequencies come from per-digit rotations, as in rotary_position_embedding:
    float32 accuracy at positions of 10^5, where p·θ in float32 would be off by ~10^-2."""
    p = np.array([[0, 99_999, 3], [123_457, 7, 65_536]])
    sections = [(0, (1.0, 0.1)), (1, (0.01,)), (2, (0.3, 0.002))]
    sin, cos = rotary_axes._section_angles(np, p, sections, np.float32, None)
    assert sin.dtype == np.float32
    owner, theta = [0, 0, 1, 2, 2], [1.0, 0.1, 0.01, 0.3, 0.002]
    angle = p[:, owner] * np.asarray(theta)
    np.testing.assert_allclose(sin, np.sin(angle), rtol=0, atol=2e-6)
    np.testing.assert_allclose(cos, np.cos(angle), rtol=0, atol=2e-6)


# ===============================================================================================
# the relative property (hypothesis)
# ===============================================================================================


def _score(f, q, k, pq, pk):
    return float(np.sum(f(q, pq) * f(k, pk)))


@settings(max_examples=25, deadline=None)
@given(
    scheme=st.sampled_from(["mrope", "axial", "mixed"]),
    layout=st.sampled_from(LAYOUTS),
    pq=st.lists(st.integers(-50, 50), min_size=3, max_size=3),
    pk=st.lists(st.integers(-50, 50), min_size=3, max_size=3),
    shift=st.lists(st.integers(-1000, 1000), min_size=3, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_scores_depend_on_the_difference_per_axis(scheme, layout, pq, pk, shift, seed):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(2, 1, 1, 12))
    f_mixed = rng.normal(size=(3, 1, 6))

    def rotate(x, p):
        p = np.asarray([p], dtype=np.float64)
        if scheme == "mrope":
            return multimodal_rotary_embedding(x, p, mrope_section=[2, 1, 3], layout=layout)
        if scheme == "axial":
            return axial_rotary_embedding(x, p, layout=layout, base=100.0)
        return mixed_rotary_embedding(x, p, f_mixed, layout=layout)

    s = np.asarray(shift)
    here = _score(rotate, q, k, pq, pk)
    moved = _score(rotate, q, k, np.add(pq, s), np.add(pk, s))
    assert math.isclose(here, moved, rel_tol=1e-9, abs_tol=1e-9)
    # and it does depend on each axis's difference
    other = np.add(pk, [0, 0, 1])
    if scheme != "mixed":
        assert not math.isclose(here, _score(rotate, q, k, pq, other), abs_tol=1e-12)


# ===============================================================================================
# rope_index
# ===============================================================================================

ROPE_CASES = {
    "image": [3, ("image", 1, 4, 6), 2],
    "two-images": [1, ("image", 1, 4, 4), 2, ("image", 1, 2, 6), 3],
    "video-short": [2, ("video", 2, 4, 4), 1],
    "video-long": [2, ("video", 6, 4, 4), 3],
    "mixed": [1, ("video", 3, 2, 2), 2, ("image", 1, 6, 4), 1],
    "vision-first": [("image", 1, 4, 4), 2],
    "text": [5],
}


def _batch(names, pad=0):
    seqs = [_sequence(ROPE_CASES[n]) for n in names]
    length = max(len(s[0]) for s in seqs) + pad
    ids = np.zeros((len(seqs), length), np.int64)
    mask = np.zeros((len(seqs), length), np.int64)
    for b, (tokens, _, _) in enumerate(seqs):
        ids[b, length - len(tokens) :] = tokens  # left padding
        mask[b, length - len(tokens) :] = 1
    images = [g for s in seqs for g in s[1]]
    videos = [g for s in seqs for g in s[2]]
    return (
        ids,
        mask,
        np.array(images, np.int64).reshape(-1, 3),
        np.array(videos, np.int64).reshape(-1, 3),
    )


def _grid_arg(backend, g):
    return backend.asarray(g) if g.shape[0] else None


@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_rope_index_matches_released_loop(backend, case):
    ids, _, images, videos = _batch([case])
    got, delta = rope_index(
        backend.asarray(ids),
        image_token_id=IMAGE,
        video_token_id=VIDEO,
        image_grid_thw=_grid_arg(backend, images),
        video_grid_thw=_grid_arg(backend, videos),
    )
    want, want_delta = _released_rope_index(ids, images, videos, 2)
    np.testing.assert_array_equal(backend.to_numpy(got), want)
    np.testing.assert_array_equal(backend.to_numpy(delta), want_delta)
    assert tuple(got.shape) == (1, ids.shape[1], 3)


def test_rope_index_batch_padding_and_qwen25_time(backend):
    ids, mask, images, videos = _batch(["video-long", "image", "mixed"], pad=2)
    seconds = np.array([0.5, 1.0 / 3.0], np.float32)
    for tps in (None, 2, 25):
        got, delta = rope_index(
            backend.asarray(ids),
            image_token_id=IMAGE,
            video_token_id=VIDEO,
            image_grid_thw=backend.asarray(images),
            video_grid_thw=backend.asarray(videos),
            attention_mask=backend.asarray(mask),
            second_per_grid_ts=backend.asarray(seconds) if tps else None,
            tokens_per_second=tps,
        )
        want, want_delta = _released_rope_index(ids, images, videos, 2, mask, seconds, tps)
        np.testing.assert_array_equal(backend.to_numpy(got), want)
        np.testing.assert_array_equal(backend.to_numpy(delta), want_delta)


def test_rope_index_drives_mrope(rng):
    """The positions of rope_index, rotated by M-RoPE: text after an image keeps RoPE's
    relative scores among text tokens."""
    ids, _, images, _ = _batch(["image"])
    p, delta = rope_index(ids, image_token_id=IMAGE, video_token_id=VIDEO, image_grid_thw=images)
    x = rng.normal(size=(1, ids.shape[1], 8))
    y = multimodal_rotary_embedding(x, p, mrope_section=[2, 1, 1])
    tail = ids.shape[1] - 2  # the last two text tokens
    rope = relattn.rotary_position_embedding(x, p[..., 0], layout="concatenated")
    np.testing.assert_allclose(y[:, tail:], rope[:, tail:], rtol=0, atol=1e-14)
    assert int(delta[0, 0]) == int(p.max()) + 1 - ids.shape[1]


# ===============================================================================================
# Hugging Face transformers (Qwen2-VL, Qwen2.5-VL), float64 on torch
# ===============================================================================================


def _hf():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")


@pytest.mark.parametrize("model", ["qwen2_vl", "qwen2_5_vl"])
def test_mrope_matches_hugging_face(rng, model):
    import torch

    q2 = _hf()
    from transformers import Qwen2VLTextConfig

    if model == "qwen2_vl":
        rotary_class = q2.Qwen2VLRotaryEmbedding
    else:
        q25 = pytest.importorskip("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl")
        rotary_class = q25.Qwen2_5_VLRotaryEmbedding
    section, base, d = [2, 3, 3], 1e6, 16
    config = Qwen2VLTextConfig(
        hidden_size=32,
        num_attention_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": base, "mrope_section": section},
    )
    emb = rotary_class(config)
    ids, mask, images, videos = _batch(["mixed", "video-long"], pad=1)
    p, _ = rope_index(ids, image_token_id=IMAGE, video_token_id=VIDEO, image_grid_thw=images,
                      video_grid_thw=videos, attention_mask=mask)  # fmt: skip
    hf_ids = torch.from_numpy(np.moveaxis(p, -1, 0).copy())  # (3, B, L)
    q = rng.normal(size=(2, 2, ids.shape[1], d))
    k = rng.normal(size=q.shape)
    # HF's sections in float64: its recomposition of float64 angles, its apply_rotary_pos_emb
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    freqs = hf_ids[..., None].double() * inv_freq
    cos, sin = (
        emb.recomposition_frequencies(freqs.cos()),
        emb.recomposition_frequencies(freqs.sin()),
    )
    hq, hk = q2.apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(k), cos, sin)
    rq = multimodal_rotary_embedding(q, p[:, None], mrope_section=section, base=base)
    rk = multimodal_rotary_embedding(k, p[:, None], mrope_section=section, base=base)
    np.testing.assert_allclose(rq, hq.numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(rk, hk.numpy(), rtol=0, atol=1e-10)
    # the whole module, which runs in float32, with its float32 inv_freq
    cos32, sin32 = emb(torch.zeros(1, dtype=torch.float32), hf_ids)
    hq32, _ = q2.apply_rotary_pos_emb(torch.from_numpy(q).float(), torch.from_numpy(k).float(),
                                      cos32, sin32)  # fmt: skip
    rq32 = multimodal_rotary_embedding(
        q, p[:, None], mrope_section=section, frequencies=emb.inv_freq.double().numpy()
    )
    np.testing.assert_allclose(rq32, hq32.numpy(), rtol=0, atol=1e-5)


def _hf_rope_index(model, ids, mask, images, videos, seconds=None, tps=None):
    import torch

    q2 = _hf()
    vision = types.SimpleNamespace(spatial_merge_size=2, tokens_per_second=tps)
    if model == "qwen2_vl":
        cls = q2.Qwen2VLModel
    else:
        cls = pytest.importorskip("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl")
        cls = cls.Qwen2_5_VLModel
    fake = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=vision))
    fake.get_vision_position_ids = lambda *a, **kw: cls.get_vision_position_ids(fake, *a, **kw)
    types_ = np.where(ids == IMAGE, 1, np.where(ids == VIDEO, 2, 0))
    extra = {} if seconds is None else {"second_per_grid_ts": torch.from_numpy(seconds)}
    pos, delta = cls.get_rope_index(
        fake,
        torch.from_numpy(ids),
        torch.from_numpy(types_),
        image_grid_thw=torch.from_numpy(images) if images.shape[0] else None,
        video_grid_thw=torch.from_numpy(videos) if videos.shape[0] else None,
        attention_mask=torch.from_numpy(mask),
        **extra,
    )
    return np.moveaxis(pos.numpy(), 0, -1), delta.numpy()


@pytest.mark.parametrize("case", ["image", "two-images", "video-short", "vision-first"])
def test_rope_index_agrees_with_hugging_face(case):
    """Images, and videos no longer than max(h, w)/m: transformers 5.24 agrees."""
    ids, mask, images, videos = _batch([case])
    want, want_delta = _hf_rope_index("qwen2_vl", ids, mask, images, videos)
    got, delta = rope_index(ids, image_token_id=IMAGE, video_token_id=VIDEO,
                            image_grid_thw=images, video_grid_thw=videos)  # fmt: skip
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(delta, want_delta)


@pytest.mark.parametrize("model", ["qwen2_vl", "qwen2_5_vl"])
def test_rope_index_disagrees_with_transformers_5(model):
    """transformers 5.24 resumes text after a video at start + max(h, w)/m, not at the
    block's largest id + 1: a 6-step video on a 2x2 merged grid gives t ids up to start + 5
    (Qwen2.5-VL at 2 tokens/s, 1 s per step: start + 10), then text from start + 2, so ids
    repeat. relattn follows the released Qwen code (largest id + 1)."""
    ids, mask, images, videos = _batch(["video-long"])
    tps = None if model == "qwen2_vl" else 2
    seconds = None if tps is None else np.ones(1, np.float32)
    hf, _ = _hf_rope_index(model, ids, mask, images, videos, seconds, tps)
    got, _ = rope_index(ids, image_token_id=IMAGE, video_token_id=VIDEO, video_grid_thw=videos,
                        second_per_grid_ts=seconds, tokens_per_second=tps)  # fmt: skip
    want, _ = _released_rope_index(ids, images, videos, 2, None, seconds, tps)
    np.testing.assert_array_equal(got, want)
    block = ids[0] == VIDEO
    after = np.flatnonzero(block)[-1] + 2  # the first text token after <vision_end>
    start = got[0, np.flatnonzero(block)[0], 1]  # the block's start id (its h of row 0)
    assert got[0, after, 0] == got[0, block].max() + 2  # <vision_end> at max + 1
    assert hf[0, after - 1, 0] == start + 2  # HF: <vision_end> at start + max(4, 4)/2
    assert not np.array_equal(hf, got)


def test_vision_rope_matches_hugging_face(rng):
    """Qwen2-VL's vision tower: axial RoPE over (h, w) in merge order, concatenated layout."""
    import torch

    q2 = _hf()
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.vision_utils import get_vision_position_ids

    config = Qwen2VLVisionConfig(embed_dim=32, num_heads=2)
    emb = q2.Qwen2VLVisionRotaryEmbedding(config)
    grid = torch.tensor([[2, 4, 6]])
    hf_pos = get_vision_position_ids(grid, 2)  # (t·h·w, 2)
    ours = grid_positions(4, 6, merge_size=2)
    np.testing.assert_array_equal(hf_pos.numpy(), np.concatenate([ours, ours]))
    d = 16
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, d // 2, 2, dtype=torch.float64) / (d // 2))
    freqs = hf_pos[..., None].double() * inv_freq
    cos, sin = (
        emb.recomposition_frequencies(freqs.cos()),
        emb.recomposition_frequencies(freqs.sin()),
    )
    q = rng.normal(size=(48, 2, d))  # HF's (tokens, heads, head_dim)
    rot = q2.rotate_half
    hq = torch.from_numpy(q) * cos[:, None] + rot(torch.from_numpy(q)) * sin[:, None]
    got = axial_rotary_embedding(
        np.moveaxis(q, 1, 0), hf_pos.numpy(), layout="concatenated", base=10000.0
    )
    np.testing.assert_allclose(np.moveaxis(got, 0, 1), hq.numpy(), rtol=0, atol=1e-10)
    # HF's own apply (float32 inside)
    h32, _ = q2.apply_rotary_pos_emb_vision(
        torch.from_numpy(q), torch.from_numpy(q), *emb(torch.zeros(1), hf_pos)
    )
    np.testing.assert_allclose(np.moveaxis(got, 0, 1), h32.numpy(), rtol=0, atol=1e-5)


# ===============================================================================================
# timm (optional)
# ===============================================================================================


def test_axial_and_mixed_match_timm(rng):
    torch = pytest.importorskip("torch")
    timm_rope = pytest.importorskip("timm.layers.pos_embed_sincos")
    d, shape, ref = 16, (3, 5), (4, 4)
    # EVA-02: RotaryEmbeddingCat, index grid on a reference shape, interleaved pairs
    sin, cos = timm_rope.build_rotary_pos_embed(
        list(shape), dim=d, in_pixels=False, ref_feat_shape=list(ref), dtype=torch.float64
    )
    x = rng.normal(size=(2, 1 + 15, d))
    want = timm_rope.apply_rot_embed(torch.from_numpy(x[:, 1:]), sin, cos).numpy()
    p = grid_positions(*shape, reference_shape=ref, dtype=np.float64)
    got = axial_rotary_embedding(x, p, layout="interleaved", prefix_tokens=1)
    np.testing.assert_allclose(got[:, 1:], want, rtol=0, atol=1e-5)  # timm's float32 grid
    np.testing.assert_array_equal(got[:, 0], x[:, 0])
    # RoPE-Mixed: get_mixed_freqs over the 'xy' grid
    f = torch.from_numpy(mixed_rotary_frequencies(d, 2, angles=[0.4, 1.7]))
    t_x, t_y = timm_rope.get_mixed_grid(list(shape), grid_indexing="xy", dtype=torch.float64)
    emb = timm_rope.get_mixed_freqs(f, t_x, t_y, dtype=torch.float64)
    xh = rng.normal(size=(1, 2, 15, d))
    want = timm_rope.apply_rot_embed_cat(torch.from_numpy(xh), emb).numpy()
    pos = np.stack([t_x.numpy(), t_y.numpy()], -1)
    got = mixed_rotary_embedding(xh, pos, f.numpy(), layout="interleaved")
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


# ===============================================================================================
# transforms: jit, gradients
# ===============================================================================================


def test_jit_equals_eager(jit_backend, dtype, rng):
    x = rng.normal(size=(2, 2, 6, 8))
    p3 = rng.integers(0, 20, size=(6, 3))
    p2 = grid_positions(2, 3)
    f = mixed_rotary_frequencies(8, 2, angles=[0.1, 0.9])

    def fn(x, p3, p2, f):
        return (
            multimodal_rotary_embedding(x, p3, mrope_section=[2, 1, 1]),
            axial_rotary_embedding(x, p2, layout="interleaved", base=100.0),
            mixed_rotary_embedding(x, p2, f, layout="concatenated"),
        )

    arrays = (
        jit_backend.asarray(x, dtype),
        jit_backend.asarray(p3),
        jit_backend.asarray(p2),
        jit_backend.asarray(f, dtype),
    )
    compiled = jit_backend.jit(fn)(*arrays)
    f_ref = f.astype(dtype).astype(np.float64)
    expected = (
        _mrope_loop(x, p3, [2, 1, 1]),
        _axial_loop(x, p2, "interleaved", 100.0),
        _mixed_loop(x, p2, f_ref, "concatenated"),
    )
    for a, b in zip(compiled, expected, strict=True):
        jit_backend.assert_close(a, b, dtype)


def test_torch_gradcheck(torch_backend, rng):
    """Gradients reach x, real positions and the (learned) frequencies."""
    torch = torch_backend.lib

    def leaf(a):
        return torch_backend.asarray(a, "float64").requires_grad_(True)

    x = leaf(rng.normal(size=(2, 4, 8)))
    p3, p2 = leaf(rng.uniform(-5, 5, size=(4, 3))), leaf(rng.uniform(-5, 5, size=(3, 2)))
    freqs = leaf(rng.uniform(0.1, 1.0, size=4))
    fm = leaf(rng.normal(size=(2, 2, 4)))
    assert torch.autograd.gradcheck(
        lambda x, p, f: multimodal_rotary_embedding(x, p, mrope_section=[1, 2, 1], frequencies=f),
        (x, p3, freqs),
    )
    assert torch.autograd.gradcheck(
        lambda x, p, f: axial_rotary_embedding(
            x, p, layout="interleaved", frequencies=f[:2], prefix_tokens=1
        ),
        (x, p2, freqs),
    )
    assert torch.autograd.gradcheck(
        lambda x, p, f: mixed_rotary_embedding(x, p, f, layout="interleaved", prefix_tokens=1),
        (x, p2, fm),
    )


def test_jax_grad_matches_central_differences(jax_backend, rng):
    import jax
    import jax.numpy as jnp

    def on(a):
        return jax_backend.asarray(a, "float64")

    params = [on(rng.normal(size=(2, 5, 8))), on(rng.normal(size=(2, 2, 4)))]
    p = on(rng.uniform(-3, 3, size=(4, 2)))
    p3 = on(rng.uniform(-3, 3, size=(5, 3)))
    weights = on(rng.normal(size=(2, 5, 8)))

    @jax.jit
    def loss(params):
        x, f = params
        out = mixed_rotary_embedding(x, p, f, layout="interleaved", prefix_tokens=1)
        out = multimodal_rotary_embedding(out, p3, mrope_section=[2, 1, 1])
        return jnp.sum(out * weights)

    grad = jax.jit(jax.grad(loss))(params)
    assert all(float(jnp.abs(g).max()) > 0 for g in grad)
    jax_backend.assert_directional_derivatives(loss, grad, params, rng)


# ===============================================================================================
# bad input
# ===============================================================================================

_X = np.zeros((4, 8))
_P3 = np.zeros((4, 3), np.int64)
_P2 = np.zeros((4, 2), np.int64)
_F = np.zeros((2, 1, 4))
_IDS = np.array([[1, IMAGE, IMAGE, 2]])

V, T = ValueError, TypeError
_MR, _AX, _MX = multimodal_rotary_embedding, axial_rotary_embedding, mixed_rotary_embedding
_MF = mixed_rotary_frequencies
BAD = [
    ("mrope-positions-trailing", lambda: _MR(_X, _P2, mrope_section=[2, 1, 1]),
     V, r"^positions must have shape \(\.\.\., L, A\) = \(\.\.\., 4, 3\).*got shape \(4, 2\)"),
    ("mrope-positions-length", lambda: _MR(_X, _P3[:3], mrope_section=[2, 1, 1]),
     V, r"^positions must have shape"),
    ("mrope-positions-1d", lambda: _MR(_X, _P3[:, 0], mrope_section=[4]),
     V, r"^positions must have shape"),
    ("mrope-section-sum", lambda: _MR(_X, _P3, mrope_section=[2, 2, 2]),
     V, r"^mrope_section must sum to d/2 = 4.*\[2, 2, 2\] \(sum 6\)"),
    ("mrope-section-type", lambda: _MR(_X, _P3, mrope_section=4),
     T, r"^mrope_section must be a sequence of integers"),
    ("mrope-section-float", lambda: _MR(_X, _P3, mrope_section=[2.0, 1, 1]),
     T, r"^mrope_section\[0\] must be an integer"),
    ("mrope-section-negative", lambda: _MR(_X, _P3, mrope_section=[5, -1, 0]),
     V, r"^mrope_section\[1\] must be >= 0"),
    ("mrope-odd-d", lambda: _MR(np.zeros((4, 7)), _P3, mrope_section=[1, 1, 1]),
     V, r"^x must have a feature size d divisible by 2"),
    ("mrope-frequencies", lambda: _MR(_X, _P3, mrope_section=[2, 1, 1],
                                                              frequencies=np.ones(3)),
     V, r"^frequencies must have shape \(d/2,\)"),
    ("mrope-positions-bool", lambda: _MR(_X, _P3 > 0, mrope_section=[2, 1, 1]),
     T, r"^positions must be a real or integer array"),
    ("mrope-positions-none", lambda: _MR(_X, None, mrope_section=[2, 1, 1]),
     T, r"^positions must be an array"),
    ("mrope-x-int", lambda: _MR(_P3, _P3, mrope_section=[1, 0, 0]),
     T, r"^x must"),
    ("mrope-layout", lambda: _MR(_X, _P3, mrope_section=[2, 1, 1], layout="x"),
     V, r"^layout must be one of"),
    ("axial-layout-missing", lambda: _AX(_X, _P2),
     T, r"^axial_rotary_embedding: layout is required"),
    ("axial-d", lambda: _AX(np.zeros((4, 6)), _P2, layout="interleaved"),
     V, r"^x must have a feature size d divisible by 4 \(2A, A = 2"),
    ("axial-positions", lambda: _AX(_X, _P2[:3], layout="interleaved"),
     V, r"^positions must have shape \(\.\.\., L - prefix_tokens, A\) = \(\.\.\., 4, 2\)"),
    ("axial-prefix", lambda: _AX(_X, _P2, layout="interleaved", prefix_tokens=1),
     V, r"^positions must have shape \(\.\.\., L - prefix_tokens, A\) = \(\.\.\., 3, 2\)"),
    ("axial-prefix-big", lambda: _AX(_X, _P2, layout="interleaved", prefix_tokens=5),
     V, r"^prefix_tokens must be at most L = 4, got 5"),
    ("axial-frequencies", lambda: _AX(_X, _P2, layout="interleaved",
                                                         frequencies=np.ones(3)),
     V, r"^frequencies must have shape \(n,\) = \(2,\) or \(A, n\) = \(2, 2\)"),
    ("mixed-layout-missing", lambda: _MX(_X[None], _P2, _F),
     T, r"^mixed_rotary_embedding: layout is required"),
    ("mixed-frequencies", lambda: _MX(_X[None], _P2, _F[:, :, :3], layout="interleaved"),
     V, r"^frequencies must have shape \(A, H, d/2\) = \(2, 1, 4\)"),
    ("mixed-x-2d", lambda: _MX(_X, _P2, _F, layout="interleaved"),
     V, r"^x must have shape \(\.\.\., H, L, d\)"),
    ("mixed-frequencies-none", lambda: _MX(_X[None], _P2, None, layout="interleaved"),
     T, r"^frequencies must be an array"),
    ("mixed-init-dim", lambda: _MF(6, 2), V, r"^head_dim must be a multiple of 4"),
    ("mixed-init-angles", lambda: _MF(8, 2, angles=[0.0]),
     V, r"^angles must have num_heads = 2 entries"),
    ("index-ids-1d", lambda: rope_index(_IDS[0], image_token_id=IMAGE, video_token_id=VIDEO),
     V, r"^input_ids must have shape \(B, L\)"),
    ("index-ids-float", lambda: rope_index(_IDS * 1.0, image_token_id=IMAGE, video_token_id=VIDEO),
     T, r"^input_ids must be an integer array"),
    ("index-grid-missing", lambda: rope_index(_IDS, image_token_id=IMAGE, video_token_id=VIDEO),
     V, r"^image_grid_thw must have one row per image block, got 0 rows"),
    ("index-grid-extra", lambda: rope_index(_IDS, image_token_id=IMAGE, video_token_id=VIDEO,
                                            image_grid_thw=np.array([[1, 2, 4], [1, 2, 2]])),
     V, r"^image_grid_thw must have one row per image block, got 2 rows for 1 blocks"),
    ("index-grid-overrun", lambda: rope_index(_IDS, image_token_id=IMAGE, video_token_id=VIDEO,
                                              image_grid_thw=np.array([[1, 4, 4]])),
     V, r"^input_ids must hold t·\(h/m\)·\(w/m\) = 4 tokens"),
    ("index-grid-merge", lambda: rope_index(_IDS, image_token_id=IMAGE, video_token_id=VIDEO,
                                            image_grid_thw=np.array([[1, 3, 4]])),
     V, r"^image_grid_thw must have h and w divisible by spatial_merge_size = 2"),
    ("index-grid-shape", lambda: rope_index(_IDS, image_token_id=IMAGE, video_token_id=VIDEO,
                                            image_grid_thw=np.array([1, 2, 4])),
     V, r"^image_grid_thw must have shape \(N, 3\)"),
    ("index-seconds", lambda: rope_index(_IDS, image_token_id=IMAGE, video_token_id=VIDEO,
                                         image_grid_thw=np.array([[1, 2, 4]]),
                                         second_per_grid_ts=np.ones(2)),
     V, r"^second_per_grid_ts must have shape \(N_videos,\) = \(0,\)"),
    ("index-mask", lambda: rope_index(_IDS, image_token_id=IMAGE, video_token_id=VIDEO,
                                      attention_mask=np.ones((1, 3))),
     V, r"^attention_mask must have the shape of input_ids"),
    ("index-token-id", lambda: rope_index(_IDS, image_token_id="img", video_token_id=VIDEO),
     T, r"^image_token_id must be an integer"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "match"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_mixed_libraries(torch_backend):
    x = torch_backend.asarray(_X)
    with pytest.raises(TypeError, match=r"different libraries"):
        multimodal_rotary_embedding(x, _P3, mrope_section=[2, 1, 1])
    with pytest.raises(TypeError, match=r"different libraries"):
        axial_rotary_embedding(x, _P2, layout="interleaved")


def test_inputs_are_not_mutated(rng):
    x = rng.normal(size=(1, 5, 8))
    p = grid_positions(2, 2)
    before = x.copy(), p.copy()
    axial_rotary_embedding(x, p, layout="interleaved", prefix_tokens=1)
    multimodal_rotary_embedding(x, rng.integers(0, 9, (5, 3)), mrope_section=[2, 1, 1])
    np.testing.assert_array_equal(x, before[0])
    np.testing.assert_array_equal(p, before[1])


def test_module_exports():
    assert set(rotary_axes.__all__) == {
        "axial_rotary_embedding",
        "mixed_rotary_embedding",
        "mixed_rotary_frequencies",
        "multimodal_rotary_embedding",
        "rope_index",
    }
