"""complex_order_embedding, complex_linear, complex_attention (Wang et al. 2020) and recipe 6.

Results are compared, on every backend and for float32 (complex64) and float64
(complex128), with NumPy references written below from the formulas with
explicit loops and Python ``cmath``. Properties: the diagonal shift
``f(pos + n) = f(pos) ⊙ exp(iωn)``, the relative property of the conjugated
real-part scores (and its absence for the authors' modulus), rotary embeddings
as its real special case. Also jit, gradients, masks and bad input.
"""

from __future__ import annotations

import cmath
import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import reference
from array_api_extra.testing import lazy_xp_function
from conftest import target_fixture
from hypothesis import given, settings
from hypothesis import strategies as st

from relattn.complex_order import complex_attention, complex_linear, complex_order_embedding
from relattn.testing import tolerance

# Lazy on Dask, traced under jax.jit on JAX, for every backend test.
for _function in (complex_attention, complex_linear, complex_order_embedding):
    lazy_xp_function(_function)

CDTYPE = {"float32": np.complex64, "float64": np.complex128}
VARIANTS = [(True, "real"), (False, "modulus"), (True, "modulus"), (False, "real")]
VARIANT_IDS = ["conj-real", "plain-modulus", "conj-modulus", "plain-real"]


# --------------------------------------------------------------------------------------------
# Naive references, straight from the formulas
# --------------------------------------------------------------------------------------------


def _embedding_loop(r, w, theta, pos):
    """f[..., l, k] = r · exp(i(ω·pos_l + θ)), one element at a time with cmath."""
    pos = np.asarray(pos, dtype=np.float64)[..., None]
    shape = np.broadcast_shapes(np.shape(r), np.shape(w), np.shape(theta), pos.shape)
    r, w, theta, pos = (np.broadcast_to(np.asarray(a, float), shape) for a in (r, w, theta, pos))
    out = np.empty(shape, dtype=np.complex128)
    for idx in np.ndindex(shape):
        out[idx] = r[idx] * cmath.exp(1j * (w[idx] * pos[idx] + theta[idx]))
    return out


def _linear_loop(x, weight, bias=None):
    """y[..., o] = Σ_c x[..., c] W[c, o] + b[o], summed one product at a time."""
    x = np.asarray(x, dtype=np.complex128)
    out = np.zeros((*x.shape[:-1], weight.shape[1]), dtype=np.complex128)
    for idx in np.ndindex(x.shape[:-1]):
        for o in range(weight.shape[1]):
            out[idx][o] = sum(
                complex(x[idx][c]) * complex(weight[c, o]) for c in range(len(x[idx]))
            )
    return out if bias is None else out + bias


def _scores_loop(q, k, conjugate, reduction, scale):
    """e[i, j] = reduce(Σ_c q_ic · (conj(k_jc) or k_jc)) · scale for one (Lq, d), (Lk, d) pair."""
    e = np.zeros((q.shape[0], k.shape[0]))
    for i in range(q.shape[0]):
        for j in range(k.shape[0]):
            s = sum(
                complex(q[i, c]) * (complex(k[j, c]).conjugate() if conjugate else complex(k[j, c]))
                for c in range(q.shape[1])
            )
            e[i, j] = (s.real if reduction == "real" else abs(s)) * scale
    return e


def _attention_loop(q, k, v, *, conjugate=True, reduction="real", mask=None, scale=None):
    """softmax over allowed keys of the reduced complex scores, times v; zero rows if none."""
    lq, d = q.shape[-2:]
    lk, dv = v.shape[-2:]
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k = (np.broadcast_to(a, (*lead, *a.shape[-2:])) for a in (q, k))
    v = np.broadcast_to(v, (*lead, lk, dv))
    mask = np.ones((lq, lk), bool) if mask is None else mask
    mask = np.broadcast_to(mask, (*lead, lq, lk))
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = np.zeros((*lead, lq, dv), dtype=np.complex128)
    for b in np.ndindex(lead):
        e = _scores_loop(q[b], k[b], conjugate, reduction, scale)
        for i in range(lq):
            p = reference.softmax_row(e[i], mask[b][i])
            for j in range(lk):
                out[b][i] += p[j] * v[b][j]
    return out


def _weights_loop(q, k, *, conjugate, reduction, scale=None):
    """The attention weights P (Lq, Lk) of one unbatched pair."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    e = _scores_loop(q, k, conjugate, reduction, scale)
    return np.stack([reference.softmax_row(row, np.ones(row.shape, bool)) for row in e])


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _c(rng, *shape):
    """Unit-scale complex128 NumPy array."""
    return (rng.normal(size=shape) + 1j * rng.normal(size=shape)) / math.sqrt(2)


def _cx(backend, a, dtype):
    """Backend complex array with the precision of the real ``dtype``."""
    return backend.asarray(a, np.dtype(CDTYPE[dtype]).name)


def _assert_complex_close(backend, actual, expected, dtype):
    """A complex result of the precision of the real ``dtype``, at ``dtype``'s tolerances."""
    backend.assert_close(actual, expected, dtype, result_dtype=np.dtype(CDTYPE[dtype]).name)


def _tables(rng, *shape):
    """Amplitude in [0.5, 1.5], frequency N(0, 0.7²), phase in [-π, π]."""
    return (
        rng.uniform(0.5, 1.5, size=shape),
        rng.normal(scale=0.7, size=shape),
        rng.uniform(-np.pi, np.pi, size=shape),
    )


# ===============================================================================================
# complex_order_embedding
# ===============================================================================================


def test_embedding_matches_loop(backend, dtype, rng):
    r, w, theta = _tables(rng, 2, 5, 4)
    pos = rng.normal(scale=3.0, size=(2, 5))
    args = [backend.asarray(a, dtype) for a in (r, w, theta, pos)]
    out = complex_order_embedding(*args)
    assert tuple(out.shape) == (2, 5, 4)
    _assert_complex_close(backend, out, _embedding_loop(r, w, theta, pos), dtype)


def test_embedding_broadcasting_and_integer_positions(backend, dtype, rng):
    # per-word amplitude (L, d), a frequency shared by all words (d,), a batch of phases
    r, _, _ = _tables(rng, 5, 4)
    w = rng.normal(size=4)
    theta = rng.uniform(-np.pi, np.pi, size=(2, 1, 4))
    pos = rng.integers(-6, 7, size=(2, 5))
    out = complex_order_embedding(
        *(backend.asarray(a, dtype) for a in (r, w, theta)), backend.asarray(pos)
    )
    assert tuple(out.shape) == (2, 5, 4)
    _assert_complex_close(backend, out, _embedding_loop(r, w, theta, pos), dtype)


def test_embedding_promotes_with_real_positions(backend, rng):
    r, w, theta = _tables(rng, 3, 2)
    pos = np.array([0.5, 1.0, 7.25])
    tables = [backend.asarray(a, "float32") for a in (r, w, theta)]
    out = complex_order_embedding(*tables, backend.asarray(pos, "float64"))
    # float64 positions promote the float32 tables: complex128, computed in float64 after the
    # tables are rounded to float32
    rounded = [a.astype(np.float32) for a in (r, w, theta)]
    _assert_complex_close(backend, out, _embedding_loop(*rounded, pos), "float64")


@pytest.mark.parametrize("low", ["float16", "bfloat16"])
def test_embedding_half_precision_gives_complex64(backend, rng, low):
    half = backend.dtype(low)
    r, w, theta = _tables(rng, 3, 2)
    pos = np.arange(3.0)
    args = [backend.asarray(a, low) for a in (r, w, theta, pos)]
    assert all(a.dtype == half for a in args)
    out = complex_order_embedding(*args)
    # The reference of the inputs as the backend holds them, rounded to ``low``. relattn
    # computes in float32 from those exact values, so the result holds complex64's
    # (float32's) tolerance, not only ``low``'s.
    expected = _embedding_loop(*(backend.to_host(a).astype(np.float64) for a in args))
    backend.assert_close(out, expected, "complex64")


@settings(max_examples=15)
@given(
    seed=st.integers(0, 2**32 - 1),
    shift=st.one_of(st.integers(-12, 12), st.floats(-12.0, 12.0, allow_nan=False)),
)
def test_embedding_shift_is_a_diagonal_map(backend, dtype, seed, shift):
    """f(pos + n) = f(pos) ⊙ exp(iωn): the same diagonal map at every position."""
    rng = np.random.default_rng(seed)
    r, w, theta = _tables(rng, 5, 3)
    pos = rng.uniform(-10, 10, size=5)
    tables = [backend.asarray(a, dtype) for a in (r, w, theta)]
    at = complex_order_embedding(*tables, backend.asarray(pos, dtype))
    moved = complex_order_embedding(*tables, backend.asarray(pos + shift, dtype))
    rotation = np.exp(1j * w * shift)  # depends on the word and n only, not on pos
    np.testing.assert_allclose(
        backend.to_host(moved),
        backend.to_host(at) * rotation,
        rtol=tolerance(dtype)["rtol"],
        atol=10 * tolerance(dtype)["atol"],
    )
    # and the map is position-free: one word at five positions, f(pos + n) / f(pos) is the same
    one_word = [backend.asarray(a[:1], dtype) for a in (r, w, theta)]
    at = backend.to_host(complex_order_embedding(*one_word, backend.asarray(pos, dtype)))
    moved = backend.to_host(complex_order_embedding(*one_word, backend.asarray(pos + shift, dtype)))
    ratio = moved / at
    np.testing.assert_allclose(ratio, np.broadcast_to(ratio[:1], ratio.shape), atol=1e-4)


# ===============================================================================================
# complex_linear
# ===============================================================================================


def test_complex_linear_equals_four_real_products(backend, dtype, rng):
    x, weight, bias = _c(rng, 2, 3, 4), _c(rng, 4, 5), _c(rng, 5)
    out = complex_linear(
        *(_cx(backend, a, dtype) for a in (x, weight)), bias=_cx(backend, bias, dtype)
    )
    # The authors' implementation: real and imaginary parts as separate real tensors.
    xr, xi, wr, wi = x.real, x.imag, weight.real, weight.imag
    expected = (xr @ wr - xi @ wi + bias.real) + 1j * (xr @ wi + xi @ wr + bias.imag)
    _assert_complex_close(backend, out, expected, dtype)
    _assert_complex_close(backend, out, _linear_loop(x, weight, bias), dtype)


def test_complex_linear_real_input_and_real_bias(backend, dtype, rng):
    x, weight, bias = rng.normal(size=(3, 4)), _c(rng, 4, 2), rng.normal(size=(3, 1))
    out = complex_linear(
        backend.asarray(x, dtype), _cx(backend, weight, dtype), bias=backend.asarray(bias, dtype)
    )
    _assert_complex_close(backend, out, _linear_loop(x, weight, bias), dtype)
    out = complex_linear(backend.asarray(x, dtype), _cx(backend, weight, dtype))
    _assert_complex_close(backend, out, x @ weight.real + 1j * (x @ weight.imag), dtype)


# ===============================================================================================
# complex_attention
# ===============================================================================================


@pytest.mark.parametrize(("conjugate", "reduction"), VARIANTS, ids=VARIANT_IDS)
def test_complex_attention_matches_loop(backend, dtype, rng, conjugate, reduction):
    q, k, v = _c(rng, 2, 3, 4), _c(rng, 2, 5, 4), _c(rng, 5, 3)  # v's lead broadcasts
    mask = rng.random((3, 5)) < 0.6
    mask[:, 2] = True
    mask[1] = False  # a fully masked row
    out = complex_attention(
        *(_cx(backend, a, dtype) for a in (q, k, v)),
        conjugate=conjugate,
        reduction=reduction,
        mask=backend.asarray(mask),
    )
    expected = _attention_loop(q, k, v, conjugate=conjugate, reduction=reduction, mask=mask)
    _assert_complex_close(backend, out, expected, dtype)
    got = backend.to_host(out)
    assert np.isfinite(got.real).all() and np.isfinite(got.imag).all()
    assert (got[:, 1] == 0).all()


@pytest.mark.parametrize(("conjugate", "reduction"), VARIANTS[:2], ids=VARIANT_IDS[:2])
def test_complex_attention_real_values_cross_attention_and_scale(
    backend, dtype, rng, conjugate, reduction
):
    q, k, v = _c(rng, 2, 4), _c(rng, 5, 4), rng.normal(size=(5, 3))
    out = complex_attention(
        _cx(backend, q, dtype),
        _cx(backend, k, dtype),
        backend.asarray(v, dtype),
        conjugate=conjugate,
        reduction=reduction,
        scale=1.0,
    )
    expected = _attention_loop(q, k, v, conjugate=conjugate, reduction=reduction, scale=1.0)
    _assert_complex_close(backend, out, expected, dtype)
    # the default scale 1/√d gives another answer: the argument is used
    default = _attention_loop(q, k, v, conjugate=conjugate, reduction=reduction)
    assert not np.allclose(expected, default, rtol=1e-3)


@pytest.mark.parametrize(("conjugate", "reduction"), VARIANTS[:2], ids=VARIANT_IDS[:2])
def test_complex_attention_all_masked_gives_zeros(backend, dtype, rng, conjugate, reduction):
    q, k, v = _c(rng, 3, 4), _c(rng, 5, 4), _c(rng, 5, 2)
    out = complex_attention(
        *(_cx(backend, a, dtype) for a in (q, k, v)),
        conjugate=conjugate,
        reduction=reduction,
        mask=backend.asarray(np.zeros((3, 5), bool)),
    )
    got = backend.to_host(out)
    assert got.dtype == CDTYPE[dtype]
    np.testing.assert_array_equal(got, np.zeros((3, 2)))


# ===============================================================================================
# Relative property: conjugated real-part scores depend on position differences only
# ===============================================================================================

POSITIONS = np.array([0.0, 1.0, 3.0, 4.0, 7.0])


def _weights(backend, dtype, r, w, theta, pos, conjugate, reduction):
    """Attention weights P of the embeddings at ``pos`` attending to themselves (v = I)."""
    tables = [backend.asarray(a, dtype) for a in (r, w, theta)]
    x = complex_order_embedding(*tables, backend.asarray(pos, dtype))
    eye = _cx(backend, np.eye(len(pos)), dtype)
    out = complex_attention(x, x, eye, conjugate=conjugate, reduction=reduction)
    return backend.to_host(out)


@pytest.mark.parametrize("shift", [3.0, -2.5, 11.0])
def test_conjugated_real_scores_are_relative(backend, dtype, rng, shift):
    # Distinct words (per-word amplitude and phase), frequencies shared per dimension.
    r, _, theta = _tables(rng, 5, 4)
    w = rng.normal(scale=0.7, size=4)
    p = _weights(backend, dtype, r, w, theta, POSITIONS, True, "real")
    moved = _weights(backend, dtype, r, w, theta, POSITIONS + shift, True, "real")
    x = _embedding_loop(r, w, theta, POSITIONS)
    _assert_close_weights(p, _weights_loop(x, x, conjugate=True, reduction="real"), dtype)
    np.testing.assert_allclose(moved, p, **tolerance(dtype))

    # The authors' variant (no conjugation, modulus) sees the absolute positions.
    p = _weights(backend, dtype, r, w, theta, POSITIONS, False, "modulus")
    moved = _weights(backend, dtype, r, w, theta, POSITIONS + shift, False, "modulus")
    _assert_close_weights(p, _weights_loop(x, x, conjugate=False, reduction="modulus"), dtype)
    assert np.abs(moved - p).max() > 1e-3


def test_relative_property_needs_shared_frequencies(backend, dtype, rng):
    # One word repeated: its frequency is shared, the weights are invariant to a shift ...
    r, w, theta = (np.broadcast_to(a, (5, 4)) for a in _tables(rng, 1, 4))
    p = _weights(backend, dtype, r, w, theta, POSITIONS, True, "real")
    moved = _weights(backend, dtype, r, w, theta, POSITIONS + 5.0, True, "real")
    np.testing.assert_allclose(moved, p, **tolerance(dtype))
    # ... distinct words with their own frequencies pick up e^{i(ω_i - ω_j) n}: they are not.
    r, w, theta = _tables(rng, 5, 4)
    p = _weights(backend, dtype, r, w, theta, POSITIONS, True, "real")
    moved = _weights(backend, dtype, r, w, theta, POSITIONS + 5.0, True, "real")
    assert np.abs(moved - p).max() > 1e-3


def _assert_close_weights(actual, expected, dtype):
    assert actual.dtype == CDTYPE[dtype]
    np.testing.assert_allclose(actual, expected, **tolerance(dtype))


def test_rotary_embedding_is_the_real_special_case(backend, dtype, rng):
    """RoPE (real 2×2 rotations of feature pairs) = conjugated real-part complex attention."""
    length, d = 5, 4
    xq, xk, v = rng.normal(size=(length, d)), rng.normal(size=(length, d)), rng.normal(size=(5, 3))
    freq = 10000.0 ** (-np.arange(d // 2) * 2 / d)
    pos = np.array([0.0, 1.0, 2.0, 5.0, 6.0])

    def rope(x):
        out = np.empty_like(x)
        for t in range(length):
            for m in range(d // 2):
                c, s = math.cos(pos[t] * freq[m]), math.sin(pos[t] * freq[m])
                out[t, 2 * m] = c * x[t, 2 * m] - s * x[t, 2 * m + 1]
                out[t, 2 * m + 1] = s * x[t, 2 * m] + c * x[t, 2 * m + 1]
        return out

    rq, rk = rope(xq), rope(xk)
    scores = np.array(
        [[rq[i] @ rk[j] / math.sqrt(d) for j in range(length)] for i in range(length)]
    )
    weights = np.stack([reference.softmax_row(row, np.ones(length, bool)) for row in scores])
    expected = weights @ v

    def as_complex_order(x):
        z = x[:, 0::2] + 1j * x[:, 1::2]  # feature pair (2m, 2m+1) → one complex number
        r, theta = np.abs(z), np.angle(z)
        args = (backend.asarray(a, dtype) for a in (r, freq, theta, pos))
        return complex_order_embedding(*args)

    out = complex_attention(
        as_complex_order(xq),
        as_complex_order(xk),
        backend.asarray(v, dtype),
        scale=1 / math.sqrt(d),  # RoPE's 1/√d over the d real features
    )
    _assert_complex_close(backend, out, expected.astype(complex), dtype)


# ===============================================================================================
# Transforms: jit, gradients
# ===============================================================================================


def _pipeline(r, w, theta, pos, wq, wk, wv, mask):
    x = complex_order_embedding(r, w, theta, pos)
    q, k, v = complex_linear(x, wq), complex_linear(x, wk), complex_linear(x, wv)
    rel = complex_attention(q, k, v, mask=mask)
    mod = complex_attention(q, k, v, conjugate=False, reduction="modulus", mask=mask)
    return rel, mod


def _pipeline_inputs(rng):
    r, w, theta = _tables(rng, 4, 3)
    pos = np.arange(4.0)
    mask = np.tril(np.ones((4, 4), bool))
    mask[0] = False
    return (r, w, theta, pos), tuple(_c(rng, 3, 3) for _ in range(3)), mask


def test_jit_equals_eager(jit_backend, dtype, rng):
    reals, weights, mask = _pipeline_inputs(rng)
    args = (
        *(jit_backend.asarray(a, dtype) for a in reals),
        *(_cx(jit_backend, a, dtype) for a in weights),
        jit_backend.asarray(mask),
    )
    jitted = jit_backend.jit(_pipeline)
    for eager, compiled in zip(_pipeline(*args), jitted(*args), strict=True):
        _assert_complex_close(jit_backend, compiled, jit_backend.to_host(eager), dtype)


def test_jax_grad_matches_central_differences(jax_backend, rng):
    import jax
    import jax.numpy as jnp

    reals, weights, mask = _pipeline_inputs(rng)
    params = [
        jax_backend.asarray(a, "float64")
        for a in (*reals[:3], *(w.real for w in weights), *(w.imag for w in weights))
    ]
    pos, mask = jax_backend.asarray(reals[3], "float64"), jax_backend.asarray(mask)

    def loss(params):
        r, w, theta, *parts = params
        wq, wk, wv = (parts[i] + 1j * parts[i + 3] for i in range(3))
        rel, mod = _pipeline(r, w, theta, pos, wq, wk, wv, mask)
        return jnp.sum(jnp.abs(rel) ** 2) + jnp.sum(jnp.abs(mod) ** 2)

    grad = [jax_backend.to_host(g) for g in jax.jit(jax.grad(loss))(params)]
    assert all(np.isfinite(g).all() for g in grad)
    direction = [rng.normal(size=p.shape) for p in params]
    h = 1e-6
    plus = loss([p + h * u for p, u in zip(params, direction, strict=True)])
    minus = loss([p - h * u for p, u in zip(params, direction, strict=True)])
    numeric = (float(plus) - float(minus)) / (2 * h)
    analytic = sum(float(np.sum(g * u)) for g, u in zip(grad, direction, strict=True))
    assert abs(analytic) > 1e-3
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6)


@pytest.mark.parametrize(("conjugate", "reduction"), VARIANTS[:2], ids=VARIANT_IDS[:2])
def test_torch_gradcheck_complex_attention(torch_backend, rng, conjugate, reduction):
    torch = torch_backend.lib
    q, k, v = (
        torch_backend.asarray(_c(rng, *shape), "complex128").requires_grad_(True)
        for shape in ((2, 3, 4), (2, 4, 4), (4, 2))
    )
    mask = torch_backend.asarray(rng.random((3, 4)) < 0.6)
    mask[:, 0] = True
    mask[2] = False

    def f(q, k, v):
        out = complex_attention(q, k, v, conjugate=conjugate, reduction=reduction, mask=mask)
        return torch.sum(out.real**2 + out.imag * out.real)  # a real loss of the complex output

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_torch_gradcheck_embedding_and_linear(torch_backend, rng):
    torch = torch_backend.lib

    def leaf(a, dtype):
        return torch_backend.asarray(a, dtype).requires_grad_(True)

    leaves = [leaf(a, "float64") for a in _tables(rng, 3, 2)]
    pos = torch_backend.asarray(np.array([0.0, 2.0, 5.0]), "float64")
    weight = leaf(_c(rng, 2, 3), "complex128")
    bias = leaf(_c(rng, 3), "complex128")

    def f(r, w, theta, weight, bias):
        y = complex_linear(complex_order_embedding(r, w, theta, pos), weight, bias=bias)
        return torch.view_as_real(y)

    assert torch.autograd.gradcheck(f, (*leaves, weight, bias))


# ===============================================================================================
# Bad input
# ===============================================================================================


def _f(b, *shape):
    return b.asarray(np.random.default_rng(0).normal(size=shape), "float64")


def _z(b, *shape):
    return b.asarray(_c(np.random.default_rng(0), *shape), "complex128")


def _att(b, q=(3, 4), k=(5, 4), v=(5, 2), **kw):
    return complex_attention(_z(b, *q), _z(b, *k), _z(b, *v), **kw)


def _emb(b, r=(5, 4), w=(5, 4), theta=(5, 4), pos=(5,), **kw):
    return complex_order_embedding(_f(b, *r), _f(b, *w), _f(b, *theta), _f(b, *pos))


V, T = ValueError, TypeError
ERRORS: list[tuple[str, Callable[[Any], Any], type[Exception], str]] = [
    # -- complex_order_embedding -------------------------------------------------------------
    (
        "emb-amplitude-int",
        lambda b: complex_order_embedding(
            b.asarray(np.ones((5, 4), int)), _f(b, 5, 4), _f(b, 5, 4), _f(b, 5)
        ),
        T,
        r"^amplitude must have a real floating dtype, got .*int",
    ),
    (
        "emb-phase-complex",
        lambda b: complex_order_embedding(_f(b, 5, 4), _f(b, 5, 4), _z(b, 5, 4), _f(b, 5)),
        T,
        r"^phase must have a real floating dtype, got .*complex",
    ),
    (
        "emb-positions-bool",
        lambda b: complex_order_embedding(
            _f(b, 5, 4), _f(b, 5, 4), _f(b, 5, 4), b.asarray(np.ones(5, bool))
        ),
        T,
        r"^positions must have an integer or real floating dtype, got .*bool",
    ),
    (
        "emb-positions-list",
        lambda b: complex_order_embedding(_f(b, 5, 4), _f(b, 5, 4), _f(b, 5, 4), [0, 1, 2, 3, 4]),
        T,
        r"^positions must be an array, got list",
    ),
    ("emb-positions-0d", lambda b: _emb(b, pos=()), V, r"^positions must have shape \(\.\.\., L\)"),
    (
        "emb-frequency-0d",
        lambda b: _emb(b, w=()),
        V,
        r"^frequency must have shape \(\.\.\., L, d\)",
    ),
    ("emb-length", lambda b: _emb(b, pos=(6,)), V, r"broadcast together.*positions \(6, 1\)"),
    ("emb-tables", lambda b: _emb(b, w=(5, 3)), V, r"broadcast together.*frequency \(5, 3\)"),
    # -- complex_linear ----------------------------------------------------------------------
    (
        "lin-weight-real",
        lambda b: complex_linear(_z(b, 3, 4), _f(b, 4, 2)),
        T,
        r"^weight must have a complex floating dtype, got .*float64",
    ),
    (
        "lin-x-int",
        lambda b: complex_linear(b.asarray(np.ones((3, 4), int)), _z(b, 4, 2)),
        T,
        r"^x must have a real or complex floating dtype",
    ),
    (
        "lin-weight-3d",
        lambda b: complex_linear(_z(b, 3, 4), _z(b, 1, 4, 2)),
        V,
        r"^weight must have shape \(d_in, d_out\), got shape \(1, 4, 2\)",
    ),
    (
        "lin-d_in",
        lambda b: complex_linear(_z(b, 3, 4), _z(b, 5, 2)),
        V,
        r"^weight must have d_in = 4 rows.*got shape \(5, 2\)",
    ),
    (
        "lin-bias-shape",
        lambda b: complex_linear(_z(b, 3, 4), _z(b, 4, 2), bias=_z(b, 3)),
        V,
        r"^bias must be broadcastable to the output \(\.\.\., d_out\) \(3, 2\), got shape \(3,\)",
    ),
    # -- complex_attention -------------------------------------------------------------------
    (
        "att-q-real",
        lambda b: complex_attention(_f(b, 3, 4), _z(b, 5, 4), _z(b, 5, 2)),
        T,
        r"^q must have a complex floating dtype, got .*float64",
    ),
    (
        "att-k-real",
        lambda b: complex_attention(_z(b, 3, 4), _f(b, 5, 4), _z(b, 5, 2)),
        T,
        r"^k must have a complex floating dtype, got .*float64",
    ),
    (
        "att-v-bool",
        lambda b: complex_attention(_z(b, 3, 4), _z(b, 5, 4), b.asarray(np.ones((5, 2), bool))),
        T,
        r"^v must have a real or complex floating dtype",
    ),
    (
        "att-reduction",
        lambda b: _att(b, reduction="imag"),
        V,
        r"^reduction must be one of .*'imag'",
    ),
    ("att-conjugate", lambda b: _att(b, conjugate=1), T, r"^conjugate must be a bool, got int"),
    ("att-d", lambda b: _att(b, k=(5, 3)), V, r"^k must have the feature size of q, d = 4"),
    ("att-lk", lambda b: _att(b, v=(4, 2)), V, r"^v must have one row per key, Lk = 5"),
    ("att-q-1d", lambda b: _att(b, q=(4,)), V, r"^q must have shape \(\.\.\., Lq, d\)"),
    ("att-lead", lambda b: _att(b, q=(2, 3, 4), k=(3, 5, 4)), V, r"do not broadcast: q \(2,\)"),
    (
        "att-mask-float",
        lambda b: _att(b, mask=_f(b, 3, 5)),
        T,
        r"^mask must be a boolean array",
    ),
    (
        "att-mask-shape",
        lambda b: _att(b, mask=b.asarray(np.ones((4, 5), bool))),
        V,
        r"^mask must be broadcastable to the scores .*got shape \(4, 5\)",
    ),
]


@pytest.mark.parametrize(
    ("make", "error", "match"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_bad_input(backend, make, error, match):
    with pytest.raises(error, match=match):
        make(backend)


def test_mixed_libraries_raise(torch_backend):
    q = np.ones((3, 4), complex)
    k = torch_backend.asarray(q)
    with pytest.raises(TypeError, match=r"different libraries.*q is a numpy.*k is a torch"):
        complex_attention(q, k, q)


class _InfoWithout:
    """An ``__array_namespace_info__`` whose devices lack some complex dtypes."""

    def __init__(self, info, missing):
        self._info, self._missing = info, missing

    def __call__(self):
        return self

    def dtypes(self, *, device=None, kind=None):
        found = self._info().dtypes(device=device, kind=kind)
        return {name: dt for name, dt in found.items() if name not in self._missing}


@pytest.mark.parametrize(
    ("missing", "dtype", "match"),
    [
        (
            ("complex128",),
            "float64",
            r"needs complex128 .* no complex128 .*complex dtypes: complex64",
        ),
        (("complex64", "complex128"), "float32", r"needs complex64 .*complex dtypes: none\)"),
    ],
)
def test_embedding_without_complex_dtype_raises(monkeypatch, rng, missing, dtype, match):
    import array_api_compat.numpy as xp

    monkeypatch.setattr(
        xp, "__array_namespace_info__", _InfoWithout(xp.__array_namespace_info__, missing)
    )
    r, w, theta = (a.astype(dtype) for a in _tables(rng, 3, 2))
    with pytest.raises(TypeError, match=match):
        complex_order_embedding(r, w, theta, np.arange(3))
    if missing == ("complex128",):  # the precision that exists still works
        out = complex_order_embedding(*(a.astype(np.float32) for a in (r, w, theta)), np.arange(3))
        assert out.dtype == np.complex64


# ===============================================================================================
# Recipe 6: examples/complex_order.py
# ===============================================================================================


def _load_example():
    path = Path(__file__).parents[1] / "examples" / "complex_order.py"
    spec = importlib.util.spec_from_file_location("example_complex_order", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The recipe returns NumPy arrays through np.asarray (host arrays).
cpu_backend = target_fixture("cpu_backend", lambda t: not t.gpu)


def test_example_recipe_matches_reference(cpu_backend):
    example = _load_example()
    results = example.run(cpu_backend.lib, seed=3)
    a = example.inputs(seed=3)
    tokens = a["tokens"]
    x = _embedding_loop(
        a["amplitude"][tokens], a["frequency"][tokens], a["phase"][tokens], a["positions"]
    )
    q, k, v = (_linear_loop(x, a[name]) for name in ("w_q", "w_k", "w_v"))
    expected = {
        "embedding": x,
        "relative": _attention_loop(q, k, v, conjugate=True, reduction="real"),
        "modulus": _attention_loop(q, k, v, conjugate=False, reduction="modulus"),
    }
    assert sorted(results) == sorted(f"{n}_{part}" for n in expected for part in ("real", "imag"))
    for name, z in expected.items():
        for part, value in (("real", z.real), ("imag", z.imag)):
            got = results[f"{name}_{part}"]
            assert got.dtype == np.float64 and got.shape == (6, 4)
            np.testing.assert_allclose(got, value, **tolerance("float64"))
    # the two variants give different outputs: both are really computed
    assert np.abs(expected["relative"] - expected["modulus"]).max() > 1e-2
