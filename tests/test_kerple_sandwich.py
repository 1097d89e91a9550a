"""kerple_bias and sandwich_bias: length-extrapolation biases of the distance (SPEC §2.18).

Each against a float64 loop written from the papers' formulas, sharing no code with
relattn: Kerple's power and logarithmic kernels (Chi et al. 2022, §4) and Sandwich's
inner product of sinusoids with NeMo's per-head compression (Chi et al. 2023, §5). End
to end, ``scaled_dot_product_attention(..., relative_bias=values)`` equals a loop over
the ``(i, j)`` pairs of ``softmax(q·k / √d + b(j - i - offset)) v``, for ``Lq = Lk`` and
a decode step ``Lq < Lk``, in the causal and the full layout, dense and blockwise.
Gradients reach Kerple's ``r1`` and ``r2`` on torch and JAX, finite at ``δ = 0``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import relattn

BATCH, HEADS, D = 2, 3, 4

#: name -> (Lq, Lk, causal layout): a causal model and its decode step over a cache, a
#: bidirectional encoder and a cross attention (full layout).
CASES = {
    "causal": (5, 5, True),
    "decode": (2, 7, True),
    "full": (4, 4, False),
    "full-cross": (3, 6, False),
}


def _kerple(kind: str, r1: float, r2: float, delta: int) -> float:
    """Chi et al. 2022, §4: ``-r1·log(1 + r2·|m - n|)`` or ``-r1·|m - n|^r2``."""
    a = abs(delta)
    if kind == "log":
        return -r1 * math.log(1.0 + r2 * a)
    return -r1 * a**r2


def _sandwich(d_model: int, delta: int) -> float:
    """Chi et al. 2023, §5: ``Σ_{k=1}^{d'/2} cos((m - n) / 10000^(2k/d'))``."""
    return sum(math.cos(delta / 10000.0 ** (2.0 * k / d_model)) for k in range(1, d_model // 2 + 1))


def _sandwich_head(d_model: int, heads: int, h: int, delta: int) -> float:
    """NeMo's ``SandwichRelativePositionEmbedding``: ``(s - d'/2) / (8·(h+1)/H)``, h from 0."""
    return (_sandwich(d_model, delta) - d_model / 2) / (8.0 * (h + 1) / heads)


def _attention_loop(q, k, v, bias, *, causal):
    """``softmax(q_i·k_j / √d + bias(h, δ)) v`` per pair, ``δ = j - i - (Lk - Lq)``; with
    ``causal`` the keys with ``δ > 0`` are left out."""
    b_, h_, lq, d = q.shape
    lk = k.shape[2]
    out = np.zeros((b_, h_, lq, v.shape[-1]))
    for b in range(b_):
        for h in range(h_):
            for i in range(lq):
                scores, rows = [], []
                for j in range(lk):
                    delta = j - i - (lk - lq)
                    if causal and delta > 0:
                        continue
                    scores.append(float(q[b, h, i] @ k[b, h, j]) / math.sqrt(d) + bias(h, delta))
                    rows.append(v[b, h, j])
                if scores:
                    w = np.exp(np.array(scores) - max(scores))
                    out[b, h, i] = (w / w.sum()) @ np.array(rows)
    return out


def _qkv(rng, lq, lk):
    return (
        rng.normal(size=(BATCH, HEADS, lq, D)),
        rng.normal(size=(BATCH, HEADS, lk, D)),
        rng.normal(size=(BATCH, HEADS, lk, 3)),
    )


def _distances(backend, lq, lk, causal):
    return relattn.relative_distances(lq, lk, causal=causal, xp=backend.lib, device=backend.device)


# ===============================================================================================
# The values, on every backend
# ===============================================================================================


@pytest.mark.parametrize("kind", ["log", "power"])
def test_kerple_values(backend, dtype, rng, kind):
    r1, r2 = rng.uniform(0.2, 2.0, HEADS), rng.uniform(0.1, 2.0, HEADS)
    delta = np.arange(-9, 6)
    want = np.array([[_kerple(kind, r1[h], r2[h], d) for d in delta] for h in range(HEADS)])
    got = relattn.kerple_bias(
        backend.asarray(delta), backend.asarray(r1, dtype), backend.asarray(r2, dtype), kind=kind
    )
    assert backend.is_array(got)
    assert got.dtype == backend.dtype(dtype)
    backend.assert_close(got, want, dtype)


def test_kerple_keeps_the_shape_of_the_distances(backend):
    delta = backend.asarray(np.array([[0, -1, -2], [3, 4, 5]]))
    r = backend.asarray(np.array([1.0, 0.5]), "float64")
    got = relattn.kerple_bias(delta, r, r, kind="log")
    assert tuple(got.shape) == (2, 2, 3)


@pytest.mark.parametrize("heads", [None, 1, 4])
def test_sandwich_values(backend, dtype, heads):
    delta = np.arange(-300, 301, 37)
    d_model = 16
    if heads is None:
        want = np.array([_sandwich(d_model, d) for d in delta])
    else:
        want = np.array(
            [[_sandwich_head(d_model, heads, h, d) for d in delta] for h in range(heads)]
        )
    got = relattn.sandwich_bias(
        backend.asarray(delta), d_model, num_heads=heads, dtype=backend.dtype(dtype)
    )
    assert backend.is_array(got)
    assert got.dtype == backend.dtype(dtype)
    backend.assert_close(got, want, dtype)


def test_sandwich_default_dtype(backend):
    got = relattn.sandwich_bias(_distances(backend, 2, 3, True), 8)
    info = backend.xp.__array_namespace_info__()
    assert got.dtype == info.default_dtypes(device=backend.device)["real floating"]


# ===============================================================================================
# End to end: attention with relative_bias= against the pair loop
# ===============================================================================================


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kind", ["log", "power"])
def test_kerple_attention(backend, dtype, rng, kind, case):
    lq, lk, causal = CASES[case]
    q, k, v = _qkv(rng, lq, lk)
    r1, r2 = rng.uniform(0.5, 2.0, HEADS), rng.uniform(0.3, 2.0, HEADS)
    expected = _attention_loop(
        q, k, v, lambda h, delta: _kerple(kind, r1[h], r2[h], delta), causal=causal
    )
    values = relattn.kerple_bias(
        _distances(backend, lq, lk, causal),
        backend.asarray(r1, dtype),
        backend.asarray(r2, dtype),
        kind=kind,
    )
    xq, xk, xv = (backend.asarray(a, dtype) for a in (q, k, v))
    for block_size in (None, 3):
        out = relattn.scaled_dot_product_attention(
            xq, xk, xv, relative_bias=values, causal=causal, block_size=block_size
        )
        backend.assert_close(out, expected, dtype)


@pytest.mark.parametrize("case", list(CASES))
def test_sandwich_attention(backend, dtype, rng, case):
    lq, lk, causal = CASES[case]
    d_model = 8
    q, k, v = _qkv(rng, lq, lk)
    # distances scaled by 40 so that the sinusoids vary over these few positions
    expected = _attention_loop(
        q, k, v, lambda h, delta: _sandwich_head(d_model, HEADS, h, 40 * delta), causal=causal
    )
    values = relattn.sandwich_bias(
        40 * _distances(backend, lq, lk, causal),
        d_model,
        num_heads=HEADS,
        dtype=backend.dtype(dtype),
    )
    xq, xk, xv = (backend.asarray(a, dtype) for a in (q, k, v))
    for block_size in (None, 3):
        out = relattn.scaled_dot_product_attention(
            xq, xk, xv, relative_bias=values, causal=causal, block_size=block_size
        )
        backend.assert_close(out, expected, dtype)


def test_kerple_with_positions_equals_contiguous(backend, rng):
    """positions= of a cache at offset 4: the same result as the contiguous layout."""
    lq, lk = 2, 6
    q, k, v = _qkv(rng, lq, lk)
    r = backend.asarray(rng.uniform(0.5, 2.0, HEADS), "float64")
    values = relattn.kerple_bias(_distances(backend, lq, lk, True), r, r, kind="log")
    xq, xk, xv = (backend.asarray(a, "float64") for a in (q, k, v))
    contiguous = relattn.scaled_dot_product_attention(xq, xk, xv, relative_bias=values)
    positions = (backend.asarray(np.arange(8, 10)), backend.asarray(np.arange(4, 10)))
    out = relattn.scaled_dot_product_attention(
        xq, xk, xv, relative_bias=values, causal=True, positions=positions
    )
    backend.assert_close(out, backend.to_host(contiguous), "float64")


# ===============================================================================================
# Gradients to r1 and r2
# ===============================================================================================


def _analytic(kind, r1, r2, delta):
    """``∂b/∂r1``, ``∂b/∂r2`` of Kerple's kernels, ``(H, W)`` each (0 at ``δ = 0``)."""
    a = np.abs(delta)[None, :].astype(np.float64)
    r1, r2 = r1[:, None], r2[:, None]
    if kind == "log":
        return -np.log1p(r2 * a), -r1 * a / (1 + r2 * a)
    power = np.where(a > 0, np.where(a > 0, a, 1.0) ** r2, 0.0)
    log_a = np.log(np.where(a > 0, a, 1.0))
    return -power, -r1 * power * log_a


@pytest.mark.parametrize("kind", ["log", "power"])
def test_torch_gradients(torch_backend, rng, kind):
    torch = torch_backend.lib
    r1 = torch_backend.asarray(rng.uniform(0.5, 2.0, HEADS), "float64").requires_grad_(True)
    r2 = torch_backend.asarray(rng.uniform(0.3, 0.9, HEADS), "float64").requires_grad_(True)
    delta = _distances(torch_backend, 3, 5, False)
    weights = torch_backend.asarray(rng.normal(size=(HEADS, 7)), "float64")
    (relattn.kerple_bias(delta, r1, r2, kind=kind) * weights).sum().backward()
    d1, d2 = _analytic(kind, *(x.detach().cpu().numpy() for x in (r1, r2)), np.arange(-4, 3))
    w = torch_backend.to_host(weights)
    np.testing.assert_allclose(torch_backend.to_host(r1.grad), (d1 * w).sum(1), rtol=1e-12)
    np.testing.assert_allclose(torch_backend.to_host(r2.grad), (d2 * w).sum(1), rtol=1e-12)

    q, k, v = (torch_backend.asarray(a, "float64") for a in _qkv(rng, 3, 5))
    causal_delta = _distances(torch_backend, 3, 5, True)

    def attend(r1, r2, block_size=None):
        values = relattn.kerple_bias(causal_delta, r1, r2, kind=kind)
        return relattn.scaled_dot_product_attention(
            q, k, v, relative_bias=values, block_size=block_size
        )

    for block_size in (None, 3):
        assert torch.autograd.gradcheck(lambda a, b, s=block_size: attend(a, b, s), (r1, r2))


@pytest.mark.parametrize("kind", ["log", "power"])
def test_jax_gradients(jax_backend, rng, kind):
    import jax
    import jax.numpy as jnp

    def on(a):
        return jax_backend.asarray(a, "float64")

    lq, lk = 2, 6
    q, k, v = (on(a) for a in _qkv(rng, lq, lk))
    params = [on(rng.uniform(0.5, 2.0, HEADS)), on(rng.uniform(0.3, 0.9, HEADS))]
    weights = on(rng.normal(size=(BATCH, HEADS, lq, 3)))
    delta = _distances(jax_backend, lq, lk, True)

    def loss(p, block_size):
        values = relattn.kerple_bias(delta, p[0], p[1], kind=kind)
        out = relattn.scaled_dot_product_attention(
            q, k, v, relative_bias=values, block_size=block_size
        )
        return jnp.sum(out * weights)

    for block_size in (None, 3):
        f = jax.jit(lambda p, b=block_size: loss(p, b))
        grad = jax.jit(jax.grad(f))(params)
        assert all(bool(jnp.all(jnp.isfinite(g))) and float(jnp.abs(g).max()) > 0 for g in grad)
        jax_backend.assert_directional_derivatives(f, grad, params, rng)


def test_power_gradients_are_finite_at_zero_distance(jit_backend):
    """``|δ|^r2`` at ``δ = 0``: value 0, gradients 0 (not ``0·log 0`` = NaN) for r2 < 1.
    The log form with ``r2 < 0`` (outside the paper's range) stays finite too."""
    delta = np.array([-2, -1, 0])
    r1, r2 = np.array([1.5, 0.7]), np.array([0.5, 0.25])
    if jit_backend.is_torch:
        leaves = [jit_backend.asarray(a, "float64").requires_grad_(True) for a in (r1, r2)]
        values = relattn.kerple_bias(jit_backend.asarray(delta), *leaves, kind="power")
        values.sum().backward()
        grads = [jit_backend.to_host(x.grad) for x in leaves]
        host = jit_backend.to_host(values.detach())
    else:
        import jax

        def f(p):
            return relattn.kerple_bias(jit_backend.asarray(delta), *p, kind="power").sum()

        params = [jit_backend.asarray(a, "float64") for a in (r1, r2)]
        grads = [np.asarray(g) for g in jax.grad(f)(params)]
        host = jit_backend.to_host(
            relattn.kerple_bias(jit_backend.asarray(delta), *params, kind="power")
        )
    assert np.all(host[:, -1] == 0)
    d1, d2 = _analytic("power", r1, r2, delta)
    np.testing.assert_allclose(grads[0], d1.sum(1), rtol=1e-12)
    np.testing.assert_allclose(grads[1], d2.sum(1), rtol=1e-12)
    negative = relattn.kerple_bias(
        jit_backend.asarray(delta),
        jit_backend.asarray(r1, "float64"),
        jit_backend.asarray(-r2 - 1, "float64"),
        kind="log",
    )
    assert np.all(jit_backend.to_host(negative) == 0)


# ===============================================================================================
# Bad input
# ===============================================================================================

_D = np.arange(-3, 1)
_R = np.array([1.0, 0.5])

BAD = {
    "kind": (
        lambda: relattn.kerple_bias(_D, _R, _R, kind="exp"),
        ValueError,
        r"^kind must be one of \('log', 'power'\), got 'exp'",
    ),
    "r1-2d": (
        lambda: relattn.kerple_bias(_D, _R[None], _R, kind="log"),
        ValueError,
        r"^r1 must have shape \(H,\), got shape \(1, 2\)",
    ),
    "r2-0d": (
        lambda: relattn.kerple_bias(_D, _R, np.asarray(1.0), kind="log"),
        ValueError,
        r"^r2 must have shape \(H,\), got shape \(\)",
    ),
    "r2-heads": (
        lambda: relattn.kerple_bias(_D, _R, _R[:1], kind="power"),
        ValueError,
        r"^r2 must have the shape of r1, \(H,\) = \(2,\), got shape \(1,\)",
    ),
    "distances-float": (
        lambda: relattn.kerple_bias(_D * 1.0, _R, _R, kind="log"),
        TypeError,
        r"^distances must be an integer array",
    ),
    "r1-int": (
        lambda: relattn.kerple_bias(_D, _D[:2], _R, kind="log"),
        TypeError,
        r"^r1 must have a real floating dtype",
    ),
    "r1-none": (
        lambda: relattn.kerple_bias(_D, None, _R, kind="log"),
        TypeError,
        r"^r1 must be an array",
    ),
    "d_model-odd": (
        lambda: relattn.sandwich_bias(_D, 7),
        ValueError,
        r"^d_model must be even",
    ),
    "d_model-0": (
        lambda: relattn.sandwich_bias(_D, 0),
        ValueError,
        r"^d_model must be >= 2, got 0",
    ),
    "num_heads-0": (
        lambda: relattn.sandwich_bias(_D, 8, num_heads=0),
        ValueError,
        r"^num_heads must be >= 1, got 0",
    ),
    "num_heads-float": (
        lambda: relattn.sandwich_bias(_D, 8, num_heads=2.0),
        TypeError,
        r"^num_heads must be an integer, got float",
    ),
    "sandwich-distances-float": (
        lambda: relattn.sandwich_bias(_D * 1.0, 8),
        TypeError,
        r"^distances must be an integer array",
    ),
    "dtype-int": (
        lambda: relattn.sandwich_bias(_D, 8, dtype=np.int64),
        TypeError,
        r"^dtype must be",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input(name):
    call, error, match = BAD[name]
    with pytest.raises(error, match=match):
        call()
