"""xpos_embedding: rotary embedding with a decay per frequency (Sun et al. 2022, §3.2).

Against a float64 loop written from the paper's formula, sharing no code with relattn:
pair ``k`` of the row at position ``n`` rotated by ``n·θ_k`` and multiplied by
``ζ_k^(±(n - centre)/γ)``, ``ζ_k = (2k + 0.4 r)/(1.4 r)`` (torchscale's ``XPOS``). With
hypothesis: ``q̃_n·k̃_m`` depends on ``n - m`` only. A decode step (queries at
``Lk - Lq + arange(Lq)``, cached keys at ``arange(Lk)``) gives the last rows of the full
computation, and attention through ``scaled_dot_product_attention`` equals a loop, dense
and blockwise. Gradients reach ``x`` and real positions; jit and compile equal eager.

Where torchscale 0.3.0 is importable (not a dependency), its ``XPOS`` equals relattn's with
the centre at ``⌈(L + offset)/2⌉``, full and with a cache. Where rotary-embedding-torch
0.9.1 is importable (it is not a dependency either: put it on the path), its
``rotate_queries_and_keys`` equals relattn's with the centre at ``L // 2``, and its
``rotate_queries_with_cached_keys`` centres queries at ``Lq // 2`` but keys at ``Lk // 2``:
its decode scores differ from its own full computation's last rows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import relattn
from relattn.xpos import xpos_embedding

LAYOUTS = ("interleaved", "concatenated")


def _xpos_loop(x, positions, *, layout, downscale=False, scale_base=512.0, centre=0.0,
               base=10000.0, rotary_dim=None):  # fmt: skip
    """Sun et al. 2022, §3.2, one pair at a time: rotate by ``n·θ_k``, scale by
    ``ζ_k^(±(n - centre)/γ)``."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    r = d if rotary_dim is None else rotary_dim
    out = x.copy()
    sign = -1.0 if downscale else 1.0
    for index in np.ndindex(*x.shape[:-1]):
        n = float(np.broadcast_to(positions, x.shape[:-1])[index])
        for k in range(r // 2):
            a, b = (2 * k, 2 * k + 1) if layout == "interleaved" else (k, k + r // 2)
            angle = n * base ** (-2.0 * k / r)
            zeta = (2 * k + 0.4 * r) / (1.4 * r)
            s = zeta ** (sign * (n - centre) / scale_base)
            xa, xb = x[(*index, a)], x[(*index, b)]
            out[(*index, a)] = s * (xa * math.cos(angle) - xb * math.sin(angle))
            out[(*index, b)] = s * (xa * math.sin(angle) + xb * math.cos(angle))
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("downscale", [False, True])
def test_values(backend, dtype, rng, layout, downscale):
    x = rng.normal(size=(2, 5, 8))
    positions = np.array([0, 3, 100, 700, 2000])
    want = _xpos_loop(x, positions, layout=layout, downscale=downscale, centre=600.0)
    got = xpos_embedding(
        backend.asarray(x, dtype), backend.asarray(positions),
        layout=layout, downscale=downscale, centre=600.0,
    )  # fmt: skip
    assert backend.is_array(got)
    assert got.dtype == backend.dtype(dtype)
    backend.assert_close(got, want, dtype)


def test_defaults_partial_rotary_and_per_row_positions(backend, rng):
    x = rng.normal(size=(2, 3, 4, 10))
    want = _xpos_loop(x, np.arange(4), layout="interleaved")
    got = xpos_embedding(backend.asarray(x, "float64"), layout="interleaved")
    backend.assert_close(got, want, "float64")
    positions = np.array([[5, 6, 7, 8], [0, 1, 2, 3]])[:, None, :]  # (B, 1, L)
    want = _xpos_loop(x, positions, layout="concatenated", rotary_dim=6, scale_base=64.0,
                      base=100.0)  # fmt: skip
    got = xpos_embedding(
        backend.asarray(x, "float64"), backend.asarray(positions),
        layout="concatenated", rotary_dim=6, scale_base=64.0, base=100.0,
    )  # fmt: skip
    backend.assert_close(got, want, "float64")


@given(
    n=st.integers(0, 3000), m=st.integers(0, 3000), shift=st.integers(-500, 500),
    centre=st.floats(-100.0, 3000.0), layout=st.sampled_from(LAYOUTS),
)  # fmt: skip
def test_scores_depend_on_the_distance_only(n, m, shift, centre, layout):
    rng = np.random.default_rng(n * 7 + m)
    q, k = rng.normal(size=(2, 1, 8))

    def score(n, m):
        qn = xpos_embedding(q, np.array([n]), layout=layout, centre=centre)
        km = xpos_embedding(k, np.array([m]), layout=layout, centre=centre, downscale=True)
        return float(qn[0] @ km[0])

    shifted = max(-min(n, m), shift)
    np.testing.assert_allclose(score(n + shifted, m + shifted), score(n, m), rtol=1e-9,
                               atol=1e-9)  # fmt: skip


def _attention_loop(q, k, v):
    """Causal ``softmax(q_i·k_j / √d) v`` with query ``i`` at ``i + Lk - Lq``."""
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    out = np.zeros((*q.shape[:-1], v.shape[-1]))
    for index in np.ndindex(*q.shape[:-2]):
        for i in range(lq):
            s = np.array([q[index][i] @ k[index][j] for j in range(i + lk - lq + 1)]) / math.sqrt(d)
            w = np.exp(s - s.max())
            out[index][i] = (w / w.sum()) @ v[index][: len(s)]
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode_equals_the_full_computation(backend, dtype, rng, layout):
    """Queries at their own positions against cached keys at theirs: the last ``Lq`` rows
    of the full computation, and attention equal to the loop, dense and blockwise."""
    lq, lk = 2, 9
    q_full = rng.normal(size=(2, 3, lk, 8))
    k, v = rng.normal(size=(2, 2, 3, lk, 8))
    centre = lk // 2
    kk = _xpos_loop(k, np.arange(lk), layout=layout, downscale=True, centre=centre)
    qq = _xpos_loop(q_full, np.arange(lk), layout=layout, centre=centre)
    expected = _attention_loop(qq[..., -lq:, :], kk, v)
    xq = backend.asarray(q_full[..., -lq:, :], dtype)
    eq = xpos_embedding(xq, backend.asarray(np.arange(lk - lq, lk)), layout=layout, centre=centre)
    ek = xpos_embedding(backend.asarray(k, dtype), layout=layout, downscale=True, centre=centre)
    backend.assert_close(eq, qq[..., -lq:, :], dtype)
    for block_size in (None, 4):
        out = relattn.scaled_dot_product_attention(
            eq, ek, backend.asarray(v, dtype), causal=True, block_size=block_size
        )
        backend.assert_close(out, expected, dtype)


def test_torch_gradients(torch_backend, rng):
    torch = torch_backend.lib
    x = torch_backend.asarray(rng.normal(size=(2, 4, 6)), "float64").requires_grad_(True)
    positions = torch_backend.asarray(np.array([0.5, 3.0, 40.0, 700.25]), "float64")
    positions.requires_grad_(True)

    def f(x, p):
        return xpos_embedding(x, p, layout="interleaved", scale_base=8.0, centre=2.0)

    assert torch.autograd.gradcheck(f, (x, positions))


def test_jax_gradients(jax_backend, rng):
    import jax
    import jax.numpy as jnp

    x = jax_backend.asarray(rng.normal(size=(2, 4, 6)), "float64")
    positions = jax_backend.asarray(np.array([0.5, 3.0, 40.0, 700.25]), "float64")
    w = jax_backend.asarray(rng.normal(size=(2, 4, 6)), "float64")

    def loss(p):
        return jnp.sum(w * xpos_embedding(p[0], p[1], layout="concatenated", scale_base=8.0))

    f = jax.jit(loss)
    grad = jax.jit(jax.grad(f))([x, positions])
    assert all(float(jnp.abs(g).max()) > 0 for g in grad)
    jax_backend.assert_directional_derivatives(f, grad, [x, positions], rng)


def test_jit_equals_eager(jit_backend, dtype, rng):
    x = jit_backend.asarray(rng.normal(size=(2, 5, 8)), dtype)
    positions = jit_backend.asarray(np.arange(3, 8))

    def f(x, positions):
        return (
            xpos_embedding(x, positions, layout="interleaved", centre=4.0),
            xpos_embedding(x, positions, layout="concatenated", downscale=True, rotary_dim=4),
        )

    compiled = jit_backend.jit(f)(x, positions)
    eager = f(x, positions)
    for a, b in zip(compiled, eager, strict=True):
        jit_backend.assert_close(a, jit_backend.to_numpy(b), dtype)


# ===============================================================================================
# torchscale 0.3.0 (optional)
# ===============================================================================================


def _torchscale(torch, d, scale_base, calls):
    """torchscale's ``XPOS(d, scale_base)``, made and called with torch's default dtype
    float64: it builds ``ζ`` (at construction) and ``θ_k`` in the default dtype; left in
    float32, its float64 outputs are off by 1e-7 to 3e-6. ``calls``: ``(x, offset,
    downscale)``."""
    module = pytest.importorskip("torchscale.component.xpos_relative_position")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        xpos = module.XPOS(d, scale_base=scale_base)
        assert xpos.scale.dtype == torch.float64
        return [xpos(x, offset=offset, downscale=downscale) for x, offset, downscale in calls]
    finally:
        torch.set_default_dtype(previous)


def _assert_1e10(got, want):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("length", [8, 9])
@pytest.mark.parametrize("scale_base", [512.0, 16.0])
def test_torchscale_full_computation_agrees(length, scale_base):
    """torchscale 0.3.0's ``torchscale.component.xpos_relative_position.XPOS`` on queries
    (``offset=0``) and keys (``downscale=True``), ``(B·H, L, d)`` as its
    ``MultiheadAttention`` passes them, float64: relattn's ``"interleaved"`` layout with
    the centre at ``⌈L/2⌉`` (its ``min_pos = -(length + offset) // 2``; an odd ``L``
    tells it from ``L // 2``), to 1e-10."""
    torch = pytest.importorskip("torch")
    d = 8
    rng = np.random.default_rng(5)
    q, k = (torch.asarray(a) for a in rng.normal(size=(2, 6, length, d)))
    q_ts, k_ts = _torchscale(torch, d, scale_base, [(q, 0, False), (k, 0, True)])
    kw = {"layout": "interleaved", "scale_base": scale_base, "centre": (length + 1) // 2}
    _assert_1e10(q_ts, xpos_embedding(q, **kw))
    _assert_1e10(k_ts, xpos_embedding(k, downscale=True, **kw))


@pytest.mark.parametrize("lq, lk", [(1, 9), (3, 40)])
def test_torchscale_decode_agrees(lq, lk):
    """torchscale 0.3.0's ``XPOS`` with a cache, as its ``MultiheadAttention`` calls it
    (``offset = src_len - 1`` for one new query; here ``Lk - Lq`` for ``Lq``): the queries
    at ``Lk - Lq + arange(Lq)`` and the keys at ``arange(Lk)``, both about ``⌈Lk/2⌉``,
    equal relattn's with those positions and that centre to 1e-10, and the scores are the
    last rows of its full computation's (one centre for both, unlike
    rotary-embedding-torch's ``rotate_queries_with_cached_keys`` below)."""
    torch = pytest.importorskip("torch")
    d, scale_base = 16, 16.0
    rng = np.random.default_rng(6)
    q_full, k = (torch.asarray(a) for a in rng.normal(size=(2, 6, lk, d)))
    q = q_full[:, -lq:]
    q_ts, k_ts, qf_ts = _torchscale(
        torch, d, scale_base, [(q, lk - lq, False), (k, 0, True), (q_full, 0, False)]
    )
    kw = {"layout": "interleaved", "scale_base": scale_base, "centre": (lk + 1) // 2}
    _assert_1e10(q_ts, xpos_embedding(q, torch.arange(lk - lq, lk), **kw))
    _assert_1e10(k_ts, xpos_embedding(k, downscale=True, **kw))
    full = (qf_ts @ k_ts.transpose(-1, -2))[:, -lq:]
    _assert_1e10(q_ts @ k_ts.transpose(-1, -2), full)


# ===============================================================================================
# rotary-embedding-torch 0.9.1 (optional)
# ===============================================================================================


def _library(torch, d):
    ret = pytest.importorskip("rotary_embedding_torch")
    module = ret.RotaryEmbedding(dim=d, use_xpos=True, xpos_scale_base=512, cache_if_possible=False)
    module = module.double()
    # Its buffers are made in float32 and only cast: ζ again in float64 (its own formula),
    # so that the comparison holds to 1e-10.
    module.scale = (torch.arange(0, d, 2, dtype=torch.float64) + 0.4 * d) / (1.4 * d)
    return module, module.freqs.detach().numpy()


def test_rotary_embedding_torch_full_computation_agrees():
    torch = pytest.importorskip("torch")
    lk, d = 9, 8
    module, freqs = _library(torch, d)
    rng = np.random.default_rng(3)
    q, k = (torch.asarray(a) for a in rng.normal(size=(2, 1, 2, lk, d)))
    q_lib, k_lib = module.rotate_queries_and_keys(q, k)
    kw = {"layout": "interleaved", "frequencies": torch.asarray(freqs), "centre": lk // 2}
    np.testing.assert_allclose(q_lib.numpy(), xpos_embedding(q, **kw).numpy(), rtol=1e-10,
                               atol=1e-12)  # fmt: skip
    np.testing.assert_allclose(k_lib.numpy(), xpos_embedding(k, downscale=True, **kw).numpy(),
                               rtol=1e-10, atol=1e-12)  # fmt: skip


def test_rotary_embedding_torch_cached_keys_centre_queries_differently():
    """``rotate_queries_with_cached_keys``: queries scaled about ``Lq // 2``, keys about
    ``Lk // 2``; its decode scores are off the full computation's last rows by
    ``ζ_k^((Lk//2 - Lq//2)/γ)`` per pair. relattn's, one centre for both, are not."""
    torch = pytest.importorskip("torch")
    lq, lk, d = 1, 9, 8
    module, freqs = _library(torch, d)
    rng = np.random.default_rng(4)
    q_full, k = (torch.asarray(a) for a in rng.normal(size=(2, 1, 2, lk, d)))
    q = q_full[..., -lq:, :]
    q_lib, k_lib = module.rotate_queries_with_cached_keys(q, k)
    qf_lib, kf_lib = module.rotate_queries_and_keys(q_full, k)
    kw = {"layout": "interleaved", "frequencies": torch.asarray(freqs)}
    qpos = torch.arange(lk - lq, lk)
    # Its cached path is relattn's with two centres.
    mine_q = xpos_embedding(q, qpos, centre=lq // 2, **kw)
    mine_k = xpos_embedding(k, centre=lk // 2, downscale=True, **kw)
    np.testing.assert_allclose(q_lib.numpy(), mine_q.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(k_lib.numpy(), mine_k.numpy(), rtol=1e-10, atol=1e-12)
    full = (qf_lib @ kf_lib.transpose(-1, -2))[..., -lq:, :].numpy()
    cached = (q_lib @ k_lib.transpose(-1, -2)).numpy()
    assert np.abs(cached - full).max() > 1e-3
    ours = (xpos_embedding(q, qpos, centre=0.0, **kw)
            @ xpos_embedding(k, centre=0.0, downscale=True, **kw).transpose(-1, -2))  # fmt: skip
    np.testing.assert_allclose(ours.numpy(), full, rtol=1e-10, atol=1e-12)


# ===============================================================================================
# Bad input
# ===============================================================================================

_X = np.ones((3, 4))

BAD = {
    "layout-none": (lambda: xpos_embedding(_X), TypeError, r"layout is required"),
    "layout": (
        lambda: xpos_embedding(_X, layout="halves"),
        ValueError,
        r"^layout must be one of",
    ),
    "scale_base-0": (
        lambda: xpos_embedding(_X, layout="interleaved", scale_base=0),
        ValueError,
        r"^scale_base must be a positive finite number, got 0.0",
    ),
    "scale_base-str": (
        lambda: xpos_embedding(_X, layout="interleaved", scale_base="512"),
        TypeError,
        r"^scale_base must be a real number, got str",
    ),
    "centre-nan": (
        lambda: xpos_embedding(_X, layout="interleaved", centre=float("nan")),
        ValueError,
        r"^centre must be a finite number, got nan",
    ),
    "downscale-int": (
        lambda: xpos_embedding(_X, layout="interleaved", downscale=1),
        TypeError,
        r"^downscale must be a bool, got int 1",
    ),
    "x-odd": (
        lambda: xpos_embedding(np.ones((3, 5)), layout="interleaved"),
        ValueError,
        r"^x must have an even feature size d",
    ),
    "positions-length": (
        lambda: xpos_embedding(_X, np.arange(4), layout="interleaved"),
        ValueError,
        r"^positions must have shape \(L,\)",
    ),
    "x-none": (
        lambda: xpos_embedding(None, layout="interleaved"),
        TypeError,
        r"^x must be an array, got None",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input(name):
    call, error, match = BAD[name]
    with pytest.raises(error, match=match):
        call()
