"""JAX as most users run it: float32 with x64 off (JAX's default).

The suite turns x64 on for the whole process (``JAX_ENABLE_X64`` in ``conftest.py``), so
that JAX's float32 results elsewhere are computed beside float64 constants and indices.
Here each call runs inside ``jax.enable_x64(False)``: float32 arrays, int32 indices,
float32 constants, as without the flag. The main attention functions, against a NumPy
float64 loop over every ``(i, j)`` pair on the float32 inputs, at SPEC §5's float32
tolerance:

- ``relative_attention``: Transformer-XL, causal, with memory (``Lk > Lq``), dense and
  blockwise (``block_size=4``);
- ``shaw_attention`` (clipped key and value embeddings, memory);
- ``disentangled_attention`` (c2p and p2c over the full layout);
- ``scaled_dot_product_attention`` with a T5 bucketed ``relative_bias`` (no scaling) and
  a mask with a fully masked row, dense and blockwise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import relattn
from relattn.testing import tolerance

B, H, LQ, MEMORY, D = 2, 2, 5, 3, 8
LK = LQ + MEMORY
WIDTH = LQ + LK - 1  # the full relative layout; the causal one has LK columns
RADIUS = 2  # Shaw's clipping distance K


def _without_x64():
    """JAX's x64 off for a block: ``jax.enable_x64(False)``, or its older spelling."""
    import jax

    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(False)
    from jax.experimental import disable_x64  # JAX < 0.7

    return disable_x64()


@pytest.fixture
def float32_jax(jax_backend):
    """The JAX target, for a test that runs with x64 off from its first array to its last
    call (its arrays: ``asarray(a, "float32")``)."""
    import jax

    with _without_x64():
        assert not jax.config.read("jax_enable_x64")
        yield jax_backend


def _exact(a):
    """``a`` as float32 holds it, in float64: the reference sees the inputs JAX sees."""
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def _loop(q, k, v, scale, *, scaled=None, added=None, value=None, causal=False, mask=None):
    """``softmax_j(scale·(q_i·k_j + scaled) + added) (v_j + value)``, one pair at a time.

    ``scaled(b, h, i, j, δ)``, ``added(h, δ)`` and ``value(h, δ)`` give a pair's terms
    (batch ``b``, head ``h``, ``δ = j - (i + Lk - Lq)``); keys with ``δ > 0``
    (``causal``) or ``mask[b, 0, i, j]`` False are left out; a row with no key is 0.
    """
    lq, lk = q.shape[-2], k.shape[-2]
    out = np.zeros((*q.shape[:-1], v.shape[-1]))
    for b, h in np.ndindex(q.shape[:2]):
        for i in range(lq):
            keys, scores = [], []
            for j in range(lk):
                delta = j - (i + lk - lq)
                if (causal and delta > 0) or (mask is not None and not mask[b, 0, i, j]):
                    continue
                s = q[b, h, i] @ k[b, h, j]
                s += 0.0 if scaled is None else scaled(b, h, i, j, delta)
                keys.append((j, delta))
                scores.append(scale * s + (0.0 if added is None else added(h, delta)))
            if not keys:
                continue
            weights = np.exp(np.array(scores) - max(scores))
            weights /= weights.sum()
            for w, (j, delta) in zip(weights, keys, strict=True):
                out[b, h, i] += w * (v[b, h, j] + (0.0 if value is None else value(h, delta)))
    return out


def _qkv(rng):
    q = _exact(rng.normal(size=(B, H, LQ, D)))
    k, v = (_exact(rng.normal(size=(B, H, LK, D))) for _ in range(2))
    return q, k, v


def _check(backend, out, expected):
    import jax.numpy as jnp

    assert out.dtype == jnp.float32
    got = backend.to_host(out)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, **tolerance("float32"))


@pytest.mark.parametrize("block_size", [None, 4])
def test_relative_attention_causal_with_memory(float32_jax, rng, block_size):
    """Dai et al. 2019: ``(q_i + u)·k_j + (q_i + v)·r(δ)``, causal layout (``W = Lk``)."""
    q, k, v = _qkv(rng)
    table = _exact(rng.normal(size=(H, LK, D)))  # column m: δ = m - (Lk - 1) <= 0
    u, pb = (_exact(rng.normal(size=(H, 1, D))) for _ in range(2))

    def scaled(b, h, i, j, delta):
        return u[h, 0] @ k[b, h, j] + (q[b, h, i] + pb[h, 0]) @ table[h, delta + LK - 1]

    expected = _loop(q, k, v, 1 / math.sqrt(D), scaled=scaled, causal=True)
    x = float32_jax
    out = relattn.relative_attention(
        *(x.asarray(a, "float32") for a in (q, k, v, table)),
        content_bias=x.asarray(u, "float32"), position_bias=x.asarray(pb, "float32"),
        causal=True, block_size=block_size,
    )  # fmt: skip
    _check(x, out, expected)


def test_shaw_attention(float32_jax, rng):
    """Shaw et al. 2018: ``q_i·(k_j + aᴷ)`` and ``Σ_j α_ij (v_j + aⱽ)``, rows
    ``clip(δ, -K, K) + K`` of the embeddings, with memory, no mask."""
    q, k, v = _qkv(rng)
    wk, wv = (_exact(rng.normal(size=(2 * RADIUS + 1, D))) for _ in range(2))

    def row(delta):
        return min(max(delta, -RADIUS), RADIUS) + RADIUS

    expected = _loop(
        q, k, v, 1 / math.sqrt(D),
        scaled=lambda b, h, i, j, delta: q[b, h, i] @ wk[row(delta)],
        value=lambda h, delta: wv[row(delta)],
    )  # fmt: skip
    x = float32_jax
    out = relattn.shaw_attention(*(x.asarray(a, "float32") for a in (q, k, v, wk, wv)))
    _check(x, out, expected)


def test_disentangled_attention(float32_jax, rng):
    """He et al. 2021: ``q_i·k_j + q_i·Kʳ[m] + k_j·Qʳ[m]``, ``m = δ + Lk - 1`` over the full
    layout, scaled by ``1/√(3d)``."""
    q, k, v = _qkv(rng)
    kr, qr = (_exact(rng.normal(size=(H, WIDTH, D))) for _ in range(2))

    def scaled(b, h, i, j, delta):
        m = delta + LK - 1
        return q[b, h, i] @ kr[h, m] + k[b, h, j] @ qr[h, m]

    expected = _loop(q, k, v, 1 / math.sqrt(3 * D), scaled=scaled)
    x = float32_jax
    out = relattn.disentangled_attention(*(x.asarray(a, "float32") for a in (q, k, v, kr, qr)))
    _check(x, out, expected)


@pytest.mark.parametrize("block_size", [None, 4])
def test_sdpa_t5_relative_bias(float32_jax, rng, block_size):
    """T5 (Raffel et al. 2020): a learned scalar per head and bucket of δ added to the
    unscaled scores (``scale=1``); a key-padding mask, and a query row that sees no key."""
    q, k, v = _qkv(rng)
    delta = np.arange(WIDTH) - (LK - 1)  # the full layout's distances
    buckets = relattn.relative_position_bucket(delta, num_buckets=8, max_distance=16)
    table = _exact(rng.normal(size=(8, H)))
    values = np.ascontiguousarray(table[buckets].T)  # (H, W)
    mask = np.ones((B, 1, LQ, LK), bool)
    mask[1, ..., LK - 2 :] = False  # the second sequence's last two keys are padding
    mask[0, 0, 2] = False  # a query that sees no key
    expected = _loop(q, k, v, 1.0, added=lambda h, delta: values[h, delta + LK - 1], mask=mask)
    assert (expected[0, :, 2] == 0).all()
    x = float32_jax
    out = relattn.scaled_dot_product_attention(
        *(x.asarray(a, "float32") for a in (q, k, v)), mask=x.asarray(mask),
        relative_bias=x.asarray(values, "float32"), scale=1.0, block_size=block_size,
    )  # fmt: skip
    _check(x, out, expected)
    assert (x.to_host(out)[0, :, 2] == 0).all()
