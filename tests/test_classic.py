"""Classic score functions (relattn.scores), Luong's local-p (relattn.local), recipe 1.

Each function is compared, on every backend and in float32 and float64, with a
NumPy float64 reference written below from the papers' formulas with explicit
loops over every ``(i, j)`` pair (Luong et al. 2015, eq. (8)–(10); Bahdanau et
al. 2015, appendix A.1.2; Graves et al. 2014, eq. (6)), with ``Lq ≠ Lk`` and
broadcast leading dimensions. Also: additive chunking, zero vectors in the
cosine, empty local windows, ``jax.jit`` against eager, torch gradcheck, bad
input, and the Vaswani encoder/decoder recipe (``examples/vaswani.py``)
against a per-pair loop model.
On JAX and Dask these run in float64 only (``FLOAT64_TARGETS`` in ``conftest.py``).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from array_api_extra.testing import lazy_xp_function
from conftest import target_fixture

import relattn
from relattn import (
    additive_scores,
    bilinear_scores,
    cosine_scores,
    dot_product_scores,
    local,
    local_p_weights,
    location_scores,
    predicted_positions,
    scaled_dot_product_scores,
    scores,
)

# Lazy on Dask, traced under jax.jit on JAX, for every backend test.
lazy_xp_modules = [relattn]
for _function in (
    additive_scores,
    bilinear_scores,
    cosine_scores,
    dot_product_scores,
    local_p_weights,
    location_scores,
    predicted_positions,
    scaled_dot_product_scores,
    relattn.masked_softmax,
):
    lazy_xp_function(_function)

# Shapes shared by most tests (few shapes: JAX compiles once per shape).
LQ, LK, D, D_K, D_A = 3, 5, 4, 3, 6
Q_SHAPE, K_SHAPE = (2, 1, LQ, D), (3, LK, D)  # leading dims (2, 1) and (3,) broadcast to (2, 3)
LEAD = (2, 3)

# ===============================================================================================
# Naive references: loops over every (i, j) pair, straight from the formulas
# ===============================================================================================


def _lead(*arrays_and_cores):
    """Broadcast leading dims of (array, core_ndim) pairs; return lead and broadcast arrays."""
    lead = np.broadcast_shapes(*(a.shape[: a.ndim - n] for a, n in arrays_and_cores))
    return lead, [np.broadcast_to(a, (*lead, *a.shape[a.ndim - n :])) for a, n in arrays_and_cores]


def dot_loop(q, k, scale=1.0):
    lead, (q, k) = _lead((q, 2), (k, 2))
    out = np.zeros((*lead, q.shape[-2], k.shape[-2]))
    for b in np.ndindex(lead):
        for i in range(q.shape[-2]):
            for j in range(k.shape[-2]):
                out[b][i, j] = scale * sum(q[b][i, c] * k[b][j, c] for c in range(q.shape[-1]))
    return out


def bilinear_loop(q, k, w):
    """Luong "general": e_ij = Σ_a Σ_c q_ia W_ac k_jc."""
    lead, (q, k, w) = _lead((q, 2), (k, 2), (w, 2))
    out = np.zeros((*lead, q.shape[-2], k.shape[-2]))
    for b in np.ndindex(lead):
        for i in range(q.shape[-2]):
            for j in range(k.shape[-2]):
                out[b][i, j] = sum(
                    q[b][i, a] * w[b][a, c] * k[b][j, c]
                    for a in range(q.shape[-1])
                    for c in range(k.shape[-1])
                )
    return out


def additive_loop(q, k, wq, uk, v, bias=None):
    """Bahdanau A.1.2: e_ij = Σ_a v_a tanh(Σ_c q_ic W_ca + Σ_c k_jc U_ca + b_a)."""
    lead, (q, k) = _lead((q, 2), (k, 2))
    d_a = v.shape[0]
    bias = np.zeros(d_a) if bias is None else bias
    out = np.zeros((*lead, q.shape[-2], k.shape[-2]))
    for b in np.ndindex(lead):
        for i in range(q.shape[-2]):
            for j in range(k.shape[-2]):
                total = 0.0
                for a in range(d_a):
                    pre = sum(q[b][i, c] * wq[c, a] for c in range(q.shape[-1]))
                    pre += sum(k[b][j, c] * uk[c, a] for c in range(k.shape[-1]))
                    total += v[a] * math.tanh(pre + bias[a])
                out[b][i, j] = total
    return out


def cosine_loop(q, k):
    """Graves et al. 2014, eq. (6): u·v / (|u| |v|), 0 when either vector is zero."""
    lead, (q, k) = _lead((q, 2), (k, 2))
    out = np.zeros((*lead, q.shape[-2], k.shape[-2]))
    for b in np.ndindex(lead):
        for i in range(q.shape[-2]):
            for j in range(k.shape[-2]):
                u, w = q[b][i], k[b][j]
                nu, nw = math.hypot(*u), math.hypot(*w)  # hypot: no overflow for huge entries
                if nu > 0 and nw > 0:
                    out[b][i, j] = sum((x / nu) * (y / nw) for x, y in zip(u, w, strict=True))
    return out


def location_loop(q, w):
    """Luong location: (W_a h_t)_n = Σ_c q_ic W_cn."""
    lead, (q, w) = _lead((q, 2), (w, 2))
    out = np.zeros((*lead, q.shape[-2], w.shape[-1]))
    for b in np.ndindex(lead):
        for i in range(q.shape[-2]):
            for n in range(w.shape[-1]):
                out[b][i, n] = sum(q[b][i, c] * w[b][c, n] for c in range(q.shape[-1]))
    return out


def positions_loop(q, wp, vp, s):
    """Luong eq. (9): p_t = S · sigmoid(v_pᵀ tanh(W_p h_t)); ``s`` broadcast to (..., Lq)."""
    s = np.broadcast_to(np.asarray(s, dtype=np.float64), q.shape[:-1])
    out = np.zeros(q.shape[:-1])
    for idx in np.ndindex(q.shape[:-1]):
        x = sum(
            vp[a] * math.tanh(sum(q[idx][c] * wp[c, a] for c in range(q.shape[-1])))
            for a in range(vp.shape[0])
        )
        out[idx] = s[idx] / (1.0 + math.exp(-x))
    return out


def local_p_loop(scores, positions, window, mask=None):
    """Luong eq. (10): softmax over |j - p_i| <= D, times exp(-(j - p_i)² / (2 (D/2)²))."""
    lead, (scores, positions) = _lead((scores, 2), (positions[..., None], 2))
    mask = np.ones(scores.shape, bool) if mask is None else np.broadcast_to(mask, scores.shape)
    out = np.zeros(scores.shape)
    for b in np.ndindex(lead):
        for i in range(scores.shape[-2]):
            p = positions[b][i, 0]
            keys = [j for j in range(scores.shape[-1]) if abs(j - p) <= window and mask[b][i, j]]
            if not keys:
                continue
            top = max(scores[b][i, j] for j in keys)
            total = sum(math.exp(scores[b][i, j] - top) for j in keys)
            for j in keys:
                align = math.exp(scores[b][i, j] - top) / total
                gauss = 1.0 if window == 0 else math.exp(-((j - p) ** 2) / (2 * (window / 2) ** 2))
                out[b][i, j] = align * gauss
    return out


# ===============================================================================================
# Helpers
# ===============================================================================================


def _rounded(backend, a, dtype):
    """``a`` on the backend in ``dtype``, and the float64 values it actually holds."""
    x = backend.asarray(a, dtype)
    return x, np.asarray(backend.to_host(x), dtype=np.float64)


def _qk(backend, dtype, rng, d_k=D):
    q, q_np = _rounded(backend, rng.normal(size=Q_SHAPE), dtype)
    k, k_np = _rounded(backend, rng.normal(size=(*K_SHAPE[:-1], d_k)), dtype)
    return q, k, q_np, k_np


def _check(backend, out, expected, dtype):
    assert tuple(out.shape) == expected.shape
    assert backend.to_host(out).dtype == np.dtype(dtype)
    backend.assert_close(out, expected, dtype)


# ===============================================================================================
# Score functions against the loops
# ===============================================================================================


def test_dot_product_scores(backend, dtype, rng):
    q, k, q_np, k_np = _qk(backend, dtype, rng)
    _check(backend, dot_product_scores(q, k), dot_loop(q_np, k_np), dtype)


@pytest.mark.parametrize("scale", [None, 0.3])
def test_scaled_dot_product_scores(backend, dtype, rng, scale):
    q, k, q_np, k_np = _qk(backend, dtype, rng)
    expected = dot_loop(q_np, k_np, 1 / math.sqrt(D) if scale is None else scale)
    _check(backend, scaled_dot_product_scores(q, k, scale=scale), expected, dtype)


@pytest.mark.parametrize("weight_lead", [(), (3,)], ids=["shared", "per-head"])
def test_bilinear_scores(backend, dtype, rng, weight_lead):
    q, k, q_np, k_np = _qk(backend, dtype, rng, d_k=D_K)  # d_q = 4 ≠ d_k = 3
    w, w_np = _rounded(backend, rng.normal(size=(*weight_lead, D, D_K)), dtype)
    _check(backend, bilinear_scores(q, k, w), bilinear_loop(q_np, k_np, w_np), dtype)


def _additive_params(backend, dtype, rng):
    named = {
        "query_weight": rng.normal(size=(D, D_A)) * 0.5,
        "key_weight": rng.normal(size=(D_K, D_A)) * 0.5,
        "v": rng.normal(size=(D_A,)),
        "bias": rng.normal(size=(D_A,)) * 0.5,
    }
    pairs = {name: _rounded(backend, a, dtype) for name, a in named.items()}
    return {n: p[0] for n, p in pairs.items()}, {n: p[1] for n, p in pairs.items()}


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_additive_scores(backend, dtype, rng, with_bias):
    q, k, q_np, k_np = _qk(backend, dtype, rng, d_k=D_K)
    p, p_np = _additive_params(backend, dtype, rng)
    bias, bias_np = (p["bias"], p_np["bias"]) if with_bias else (None, None)
    out = additive_scores(q, k, p["query_weight"], p["key_weight"], p["v"], bias=bias)
    expected = additive_loop(
        q_np, k_np, p_np["query_weight"], p_np["key_weight"], p_np["v"], bias_np
    )
    _check(backend, out, expected, dtype)


@pytest.mark.parametrize("chunk_size", [1, 2, LQ, LQ + 4])
def test_additive_chunked_equals_unchunked(backend, dtype, rng, chunk_size):
    q, k, q_np, k_np = _qk(backend, dtype, rng, d_k=D_K)
    p, p_np = _additive_params(backend, dtype, rng)
    args = (q, k, p["query_weight"], p["key_weight"], p["v"])
    chunked = additive_scores(*args, bias=p["bias"], chunk_size=chunk_size)
    whole = additive_scores(*args, bias=p["bias"], chunk_size=LQ)  # one chunk: unchunked
    expected = additive_loop(q_np, k_np, *(p_np[n] for n in ("query_weight", "key_weight", "v")),
                             p_np["bias"])  # fmt: skip
    _check(backend, chunked, expected, dtype)
    tol = {"float32": 1e-6, "float64": 1e-14}[dtype]
    np.testing.assert_allclose(backend.to_host(chunked), backend.to_host(whole), rtol=tol, atol=tol)


def test_additive_default_chunk_follows_the_budget(backend, rng, monkeypatch):
    """With a tiny element budget the default chunk is 1 or 2 queries; same result."""
    q, k, q_np, k_np = _qk(backend, "float64", rng, d_k=D_K)
    p, p_np = _additive_params(backend, "float64", rng)
    expected = additive_loop(q_np, k_np, p_np["query_weight"], p_np["key_weight"], p_np["v"])
    per_query = math.prod(LEAD) * LK * D_A
    for budget, chunk in [(2 * per_query, 2), (per_query - 1, 1), (2**22, LQ)]:
        monkeypatch.setattr(scores, "ADDITIVE_CHUNK_ELEMENTS", budget)
        assert scores._additive_chunk_size(LEAD, LQ, LK, D_A) == chunk
        out = additive_scores(q, k, p["query_weight"], p["key_weight"], p["v"])
        _check(backend, out, expected, "float64")


@pytest.mark.parametrize(
    ("lead", "lq", "lk", "d_a"),
    [((), 1000, 1000, 64), ((8, 4), 512, 512, 128), ((2,), 7, 3, 5), ((64, 16), 4096, 4096, 64)],
)
def test_additive_chunk_size_bound(lead, lq, lk, d_a):
    """One chunk's (..., chunk, Lk, d_a) tensor fits the budget unless one query exceeds it."""
    budget = scores.ADDITIVE_CHUNK_ELEMENTS
    chunk = scores._additive_chunk_size(lead, lq, lk, d_a)
    per_query = math.prod(lead) * lk * d_a
    assert 1 <= chunk <= lq
    assert chunk * per_query <= max(budget, per_query)
    assert chunk == lq or (chunk + 1) * per_query > budget  # the largest that fits


def test_cosine_scores(backend, dtype, rng):
    q_np = rng.normal(size=Q_SHAPE)
    k_np = rng.normal(size=K_SHAPE)
    q_np[1, 0, 2] = 0.0  # a zero query
    k_np[0, 3] = 0.0  # a zero key
    q, q_np = _rounded(backend, q_np, dtype)
    k, k_np = _rounded(backend, k_np, dtype)
    out = cosine_scores(q, k)
    _check(backend, out, cosine_loop(q_np, k_np), dtype)
    got = backend.to_host(out)
    assert np.isfinite(got).all()
    assert (got[1, :, 2, :] == 0).all()
    assert (got[:, 0, :, 3] == 0).all()
    assert (np.abs(got) <= 1 + 1e-6).all()


@pytest.mark.parametrize("fdtype", ["float16", "float32", "float64"])
def test_cosine_scores_extreme_magnitudes(backend, fdtype, rng):
    """Scale-invariant even where the squared norm would overflow or underflow in ``fdtype``."""
    big, tiny = {"float16": (300.0, 1e-3), "float32": (1e25, 1e-25), "float64": (1e200, 1e-200)}[
        fdtype
    ]
    q_np = rng.normal(size=Q_SHAPE)
    k_np = rng.normal(size=K_SHAPE)
    q_np[0] *= big
    k_np[0] *= big
    k_np[1] *= tiny
    q, q_np = _rounded(backend, q_np, fdtype)
    k, k_np = _rounded(backend, k_np, fdtype)
    assert backend.to_host(q).dtype == np.dtype(fdtype)
    backend.assert_close(cosine_scores(q, k), cosine_loop(q_np, k_np), fdtype)


def _zero_vector_inputs(target, rng):
    """q and k (float64) with a zero query and a zero key, and loss weights for the scores."""
    q_np = rng.normal(size=Q_SHAPE)
    k_np = rng.normal(size=K_SHAPE)
    q_np[1, 0, 1] = 0.0
    k_np[0, 2] = 0.0
    weights = target.asarray(rng.normal(size=(*LEAD, LQ, LK)), "float64")
    return target.asarray(q_np, "float64"), target.asarray(k_np, "float64"), weights


def _check_zero_vector_gradients(target, out, grads):
    got = target.to_host(out)
    assert (got[1, :, 1, :] == 0).all() and (got[:, 0, :, 2] == 0).all()
    for g in grads:
        assert np.isfinite(target.to_host(g)).all()


def test_cosine_zero_vector_gradient_torch(torch_backend, rng):
    q, k, weights = _zero_vector_inputs(torch_backend, rng)
    q.requires_grad_(True)
    k.requires_grad_(True)
    out = cosine_scores(q, k)
    (out * weights).sum().backward()
    _check_zero_vector_gradients(torch_backend, out, [q.grad, k.grad])


def test_cosine_zero_vector_gradient_jax(jax_backend, rng):
    import jax
    import jax.numpy as jnp

    q, k, weights = _zero_vector_inputs(jax_backend, rng)

    def loss(q, k):
        return jnp.sum(cosine_scores(q, k) * weights)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(q, k)  # one compilation, not per op
    _check_zero_vector_gradients(jax_backend, cosine_scores(q, k), grads)


def test_location_scores(backend, dtype, rng):
    n_positions = 6
    q, q_np = _rounded(backend, rng.normal(size=Q_SHAPE), dtype)
    w, w_np = _rounded(backend, rng.normal(size=(3, D, n_positions)), dtype)
    logits = location_scores(q, w)
    expected = location_loop(q_np, w_np)
    _check(backend, logits, expected, dtype)
    # Luong's a_t = softmax(W_a h_t): a distribution over the fixed positions
    weights = backend.to_host(relattn.masked_softmax(logits))
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-5)


def test_predicted_positions(backend, dtype, rng):
    d_p = 5
    q, q_np = _rounded(backend, rng.normal(size=Q_SHAPE), dtype)
    wp, wp_np = _rounded(backend, rng.normal(size=(D, d_p)), dtype)
    vp, vp_np = _rounded(backend, rng.normal(size=(d_p,)) * 2, dtype)
    out = predicted_positions(q, wp, vp, LK)
    _check(backend, out, positions_loop(q_np, wp_np, vp_np, LK), dtype)
    got = backend.to_host(out)
    assert ((got >= 0) & (got <= LK)).all()


def test_predicted_positions_per_sentence_lengths(backend, dtype, rng):
    """S from a padded batch: one source length per sentence, broadcast over queries."""
    d_p = 5
    q, q_np = _rounded(backend, rng.normal(size=Q_SHAPE), dtype)
    wp, wp_np = _rounded(backend, rng.normal(size=(D, d_p)), dtype)
    vp, vp_np = _rounded(backend, rng.normal(size=(d_p,)), dtype)
    lengths = np.array([5, 2])[:, None, None]  # (B, 1, 1) against q's (B, 1, Lq)
    out = predicted_positions(q, wp, vp, backend.asarray(lengths))
    _check(backend, out, positions_loop(q_np, wp_np, vp_np, lengths), dtype)
    s, s_np = _rounded(backend, np.array([4.5, 2.25])[:, None, None], dtype)
    out = predicted_positions(q, wp, vp, s)
    _check(backend, out, positions_loop(q_np, wp_np, vp_np, s_np), dtype)


# ===============================================================================================
# Local-p weights
# ===============================================================================================

#: (2, LQ) positions in key units, fractional so that no key sits on a window edge; row 1 has
#: a query whose window (D <= 2) lies before every key and one past the last key.
POSITIONS = np.array([[0.3, 2.6, 4.7], [-3.4, 1.5, 8.2]])


@pytest.mark.parametrize("window", [0, 1, 2, 7])
def test_local_p_weights(backend, dtype, rng, window):
    scores, s_np = _rounded(backend, rng.normal(size=(*LEAD, LQ, LK)), dtype)
    positions, p_np = _rounded(backend, POSITIONS[:, None, :], dtype)  # (2, 1, Lq)
    out = local_p_weights(scores, positions, window)
    expected = local_p_loop(s_np, p_np, window)
    _check(backend, out, expected, dtype)
    got = backend.to_host(out)
    assert np.isfinite(got).all()
    if window < 3:
        assert (got[1, :, 0] == 0).all()  # p = -3.4: no key within D
        assert (got[1, :, 2] == 0).all()  # p = 8.2 > Lk - 1 + D


def test_local_p_weights_empty_window_gives_zeros(backend, dtype, rng):
    scores, _ = _rounded(backend, rng.normal(size=(*LEAD, LQ, LK)) * 10, dtype)
    positions, _ = _rounded(backend, np.full((2, 1, LQ), [-2.5, LK + 1.5, 100.0]), dtype)
    got = backend.to_host(local_p_weights(scores, positions, 1))
    np.testing.assert_array_equal(got, np.zeros((*LEAD, LQ, LK)))


def test_local_p_weights_window_zero(backend, dtype, rng):
    """D = 0: only a key at distance exactly 0 survives, with weight 1; else the row is 0."""
    scores, _ = _rounded(backend, rng.normal(size=(*LEAD, LQ, LK)), dtype)
    positions, _ = _rounded(backend, np.array([[[2.0, 3.5, 4.0]], [[0.0, -1.0, 0.5]]]), dtype)
    got = backend.to_host(local_p_weights(scores, positions, 0))
    expected = np.zeros((*LEAD, LQ, LK))
    expected[0, :, 0, 2] = expected[0, :, 2, 4] = expected[1, :, 0, 0] = 1.0
    np.testing.assert_array_equal(got, expected)


def test_local_p_weights_with_mask(backend, dtype, rng):
    scores, s_np = _rounded(backend, rng.normal(size=(*LEAD, LQ, LK)), dtype)
    positions, p_np = _rounded(backend, POSITIONS[:, None, :], dtype)
    mask = rng.random((2, 1, 1, LK)) < 0.7  # a key padding mask
    mask[..., 1] = True
    out = local_p_weights(scores, positions, 2, mask=backend.asarray(mask))
    _check(backend, out, local_p_loop(s_np, p_np, 2, mask), dtype)


def test_local_p_attention_end_to_end(backend, dtype, rng):
    """Luong's local-p: general scores, predicted positions, weights, context vectors."""
    q, k, q_np, k_np = _qk(backend, dtype, rng, d_k=D_K)
    w, w_np = _rounded(backend, rng.normal(size=(D, D_K)), dtype)
    wp, wp_np = _rounded(backend, rng.normal(size=(D, 5)), dtype)
    vp, vp_np = _rounded(backend, rng.normal(size=(5,)), dtype)
    positions = predicted_positions(q, wp, vp, LK)
    weights = local_p_weights(bilinear_scores(q, k, w), positions, 1)
    context = weights @ k
    p_ref = positions_loop(q_np, wp_np, vp_np, LK)
    w_ref = local_p_loop(bilinear_loop(q_np, k_np, w_np), p_ref, 1)
    _check(backend, weights, w_ref, dtype)
    _check(backend, context, w_ref @ k_np, dtype)


def test_result_dtype_promotes(backend, rng):
    q = backend.asarray(rng.normal(size=Q_SHAPE), "float32")
    k = backend.asarray(rng.normal(size=K_SHAPE), "float64")
    for fn in (dot_product_scores, scaled_dot_product_scores, cosine_scores):
        assert backend.to_host(fn(q, k)).dtype == np.float64
    assert backend.to_host(fn(q, q)).dtype == np.float32
    scores = backend.asarray(rng.normal(size=(*LEAD, LQ, LK)), "float32")
    positions = backend.asarray(POSITIONS[:, None, :], "float64")
    assert backend.to_host(local_p_weights(scores, positions, 1)).dtype == np.float64


# ===============================================================================================
# jax.jit equals eager
# ===============================================================================================


def _normal(rng, *shape):
    return rng.normal(size=shape)


#: name -> (inputs(rng), call(*arrays)); static arguments are closed over.
JIT_CASES: dict[str, tuple[Callable[..., tuple], Callable[..., Any]]] = {
    "dot_product_scores": (
        lambda r: (_normal(r, *Q_SHAPE), _normal(r, *K_SHAPE)),
        dot_product_scores,
    ),
    "scaled_dot_product_scores": (
        lambda r: (_normal(r, *Q_SHAPE), _normal(r, *K_SHAPE)),
        lambda q, k: scaled_dot_product_scores(q, k, scale=0.4),
    ),
    "bilinear_scores": (
        lambda r: (_normal(r, *Q_SHAPE), _normal(r, 3, LK, D_K), _normal(r, D, D_K)),
        bilinear_scores,
    ),
    "additive_scores": (
        lambda r: (
            _normal(r, *Q_SHAPE),
            _normal(r, 3, LK, D_K),
            _normal(r, D, D_A),
            _normal(r, D_K, D_A),
            _normal(r, D_A),
            _normal(r, D_A),
        ),
        lambda q, k, w, u, v, b: additive_scores(q, k, w, u, v, bias=b),
    ),
    "additive_scores[chunked]": (
        lambda r: (
            _normal(r, *Q_SHAPE),
            _normal(r, 3, LK, D_K),
            _normal(r, D, D_A),
            _normal(r, D_K, D_A),
            _normal(r, D_A),
        ),
        lambda q, k, w, u, v: additive_scores(q, k, w, u, v, chunk_size=2),
    ),
    "cosine_scores": (
        lambda r: (_normal(r, *Q_SHAPE) * np.array([1, 1, 0])[:, None], _normal(r, *K_SHAPE)),
        cosine_scores,
    ),
    "location_scores": (
        lambda r: (_normal(r, *Q_SHAPE), _normal(r, D, 6)),
        location_scores,
    ),
    "predicted_positions": (
        lambda r: (_normal(r, *Q_SHAPE), _normal(r, D, 5), _normal(r, 5)),
        lambda q, w, v: predicted_positions(q, w, v, LK),
    ),
    "local_p_weights": (
        lambda r: (_normal(r, *LEAD, LQ, LK), POSITIONS[:, None, :]),
        lambda s, p: local_p_weights(s, p, 1),
    ),
}


def test_jit_cases_cover_the_module():
    classic = (set(scores.__all__) - {"relative_scores"}) | set(local.__all__)
    assert {name.partition("[")[0] for name in JIT_CASES} == classic


@pytest.mark.parametrize("name", sorted(JIT_CASES))
def test_jit_equals_eager(jit_backend, dtype, rng, name):
    inputs, call = JIT_CASES[name]
    jitted = jit_backend.jit(call)
    arrays = [jit_backend.asarray(a, dtype) for a in inputs(rng)]
    eager, compiled = call(*arrays), jitted(*arrays)
    assert jit_backend.is_array(compiled)
    assert compiled.shape == eager.shape and compiled.dtype == eager.dtype
    tol = {"float32": 1e-5, "float64": 1e-12}[dtype]
    np.testing.assert_allclose(
        jit_backend.to_host(compiled), jit_backend.to_host(eager), rtol=tol, atol=tol
    )


# ===============================================================================================
# torch.autograd.gradcheck (float64)
# ===============================================================================================


def _leaves(torch_backend, *arrays):
    """float64 tensors on the target's device that require a gradient."""
    return tuple(torch_backend.asarray(a, "float64").requires_grad_(True) for a in arrays)


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_gradcheck_additive(torch_backend, rng, chunk_size):
    torch = torch_backend.lib
    leaves = _leaves(
        torch_backend,
        _normal(rng, 2, LQ, D),
        _normal(rng, LK, D_K),
        _normal(rng, D, D_A) * 0.5,
        _normal(rng, D_K, D_A) * 0.5,
        _normal(rng, D_A),
        _normal(rng, D_A) * 0.5,
    )

    def f(q, k, w, u, v, b):
        return additive_scores(q, k, w, u, v, bias=b, chunk_size=chunk_size)

    assert torch.autograd.gradcheck(f, leaves)


def test_gradcheck_bilinear_and_location(torch_backend, rng):
    torch = torch_backend.lib
    q, k, w, wl = _leaves(
        torch_backend,
        _normal(rng, 2, LQ, D),
        _normal(rng, LK, D_K),
        _normal(rng, D, D_K),
        _normal(rng, D, 6),
    )
    assert torch.autograd.gradcheck(bilinear_scores, (q, k, w))
    assert torch.autograd.gradcheck(location_scores, (q, wl))


def test_gradcheck_cosine(torch_backend, rng):
    torch = torch_backend.lib
    leaves = _leaves(torch_backend, _normal(rng, 2, LQ, D), _normal(rng, LK, D))
    assert torch.autograd.gradcheck(cosine_scores, leaves)


#: |q| about 1e100 and |k| about 1e-100, as powers of 2: multiplying by them is exact.
BIG, TINY = 2.0**332, 2.0**-332


def check_cosine_gradients_at_extreme_magnitudes(torch_backend, rng, fn=cosine_scores):
    """The gradients of ``fn`` (the cosine) at |q| ≈ 1e100, |k| ≈ 1e-100, each checked with
    a step relative to its input, and against the gradients at unit scale.

    An absolute step cannot check the q-gradient there: ``q + eps == q`` for any eps below
    q's spacing (about 1e84), so the finite difference is 0, and so within atol of the true
    gradient (about 1e-100). Instead:

    - gradcheck varies unit-scale ``x, y`` of ``q = x·BIG``, ``k = y·TINY``: its step of
      1e-6 is a relative step of q and of k, and the chain rule's factors are exact;
    - the cosine is invariant under ``q -> c q``, ``k -> c' k``, so its gradients there are
      those at unit scale divided by ``c`` and ``c'`` (taken at leaves, no product between).
    """
    torch = torch_backend.lib
    x, y = _leaves(torch_backend, _normal(rng, LQ, D), _normal(rng, LK, D))
    assert torch.autograd.gradcheck(lambda x, y: fn(x * BIG, y * TINY), (x, y))
    weights = torch_backend.asarray(rng.normal(size=(LQ, LK)), "float64")
    q, k = _leaves(torch_backend, torch_backend.to_host(x) * BIG, torch_backend.to_host(y) * TINY)
    unit_q, unit_k = torch.autograd.grad((fn(x, y) * weights).sum(), (x, y))
    big_q, tiny_k = torch.autograd.grad((fn(q, k) * weights).sum(), (q, k))
    assert 1e-102 < float(big_q.abs().max()) < 1e-98  # the scale of the q-gradient
    for got, unit in ((big_q * BIG, unit_q), (tiny_k * TINY, unit_k)):
        np.testing.assert_allclose(
            torch_backend.to_host(got), torch_backend.to_host(unit), rtol=1e-10, atol=1e-12
        )


def test_gradcheck_cosine_extreme_magnitudes(torch_backend, rng):
    check_cosine_gradients_at_extreme_magnitudes(torch_backend, rng)


def test_gradcheck_local_p_weights(torch_backend, rng):
    """Gradients with respect to the scores and the positions (through the Gaussian)."""
    torch = torch_backend.lib
    scores, positions = _leaves(torch_backend, _normal(rng, 2, LQ, LK), POSITIONS)
    mask = torch_backend.asarray(rng.random((LQ, LK)) < 0.8)
    for window in (1, 2, 7):
        assert torch.autograd.gradcheck(
            lambda s, p, w=window: local_p_weights(s, p, w, mask=mask), (scores, positions)
        )


def test_gradcheck_predicted_positions(torch_backend, rng):
    torch = torch_backend.lib
    leaves = _leaves(torch_backend, _normal(rng, 2, LQ, D), _normal(rng, D, 5), _normal(rng, 5))
    assert torch.autograd.gradcheck(lambda q, w, v: predicted_positions(q, w, v, LK), leaves)


def test_jax_grad_local_p_empty_rows_finite(jax_backend, rng):
    import jax
    import jax.numpy as jnp

    scores = jax_backend.asarray(_normal(rng, 2, LQ, LK), "float64")
    positions = jax_backend.asarray(POSITIONS, "float64")  # rows with empty windows included

    def loss(s, p):
        return jnp.sum(local_p_weights(s, p, 1) ** 2)

    gs, gp = jax.jit(jax.grad(loss, argnums=(0, 1)))(scores, positions)
    assert bool(jnp.all(jnp.isfinite(gs))) and bool(jnp.all(jnp.isfinite(gp)))
    assert float(gp[1, 0]) == 0.0 and bool(jnp.all(gs[1, 0] == 0))


# ===============================================================================================
# Bad input
# ===============================================================================================


def _f(b, *shape):
    return b.asarray(np.random.default_rng(0).normal(size=shape), "float64")


def _i(b, *shape):
    return b.asarray(np.ones(shape, dtype=np.int64))


def _m(b, *shape):
    return b.asarray(np.ones(shape, dtype=bool))


def _additive(b, q=(3, 4), k=(5, 3), w=(4, 6), u=(3, 6), v=(6,), **kw):
    return additive_scores(_f(b, *q), _f(b, *k), _f(b, *w), _f(b, *u), _f(b, *v), **kw)


def _positions(b, q=(3, 4), w=(4, 5), v=(5,), key_length=5):
    return predicted_positions(_f(b, *q), _f(b, *w), _f(b, *v), key_length)


def _local(b, scores=(3, 5), positions=(3,), window=1, **kw):
    return local_p_weights(_f(b, *scores), _f(b, *positions), window, **kw)


V, T = ValueError, TypeError

ERRORS: list[tuple[str, Callable[[Any], Any], type[Exception], str]] = [
    # -- dot, scaled dot, cosine ----------------------------------------------------------
    *[
        entry
        for fn in (dot_product_scores, scaled_dot_product_scores, cosine_scores)
        for entry in [
            (
                f"{fn.__name__}-features",
                lambda b, fn=fn: fn(_f(b, 3, 4), _f(b, 5, 3)),
                V,
                r"^k must have the feature size of q, d = 4, got k of shape \(5, 3\)",
            ),
            (
                f"{fn.__name__}-q-1d",
                lambda b, fn=fn: fn(_f(b, 4), _f(b, 5, 4)),
                V,
                r"^q must have shape \(\.\.\., Lq, d\), got shape \(4,\)",
            ),
            (
                f"{fn.__name__}-leading",
                lambda b, fn=fn: fn(_f(b, 2, 3, 4), _f(b, 3, 5, 4)),
                V,
                r"leading .* q \(2,\), k \(3,\)",
            ),
            (
                f"{fn.__name__}-int",
                lambda b, fn=fn: fn(_i(b, 3, 4), _f(b, 5, 4)),
                T,
                r"^q must have a real floating dtype",
            ),
            (
                f"{fn.__name__}-bool",
                lambda b, fn=fn: fn(_f(b, 3, 4), _m(b, 5, 4)),
                T,
                r"^k must have a real floating dtype",
            ),
            (
                f"{fn.__name__}-list",
                lambda b, fn=fn: fn([[1.0]], _f(b, 1, 1)),
                T,
                r"^q must be an array, got list",
            ),
        ]
    ],
    # -- bilinear -------------------------------------------------------------------------
    (
        "bilinear-weight-shape",
        lambda b: bilinear_scores(_f(b, 3, 4), _f(b, 5, 3), _f(b, 4, 4)),
        V,
        r"^k must have 4 features to match weight \(\.\.\., d_q, d_k\) of shape \(4, 4\)",
    ),
    (
        "bilinear-weight-1d",
        lambda b: bilinear_scores(_f(b, 3, 4), _f(b, 5, 3), _f(b, 12)),
        V,
        r"^weight must have shape \(\.\.\., d_q, d_k\), got shape \(12,\)",
    ),
    (
        "bilinear-weight-leading",
        lambda b: bilinear_scores(_f(b, 2, 3, 4), _f(b, 5, 3), _f(b, 3, 4, 3)),
        V,
        r"leading .* weight \(3,\)",
    ),
    (
        "bilinear-weight-int",
        lambda b: bilinear_scores(_f(b, 3, 4), _f(b, 5, 3), _i(b, 4, 3)),
        T,
        r"^weight must have a real floating dtype",
    ),
    # -- additive -------------------------------------------------------------------------
    (
        "additive-query_weight",
        lambda b: _additive(b, w=(5, 6)),
        V,
        r"^query_weight must have shape \(d_q, d_a\) = \(4, 6\), got shape \(5, 6\)",
    ),
    (
        "additive-query_weight-3d",
        lambda b: _additive(b, w=(2, 4, 6)),
        V,
        r"^query_weight must have shape \(d_q, d_a\) = \(4, 6\), got shape \(2, 4, 6\)",
    ),
    (
        "additive-query_weight-1d",
        lambda b: _additive(b, w=(4,)),
        V,
        r"^query_weight must have shape \(d_q, d_a\), got shape \(4,\)",
    ),
    (
        "additive-key_weight",
        lambda b: _additive(b, u=(3, 5)),
        V,
        r"^key_weight must have shape \(d_k, d_a\) = \(3, 6\), got shape \(3, 5\)",
    ),
    (
        "additive-key_weight-features",
        lambda b: _additive(b, u=(4, 6)),
        V,
        r"^k must have 4 features to match key_weight \(d_k, d_a\) of shape \(4, 6\)",
    ),
    ("additive-v", lambda b: _additive(b, v=(5,)), V, r"^v must have shape \(d_a,\) = \(6,\)"),
    (
        "additive-bias",
        lambda b: _additive(b, bias=_f(b, 6, 1)),
        V,
        r"^bias must have shape \(d_a,\) = \(6,\), got shape \(6, 1\)",
    ),
    (
        "additive-leading",
        lambda b: _additive(b, q=(2, 3, 4), k=(3, 5, 3)),
        V,
        r"leading .* q \(2,\), k \(3,\)",
    ),
    ("additive-chunk-0", lambda b: _additive(b, chunk_size=0), V, r"^chunk_size must be >= 1"),
    (
        "additive-chunk-float",
        lambda b: _additive(b, chunk_size=1.5),
        T,
        r"^chunk_size must be an integer, got float",
    ),
    (
        "additive-v-int",
        lambda b: additive_scores(_f(b, 3, 4), _f(b, 5, 3), _f(b, 4, 6), _f(b, 3, 6), _i(b, 6)),
        T,
        r"^v must have a real floating dtype",
    ),
    (
        "additive-bias-int",
        lambda b: _additive(b, bias=_i(b, 6)),
        T,
        r"^bias must have a real floating dtype",
    ),
    # -- location -------------------------------------------------------------------------
    (
        "location-weight",
        lambda b: location_scores(_f(b, 3, 4), _f(b, 5, 6)),
        V,
        r"^weight must have shape \(\.\.\., d, n_positions\) with d = 4 .*got shape \(5, 6\)",
    ),
    (
        "location-weight-1d",
        lambda b: location_scores(_f(b, 3, 4), _f(b, 4)),
        V,
        r"^weight must have shape \(\.\.\., d, n_positions\), got shape \(4,\)",
    ),
    (
        "location-int",
        lambda b: location_scores(_i(b, 3, 4), _f(b, 4, 6)),
        T,
        r"^q must have a real floating dtype",
    ),
    # -- predicted_positions --------------------------------------------------------------
    (
        "positions-weight",
        lambda b: _positions(b, w=(5, 5)),
        V,
        r"^weight must have shape \(d, d_p\) = \(4, 5\), got shape \(5, 5\)",
    ),
    ("positions-v", lambda b: _positions(b, v=(4,)), V, r"^v must have shape \(d_p,\) = \(5,\)"),
    (
        "positions-key_length-0",
        lambda b: _positions(b, key_length=0),
        V,
        r"^key_length must be >= 1, got 0",
    ),
    (
        "positions-key_length-float",
        lambda b: _positions(b, key_length=2.5),
        T,
        r"^key_length must be an integer, got float",
    ),
    (
        "positions-key_length-bool",
        lambda b: _positions(b, key_length=True),
        T,
        r"^key_length must be an integer, got bool",
    ),
    (
        "positions-key_length-bool-array",
        lambda b: _positions(b, key_length=_m(b, 3)),
        T,
        r"^key_length must be an integer or a real or integer array",
    ),
    (
        "positions-key_length-shape",
        lambda b: _positions(b, key_length=_i(b, 4)),
        V,
        r"^key_length must be broadcastable to \(\.\.\., Lq\) \(3,\), got shape \(4,\)",
    ),
    # -- local_p_weights -----------------------------------------------------------------
    ("local-window-negative", lambda b: _local(b, window=-1), V, r"^window must be >= 0, got -1"),
    (
        "local-window-float",
        lambda b: _local(b, window=1.0),
        T,
        r"^window must be an integer, got float",
    ),
    (
        "local-positions-length",
        lambda b: _local(b, positions=(5,)),
        V,
        r"^positions must have one entry per query, Lq = 3, got positions of shape \(5,\)",
    ),
    (
        "local-positions-int",
        lambda b: local_p_weights(_f(b, 3, 5), _i(b, 3), 1),
        T,
        r"^positions must have a real floating dtype",
    ),
    (
        "local-scores-int",
        lambda b: local_p_weights(_i(b, 3, 5), _f(b, 3), 1),
        T,
        r"^scores must have a real floating dtype",
    ),
    (
        "local-scores-1d",
        lambda b: _local(b, scores=(5,)),
        V,
        r"^scores must have shape \(\.\.\., Lq, Lk\)",
    ),
    (
        "local-leading",
        lambda b: _local(b, scores=(2, 3, 5), positions=(4, 3)),
        V,
        r"leading .* scores \(2,\), positions \(4,\)",
    ),
    ("local-mask-float", lambda b: _local(b, mask=_f(b, 3, 5)), T, r"^mask must be a boolean"),
    (
        "local-mask-shape",
        lambda b: _local(b, mask=_m(b, 3, 4)),
        V,
        r"^mask must be broadcastable to the scores",
    ),
]


@pytest.mark.parametrize(
    ("call", "exception", "match"),
    [pytest.param(c, e, m, id=i) for i, c, e, m in ERRORS],
)
def test_bad_input(backend, call, exception, match):
    with pytest.raises(exception, match=match):
        call(backend)


def test_mixed_libraries_raise(torch_backend):
    torch = torch_backend.lib
    q = torch.ones((3, 4), dtype=torch.float64, device=torch_backend.device)
    k = np.ones((5, 4))
    match = r"^arrays from different libraries cannot be mixed: q is a torch array, k is a numpy"
    for fn in (dot_product_scores, scaled_dot_product_scores, cosine_scores):
        with pytest.raises(TypeError, match=match):
            fn(q, k)
    with pytest.raises(TypeError, match=r"weight is a numpy array"):
        bilinear_scores(q, q, np.ones((4, 4)))
    w = torch.ones((4, 6), dtype=torch.float64, device=torch_backend.device)
    with pytest.raises(TypeError, match=r"v is a numpy array"):
        additive_scores(q, q, w, q[:, :1].T, np.ones(6))
    with pytest.raises(TypeError, match=r"key_length is a numpy array"):
        predicted_positions(q, q, q[0], np.array([5]))
    with pytest.raises(TypeError, match=r"positions is a numpy array"):
        local_p_weights(q, np.ones(3), 1)


# ===============================================================================================
# SPEC §4 recipe 1: the Vaswani encoder and decoder layers (examples/vaswani.py)
# ===============================================================================================

EXAMPLE = Path(__file__).parents[1] / "examples" / "vaswani.py"


@pytest.fixture(scope="module")
def vaswani():
    spec = importlib.util.spec_from_file_location("vaswani_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sinusoid_loop(length, d):
    """Vaswani sec. 3.5: PE(p, 2k) = sin(p / 10000^(2k/d)), PE(p, 2k+1) = cos(...)."""
    pe = np.zeros((length, d))
    for p in range(length):
        for two_k in range(0, d, 2):
            pe[p, two_k] = math.sin(p / 10000 ** (two_k / d))
            pe[p, two_k + 1] = math.cos(p / 10000 ** (two_k / d))
    return pe


def _layer_norm_loop(x, p, eps=1e-5):
    out = np.zeros_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx]
        mean = sum(row) / len(row)
        var = sum((r - mean) ** 2 for r in row) / len(row)
        out[idx] = [(r - mean) / math.sqrt(var + eps) * g + s
                    for r, g, s in zip(row, p["gain"], p["shift"], strict=True)]  # fmt: skip
    return out


def _ffn_loop(x, p):
    hidden = np.maximum(x @ p["w_1"] + p["b_1"], 0.0)
    return hidden @ p["w_2"] + p["b_2"]


def _mha_loop(x_q, x_kv, p, heads, allowed):
    """Multi-head attention, scores and softmax per (b, head, i, j); ``allowed(b, i, j)``."""
    batch, lq, d = x_q.shape
    lk = x_kv.shape[1]
    dh = d // heads
    concat = np.zeros((batch, lq, d))
    for b in range(batch):
        q, k, v = x_q[b] @ p["w_q"], x_kv[b] @ p["w_k"], x_kv[b] @ p["w_v"]
        for h in range(heads):
            cols = range(h * dh, (h + 1) * dh)
            for i in range(lq):
                keys = [j for j in range(lk) if allowed(b, i, j)]
                if not keys:
                    continue
                e = {j: sum(q[i, c] * k[j, c] for c in cols) / math.sqrt(dh) for j in keys}
                top = max(e.values())
                total = sum(math.exp(s - top) for s in e.values())
                for c in cols:
                    concat[b, i, c] = sum(math.exp(e[j] - top) / total * v[j, c] for j in keys)
    return concat @ p["w_o"]


def vaswani_loop(params, heads):
    d = params["embedding"].shape[1]
    lengths = params["source_lengths"]
    src, tgt = params["source_tokens"], params["target_tokens"]

    def embed(tokens):
        return params["embedding"][tokens] * math.sqrt(d) + _sinusoid_loop(tokens.shape[1], d)

    def real_key(b, i, j):
        return j < lengths[b]

    enc, dec = params["encoder"], params["decoder"]
    x = embed(src)
    h = _layer_norm_loop(x + _mha_loop(x, x, enc["self_attention"], heads, real_key),
                         enc["norm_1"])  # fmt: skip
    memory = _layer_norm_loop(h + _ffn_loop(h, enc["feed_forward"]), enc["norm_2"])

    y = embed(tgt)

    def causal(b, i, j):
        return j <= i

    h = _layer_norm_loop(y + _mha_loop(y, y, dec["self_attention"], heads, causal),
                         dec["norm_1"])  # fmt: skip
    h = _layer_norm_loop(h + _mha_loop(h, memory, dec["cross_attention"], heads, real_key),
                         dec["norm_2"])  # fmt: skip
    out = _layer_norm_loop(h + _ffn_loop(h, dec["feed_forward"]), dec["norm_3"])
    return {"encoder": memory, "decoder": out}


@pytest.fixture(scope="module")
def vaswani_expected(vaswani):
    return vaswani_loop(vaswani.init(0), vaswani.HEADS)


#: The recipe builds its arrays with xp.asarray on the default (CPU) device.
host_backend = target_fixture("host_backend", lambda t: not t.gpu and not t.readonly)


def test_vaswani_recipe(host_backend, vaswani, vaswani_expected):
    got = vaswani.run(host_backend.lib, seed=0)
    assert set(got) == {"encoder", "decoder"}
    params = vaswani.init(0)
    batch = params["source_tokens"].shape[0]
    assert got["encoder"].shape == (batch, vaswani.SOURCE_LENGTH, vaswani.D_MODEL)
    assert got["decoder"].shape == (batch, vaswani.TARGET_LENGTH, vaswani.D_MODEL)
    assert vaswani.SOURCE_LENGTH != vaswani.TARGET_LENGTH  # cross-attention with Lq ≠ Lk
    for name in got:
        np.testing.assert_allclose(got[name], vaswani_expected[name], rtol=1e-10, atol=1e-12)


def test_vaswani_recipe_masks_matter(vaswani, vaswani_expected):
    """The padded source positions and the future target positions really are hidden."""
    params = vaswani.init(0)
    assert min(params["source_lengths"]) < vaswani.SOURCE_LENGTH  # some padding exists
    # Changing a padded source token changes neither the real encoder rows nor the decoder.
    tokens = params["source_tokens"].copy()
    short = int(np.argmin(params["source_lengths"]))
    tokens[short, -1] = (tokens[short, -1] + 1) % vaswani.VOCAB
    changed = vaswani_loop({**params, "source_tokens": tokens}, vaswani.HEADS)
    real = params["source_lengths"][short]
    np.testing.assert_allclose(
        changed["encoder"][short, :real], vaswani_expected["encoder"][short, :real], atol=1e-12
    )
    np.testing.assert_allclose(changed["decoder"], vaswani_expected["decoder"], atol=1e-12)
    # The model without masks differs: the reference is sensitive to them.
    no_padding = np.full_like(params["source_lengths"], vaswani.SOURCE_LENGTH)
    unmasked = vaswani_loop({**params, "source_lengths": no_padding}, vaswani.HEADS)
    assert np.abs(unmasked["decoder"] - vaswani_expected["decoder"]).max() > 1e-3
