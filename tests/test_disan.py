"""DiSAN: multi_dimensional_attention (token2token, masks, fusion gate) and source2token_attention.

Every result is compared, on every backend and in float32 and float64, with a
NumPy float64 reference written below from Shen et al. 2018 with explicit loops
over query ``i``, key ``j`` and feature ``k``; the positional masks of the
reference are built here from ``i`` and ``j`` (not with ``relattn.masks``).
On JAX and Dask these run in float64 only (``FLOAT64_TARGETS`` in ``conftest.py``).
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from array_api_extra.testing import lazy_xp_function
from hypothesis import given
from hypothesis import strategies as st

import relattn
from relattn import disan
from relattn.disan import multi_dimensional_attention, source2token_attention
from relattn.testing import skip_unless_capable

# Lazy on Dask, traced under jax.jit on JAX, for every backend test.
lazy_xp_modules = [relattn]
for _function in (multi_dimensional_attention, source2token_attention, relattn.padding_mask):
    lazy_xp_function(_function)

WORDS = ("I", "come", "from", "China", "!")
L, D = 5, 4

# ===============================================================================================
# Naive references (float64, loops over every (i, j, k))
# ===============================================================================================


def _allowed(direction, length):
    """DiSAN's positional masks, [query i, key j], from the index comparison itself."""
    keep = {
        None: lambda i, j: True,
        "forward": lambda i, j: j < i,
        "backward": lambda i, j: j > i,
        "diag": lambda i, j: j != i,
    }[direction]
    return np.array([[keep(i, j) for j in range(length)] for i in range(length)])


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def _elu(x):
    return x if x > 0 else math.exp(x) - 1.0


def _linear(row, w, b=None):
    """row @ w + b, summed term by term."""
    n_in, n_out = w.shape
    return [
        sum(row[m] * w[m, k] for m in range(n_in)) + (0.0 if b is None else b[k])
        for k in range(n_out)
    ]


def t2t_loop(h, w1, w2, b1, allowed, c=5.0, fusion=None):
    """DiSA block: f_ij^k = c·tanh((W¹h_i + W²h_j + b¹)_k / c) on allowed j, softmax over j per k,
    s_i = Σ_j P_ij ⊙ h_j; with fusion, u = F ⊙ h + (1 - F) ⊙ s, F = sigmoid(s W_s + h W_h + b_f)."""
    h = np.asarray(h, dtype=np.float64)
    w1, w2, b1 = (np.asarray(a, dtype=np.float64) for a in (w1, w2, b1))
    lead, (length, d) = h.shape[:-2], h.shape[-2:]
    allowed = np.broadcast_to(allowed, (*lead, length, length))
    out = np.zeros_like(h)
    for b in np.ndindex(lead):
        hb = h[b]
        s = np.zeros((length, d))
        for i in range(length):
            head = _linear(hb[i], w1, b1)
            for k in range(d):
                logits = {}
                for j in range(length):
                    if allowed[b][i, j]:
                        logits[j] = c * math.tanh((head[k] + _linear(hb[j], w2)[k]) / c)
                if not logits:
                    continue  # no allowed key: s_i = 0
                top = max(logits.values())
                total = sum(math.exp(v - top) for v in logits.values())
                s[i, k] = sum(math.exp(v - top) / total * hb[j, k] for j, v in logits.items())
        if fusion is None:
            out[b] = s
            continue
        w_s, w_h, b_f = (np.asarray(a, dtype=np.float64) for a in fusion)
        for i in range(length):
            pre_s, pre_h = _linear(s[i], w_s, b_f), _linear(hb[i], w_h)
            for k in range(d):
                gate = _sigmoid(pre_s[k] + pre_h[k])
                out[b][i, k] = gate * hb[i, k] + (1.0 - gate) * s[i, k]
    return out


def gate_loop(h, s, fusion):
    """F = sigmoid(s W_s + h W_h + b_f), row by row."""
    h, s = np.asarray(h, dtype=np.float64), np.asarray(s, dtype=np.float64)
    w_s, w_h, b_f = (np.asarray(a, dtype=np.float64) for a in fusion)
    out = np.zeros_like(h)
    for idx in np.ndindex(h.shape[:-1]):
        pre_s, pre_h = _linear(s[idx], w_s, b_f), _linear(h[idx], w_h)
        out[idx] = [_sigmoid(a + b) for a, b in zip(pre_s, pre_h, strict=True)]
    return out


def s2t_loop(h, w1, b1, w, b, token_mask=None):
    """f(h_i) = W^T elu(W¹ h_i + b¹) + b, softmax over allowed tokens i per feature k,
    s = Σ_i P_i ⊙ h_i (0 if no token is allowed)."""
    h = np.asarray(h, dtype=np.float64)
    lead, (length, d) = h.shape[:-2], h.shape[-2:]
    token_mask = np.ones(h.shape[:-1], bool) if token_mask is None else token_mask
    token_mask = np.broadcast_to(token_mask, h.shape[:-1])
    out = np.zeros((*lead, d))
    for bi in np.ndindex(lead):
        logits = [
            _linear([_elu(v) for v in _linear(h[bi][i], w1, b1)], w, b) for i in range(length)
        ]
        for k in range(d):
            kept = [i for i in range(length) if token_mask[bi][i]]
            if not kept:
                continue
            top = max(logits[i][k] for i in kept)
            total = sum(math.exp(logits[i][k] - top) for i in kept)
            out[bi][k] = sum(math.exp(logits[i][k] - top) / total * h[bi][i, k] for i in kept)
    return out


# ===============================================================================================
# Inputs
# ===============================================================================================


def _params(rng, d=D):
    w1, w2 = rng.normal(scale=0.8, size=(2, d, d))
    b1 = rng.normal(scale=0.3, size=d)
    fusion = (
        rng.normal(scale=0.6, size=(d, d)),
        rng.normal(scale=0.6, size=(d, d)),
        rng.normal(size=d),
    )
    return w1, w2, b1, fusion


def _on(backend, dtype, *arrays):
    return [backend.asarray(a, dtype) for a in arrays]


def _t2t(backend, dtype, h, w1, w2, b1, fusion=None, **kw):
    args = _on(backend, dtype, h, w1, w2, b1)
    if fusion is not None:
        kw["fusion"] = tuple(_on(backend, dtype, *fusion))
    return multi_dimensional_attention(*args, **kw)


def _padding(backend, lengths, length=L):
    lengths = backend.asarray(np.asarray(lengths, dtype=np.int64))
    return relattn.padding_mask(lengths, length)


# ===============================================================================================
# token2token
# ===============================================================================================


@pytest.mark.grid
@pytest.mark.parametrize("fused", [False, True], ids=["s", "fused"])
@pytest.mark.parametrize("direction", [None, "forward", "backward", "diag"])
def test_token2token_matches_loop(backend, dtype, rng, direction, fused):
    h = rng.normal(size=(2, L, D))
    w1, w2, b1, fusion = _params(rng)
    fusion = fusion if fused else None
    out = _t2t(backend, dtype, h, w1, w2, b1, fusion, direction=direction)
    assert tuple(out.shape) == (2, L, D)
    assert backend.to_host(out).dtype == np.dtype(dtype)
    backend.assert_close(out, t2t_loop(h, w1, w2, b1, _allowed(direction, L), fusion=fusion), dtype)


def test_token2token_scale_c(backend, dtype, rng):
    # c enters twice (c·tanh(x/c)): a small c saturates the logits, a large one leaves them linear
    h = rng.normal(size=(2, L, D)) * 3
    w1, w2, b1, _ = _params(rng)
    for c in (0.5, 50.0):
        out = _t2t(backend, dtype, h, w1, w2, b1, c=c, direction="diag")
        backend.assert_close(out, t2t_loop(h, w1, w2, b1, _allowed("diag", L), c=c), dtype)
    assert not np.allclose(
        t2t_loop(h, w1, w2, b1, _allowed("diag", L), c=0.5),
        t2t_loop(h, w1, w2, b1, _allowed("diag", L), c=50.0),
    )


@pytest.mark.parametrize("direction", [None, "forward", "backward"])
def test_token2token_padding_mask(backend, dtype, rng, direction):
    h = rng.normal(size=(2, L, D))
    w1, w2, b1, fusion = _params(rng)
    lengths = [L, 3]
    keys = _padding(backend, lengths)[:, None, :]  # (B, 1, L)
    out = _t2t(backend, dtype, h, w1, w2, b1, fusion, direction=direction, mask=keys)
    allowed = _allowed(direction, L) & (np.arange(L) < np.array(lengths)[:, None])[:, None, :]
    backend.assert_close(out, t2t_loop(h, w1, w2, b1, allowed, fusion=fusion), dtype)
    if direction == "backward":
        # "from", the last real word of "I come from", sees only padding: s = 0, u = F ⊙ h
        s = _t2t(backend, dtype, h, w1, w2, b1, direction=direction, mask=keys)
        assert (backend.to_host(s)[1, 2] == 0).all()
        backend.assert_close(out[1, 2, :], gate_loop(h[1, 2], np.zeros(D), fusion) * h[1, 2], dtype)


@pytest.mark.parametrize("chunk_size", [1, 2, L, L + 3])
def test_chunked_equals_unchunked(backend, dtype, rng, chunk_size):
    # a mask with its own query axis (B, L, L) is cut into query chunks with the logits
    h = rng.normal(size=(2, L, D))
    w1, w2, b1, fusion = _params(rng)
    mask = rng.random((2, L, L)) < 0.7
    mask[0, 3] = False  # fully masked rows, on top of the first token under "forward"
    mask[1, 2] = False
    kw = {"direction": "forward", "mask": backend.asarray(mask)}
    whole = _t2t(backend, dtype, h, w1, w2, b1, fusion, **kw)
    chunked = _t2t(backend, dtype, h, w1, w2, b1, fusion, chunk_size=chunk_size, **kw)
    backend.assert_close(chunked, backend.to_host(whole), dtype)
    allowed = mask & _allowed("forward", L)
    backend.assert_close(chunked, t2t_loop(h, w1, w2, b1, allowed, fusion=fusion), dtype)
    s = backend.to_host(_t2t(backend, dtype, h, w1, w2, b1, chunk_size=chunk_size, **kw))
    assert np.isfinite(s).all()
    assert (s[:, 0] == 0).all() and (s[0, 3] == 0).all() and (s[1, 2] == 0).all()


def test_default_chunk_follows_budget(backend, rng, monkeypatch):
    h = rng.normal(size=(2, L, D))
    w1, w2, b1, _ = _params(rng)
    seen = []
    softmax = disan.softmax

    def spy(scores, mask, axis, xp):
        seen.append(tuple(scores.shape))
        return softmax(scores, mask, axis, xp)

    monkeypatch.setattr(disan, "softmax", spy)
    expected = t2t_loop(h, w1, w2, b1, _allowed("backward", L))
    args = _on(backend, "float64", h, w1, w2, b1)
    # disan.multi_dimensional_attention, not the name lazy_xp_function patches: under jax.jit
    # the second call, with another budget but the same arguments, would not be traced again.
    t2t = disan.multi_dimensional_attention
    # the default budget holds the whole (2, 5, 5, 4) problem in one chunk
    out = t2t(*args, direction="backward")
    assert seen == [(2, L, L, D)]
    backend.assert_close(out, expected, "float64")
    # a budget of two query rows, 2·2·L·D logits: chunks of 2, 2 and 1 queries
    seen.clear()
    monkeypatch.setattr(disan, "LOGIT_BUDGET", 2 * 2 * L * D + 1)
    out = t2t(*args, direction="backward")
    assert seen == [(2, 2, L, D), (2, 2, L, D), (2, 1, L, D)]
    backend.assert_close(out, expected, "float64")


@pytest.mark.parametrize("direction", ["forward", "backward", "diag"])
def test_sentence_masks_one_hot_probe(backend, dtype, rng, direction):
    # h = one-hot tokens (d = L): s_i^k = Σ_j P_ij^k h_j^k = P_ik^k, the weight of query i on
    # key k in feature k. Its support is the mask: which words each word attends to.
    h = np.eye(L)
    w1, w2, b1, _ = _params(rng, d=L)
    out = _t2t(backend, dtype, h, w1, w2, b1, direction=direction)
    backend.assert_close(out, t2t_loop(h, w1, w2, b1, _allowed(direction, L)), dtype)
    weights = backend.to_host(out)
    sees = {word: {WORDS[k] for k in range(L) if weights[i, k] > 0} for i, word in enumerate(WORDS)}
    expected = {
        "forward": {
            "I": set(),
            "come": {"I"},
            "from": {"I", "come"},
            "China": {"I", "come", "from"},
        },
        "backward": {"I": {"come", "from", "China", "!"}, "China": {"!"}, "!": set()},
        "diag": {"China": {"I", "come", "from", "!"}, "I": {"come", "from", "China", "!"}},
    }[direction]
    for word, keys in expected.items():
        assert sees[word] == keys, (word, sees[word])
    assert ((weights > 0) == _allowed(direction, L)).all()


@pytest.mark.parametrize("low", ["float32", "float64", "float16", "bfloat16"])
def test_no_key_gives_zero_not_nan(backend, rng, low):
    h = rng.normal(size=(2, L, D))
    w1, w2, b1, fusion = _params(rng)
    h, w1, w2, b1, *fusion = _on(backend, low, h, w1, w2, b1, *fusion)
    # the reference sees the inputs as rounded to the test dtype
    h_, w1_, w2_, b1_, *fusion_ = (
        backend.to_host(a).astype(np.float64) for a in (h, w1, w2, b1, *fusion)
    )
    for direction, first in (("forward", 0), ("backward", L - 1)):
        s = backend.to_host(multi_dimensional_attention(h, w1, w2, b1, direction=direction))
        u = multi_dimensional_attention(h, w1, w2, b1, direction=direction, fusion=tuple(fusion))
        got = np.asarray(backend.to_host(u), dtype=np.float64)
        assert np.isfinite(s.astype(np.float64)).all() and np.isfinite(got).all()
        assert (s[:, first] == 0).all()  # exactly, not merely close
        expected = gate_loop(h_[:, first], np.zeros((2, D)), fusion_) * h_[:, first]
        backend.assert_close(u[:, first, :], expected, low)
        backend.assert_close(
            u, t2t_loop(h_, w1_, w2_, b1_, _allowed(direction, L), fusion=fusion_), low
        )


def test_no_overflow_on_large_inputs(backend, rng):
    # sigmoid and ELU exponentiate non-positive numbers only; logits are bounded by c
    skip_unless_capable(backend, "multi_dimensional_attention", "float16")
    h = rng.normal(size=(2, L, D)) * 40
    w1, w2, b1, fusion = _params(rng)
    args = _on(backend, "float16", h, w1, w2, b1)
    gate = tuple(_on(backend, "float16", *fusion))
    with warnings.catch_warnings(), np.errstate(over="raise", invalid="raise", divide="raise"):
        warnings.simplefilter("error")
        u = backend.to_host(multi_dimensional_attention(*args, direction="forward", fusion=gate))
        s = backend.to_host(source2token_attention(args[0], args[1], args[3], args[2], args[3]))
    assert np.isfinite(u).all() and np.isfinite(s).all()


def test_forward_is_backward_reversed(backend, dtype, rng):
    # reversing the tokens swaps the two directions
    h = rng.normal(size=(2, L, D))
    w1, w2, b1, fusion = _params(rng)
    fw = _t2t(backend, dtype, h[:, ::-1], w1, w2, b1, fusion, direction="forward")
    bw = _t2t(backend, dtype, h, w1, w2, b1, fusion, direction="backward")
    backend.assert_close(fw, backend.to_host(bw)[:, ::-1], dtype)


@given(
    length=st.integers(1, 6),
    d=st.integers(1, 4),
    chunk=st.integers(1, 7),
    direction=st.sampled_from([None, "forward", "backward", "diag"]),
    seed=st.integers(0, 2**16),
)
def test_property_any_chunk_matches_loop(length, d, chunk, direction, seed):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(length, d))
    w1, w2, b1, fusion = _params(rng, d=d)
    out = multi_dimensional_attention(
        h, w1, w2, b1, direction=direction, fusion=fusion, chunk_size=chunk
    )
    expected = t2t_loop(h, w1, w2, b1, _allowed(direction, length), fusion=fusion)
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)


# ===============================================================================================
# source2token
# ===============================================================================================


def _s2t_params(rng, d=D):
    w1, w = rng.normal(scale=0.8, size=(2, d, d))
    b1, b = rng.normal(scale=0.5, size=(2, d))
    return w1, b1, w, b


def test_source2token_matches_loop(backend, dtype, rng):
    h = rng.normal(size=(3, L, D))
    params = _s2t_params(rng)
    tokens = np.array([[True] * L, [True, False, True, True, False], [False] * L])
    out = source2token_attention(*_on(backend, dtype, h, *params), mask=backend.asarray(tokens))
    assert tuple(out.shape) == (3, D)
    backend.assert_close(out, s2t_loop(h, *params, tokens), dtype)
    got = backend.to_host(out)
    assert (got[2] == 0).all() and np.isfinite(got).all()  # no token: s = 0, not NaN
    # no mask: every token
    out = source2token_attention(*_on(backend, dtype, h, *params))
    backend.assert_close(out, s2t_loop(h, *params), dtype)


def test_source2token_padding_and_broadcast_mask(backend, dtype, rng):
    h = rng.normal(size=(2, L, D))
    params = _s2t_params(rng)
    out = source2token_attention(*_on(backend, dtype, h, *params), mask=_padding(backend, [2, 4]))
    tokens = np.arange(L) < np.array([2, 4])[:, None]
    backend.assert_close(out, s2t_loop(h, *params, tokens), dtype)
    one = np.array([True, False, True, True, True])  # (L,): the same tokens in every sequence
    out = source2token_attention(*_on(backend, dtype, h, *params), mask=backend.asarray(one))
    backend.assert_close(out, s2t_loop(h, *params, one), dtype)


@pytest.mark.parametrize("low", ["float16", "bfloat16"])
def test_source2token_low_precision_all_masked(backend, rng, low):
    backend.dtype(low)
    h = rng.normal(size=(2, L, D))
    arrays = _on(backend, low, h, *_s2t_params(rng))
    tokens = np.array([[True, True, False, True, False], [False] * L])
    out = source2token_attention(*arrays, mask=backend.asarray(tokens))
    got = np.asarray(backend.to_host(out), dtype=np.float64)
    assert np.isfinite(got).all() and (got[1] == 0).all()
    rounded = [backend.to_host(a).astype(np.float64) for a in arrays]
    backend.assert_close(out, s2t_loop(*rounded, tokens), low)


# ===============================================================================================
# Transforms: jit, gradients
# ===============================================================================================


def test_jit_equals_eager(jit_backend, rng):
    h = rng.normal(size=(2, L, D))
    w1, w2, b1, fusion = _params(rng)
    params = _s2t_params(rng)
    tokens = _padding(jit_backend, [L, 2])
    arrays = _on(jit_backend, "float64", h, w1, w2, b1, *fusion, *params)

    def both(h, w1, w2, b1, ws, wh, bf, v1, c1, v, c, tokens):
        u = multi_dimensional_attention(
            h, w1, w2, b1, direction="forward", mask=tokens[:, None, :],
            fusion=(ws, wh, bf), chunk_size=2,
        )  # fmt: skip
        return u, source2token_attention(u, v1, c1, v, c, mask=tokens)

    eager = both(*arrays, tokens)
    compiled = jit_backend.jit(both)(*arrays, tokens)
    for a, b in zip(eager, compiled, strict=True):
        jit_backend.assert_close(b, jit_backend.to_host(a), "float64")


def test_torch_gradcheck(torch_backend):
    torch = torch_backend.lib
    rng = np.random.default_rng(7)
    h = rng.normal(size=(2, 4, 3))
    w1, w2, b1, fusion = _params(rng, d=3)
    params = _s2t_params(rng, d=3)
    tokens = torch_backend.asarray(np.arange(4) < np.array([4, 2])[:, None])

    def t(a):
        return torch_backend.asarray(a, "float64").requires_grad_(True)

    t2t_inputs = tuple(t(a) for a in (h, w1, w2, b1, *fusion))

    def t2t(h, w1, w2, b1, ws, wh, bf):
        # first token (forward) and padded rows: no allowed key, gradient through s = 0
        return multi_dimensional_attention(
            h, w1, w2, b1, direction="forward", mask=tokens[:, None, :],
            fusion=(ws, wh, bf), chunk_size=3,
        )  # fmt: skip

    assert torch.autograd.gradcheck(t2t, t2t_inputs)
    s2t_inputs = tuple(t(a) for a in (h, *params))
    empty = torch_backend.asarray(np.array([[True, False, True, True], [False] * 4]))
    assert torch.autograd.gradcheck(lambda *a: source2token_attention(*a, mask=empty), s2t_inputs)
    # ELU and the gate at exactly 0: one-sided formulas agree, no 0·inf
    zero = tuple(
        t(a) for a in (np.zeros((1, 3, 3)), *(np.zeros_like(a) for a in (w1, w2, b1, *fusion)))
    )
    assert torch.autograd.gradcheck(
        lambda *a: multi_dimensional_attention(*a[:4], fusion=a[4:]), zero
    )


def test_jax_grad_finite(jax_backend):
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(3)
    h = rng.normal(size=(2, L, D))
    w1, w2, b1, fusion = _params(rng)
    weights = _on(jax_backend, "float64", w1, w2, b1)
    fusion = tuple(_on(jax_backend, "float64", *fusion))
    params = _on(jax_backend, "float64", *_s2t_params(rng))
    tokens = jax_backend.asarray(np.arange(L) < np.array([L, 3])[:, None])

    def loss(h):
        u = multi_dimensional_attention(
            h, *weights, direction="backward", mask=tokens[:, None, :], fusion=fusion
        )
        s = source2token_attention(u, *params, mask=tokens)
        return jnp.sum(s**2)

    loss = jax.jit(loss)  # one compilation instead of an eager dispatch per operation
    grad = jax_backend.to_host(jax.jit(jax.grad(loss))(jax_backend.asarray(h, "float64")))
    assert np.isfinite(grad).all() and np.abs(grad).max() > 0
    # against a central difference in one coordinate
    eps, e = 1e-6, np.zeros_like(h)
    e[0, 1, 2] = eps
    plus, minus = (jax_backend.asarray(a, "float64") for a in (h + e, h - e))
    numeric = (loss(plus) - loss(minus)) / (2 * eps)
    np.testing.assert_allclose(grad[0, 1, 2], float(numeric), rtol=1e-5, atol=1e-8)


# ===============================================================================================
# Bad input
# ===============================================================================================


def _f(b, *shape):
    return b.asarray(np.random.default_rng(0).normal(size=shape), "float64")


def _t2t_call(b, h=(L, D), w1=(D, D), w2=(D, D), b1=(D,), **kw):
    return multi_dimensional_attention(_f(b, *h), _f(b, *w1), _f(b, *w2), _f(b, *b1), **kw)


def _s2t_call(b, h=(L, D), w1=(D, D), b1=(D,), w=(D, D), bias=(D,), **kw):
    return source2token_attention(_f(b, *h), _f(b, *w1), _f(b, *b1), _f(b, *w), _f(b, *bias), **kw)


def _gate(b, ws=(D, D), wh=(D, D), bf=(D,)):
    return (_f(b, *ws), _f(b, *wh), _f(b, *bf))


def test_no_tokens(backend):
    """SPEC §1, empty axes: ``L = 0`` gives an empty ``u``; source2token has no token, so zeros."""
    u = _t2t_call(backend, h=(2, 0, D))
    assert tuple(u.shape) == (2, 0, D)
    backend.assert_close(u, np.zeros((2, 0, D)), "float64")
    s = _s2t_call(backend, h=(2, 0, D))
    backend.assert_close(s, np.zeros((2, D)), "float64")


V, T = ValueError, TypeError

ERRORS = [
    (
        "direction",
        lambda b: _t2t_call(b, direction="up"),
        V,
        r"^direction must be one of .*'forward'.*got 'up'",
    ),
    ("c-zero", lambda b: _t2t_call(b, c=0.0), V, r"^c must be positive and finite, got 0"),
    ("c-negative", lambda b: _t2t_call(b, c=-5), V, r"^c must be positive and finite, got -5"),
    ("c-inf", lambda b: _t2t_call(b, c=math.inf), V, r"^c must be positive and finite, got inf"),
    ("c-str", lambda b: _t2t_call(b, c="5"), T, r"^c must be a real number.*got str"),
    ("c-bool", lambda b: _t2t_call(b, c=True), T, r"^c must be a real number.*got bool"),
    (
        "h-1d",
        lambda b: _t2t_call(b, h=(D,)),
        V,
        r"^h must have shape \(\.\.\., L, d\), got shape \(4,\)",
    ),
    (
        "query_weight",
        lambda b: _t2t_call(b, w1=(D, 3)),
        V,
        r"^query_weight must have shape \(d, d\) = \(4, 4\).*got shape \(4, 3\)",
    ),
    (
        "key_weight",
        lambda b: _t2t_call(b, w2=(2, D, D)),
        V,
        r"^key_weight must have shape \(d, d\)",
    ),
    (
        "bias",
        lambda b: _t2t_call(b, b1=(D, 1)),
        V,
        r"^bias must have shape \(d,\) = \(4,\).*got shape \(4, 1\)",
    ),
    (
        "fusion-list-len",
        lambda b: _t2t_call(b, fusion=_gate(b)[:2]),
        V,
        r"^fusion must be a tuple \(w_s, w_h, b_f\) of 3 arrays, got 2",
    ),
    (
        "fusion-type",
        lambda b: _t2t_call(b, fusion=_f(b, D, D)),
        T,
        r"^fusion must be a tuple .*got ",
    ),
    (
        "fusion-none",
        lambda b: _t2t_call(b, fusion=(None, None, None)),
        T,
        r"^w_s \(fusion\[0\]\) must be an array",
    ),
    (
        "fusion-w_s",
        lambda b: _t2t_call(b, fusion=_gate(b, ws=(3, D))),
        V,
        r"^w_s \(fusion\[0\]\) must have shape \(d, d\)",
    ),
    (
        "fusion-w_h",
        lambda b: _t2t_call(b, fusion=_gate(b, wh=(D,))),
        V,
        r"^w_h \(fusion\[1\]\) must have shape \(d, d\)",
    ),
    (
        "fusion-b_f",
        lambda b: _t2t_call(b, fusion=_gate(b, bf=(3,))),
        V,
        r"^b_f \(fusion\[2\]\) must have shape \(d,\)",
    ),
    (
        "fusion-int",
        lambda b: _t2t_call(b, fusion=(*_gate(b)[:2], b.asarray(np.ones(D, np.int64)))),
        T,
        r"^b_f \(fusion\[2\]\) must have a real floating",
    ),
    ("chunk-0", lambda b: _t2t_call(b, chunk_size=0), V, r"^chunk_size must be >= 1, got 0"),
    (
        "chunk-float",
        lambda b: _t2t_call(b, chunk_size=2.0),
        T,
        r"^chunk_size must be an integer, got float",
    ),
    ("mask-float", lambda b: _t2t_call(b, mask=_f(b, L, L)), T, r"^mask must be a boolean"),
    (
        "mask-shape",
        lambda b: _t2t_call(b, mask=b.asarray(np.ones((L, 3), bool))),
        V,
        r"^mask must be broadcastable to .*\(5, 5\), got shape \(5, 3\)",
    ),
    (
        "h-int",
        lambda b: multi_dimensional_attention(
            b.asarray(np.ones((L, D), np.int64)), *_gate(b)[:2], _f(b, D)
        ),
        T,
        r"^h must have a real floating",
    ),
    (
        "h-list",
        lambda b: multi_dimensional_attention([[1.0] * D] * L, *_gate(b)[:2], _f(b, D)),
        T,
        r"^h must be an array, got list",
    ),
    ("s2t-h-1d", lambda b: _s2t_call(b, h=(D,)), V, r"^h must have shape \(\.\.\., L, d\)"),
    (
        "s2t-weight1",
        lambda b: _s2t_call(b, w1=(D, 2)),
        V,
        r"^weight1 must have shape \(d, d\) = \(4, 4\)",
    ),
    ("s2t-bias1", lambda b: _s2t_call(b, b1=(2,)), V, r"^bias1 must have shape \(d,\)"),
    ("s2t-weight", lambda b: _s2t_call(b, w=(D, D, 1)), V, r"^weight must have shape \(d, d\)"),
    ("s2t-bias", lambda b: _s2t_call(b, bias=(1,)), V, r"^bias must have shape \(d,\)"),
    (
        "s2t-mask-shape",
        lambda b: _s2t_call(b, mask=b.asarray(np.ones((L, L), bool))),
        V,
        r"^mask must be broadcastable to the tokens \(\.\.\., L\) \(5,\), got shape \(5, 5\)",
    ),
    (
        "s2t-mask-int",
        lambda b: _s2t_call(b, mask=b.asarray(np.ones(L, np.int64))),
        T,
        r"^mask must be a boolean",
    ),
]


@pytest.mark.parametrize(
    ("call", "exc", "match"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_bad_input(backend, call, exc, match):
    with pytest.raises(exc, match=match):
        call(backend)


def test_mixed_libraries(torch_backend):
    h = np.ones((L, D))
    w, zero = torch_backend.asarray(np.ones((D, D))), torch_backend.asarray(np.zeros(D))
    with pytest.raises(
        TypeError, match=r"different libraries cannot be mixed: h is a numpy array.*torch"
    ):
        multi_dimensional_attention(h, w, w, zero)
    with pytest.raises(
        TypeError, match=r"different libraries cannot be mixed: h is a numpy array.*torch"
    ):
        source2token_attention(h, w, zero, w, np.zeros(D))


# ===============================================================================================
# SPEC §4 recipe 7: examples/disan.py
# ===============================================================================================


def _load_example():
    path = Path(__file__).parents[1] / "examples" / "disan.py"
    spec = importlib.util.spec_from_file_location("example_disan", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _disan_loop(example, seed):
    """The whole DiSAN of the recipe, every step by the loops above."""
    p = example.inputs(seed)
    x = p["x"]
    lengths = np.array(example.LENGTHS)
    length = x.shape[1]
    tokens = np.arange(length) < lengths[:, None]
    outputs = {}
    for direction in ("forward", "backward"):
        q = p[direction]
        h = np.zeros((*x.shape[:2], q["w_x"].shape[1]))
        for idx in np.ndindex(x.shape[:2]):
            h[idx] = [_elu(v) for v in _linear(x[idx], q["w_x"], q["b_x"])]
        u = t2t_loop(
            h, q["w_1"], q["w_2"], q["b_1"],
            _allowed(direction, length) & tokens[:, None, :],
            fusion=(q["w_f1"], q["w_f2"], q["b_f"]),
        )  # fmt: skip
        outputs[direction] = u * tokens[:, :, None]  # padding positions are zero, as in DiSAN
    u = np.concatenate((outputs["forward"], outputs["backward"]), axis=-1)
    q = p["sentence"]
    sentence = s2t_loop(u, q["w_1"], q["b_1"], q["w"], q["b"], tokens)
    return outputs["forward"], outputs["backward"], sentence


def test_example_recipe(recipe_backend):
    example = _load_example()
    results = example.run(recipe_backend.lib, seed=1)
    forward, backward, sentence = _disan_loop(example, 1)
    tol = {"rtol": 1e-10, "atol": 1e-12}
    np.testing.assert_allclose(results["u_forward"], forward, **tol)
    np.testing.assert_allclose(results["u_backward"], backward, **tol)
    np.testing.assert_allclose(results["sentence"], sentence, **tol)
    assert results["sentence"].shape == (2, 2 * example.D)
    np.testing.assert_array_equal(results["forward_mask"], _allowed("forward", L))
    np.testing.assert_array_equal(results["backward_mask"], _allowed("backward", L))
    # the printed tables: "China" (row) may attend to I, come, from (forward) and ! (backward)
    china_fw = next(
        r for r in results["forward_table"].splitlines() if r.strip().startswith("China")
    )
    assert china_fw.split("|")[1].split() == ["x", "x", "x", ".", "."]
    china_bw = next(
        r for r in results["backward_table"].splitlines() if r.strip().startswith("China")
    )
    assert china_bw.split("|")[1].split() == [".", ".", ".", ".", "x"]
    assert results["forward_table"].splitlines()[0].split("|")[1].split() == list(WORDS)
