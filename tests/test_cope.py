"""cope_bias: contextual positions counted by gates (Golovneva et al. 2024, §3).

Against a float64 loop written from the paper's formulas, sharing no code with relattn:
``g_it = σ(s·q_i·k_t)``, ``p_ij = Σ_{t=j}^{i} g_it`` clipped to ``npos - 1``, and
``z_ij`` interpolated linearly between ``q_i·e[⌊p_ij⌋]`` and ``q_i·e[⌈p_ij⌉]``; the query
``i`` of a decode step (``Lq < Lk``) sits at ``i + Lk - Lq`` and counts the gates of the keys
up to it. End to end, ``scaled_dot_product_attention(..., bias=z, causal=True)`` equals a
loop, dense and blockwise. Gradients reach ``q``, ``k`` and the embeddings on torch and
JAX; jit and compile equal eager.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import relattn
from relattn.cope import cope_bias

BATCH, HEADS, D, NPOS = 2, 3, 4, 4


def _cope_loop(q, k, e, *, scale=None, mask=None):
    """``z[..., i, j]`` per pair, from the paper's §3; ``e`` broadcast to ``(B, H, npos, d)``."""
    b_, h_, lq, d = q.shape
    lk = k.shape[2]
    e = np.broadcast_to(e, (b_, h_, *e.shape[-2:]))
    npos = e.shape[-2]
    s = 1.0 / math.sqrt(d) if scale is None else scale
    mask = (
        np.ones((b_, h_, lq, lk), bool) if mask is None else np.broadcast_to(mask, (b_, h_, lq, lk))
    )
    z = np.zeros((b_, h_, lq, lk))
    for b, h, i in np.ndindex(b_, h_, lq):
        last = i + lk - lq
        gates = [1.0 / (1.0 + math.exp(-s * float(q[b, h, i] @ k[b, h, t])))
                 if t <= last and mask[b, h, i, t] else 0.0 for t in range(lk)]  # fmt: skip
        for j in range(lk):
            p = min(sum(gates[j:]), npos - 1)
            lo, hi = math.floor(p), math.ceil(p)
            w = p - lo
            z[b, h, i, j] = (1 - w) * float(q[b, h, i] @ e[b, h, lo]) + w * float(
                q[b, h, i] @ e[b, h, hi]
            )
    return z


def _inputs(rng, lq, lk, per_head=True):
    q = rng.normal(size=(BATCH, HEADS, lq, D))
    k, v = rng.normal(size=(2, BATCH, HEADS, lk, D))
    e = rng.normal(size=(HEADS, NPOS, D) if per_head else (NPOS, D))
    return q, k, v, e


@pytest.mark.parametrize("per_head", [True, False])
@pytest.mark.parametrize("lq, lk", [(5, 5), (2, 7), (1, 9)])
def test_values(backend, dtype, rng, lq, lk, per_head):
    q, k, _, e = _inputs(rng, lq, lk, per_head)
    want = _cope_loop(q, k, e)
    got = cope_bias(backend.asarray(q, dtype), backend.asarray(k, dtype), backend.asarray(e, dtype))
    assert backend.is_array(got)
    assert got.dtype == backend.dtype(dtype)
    assert tuple(got.shape) == (BATCH, HEADS, lq, lk)
    backend.assert_close(got, want, dtype)


def test_paper_scale_and_mask(backend, rng):
    """``scale=1`` (the paper's ``σ(q·k)``) and padded keys, whose gates are 0."""
    q, k, _, e = _inputs(rng, 3, 6)
    q, k = 2 * q, 2 * k  # gates away from 1/2, so that the scale matters
    mask = np.arange(6) < np.array([6, 4])[:, None, None, None]  # (B, 1, 1, Lk)
    want = _cope_loop(q, k, e, scale=1.0, mask=mask)
    got = cope_bias(
        *(backend.asarray(a, "float64") for a in (q, k, e)), scale=1.0, mask=backend.asarray(mask)
    )
    backend.assert_close(got, want, "float64")
    assert not np.allclose(want, _cope_loop(q, k, e, mask=mask))


@given(lk=st.integers(1, 10), lq=st.integers(1, 10), seed=st.integers(0, 2**16))
def test_decode_rows_are_the_full_rows(lk, lq, seed):
    """A decode step against the cache (queries at ``Lk - Lq + arange(Lq)``) gives the last
    ``Lq`` rows of the full computation."""
    lq = min(lq, lk)
    rng = np.random.default_rng(seed)
    q, k, _, e = _inputs(rng, lk, lk)
    full = cope_bias(q, k, e)
    step = cope_bias(q[..., lk - lq :, :], k, e)
    np.testing.assert_allclose(step, full[..., lk - lq :, :], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("lq, lk", [(5, 5), (2, 7)])
def test_attention(backend, dtype, rng, lq, lk):
    q, k, v, e = _inputs(rng, lq, lk)
    z = _cope_loop(q, k, e)
    expected = np.zeros((BATCH, HEADS, lq, v.shape[-1]))
    for b, h, i in np.ndindex(BATCH, HEADS, lq):
        keys = i + lk - lq + 1
        s = np.array([q[b, h, i] @ k[b, h, j] / math.sqrt(D) + z[b, h, i, j] for j in range(keys)])
        w = np.exp(s - s.max())
        expected[b, h, i] = (w / w.sum()) @ v[b, h, :keys]
    xq, xk, xv, xe = (backend.asarray(a, dtype) for a in (q, k, v, e))
    bias = cope_bias(xq, xk, xe)
    for block_size in (None, 3):
        out = relattn.scaled_dot_product_attention(
            xq, xk, xv, bias=bias, causal=True, block_size=block_size
        )
        backend.assert_close(out, expected, dtype)


def test_torch_gradients(torch_backend, rng):
    torch = torch_backend.lib
    q, k, v, e = _inputs(rng, 2, 5)
    leaves = tuple(torch_backend.asarray(a, "float64").requires_grad_(True) for a in (q, k, e))
    xv = torch_backend.asarray(v, "float64")

    def f(q, k, e):
        bias = cope_bias(q, k, e)
        return relattn.scaled_dot_product_attention(q, k, xv, bias=bias, causal=True)

    grads = torch.autograd.grad(f(*leaves).square().sum(), leaves)
    assert all(float(g.abs().max()) > 0 for g in grads)
    assert torch.autograd.gradcheck(f, leaves)


def test_jax_gradients(jax_backend, rng):
    import jax
    import jax.numpy as jnp

    q, k, v, e = _inputs(rng, 2, 5)
    params = [jax_backend.asarray(a, "float64") for a in (q, k, e)]
    xv = jax_backend.asarray(v, "float64")

    def loss(p):
        out = relattn.scaled_dot_product_attention(
            p[0], p[1], xv, bias=cope_bias(*p), causal=True, block_size=3
        )
        return jnp.sum(out**2)

    f = jax.jit(loss)
    grad = jax.jit(jax.grad(f))(params)
    assert all(bool(jnp.all(jnp.isfinite(g))) and float(jnp.abs(g).max()) > 0 for g in grad)
    jax_backend.assert_directional_derivatives(f, grad, params, rng)


def test_jit_equals_eager(jit_backend, dtype, rng):
    q, k, v, e = _inputs(rng, 2, 6)
    arrays = [jit_backend.asarray(a, dtype) for a in (q, k, v, e)]

    def f(q, k, v, e):
        bias = cope_bias(q, k, e)
        return bias, relattn.scaled_dot_product_attention(q, k, v, bias=bias, causal=True)

    compiled = jit_backend.jit(f)(*arrays)
    eager = f(*arrays)
    for a, b in zip(compiled, eager, strict=True):
        jit_backend.assert_close(a, jit_backend.to_numpy(b), dtype)


def test_empty_axes():
    q, k, _, e = _inputs(np.random.default_rng(0), 0, 3)
    assert cope_bias(q, k, e).shape == (BATCH, HEADS, 0, 3)
    q, k, _, e = _inputs(np.random.default_rng(0), 2, 0)
    assert cope_bias(q[..., :0, :], k, e).shape == (BATCH, HEADS, 0, 0)


# ===============================================================================================
# Bad input
# ===============================================================================================

_Q = np.ones((2, 3, 4))
_K = np.ones((2, 5, 4))
_E = np.ones((6, 4))

BAD = {
    "embeddings-features": (
        lambda: cope_bias(_Q, _K, np.ones((6, 3))),
        ValueError,
        r"^embeddings must have the feature size of q, d = 4, got embeddings of shape \(6, 3\)",
    ),
    "embeddings-1d": (
        lambda: cope_bias(_Q, _K, np.ones(4)),
        ValueError,
        r"^embeddings must have shape \(\.\.\., npos, d\), got shape \(4,\)",
    ),
    "embeddings-empty": (
        lambda: cope_bias(_Q, _K, np.ones((0, 4))),
        ValueError,
        r"^embeddings must hold npos >= 1 positions, got shape \(0, 4\)",
    ),
    "k-features": (
        lambda: cope_bias(_Q, np.ones((2, 5, 3)), _E),
        ValueError,
        r"^k must have the feature size of q",
    ),
    "lead": (
        lambda: cope_bias(_Q, np.ones((3, 5, 4)), _E),
        ValueError,
        r"^leading \(batch, head\) dimensions do not broadcast",
    ),
    "mask-dtype": (
        lambda: cope_bias(_Q, _K, _E, mask=np.ones((3, 5))),
        TypeError,
        r"^mask must be a boolean array",
    ),
    "mask-shape": (
        lambda: cope_bias(_Q, _K, _E, mask=np.ones((3, 4), bool)),
        ValueError,
        r"^mask must be broadcastable to the scores' shape \(2, 3, 5\), got shape \(3, 4\)",
    ),
    "q-int": (
        lambda: cope_bias(_Q.astype(int), _K, _E),
        TypeError,
        r"^q must have a real floating dtype",
    ),
    "e-none": (
        lambda: cope_bias(_Q, _K, None),
        TypeError,
        r"^embeddings must be an array, got None",
    ),
    "scale-str": (
        lambda: cope_bias(_Q, _K, _E, scale="1"),
        TypeError,
        r"^scale must be a real number",
    ),
    "d-0": (
        lambda: cope_bias(np.ones((3, 0)), np.ones((5, 0)), np.ones((2, 0))),
        ValueError,
        r"^q must have a feature size d >= 1",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input(name):
    call, error, match = BAD[name]
    with pytest.raises(error, match=match):
        call()


def test_mixed_libraries():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError):
        cope_bias(torch.ones(3, 4, dtype=torch.float64), _K[0], _E)
