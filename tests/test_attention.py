"""masked_softmax, scaled_dot_product_attention, relative_scores, relative_attention, mask_to_bias.

Each result is compared, on every backend and in float32 and float64, with a
NumPy float64 reference that loops over every ``(i, j)`` pair (``reference.py``
or the private loops below).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import reference
from array_api_extra.testing import lazy_xp_function

import relattn

# The core's values in float32 on JAX and Dask too (tests/conftest.py: FLOAT64_TARGETS).
pytestmark = pytest.mark.every_dtype

# Lazy on Dask, traced under jax.jit on JAX, for every backend test.
lazy_xp_modules = [relattn]
for _function in (
    relattn.masked_softmax,
    relattn.scaled_dot_product_attention,
    relattn.relative_scores,
    relattn.relative_attention,
    relattn.mask_to_bias,
    relattn.causal_mask,
    relattn.padding_mask,
):
    lazy_xp_function(_function)


def _random_mask(rng, shape, p=0.6):
    return rng.random(shape) < p


def _weights_loop(scores, mask):
    """Row softmax of ``scores`` over the allowed keys, a row at a time (zeros if none)."""
    out = np.zeros_like(scores)
    for idx in np.ndindex(scores.shape[:-1]):
        out[idx] = reference.softmax_row(scores[idx], mask[idx])
    return out


def _relative_scores_loop(q, table, lk, bias=None):
    """out[..., i, j] = (q_i + bias_i) · table[δ(i, j) + Lk - 1], 0 where that row is missing."""
    q = np.asarray(q, dtype=np.float64)
    table = np.asarray(table, dtype=np.float64)
    lq, d = q.shape[-2:]
    width = table.shape[-2]
    lead = np.broadcast_shapes(q.shape[:-2], table.shape[:-2])
    q = np.broadcast_to(q, (*lead, lq, d))
    table = np.broadcast_to(table, (*lead, width, d))
    bias = np.zeros(d) if bias is None else np.asarray(bias, dtype=np.float64)
    bias = np.broadcast_to(bias, (*lead, lq, d))
    out = np.zeros((*lead, lq, lk))
    for b in np.ndindex(lead):
        for i in range(lq):
            for j in range(lk):
                m = reference.delta(i, j, lq, lk) + lk - 1
                if m < width:
                    out[b][i, j] = sum(
                        (q[b][i, c] + bias[b][i, c]) * table[b][m, c] for c in range(d)
                    )
    return out


def _result_dtype(backend, x):
    return backend.to_host(x).dtype


# ===============================================================================================
# masked_softmax
# ===============================================================================================


def test_masked_softmax_random_mask(backend, dtype, rng):
    scores = rng.normal(size=(2, 4, 5)) * 3
    mask = _random_mask(rng, scores.shape)
    mask[0, 1, :] = False  # fully masked rows
    mask[1, 3, :] = False
    mask[1, 0, :] = True
    out = relattn.masked_softmax(backend.asarray(scores, dtype), backend.asarray(mask))
    expected = reference.masked_softmax(scores, mask)
    backend.assert_close(out, expected, dtype)
    got = backend.to_host(out)
    assert got.dtype == np.dtype(dtype)
    assert np.isfinite(got).all()
    # fully masked rows are exactly zero, masked entries are exactly zero
    assert (got[0, 1] == 0).all()
    assert (got[1, 3] == 0).all()
    assert (got[~mask] == 0).all()
    # other rows sum to one
    rows = mask.any(axis=-1)
    np.testing.assert_allclose(got.sum(axis=-1)[rows], 1.0, rtol=1e-5)


def test_masked_softmax_no_mask(backend, dtype, rng):
    scores = rng.normal(size=(2, 4, 5))
    out = relattn.masked_softmax(backend.asarray(scores, dtype))
    expected = reference.masked_softmax(scores)
    backend.assert_close(out, expected, dtype)
    # written out: exp(e_ij) / sum_j exp(e_ij)
    direct = np.exp(scores) / np.exp(scores).sum(axis=-1, keepdims=True)
    backend.assert_close(out, direct, dtype)


def test_masked_softmax_all_masked(backend, dtype, rng):
    scores = rng.normal(size=(4, 5))
    mask = np.zeros((4, 5), bool)
    out = backend.to_host(
        relattn.masked_softmax(backend.asarray(scores, dtype), backend.asarray(mask))
    )
    np.testing.assert_array_equal(out, np.zeros((4, 5)))


def test_masked_softmax_ignores_masked_values(backend, dtype, rng):
    # huge scores under the mask must not leak into the normalisation
    scores = rng.normal(size=(4, 5))
    mask = _random_mask(rng, scores.shape)
    mask[:, 0] = True
    big = np.where(mask, scores, 1e4)
    out = relattn.masked_softmax(backend.asarray(big, dtype), backend.asarray(mask))
    backend.assert_close(out, reference.masked_softmax(scores, mask), dtype)


def test_masked_softmax_large_scores_stable(backend, dtype, rng):
    scores = rng.normal(size=(4, 5)) + 500.0
    out = relattn.masked_softmax(backend.asarray(scores, dtype))
    backend.assert_close(out, reference.masked_softmax(scores), dtype)


def test_masked_softmax_negative_infinity_scores(backend, dtype, rng):
    # -inf scores (e.g. an additive -inf bias) act as masked; a row of -inf gives zeros
    scores = rng.normal(size=(4, 5))
    scores[0, 1] = -np.inf
    scores[2, :] = -np.inf
    out = relattn.masked_softmax(backend.asarray(scores, dtype))
    allowed = np.isfinite(scores)
    expected = reference.masked_softmax(np.where(allowed, scores, 0.0), allowed)
    backend.assert_close(out, expected, dtype)
    got = backend.to_host(out)
    assert (got[2] == 0).all()
    assert got[0, 1] == 0


@pytest.mark.parametrize("axis", [0, -2])
def test_masked_softmax_axis(backend, dtype, rng, axis):
    scores = rng.normal(size=(2, 4, 5))
    mask = _random_mask(rng, scores.shape)
    moved_s = np.moveaxis(scores, axis, -1)
    moved_m = np.moveaxis(mask, axis, -1)
    moved_m[0, 0, :] = False  # one fully masked fibre along `axis`
    expected = np.moveaxis(reference.masked_softmax(moved_s, moved_m), -1, axis)
    out = relattn.masked_softmax(backend.asarray(scores, dtype), backend.asarray(mask), axis=axis)
    backend.assert_close(out, expected, dtype)
    np.testing.assert_allclose(
        backend.to_host(out).sum(axis=axis), moved_m.any(axis=-1).astype(float), rtol=1e-5
    )


@pytest.mark.parametrize(
    "mask_shape",
    [(5,), (4, 1), (2, 1, 5), (1, 4, 5)],
)
def test_masked_softmax_mask_broadcasts(backend, dtype, rng, mask_shape):
    scores = rng.normal(size=(2, 4, 5))
    mask = _random_mask(rng, mask_shape, p=0.5)
    mask.flat[0] = False
    mask.flat[-1] = True
    out = relattn.masked_softmax(backend.asarray(scores, dtype), backend.asarray(mask))
    assert tuple(out.shape) == scores.shape
    expected = reference.masked_softmax(scores, np.broadcast_to(mask, scores.shape))
    backend.assert_close(out, expected, dtype)


@pytest.mark.parametrize("low", ["float16", "bfloat16"])
def test_masked_softmax_low_precision_fully_masked(backend, rng, low):
    xdt = backend.dtype(low)
    scores = rng.normal(size=(4, 5))
    mask = _random_mask(rng, scores.shape)
    mask[1] = False
    mask[0] = True
    s = backend.asarray(scores, low)
    assert s.dtype == xdt
    out = relattn.masked_softmax(s, backend.asarray(mask))
    assert out.dtype == xdt
    got = np.asarray(backend.to_host(out), dtype=np.float64)
    assert np.isfinite(got).all()
    assert (got[1] == 0).all()
    # The reference of the scores as the backend holds them, rounded to ``low``.
    exact = backend.to_host(s).astype(np.float64)
    expected = reference.masked_softmax(exact, mask)
    backend.assert_close(out, expected, low)
    # Tighter, relative per weight: computed in ``low`` (u = 2^-11 or 2^-8), ``s - peak``
    # is rounded (an error of u|s - peak|, which exp turns into a relative one), exp, the
    # sum of n terms and the quotient add u, (n - 1)u and u: |Δw| <= (|s - peak| + n + 2)u·w
    # to first order, one u more for an exp within 2 ulps. A weight below the smallest
    # normal number has an absolute spacing instead: ``tiny`` of ``low``.
    u = {"float16": 2.0**-11, "bfloat16": 2.0**-8}[low]
    tiny = {"float16": 2.0**-14, "bfloat16": 2.0**-126}[low]
    rows = [row[keep] for row, keep in zip(exact, mask, strict=True) if keep.any()]
    spread = max(row.max() - row.min() for row in rows)
    rtol = (spread + scores.shape[-1] + 3) * u
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=tiny)


# ===============================================================================================
# scaled_dot_product_attention
# ===============================================================================================


def test_sdpa_self_attention(backend, dtype, rng):
    q, k, v = (rng.normal(size=(4, 4)) for _ in range(3))
    out = relattn.scaled_dot_product_attention(*(backend.asarray(a, dtype) for a in (q, k, v)))
    backend.assert_close(out, reference.attention(q, k, v), dtype)
    assert _result_dtype(backend, out) == np.dtype(dtype)
    # written out with the 1/sqrt(d) scale of Vaswani eq. (1)
    e = q @ k.T / 2.0
    w = np.exp(e - e.max(-1, keepdims=True))
    backend.assert_close(out, (w / w.sum(-1, keepdims=True)) @ v, dtype)


def test_sdpa_causal_self_attention(backend, dtype, rng):
    q, k, v = (rng.normal(size=(2, 4, 4)) for _ in range(3))
    mask = relattn.causal_mask(4, 4, xp=backend.lib, device=backend.device)
    out = relattn.scaled_dot_product_attention(
        *(backend.asarray(a, dtype) for a in (q, k, v)), mask=mask
    )
    expected = reference.attention(q, k, v, mask=np.tril(np.ones((4, 4), bool)))
    backend.assert_close(out, expected, dtype)
    # the first query sees only the first key: its output is v_0
    backend.assert_close(out[:, 0, :], v[:, 0, :], dtype)


@pytest.mark.parametrize(("lq", "lk"), [(3, 5), (5, 3), (1, 5)])
def test_sdpa_cross_attention(backend, dtype, rng, lq, lk):
    q = rng.normal(size=(lq, 4))
    k = rng.normal(size=(lk, 4))
    v = rng.normal(size=(lk, 3))  # d_v != d
    mask = _random_mask(rng, (lq, lk))
    mask[0] = False
    out = relattn.scaled_dot_product_attention(
        backend.asarray(q, dtype),
        backend.asarray(k, dtype),
        backend.asarray(v, dtype),
        mask=backend.asarray(mask),
    )
    assert tuple(out.shape) == (lq, 3)
    backend.assert_close(out, reference.attention(q, k, v, mask=mask), dtype)
    # fully masked query row: output exactly zero
    assert (backend.to_host(out)[0] == 0).all()


def test_sdpa_bias_and_mask(backend, dtype, rng):
    q = rng.normal(size=(2, 3, 4))
    k = rng.normal(size=(2, 5, 4))
    v = rng.normal(size=(2, 5, 3))
    bias = rng.normal(size=(3, 5))
    mask = _random_mask(rng, (2, 3, 5))
    mask[1, 2] = False
    out = relattn.scaled_dot_product_attention(
        *(backend.asarray(a, dtype) for a in (q, k, v)),
        bias=backend.asarray(bias, dtype),
        mask=backend.asarray(mask),
    )
    backend.assert_close(out, reference.attention(q, k, v, mask=mask, bias=bias), dtype)
    # the bias really enters: without it the result differs
    plain = reference.attention(q, k, v, mask=mask)
    assert np.abs(backend.to_host(out) - plain).max() > 1e-2


@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_sdpa_custom_scale(backend, dtype, rng, scale):
    q, k, v = (rng.normal(size=(4, 4)) for _ in range(3))
    out = relattn.scaled_dot_product_attention(
        *(backend.asarray(a, dtype) for a in (q, k, v)), scale=scale
    )
    backend.assert_close(out, reference.attention(q, k, v, scale=scale), dtype)


def test_sdpa_leading_dims_broadcast_padding(backend, dtype, rng):
    b, h, lq, lk, d = 2, 2, 3, 5, 4
    q = rng.normal(size=(b, h, lq, d))
    k = rng.normal(size=(b, 1, lk, d))  # shared across heads
    v = rng.normal(size=(1, h, lk, d))  # shared across batch
    lengths = np.array([2, 0])  # second sequence is all padding
    pad = relattn.padding_mask(backend.asarray(lengths, "int64"), lk)
    mask = pad[:, None, None, :]
    out = relattn.scaled_dot_product_attention(
        backend.asarray(q, dtype), backend.asarray(k, dtype), backend.asarray(v, dtype), mask=mask
    )
    assert tuple(out.shape) == (b, h, lq, d)
    pad_np = np.arange(lk)[None, :] < lengths[:, None]
    expected = reference.attention(q, k, v, mask=pad_np[:, None, None, :])
    backend.assert_close(out, expected, dtype)
    got = backend.to_host(out)
    assert (got[1] == 0).all()
    # padded keys take no part: dropping them gives the same output for batch 0
    trimmed = reference.attention(q[0], k[0, :, :2], v[0, :, :2])
    backend.assert_close(out[0, ...], trimmed, dtype)


def test_sdpa_fully_masked_rows_no_nan(backend, dtype, rng):
    q, k, v = (rng.normal(size=(4, 4)) for _ in range(3))
    mask = np.zeros((4, 4), bool)
    out = relattn.scaled_dot_product_attention(
        *(backend.asarray(a, dtype) for a in (q, k, v)), mask=backend.asarray(mask)
    )
    np.testing.assert_array_equal(backend.to_host(out), np.zeros((4, 4)))


def test_sdpa_mixed_dtypes_promote(backend, rng):
    q, k, v = (rng.normal(size=(4, 4)) for _ in range(3))
    out = relattn.scaled_dot_product_attention(
        backend.asarray(q, "float32"), backend.asarray(k, "float64"), backend.asarray(v, "float32")
    )
    assert _result_dtype(backend, out) == np.float64
    q32 = q.astype(np.float32).astype(np.float64)
    v32 = v.astype(np.float32).astype(np.float64)
    backend.assert_close(out, reference.attention(q32, k, v32), "float64")


def test_sdpa_mask_matches_mask_to_bias(backend, dtype, rng):
    q, k, v = (rng.normal(size=(2, 4, 4)) for _ in range(3))
    mask = _random_mask(rng, (2, 4, 4))
    mask[..., 0] = True  # no fully masked row: a bias gives uniform weights there
    m = backend.asarray(mask)
    args = [backend.asarray(a, dtype) for a in (q, k, v)]
    with_mask = relattn.scaled_dot_product_attention(*args, mask=m)
    bias = relattn.mask_to_bias(m, dtype=backend.dtype(dtype))
    with_bias = relattn.scaled_dot_product_attention(*args, bias=bias)
    expected = reference.attention(q, k, v, mask=mask)
    backend.assert_close(with_mask, expected, dtype)
    backend.assert_close(with_bias, expected, dtype)


# ===============================================================================================
# relative_scores
# ===============================================================================================

SCORE_SHAPES = [(3, 5), (5, 3), (4, 4), (1, 5)]


@pytest.mark.parametrize("layout", ["full", "causal"])
@pytest.mark.parametrize(("lq", "lk"), SCORE_SHAPES)
def test_relative_scores(backend, dtype, rng, layout, lq, lk):
    d = 4
    width = lk if layout == "causal" else lq + lk - 1
    q = rng.normal(size=(2, lq, d))
    table = rng.normal(size=(width, d))
    out = relattn.relative_scores(backend.asarray(q, dtype), backend.asarray(table, dtype), lk)
    assert tuple(out.shape) == (2, lq, lk)
    expected = _relative_scores_loop(q, table, lk)
    backend.assert_close(out, expected, dtype)
    if layout == "causal":
        delta = np.array([[reference.delta(i, j, lq, lk) for j in range(lk)] for i in range(lq)])
        assert (backend.to_host(out)[:, delta > 0] == 0).all()


@pytest.mark.parametrize("layout", ["full", "causal"])
def test_relative_scores_bias_and_per_head_table(backend, dtype, rng, layout):
    b, h, lq, lk, d = 2, 2, 3, 5, 4
    width = lk if layout == "causal" else lq + lk - 1
    q = rng.normal(size=(b, h, lq, d))
    table = rng.normal(size=(h, width, d))
    bias = rng.normal(size=(h, 1, d))
    out = relattn.relative_scores(
        backend.asarray(q, dtype),
        backend.asarray(table, dtype),
        lk,
        bias=backend.asarray(bias, dtype),
    )
    assert tuple(out.shape) == (b, h, lq, lk)
    backend.assert_close(out, _relative_scores_loop(q, table, lk, bias), dtype)


def test_relative_scores_distance_table(backend, dtype):
    # a 1-d table holding δ itself recovers δ(i, j) for every pair (q = 1)
    lq, lk = 3, 5
    dist = np.arange(-(lk - 1), lq, dtype=np.float64)[:, None]
    out = relattn.relative_scores(
        backend.asarray(np.ones((lq, 1)), dtype), backend.asarray(dist, dtype), lk
    )
    expected = [[reference.delta(i, j, lq, lk) for j in range(lk)] for i in range(lq)]
    backend.assert_close(out, expected, dtype)


# ===============================================================================================
# relative_attention
# ===============================================================================================


def _delta_matrix(lq, lk):
    return np.array([[reference.delta(i, j, lq, lk) for j in range(lk)] for i in range(lq)])


def _txl_inputs(rng, b, h, lq, mem, d, d_model=6):
    """Transformer-XL: memory first, projected sinusoid of i - j = -δ over the causal layout."""
    lk = lq + mem
    q = rng.normal(size=(b, h, lq, d))
    k = rng.normal(size=(b, h, lk, d))
    v = rng.normal(size=(b, h, lk, d))
    # row m encodes δ = m - (Lk - 1), i.e. i - j = Lk - 1 - m
    r_raw = reference.sinusoid(np.arange(lk - 1, -1, -1), d_model, layout="concatenated")
    w_kr = rng.normal(size=(h, d, d_model)) / math.sqrt(d_model)
    table = np.einsum("wm,hdm->hwd", r_raw, w_kr)  # (H, W, d): per-head projection
    u = rng.normal(size=(h, 1, d))
    vb = rng.normal(size=(h, 1, d))
    return q, k, v, table, u, vb


def test_relative_attention_transformer_xl_memory(backend, dtype, rng):
    b, h, lq, mem, d = 2, 2, 3, 2, 4
    q, k, v, table, u, vb = _txl_inputs(rng, b, h, lq, mem, d)
    out = relattn.relative_attention(
        *(backend.asarray(a, dtype) for a in (q, k, v, table)),
        content_bias=backend.asarray(u, dtype),
        position_bias=backend.asarray(vb, dtype),
    )
    assert tuple(out.shape) == (b, h, lq, d)
    backend.assert_close(out, reference.relative_attention(q, k, v, table, u, vb), dtype)


def test_relative_attention_single_table(backend, dtype, rng):
    b, h, lq, lk, d = 2, 2, 3, 5, 4
    q = rng.normal(size=(b, h, lq, d))
    k = rng.normal(size=(b, h, lk, d))
    v = rng.normal(size=(b, h, lk, 3))
    table = rng.normal(size=(lk, d))  # one (W, d) table shared by every head
    u = rng.normal(size=(h, 1, d))
    vb = rng.normal(size=(d,))
    out = relattn.relative_attention(
        *(backend.asarray(a, dtype) for a in (q, k, v, table)),
        content_bias=backend.asarray(u, dtype),
        position_bias=backend.asarray(vb, dtype),
    )
    backend.assert_close(out, reference.relative_attention(q, k, v, table, u, vb), dtype)


def test_relative_attention_only_one_bias(backend, dtype, rng):
    lq, lk, d = 3, 5, 4
    q = rng.normal(size=(lq, d))
    k = rng.normal(size=(lk, d))
    v = rng.normal(size=(lk, d))
    table = rng.normal(size=(lk, d))
    u = rng.normal(size=(d,))
    args = [backend.asarray(a, dtype) for a in (q, k, v, table)]
    out_u = relattn.relative_attention(*args, content_bias=backend.asarray(u, dtype))
    backend.assert_close(out_u, reference.relative_attention(q, k, v, table, u=u), dtype)
    out_v = relattn.relative_attention(*args, position_bias=backend.asarray(u, dtype))
    backend.assert_close(out_v, reference.relative_attention(q, k, v, table, vb=u), dtype)
    plain = relattn.relative_attention(*args)
    backend.assert_close(plain, reference.relative_attention(q, k, v, table), dtype)


@pytest.mark.parametrize(("lq", "mem"), [(4, 0), (3, 2), (1, 4)])
def test_relative_attention_causal_future_keys_get_zero_weight(backend, dtype, rng, lq, mem):
    # with v = identity the output rows are the attention weights themselves
    lk, d = lq + mem, 4
    q = rng.normal(size=(lq, d))
    k = rng.normal(size=(lk, d))
    table = rng.normal(size=(lk, d))
    eye = np.eye(lk)
    out = relattn.relative_attention(*(backend.asarray(a, dtype) for a in (q, k, eye, table)))
    w = backend.to_host(out)
    delta = _delta_matrix(lq, lk)
    assert (w[delta > 0] == 0).all()
    assert (w[delta <= 0] > 0).all()  # every memory and past key takes part
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=1e-5)
    backend.assert_close(out, reference.relative_attention(q, k, eye, table), dtype)


def _four_terms_weights(q, k, table, u, vb, scale, mask):
    """Dai et al. sec. 3.3: A_ij = (a) q·k + (b) q·r + (c) u·k + (d) v·r, each by a loop."""
    lq, d = q.shape
    lk, width = k.shape[0], table.shape[0]
    scores = np.zeros((lq, lk))
    allowed = mask.copy()
    for i in range(lq):
        for j in range(lk):
            m = reference.delta(i, j, lq, lk) + lk - 1
            if m >= width:
                allowed[i, j] = False
                continue
            a = sum(q[i, c] * k[j, c] for c in range(d))
            b = sum(q[i, c] * table[m, c] for c in range(d))
            cc = sum(u[c] * k[j, c] for c in range(d))
            dd = sum(vb[c] * table[m, c] for c in range(d))
            scores[i, j] = (a + b + cc + dd) * scale
    return _weights_loop(scores, allowed)


@pytest.mark.parametrize("layout", ["causal", "full"])
@pytest.mark.parametrize(("lq", "lk"), [(3, 5), (4, 4)])
def test_relative_attention_four_term_decomposition(backend, dtype, rng, layout, lq, lk):
    d = 4
    width = lk if layout == "causal" else lq + lk - 1
    q = rng.normal(size=(lq, d))
    k = rng.normal(size=(lk, d))
    table = rng.normal(size=(width, d))
    u = rng.normal(size=(d,))
    vb = rng.normal(size=(d,))
    mask = np.ones((lq, lk), bool)
    mask[0, 1] = False
    expected = _four_terms_weights(q, k, table, u, vb, 1 / math.sqrt(d), mask)
    out = relattn.relative_attention(
        *(backend.asarray(a, dtype) for a in (q, k, np.eye(lk), table)),
        content_bias=backend.asarray(u, dtype),
        position_bias=backend.asarray(vb, dtype),
        mask=backend.asarray(mask),
    )
    backend.assert_close(out, expected, dtype)
    # the score differences recovered from the weights are those of the four terms
    w = backend.to_host(out).astype(np.float64)
    ok = expected > 0
    i, j = np.nonzero(ok)
    ref_log = np.log(expected[ok])
    got_log = np.log(w[ok])
    for row in range(lq):
        sel = i == row
        np.testing.assert_allclose(
            got_log[sel] - got_log[sel][0],
            ref_log[sel] - ref_log[sel][0],
            atol=1e-3 if dtype == "float32" else 1e-9,
        )
    assert len(set(j)) > 1


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize(("lq", "lk"), [(3, 5), (4, 4), (5, 3)])
def test_relative_attention_full_layout(backend, dtype, rng, lq, lk, with_mask):
    # XLNet / Conformer: every distance has a row, no implied causal mask
    b, h, d = 2, 2, 4
    q = rng.normal(size=(b, h, lq, d))
    k = rng.normal(size=(b, h, lk, d))
    v = rng.normal(size=(b, h, lk, 3))
    table = rng.normal(size=(h, lq + lk - 1, d))
    u = rng.normal(size=(h, 1, d))
    vb = rng.normal(size=(h, 1, d))
    mask = None
    if with_mask:
        mask = _random_mask(rng, (b, 1, lq, lk))
        mask[0, 0, 0] = False  # a fully masked row
        mask[1, 0, -1] = True
    out = relattn.relative_attention(
        *(backend.asarray(a, dtype) for a in (q, k, v, table)),
        content_bias=backend.asarray(u, dtype),
        position_bias=backend.asarray(vb, dtype),
        mask=None if mask is None else backend.asarray(mask),
    )
    assert tuple(out.shape) == (b, h, lq, 3)
    expected = reference.relative_attention(q, k, v, table, u, vb, mask)
    backend.assert_close(out, expected, dtype)
    if with_mask:
        assert (backend.to_host(out)[0, :, 0] == 0).all()


def test_relative_attention_full_layout_future_keys_take_part(backend, dtype, rng):
    lq, lk, d = 4, 4, 4
    q = rng.normal(size=(lq, d))
    k = rng.normal(size=(lk, d))
    table = rng.normal(size=(lq + lk - 1, d))
    w = backend.to_host(
        relattn.relative_attention(*(backend.asarray(a, dtype) for a in (q, k, np.eye(lk), table)))
    )
    assert (w > 0).all()  # no causal mask in the full layout


def test_relative_attention_causal_with_extra_mask(backend, dtype, rng):
    # padding mask (B, 1, 1, Lk) combined with the causal layout's implied mask
    b, h, lq, mem, d = 2, 2, 3, 2, 4
    q, k, v, table, u, vb = _txl_inputs(rng, b, h, lq, mem, d)
    lk = lq + mem
    lengths = np.array([4, 1])
    pad = np.arange(lk)[None, :] < lengths[:, None]
    mask = pad[:, None, None, :]
    out = relattn.relative_attention(
        *(backend.asarray(a, dtype) for a in (q, k, v, table)),
        content_bias=backend.asarray(u, dtype),
        position_bias=backend.asarray(vb, dtype),
        mask=backend.asarray(mask),
    )
    backend.assert_close(out, reference.relative_attention(q, k, v, table, u, vb, mask), dtype)
    # batch 1 keeps only key 0 (a memory slot, visible to all): output is v[1, :, 0]
    backend.assert_close(out[1, ...], np.broadcast_to(v[1, :, :1, :], (h, lq, d)), dtype)


def test_relative_attention_causal_equals_full_with_causal_mask(backend, dtype, rng):
    # the causal layout is the full layout restricted to δ <= 0 plus the causal mask
    lq, lk, d = 3, 5, 4
    q = rng.normal(size=(lq, d))
    k = rng.normal(size=(lk, d))
    v = rng.normal(size=(lk, d))
    causal_table = rng.normal(size=(lk, d))
    full_table = np.concatenate([causal_table, rng.normal(size=(lq - 1, d)) * 10])
    args = [backend.asarray(a, dtype) for a in (q, k, v)]
    causal = relattn.relative_attention(*args, backend.asarray(causal_table, dtype))
    full = relattn.relative_attention(
        *args,
        backend.asarray(full_table, dtype),
        mask=relattn.causal_mask(lq, lk, xp=backend.lib, device=backend.device),
    )
    expected = reference.relative_attention(q, k, v, causal_table)
    backend.assert_close(causal, expected, dtype)
    backend.assert_close(full, expected, dtype)


def test_relative_attention_tener(backend, dtype, rng):
    # TENER: unprojected sinusoid of the signed distance, scale = 1
    lq = lk = 4
    d = 4
    q = rng.normal(size=(2, lq, d)) * 0.5
    k = rng.normal(size=(2, lk, d)) * 0.5
    v = rng.normal(size=(2, lk, d))
    dist = np.arange(-(lk - 1), lq)  # relative layout, ascending δ
    table = reference.sinusoid(dist, d, layout="concatenated")
    u = rng.normal(size=(d,)) * 0.5
    vb = rng.normal(size=(d,)) * 0.5
    out = relattn.relative_attention(
        *(backend.asarray(a, dtype) for a in (q, k, v, table)),
        content_bias=backend.asarray(u, dtype),
        position_bias=backend.asarray(vb, dtype),
        scale=1.0,
    )
    backend.assert_close(out, reference.relative_attention(q, k, v, table, u, vb, scale=1.0), dtype)
    default = reference.relative_attention(q, k, v, table, u, vb)
    assert np.abs(backend.to_host(out) - default).max() > 1e-3  # scale=1 really differs


def test_relative_attention_single_query(backend, dtype, rng):
    # Lq = 1: both layouts have width Lk (δ = -(Lk-1) … 0) and no key is in the future
    lk, d = 5, 4
    q = rng.normal(size=(2, 1, d))
    k = rng.normal(size=(2, lk, d))
    v = rng.normal(size=(2, lk, d))
    table = rng.normal(size=(lk, d))
    out = relattn.relative_attention(*(backend.asarray(a, dtype) for a in (q, k, v, table)))
    assert tuple(out.shape) == (2, 1, d)
    backend.assert_close(out, reference.relative_attention(q, k, v, table), dtype)


def test_relative_attention_mixed_dtypes_promote(backend, rng):
    lq, lk, d = 3, 5, 4
    q = rng.normal(size=(lq, d))
    k = rng.normal(size=(lk, d))
    v = rng.normal(size=(lk, d))
    table = rng.normal(size=(lq + lk - 1, d))
    u = rng.normal(size=(d,))
    out = relattn.relative_attention(
        backend.asarray(q, "float32"),
        backend.asarray(k, "float64"),
        backend.asarray(v, "float64"),
        backend.asarray(table, "float32"),
        content_bias=backend.asarray(u, "float32"),
    )
    assert _result_dtype(backend, out) == np.float64
    f32 = [a.astype(np.float32).astype(np.float64) for a in (q, table, u)]
    expected = reference.relative_attention(f32[0], k, v, f32[1], u=f32[2])
    backend.assert_close(out, expected, "float64")


def test_relative_attention_all_float32_stays_float32(backend, rng):
    q = rng.normal(size=(3, 4))
    out = relattn.relative_attention(
        *(backend.asarray(a, "float32") for a in (q, q, q, rng.normal(size=(3, 4))))
    )
    assert _result_dtype(backend, out) == np.float32


# ===============================================================================================
# mask_to_bias
# ===============================================================================================


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64"])
def test_mask_to_bias(backend, rng, name):
    target = backend.dtype(name)
    mask = _random_mask(rng, (2, 3, 4))
    mask[0, 0, 0] = True
    mask[1, 2, 3] = False
    bias = relattn.mask_to_bias(backend.asarray(mask), dtype=target)
    assert backend.is_array(bias)
    assert bias.dtype == target
    assert tuple(bias.shape) == mask.shape
    got = np.asarray(backend.to_host(bias), dtype=np.float64)
    assert np.isfinite(got).all()  # never -inf
    assert (got[mask] == 0).all()
    blocked = got[~mask]
    assert (blocked == blocked[0]).all()
    assert blocked[0] < -1e4  # large negative, even for float16 (min -65504)
    # two biases added stay finite in the same dtype (no overflow to -inf)
    twice = np.asarray(backend.to_host(bias + bias), dtype=np.float64)
    assert np.isfinite(twice).all()
    assert (twice[~mask] < -1e4).all()


def test_mask_to_bias_softmax_weights(backend, dtype, rng):
    # adding the bias to the scores gives the masked softmax (rows with an allowed key)
    scores = rng.normal(size=(3, 5))
    mask = _random_mask(rng, scores.shape)
    mask[:, 2] = True
    m = backend.asarray(mask)
    s = backend.asarray(scores, dtype)
    biased = s + relattn.mask_to_bias(m, dtype=backend.dtype(dtype))
    backend.assert_close(
        relattn.masked_softmax(biased), reference.masked_softmax(scores, mask), dtype
    )
