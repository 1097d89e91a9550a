"""SPEC §4 recipes 3–5, as users would copy them from ``examples/``.

Each example's ``run(xp)`` is executed on the backends that can hand results
back through DLPack and checked against per-pair loop references; the
properties each paper relies on (memory equivalence, clamping, TENER's
direction awareness) are checked as well.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import reference

import relattn

EXAMPLES = Path(__file__).parents[1] / "examples"


def load_example(name):
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _per_head(x, heads):
    """(B, L, d) -> list over heads of (B, L, d_head) column blocks."""
    dh = x.shape[-1] // heads
    return [x[..., h * dh : (h + 1) * dh] for h in range(heads)]


# -- Transformer-XL -------------------------------------------------------------------------


def test_transformer_xl_recipe(recipe_backend):
    example = load_example("transformer_xl")
    result = example.run(recipe_backend.lib)
    params = example.init_params(0, heads=2)
    expected = reference.transformer_xl(params, result["tokens"], heads=2, clamp_len=6)
    np.testing.assert_allclose(result["whole"], expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(result["segmented"], expected, rtol=1e-10, atol=1e-12)


def test_transformer_xl_clamp_len_changes_only_far_distances():
    """clamp_len = n - 1 or more is no clamping; a small clamp_len changes the result."""
    example = load_example("transformer_xl")
    params = example.init_params(0, heads=2)
    tokens = np.arange(12) % 50
    free = reference.transformer_xl(params, tokens, heads=2, clamp_len=11)
    xp = relattn.backends.namespace_of_module(np)
    options = {"heads": 2, "xp": xp, "segment": 4, "memory_length": 8}
    p = example.to_xp(params, xp, xp.float64)
    unclamped = example.encode(np.asarray(tokens), p, clamp_len=11, **options)
    clamped = example.encode(np.asarray(tokens), p, clamp_len=2, **options)
    np.testing.assert_allclose(unclamped, free, rtol=1e-10)
    np.testing.assert_allclose(
        clamped, reference.transformer_xl(params, tokens, heads=2, clamp_len=2), rtol=1e-10
    )
    # The first tokens only see distances <= 2: clamping cannot change them.
    np.testing.assert_allclose(clamped[:3], unclamped[:3], rtol=1e-10)
    assert np.max(np.abs(clamped[3:] - unclamped[3:])) > 1e-3


# -- Conformer and XLNet ----------------------------------------------------------------------


def _full_layout_reference(x, context, p, heads, layout, mask):
    """Per head, per pair: the full layout sinusoid of i - j, projected, no causal mask."""
    lq, lk, d = x.shape[-2], context.shape[-2], x.shape[-1]
    distance = -np.arange(-(lk - 1), lq)  # i - j for δ ascending
    table = reference.sinusoid(distance, d, layout=layout) @ p["w_pos"]
    outs = []
    for h, (q, k, v, r) in enumerate(
        zip(
            _per_head(x @ p["w_q"], heads),
            _per_head(context @ p["w_k"], heads),
            _per_head(context @ p["w_v"], heads),
            _per_head(table, heads),
            strict=True,
        )
    ):
        outs.append(reference.relative_attention(q, k, v, r, p["u"][h], p["v"][h], mask=mask))
    return np.concatenate(outs, axis=-1) @ p["w_o"]


def test_conformer_and_xlnet_recipe(recipe_backend):
    result = load_example("conformer_xlnet").run(recipe_backend.lib)
    p, x = result["params"], result["x"]
    key_mask = (np.arange(5)[None, :] < result["lengths"][:, None])[:, None, :]  # (B, 1, T)
    conformer = _full_layout_reference(x, x, p, 2, "interleaved", key_mask)
    np.testing.assert_allclose(result["conformer"], conformer, rtol=1e-10, atol=1e-12)
    context = np.concatenate((result["memory"], result["segment"]), axis=1)
    xlnet = _full_layout_reference(result["segment"], context, p, 2, "concatenated", None)
    np.testing.assert_allclose(result["xlnet"], xlnet, rtol=1e-10, atol=1e-12)


def test_full_layout_sees_the_future_causal_does_not(backend, dtype):
    """The same table rows, full vs causal layout: only the full one reaches δ > 0 keys."""
    rng = np.random.default_rng(1)
    lq = lk = 4
    q, k = rng.normal(size=(2, lq, 4))
    v = np.eye(lk)  # output row i = attention weights of query i
    table = rng.normal(size=(lq + lk - 1, 4))
    xq, xk, xv, xt = (backend.asarray(a, dtype) for a in (q, k, v, table))
    full = backend.to_numpy(relattn.relative_attention(xq, xk, xv, xt))
    causal = backend.to_numpy(relattn.relative_attention(xq, xk, xv, xt[:lk, :]))
    future = np.triu(np.ones((lq, lk), bool), 1)
    assert np.all(full[future] > 0)
    assert np.all(causal[future] == 0)
    backend.assert_close(
        relattn.relative_attention(xq, xk, xv, xt),
        reference.relative_attention(q, k, v, table),
        dtype,
    )


# -- TENER ------------------------------------------------------------------------------------


def _tener_reference(h, p, heads, lengths):
    n, d = h.shape[-2], h.shape[-1]
    dh = d // heads
    distance = -np.arange(-(n - 1), n)  # t - j, ascending δ
    table = reference.sinusoid(distance, dh, layout="concatenated")
    mask = (np.arange(n)[None, :] < lengths[:, None])[:, None, :]
    outs = []
    for hd, (q, k, v) in enumerate(
        zip(
            _per_head(h @ p["w_q"], heads),
            _per_head(h, heads),
            _per_head(h @ p["w_v"], heads),
            strict=True,
        )
    ):
        outs.append(
            reference.relative_attention(
                q, k, v, table, p["u"][hd], p["v"][hd], mask=mask, scale=1.0
            )
        )
    return np.concatenate(outs, axis=-1)


def test_tener_recipe(recipe_backend):
    result = load_example("tener").run(recipe_backend.lib)
    expected = _tener_reference(result["h"], result["params"], 2, result["lengths"])
    np.testing.assert_allclose(result["out"], expected, rtol=1e-10, atol=1e-12)
    left, right = result["mirrored"]
    assert abs(left - right) > 0.1


def test_tener_is_direction_aware_absolute_dot_product_is_not(backend, dtype):
    """TENER eq. (13)–(14): PE_t·PE_{t+k} = PE_t·PE_{t-k}, but v·R_k ≠ v·R_{-k}."""
    d, length, t = 8, 9, 4
    xp = backend.lib
    pe = backend.to_numpy(
        relattn.sinusoidal_position_encoding(
            length, d, dtype=backend.dtype(dtype), xp=xp, device=backend.device
        )
    )
    for k in range(1, 4):
        np.testing.assert_allclose(pe[t] @ pe[t + k], pe[t] @ pe[t - k], rtol=1e-5)
    # Relative scores of one query against keys at mirrored distances ±k.
    rng = np.random.default_rng(2)
    q = rng.normal(size=(length, d))
    table_delta = np.arange(-(length - 1), length)
    table = reference.sinusoid(-table_delta, d, layout="concatenated")
    scores = backend.to_numpy(
        relattn.relative_scores(backend.asarray(q, dtype), backend.asarray(table, dtype), length)
    )
    expected = reference.rel_shift(q @ table.T, length)
    backend.assert_close(backend.asarray(scores), expected, dtype)
    mirrored = [abs(scores[t, t + k] - scores[t, t - k]) for k in range(1, 4)]
    assert min(mirrored) > 1e-2
