"""shaw_attention (Shaw et al. 2018) and the SPEC §4 recipe 2 script.

Two independent NumPy float64 references, written here from the paper:

- ``_materialised_shaw``: tensor2tensor's way, gathering ``a^K_ij`` and ``a^V_ij``
  into ``(Lq, Lk, d)`` tensors, ``w[clip(j - i_aligned, -K, K) + K]`` per pair
  (zero rows beyond ``±K`` for ``"zero"``), then eq. (2)–(3);
- ``_loop_shaw``: explicit loops over ``i``, ``j`` and features.

relattn's result is compared with both on every backend, float32 and float64.
On JAX and Dask these run in float64 only (``FLOAT64_TARGETS`` in ``conftest.py``).
"""

from __future__ import annotations

import importlib.util
import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import reference
from array_api_extra.testing import lazy_xp_function
from hypothesis import example, given
from hypothesis import strategies as st

import relattn
from relattn.shaw import shaw_attention

# Lazy on Dask, traced under jax.jit on JAX, for every backend test.
lazy_xp_modules = [relattn]
for _function in (shaw_attention, relattn.causal_mask, relattn.scaled_dot_product_attention):
    lazy_xp_function(_function)

EXAMPLE = Path(__file__).parents[1] / "examples" / "shaw.py"


# ===============================================================================================
# references
# ===============================================================================================


def _broadcast(lead, a):
    return np.broadcast_to(a, (*lead, *a.shape[-2:]))


def _prepare(q, k, v, key_table, value_table, mask, scale):
    q, k, v, wk, wv = (np.asarray(a, dtype=np.float64) for a in (q, k, v, key_table, value_table))
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    lead = np.broadcast_shapes(*(a.shape[:-2] for a in (q, k, v, wk, wv)))
    q, k, v, wk, wv = (_broadcast(lead, a) for a in (q, k, v, wk, wv))
    mask = np.ones((lq, lk), bool) if mask is None else np.asarray(mask)
    mask = np.broadcast_to(mask, (*lead, lq, lk))
    scale = 1 / math.sqrt(d) if scale is None else scale
    return q, k, v, wk, wv, mask, scale, lead, lq, lk


def _t2t_embeddings(table, lq, lk, out_of_range):
    """tensor2tensor: relative positions matrix, clipped, then one embedding row per pair."""
    radius = (table.shape[0] - 1) // 2
    dist = np.arange(lk)[None, :] - (np.arange(lq)[:, None] + lk - lq)  # j - i_aligned
    a = table[np.clip(dist, -radius, radius) + radius]  # (Lq, Lk, d)
    if out_of_range == "zero":
        a = np.where((np.abs(dist) <= radius)[..., None], a, 0.0)
    return a


def _materialised_shaw(q, k, v, key_table, value_table, mask=None, scale=None, out_of_range="clip"):
    """Shaw et al. eq. (2)–(5) with a^K, a^V materialised as (Lq, Lk, d) tensors."""
    q, k, v, wk, wv, mask, scale, lead, lq, lk = _prepare(
        q, k, v, key_table, value_table, mask, scale
    )
    out = np.zeros((*lead, lq, v.shape[-1]))
    for b in np.ndindex(lead):
        a_k = _t2t_embeddings(wk[b], lq, lk, out_of_range)
        a_v = _t2t_embeddings(wv[b], lq, lk, out_of_range)
        e = np.einsum("id,ijd->ij", q[b], k[b][None, :, :] + a_k) * scale
        alpha = reference.masked_softmax(e, mask[b])
        out[b] = np.einsum("ij,ijd->id", alpha, v[b][None, :, :] + a_v)
    return out


def _row(table, dist, out_of_range):
    """w_{clip(dist, K)}, or a zero row beyond ±K for "zero"."""
    radius = (len(table) - 1) // 2
    if abs(dist) > radius:
        if out_of_range == "zero":
            return np.zeros(table.shape[-1])
        dist = radius if dist > 0 else -radius
    return table[dist + radius]


def _loop_shaw(q, k, v, key_table, value_table, mask=None, scale=None, out_of_range="clip"):
    """e_ij = q_i·(k_j + a^K_ij)·scale, z_i = Σ_j α_ij (v_j + a^V_ij), one pair at a time."""
    q, k, v, wk, wv, mask, scale, lead, lq, lk = _prepare(
        q, k, v, key_table, value_table, mask, scale
    )
    d, dv = q.shape[-1], v.shape[-1]
    out = np.zeros((*lead, lq, dv))
    for b in np.ndindex(lead):
        for i in range(lq):
            e = np.zeros(lk)
            for j in range(lk):
                a_k = _row(wk[b], reference.delta(i, j, lq, lk), out_of_range)
                e[j] = sum(q[b][i, c] * (k[b][j, c] + a_k[c]) for c in range(d)) * scale
            alpha = reference.softmax_row(e, mask[b][i])
            for j in range(lk):
                a_v = _row(wv[b], reference.delta(i, j, lq, lk), out_of_range)
                for c in range(dv):
                    out[b][i, c] += alpha[j] * (v[b][j, c] + a_v[c])
    return out


def _inputs(rng, lead, lq, lk, radius, d=4, dv=3, value_radius=None, table_lead=()):
    value_radius = radius if value_radius is None else value_radius
    return (
        rng.normal(size=(*lead, lq, d)),
        rng.normal(size=(*lead, lk, d)),
        rng.normal(size=(*lead, lk, dv)),
        rng.normal(size=(*table_lead, 2 * radius + 1, d)),
        rng.normal(size=(*table_lead, 2 * value_radius + 1, dv)),
    )


def test_references_agree(rng):
    # the two references are independent; they must agree with each other
    for lq, lk, radius, mode in [(4, 4, 1, "clip"), (3, 5, 2, "zero"), (5, 2, 0, "clip")]:
        args = _inputs(rng, (2,), lq, lk, radius)
        mask = rng.random((2, lq, lk)) < 0.7
        np.testing.assert_allclose(
            _materialised_shaw(*args, mask=mask, out_of_range=mode),
            _loop_shaw(*args, mask=mask, out_of_range=mode),
            rtol=1e-12,
            atol=1e-12,
        )


# ===============================================================================================
# values on every backend
# ===============================================================================================

SHAPES = [(4, 4), (3, 5), (5, 3)]
SHAPE_IDS = ["self", "memory", "lq>lk"]


@pytest.mark.grid
@pytest.mark.parametrize("out_of_range", ["clip", "zero"])
@pytest.mark.parametrize("radius", [0, 1, 2, 9], ids=["K0", "K1", "K2", "K-beyond"])
@pytest.mark.parametrize(("lq", "lk"), SHAPES, ids=SHAPE_IDS)
def test_shaw_matches_references(backend, dtype, rng, lq, lk, radius, out_of_range):
    q, k, v, wk, wv = _inputs(rng, (2, 2), lq, lk, radius)  # (B, H), tables shared by heads
    out = shaw_attention(
        *(backend.asarray(a, dtype) for a in (q, k, v, wk, wv)), out_of_range=out_of_range
    )
    assert tuple(out.shape) == (2, 2, lq, 3)
    assert backend.to_host(out).dtype == np.dtype(dtype)
    expected = _materialised_shaw(q, k, v, wk, wv, out_of_range=out_of_range)
    backend.assert_close(out, expected, dtype)
    backend.assert_close(out, _loop_shaw(q, k, v, wk, wv, out_of_range=out_of_range), dtype)


@pytest.mark.parametrize(("lq", "lk"), SHAPES, ids=SHAPE_IDS)
def test_shaw_clip_and_zero_differ_only_beyond_radius(backend, rng, lq, lk):
    # K >= every distance: both modes are the same; K = 1 < max distance: they differ
    q, k, v, wk, wv = _inputs(rng, (2, 2), lq, lk, 9)
    arrays = [backend.asarray(a, "float64") for a in (q, k, v, wk, wv)]
    clip = backend.to_host(shaw_attention(*arrays, out_of_range="clip"))
    zero = backend.to_host(shaw_attention(*arrays, out_of_range="zero"))
    np.testing.assert_allclose(clip, zero, rtol=1e-12)
    small = [*arrays[:3], arrays[3][8:11, :], arrays[4][8:11, :]]  # K = 1
    clip = backend.to_host(shaw_attention(*small, out_of_range="clip"))
    zero = backend.to_host(shaw_attention(*small, out_of_range="zero"))
    assert np.abs(clip - zero).max() > 1e-3


def test_shaw_different_key_and_value_radii(backend, dtype, rng):
    q, k, v, wk, wv = _inputs(rng, (2, 2), 3, 5, 1, value_radius=2)
    for mode in ("clip", "zero"):
        out = shaw_attention(
            *(backend.asarray(a, dtype) for a in (q, k, v, wk, wv)), out_of_range=mode
        )
        backend.assert_close(out, _materialised_shaw(q, k, v, wk, wv, out_of_range=mode), dtype)


def test_shaw_per_head_tables(backend, dtype, rng):
    # tables (H, 2K+1, d) broadcast against q (B, H, Lq, d)
    q, k, v, wk, wv = _inputs(rng, (2, 2), 4, 4, 1, table_lead=(2,))
    out = shaw_attention(*(backend.asarray(a, dtype) for a in (q, k, v, wk, wv)))
    expected = _materialised_shaw(q, k, v, wk, wv)
    backend.assert_close(out, expected, dtype)
    # each head really uses its own table
    shared = _materialised_shaw(q, k, v, wk[0], wv[0])
    assert np.abs(expected[:, 1:] - shared[:, 1:]).max() > 1e-3


@pytest.mark.parametrize(("lq", "lk"), SHAPES, ids=SHAPE_IDS)
def test_shaw_mask_with_fully_masked_row(backend, dtype, rng, lq, lk):
    q, k, v, wk, wv = _inputs(rng, (2, 2), lq, lk, 1)
    mask = rng.random((2, 1, lq, lk)) < 0.6
    mask[..., 0] = True
    mask[0, 0, 1] = False  # query 1 of batch 0 sees no key
    out = shaw_attention(
        *(backend.asarray(a, dtype) for a in (q, k, v, wk, wv)), mask=backend.asarray(mask)
    )
    expected = _materialised_shaw(q, k, v, wk, wv, mask=mask)
    backend.assert_close(out, expected, dtype)
    backend.assert_close(out, _loop_shaw(q, k, v, wk, wv, mask=mask), dtype)
    got = backend.to_host(out)
    assert np.isfinite(got).all()
    assert (got[0, :, 1] == 0).all()  # exact zeros, not NaN, not the value table
    assert np.abs(got[1, :, 1]).max() > 0


@pytest.mark.parametrize(("lq", "lk"), [(4, 4), (3, 5)], ids=["self", "memory"])
@pytest.mark.parametrize("out_of_range", ["clip", "zero"])
def test_shaw_causal_mask(backend, dtype, rng, lq, lk, out_of_range):
    q, k, v, wk, wv = _inputs(rng, (2, 2), lq, lk, 1)
    causal = relattn.causal_mask(lq, lk, xp=backend.lib, device=backend.device)
    out = shaw_attention(
        *(backend.asarray(a, dtype) for a in (q, k, v, wk, wv)),
        mask=causal,
        out_of_range=out_of_range,
    )
    mask = np.arange(lk)[None, :] <= np.arange(lq)[:, None] + lk - lq
    expected = _materialised_shaw(q, k, v, wk, wv, mask=mask, out_of_range=out_of_range)
    backend.assert_close(out, expected, dtype)
    # future rows of the tables (δ > 0) take no part: changing them changes nothing
    wk2, wv2 = wk.copy(), wv.copy()
    wk2[2], wv2[2] = 100.0, 100.0
    again = shaw_attention(
        *(backend.asarray(a, dtype) for a in (q, k, v, wk2, wv2)),
        mask=causal,
        out_of_range=out_of_range,
    )
    backend.assert_close(again, expected, dtype)


def test_shaw_single_query_and_single_key(backend, dtype, rng):
    for lq, lk in [(1, 4), (4, 1)]:  # Lq = Lk = 1: the property test
        q, k, v, wk, wv = _inputs(rng, (2, 2), lq, lk, 1)
        out = shaw_attention(*(backend.asarray(a, dtype) for a in (q, k, v, wk, wv)))
        backend.assert_close(out, _materialised_shaw(q, k, v, wk, wv), dtype)


def test_shaw_scale(backend, dtype, rng):
    q, k, v, wk, wv = _inputs(rng, (2, 2), 4, 4, 1)
    out = shaw_attention(*(backend.asarray(a, dtype) for a in (q, k, v, wk, wv)), scale=0.3)
    backend.assert_close(out, _materialised_shaw(q, k, v, wk, wv, scale=0.3), dtype)
    assert np.abs(_materialised_shaw(q, k, v, wk, wv) - backend.to_host(out)).max() > 1e-3


@pytest.mark.parametrize(("lq", "lk"), SHAPES, ids=SHAPE_IDS)
def test_shaw_zero_tables_equal_scaled_dot_product_attention(backend, dtype, rng, lq, lk):
    q, k, v, _, _ = _inputs(rng, (2, 2), lq, lk, 2)
    mask = rng.random((lq, lk)) < 0.6
    mask[0] = False
    arrays = [backend.asarray(a, dtype) for a in (q, k, v)]
    m = backend.asarray(mask)
    zeros = [backend.asarray(np.zeros((5, n)), dtype) for n in (4, 3)]
    out = shaw_attention(*arrays, *zeros, mask=m)
    sdpa = relattn.scaled_dot_product_attention(*arrays, mask=m)
    backend.assert_close(out, backend.to_host(sdpa), dtype)
    backend.assert_close(out, reference.attention(q, k, v, mask=mask), dtype)


def test_shaw_mixed_dtypes_promote(backend, rng):
    q, k, v, wk, wv = _inputs(rng, (2, 2), 4, 4, 1)
    out = shaw_attention(
        backend.asarray(q, "float32"),
        backend.asarray(k, "float64"),
        backend.asarray(v, "float32"),
        backend.asarray(wk, "float32"),
        backend.asarray(wv, "float64"),
    )
    assert backend.to_host(out).dtype == np.float64
    f32 = [a.astype(np.float32).astype(np.float64) for a in (q, v, wk)]
    expected = _materialised_shaw(f32[0], k, f32[1], f32[2], wv)
    backend.assert_close(out, expected, "float64")


# ===============================================================================================
# transforms: jit, gradients, memory
# ===============================================================================================


def test_shaw_jit_equals_eager(jit_backend, dtype, rng):
    lq, lk = 3, 5
    q, k, v, wk, wv = _inputs(rng, (2, 2), lq, lk, 1)
    mask = rng.random((lq, lk)) < 0.6
    mask[1] = False
    arrays = [jit_backend.asarray(a, dtype) for a in (q, k, v, wk, wv)]
    m = jit_backend.asarray(mask)

    def f(q, k, v, wk, wv, m):
        return shaw_attention(q, k, v, wk, wv, mask=m, out_of_range="zero")

    jitted = jit_backend.jit(f)(*arrays, m)
    eager = f(*arrays, m)
    jit_backend.assert_close(jitted, jit_backend.to_host(eager), dtype)
    jit_backend.assert_close(jitted, _materialised_shaw(q, k, v, wk, wv, mask, None, "zero"), dtype)


@pytest.mark.parametrize("out_of_range", ["clip", "zero"])
@pytest.mark.parametrize(("lq", "lk"), SHAPES, ids=SHAPE_IDS)
def test_gradcheck_shaw(torch_backend, rng, lq, lk, out_of_range):
    torch = torch_backend.lib
    leaves = tuple(
        torch_backend.asarray(a, "float64").requires_grad_(True)
        for a in _inputs(rng, (2,), lq, lk, 1)
    )
    mask = rng.random((lq, lk)) < 0.6
    mask[:, 0] = True
    mask[lq - 1] = False
    mask_t = torch_backend.asarray(mask)

    def f(q, k, v, wk, wv):
        return shaw_attention(q, k, v, wk, wv, mask=mask_t, out_of_range=out_of_range)

    out = f(*leaves)
    assert torch.all(out[:, lq - 1] == 0)
    assert torch.autograd.gradcheck(f, leaves)
    # every input gets a gradient (the tables through shift and unshift)
    out.square().sum().backward()
    for leaf in leaves:
        assert leaf.grad is not None and torch.count_nonzero(leaf.grad) > 0


def test_jax_grad_matches_central_differences(jax_backend, rng):
    import jax
    import jax.numpy as jnp

    def on(a):
        return jax_backend.asarray(a, "float64")

    lq, lk = 3, 5
    params = [on(a) for a in _inputs(rng, (2,), lq, lk, 1)]
    mask = jax_backend.asarray(np.arange(lk)[None, :] <= np.arange(lq)[:, None] + 1)
    weights = on(rng.normal(size=(2, lq, 3)))

    @jax.jit
    def loss(p):
        return jnp.sum(shaw_attention(*p, mask=mask) * weights)

    grad = jax.jit(jax.grad(loss))(params)
    jax_backend.assert_directional_derivatives(loss, grad, params, rng)


def test_shaw_memory_has_no_pair_tensor(rng):
    # SPEC §5: O(B·H·Lq·Lk + W·d); an (Lq, Lk, d) float64 tensor would be 2 MiB here
    lq = lk = 64
    d = 64
    q, k, v, wk, wv = _inputs(rng, (), lq, lk, 4, d=d, dv=d)
    shaw_attention(q, k, v, wk, wv)  # warm up lazy imports and caches
    tracemalloc.start()
    try:
        shaw_attention(q, k, v, wk, wv)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    pair_tensor = lq * lk * d * 8
    assert peak < pair_tensor / 4, (peak, pair_tensor)


# ===============================================================================================
# bad input
# ===============================================================================================


def _call(b, q=(3, 4), k=(5, 4), v=(5, 2), key_table=(3, 4), value_table=(5, 2), **kw):
    def f(*shape):
        return b.asarray(np.random.default_rng(0).normal(size=shape), "float64")

    return shaw_attention(f(*q), f(*k), f(*v), f(*key_table), f(*value_table), **kw)


V, T = ValueError, TypeError

ERRORS = [
    ("key-table-even", lambda b: _call(b, key_table=(4, 4)), V, r"^key_embeddings .* odd"),
    ("value-table-even", lambda b: _call(b, value_table=(2, 2)), V, r"^value_embeddings .*odd.*2"),
    (
        "key-table-features",
        lambda b: _call(b, key_table=(3, 2)),
        V,
        r"^key_embeddings must have the feature size d = 4, got shape \(3, 2\)",
    ),
    (
        "value-table-features",
        lambda b: _call(b, value_table=(3, 4)),
        V,
        r"^value_embeddings must have the feature size d_v = 2, got shape \(3, 4\)",
    ),
    ("key-table-1d", lambda b: _call(b, key_table=(4,)), V, r"^key_embeddings must have shape"),
    ("value-table-1d", lambda b: _call(b, value_table=(2,)), V, r"^value_embeddings .* shape"),
    (
        "out-of-range",
        lambda b: _call(b, out_of_range="wrap"),
        V,
        r"^out_of_range must be one of \('clip', 'zero'\), got 'wrap'",
    ),
    ("qk-features", lambda b: _call(b, k=(5, 3)), V, r"^k must have the feature size of q, d = 4"),
    ("kv-length", lambda b: _call(b, v=(4, 2)), V, r"^v must have one row per key, Lk = 5"),
    (
        "table-leading",
        lambda b: _call(b, q=(2, 3, 4), k=(2, 5, 4), v=(2, 5, 2), key_table=(3, 3, 4)),
        V,
        r"leading .*key_embeddings \(3,\)",
    ),
    (
        "mask-shape",
        lambda b: _call(b, mask=b.asarray(np.ones((5, 3), bool))),
        V,
        r"^mask must be broadcastable",
    ),
    (
        "mask-float",
        lambda b: _call(b, mask=b.asarray(np.ones((3, 5)), "float64")),
        T,
        r"^mask must be a boolean",
    ),
    (
        "mask-int",
        lambda b: _call(b, mask=b.asarray(np.ones((3, 5), dtype=np.int64))),
        T,
        r"^mask must be a boolean",
    ),
]


@pytest.mark.parametrize(
    ("call", "error", "match"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_shaw_bad_input(backend, call, error, match):
    with pytest.raises(error, match=match):
        call(backend)


def test_shaw_integer_table(backend):
    f = backend.asarray(np.ones((3, 4)), "float64")
    table = backend.asarray(np.ones((3, 4), dtype=np.int64))
    with pytest.raises(TypeError, match=r"^key_embeddings must have a real floating dtype"):
        shaw_attention(f, f, f, table, f)


def test_shaw_mixed_libraries(torch_backend):
    a = np.ones((3, 4))
    with pytest.raises(TypeError, match=r"different libraries.*key_embeddings is a torch array"):
        shaw_attention(a, a, a, torch_backend.asarray(a), a)
    with pytest.raises(TypeError, match=r"^value_embeddings must be an array, got list"):
        shaw_attention(a, a, a, a, [[0.0] * 4] * 3)


# ===============================================================================================
# property test (NumPy)
# ===============================================================================================


@example(lq=1, lk=1, radius=0, value_radius=2, out_of_range="zero", masked=False, seed=0)
@example(lq=1, lk=1, radius=1, value_radius=0, out_of_range="clip", masked=True, seed=1)
@given(
    lq=st.integers(1, 6),
    lk=st.integers(1, 6),
    radius=st.integers(0, 7),
    value_radius=st.integers(0, 7),
    out_of_range=st.sampled_from(["clip", "zero"]),
    masked=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_shaw_property(lq, lk, radius, value_radius, out_of_range, masked, seed):
    rng = np.random.default_rng(seed)
    q, k, v, wk, wv = _inputs(rng, (2,), lq, lk, radius, value_radius=value_radius)
    mask = rng.random((2, lq, lk)) < 0.6 if masked else None
    out = shaw_attention(q, k, v, wk, wv, mask=mask, out_of_range=out_of_range)
    expected = _loop_shaw(q, k, v, wk, wv, mask=mask, out_of_range=out_of_range)
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)


# ===============================================================================================
# SPEC §4 recipe 2: examples/shaw.py
# ===============================================================================================


def _load_example():
    spec = importlib.util.spec_from_file_location("relattn_example_shaw", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recipe_reference(example, seed, mask):
    """The multi-head layer in NumPy, attention by the materialised Shaw reference."""
    p = example.inputs(seed)
    heads = example.HEADS
    b, length, d_model = p["x"].shape

    def split(a):
        return a.reshape(b, length, heads, d_model // heads).transpose(0, 2, 1, 3)

    q, k, v = (split(p["x"] @ p[name]) for name in ("w_q", "w_k", "w_v"))
    z = _materialised_shaw(q, k, v, p["key_embeddings"], p["value_embeddings"], mask=mask)
    return z.transpose(0, 2, 1, 3).reshape(b, length, d_model) @ p["w_o"]


@pytest.mark.parametrize("seed", [0, 1])
def test_example_recipe(recipe_backend, seed):
    example = _load_example()
    results = example.run(recipe_backend.lib, seed=seed)
    length = example.LENGTH
    lengths = np.asarray(example.LENGTHS)
    padding = (np.arange(length)[None, :] < lengths[:, None])[:, None, None, :]
    causal = np.tril(np.ones((length, length), bool))
    expected = {
        "encoder": _recipe_reference(example, seed, padding),
        "decoder": _recipe_reference(example, seed, causal),
    }
    assert set(results) == set(expected)
    for name, want in expected.items():
        assert isinstance(results[name], np.ndarray) and results[name].dtype == np.float64
        np.testing.assert_allclose(results[name], want, rtol=1e-10, atol=1e-12)
    assert np.abs(results["encoder"] - results["decoder"]).max() > 1e-3
