"""rotary_position_embedding (Su et al. 2021, RoFormer eq. (34); SPEC §2.11).

The reference ``_rope_loop`` rotates one feature pair of one row at a time by
``p·θ_k``, ``θ_k = base^(-2k/r)``: pairs ``(2k, 2k+1)`` in the interleaved
layout, ``(k, k + r/2)`` in the concatenated one; features ``r … d-1`` unchanged.
It shares no code with relattn. Every backend, float32 and float64 (float16 and
bfloat16 where they exist).
On JAX and Dask these run in float64 only (``FLOAT64_TARGETS`` in ``conftest.py``).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import reference
from array_api_extra.testing import lazy_xp_function
from hypothesis import given, settings
from hypothesis import strategies as st

import relattn
import relattn.rotary

# Lazy on Dask, traced under jax.jit on JAX, for every backend test.
lazy_xp_modules = [relattn]
for _function in (
    relattn.rotary_position_embedding,
    relattn.scaled_dot_product_attention,
    relattn.complex_order_embedding,
):
    lazy_xp_function(_function)

EXAMPLE = Path(__file__).parents[1] / "examples" / "rope.py"
LAYOUTS = ("interleaved", "concatenated")


# ===============================================================================================
# reference
# ===============================================================================================


def _pairs(layout, rotary_dim):
    half = rotary_dim // 2
    if layout == "interleaved":
        return [(2 * k, 2 * k + 1) for k in range(half)]
    return [(k, k + half) for k in range(half)]


def _rope_loop(x, positions=None, *, base=10000.0, layout="interleaved", rotary_dim=None,
               frequencies=None):  # fmt: skip
    """Eq. (34): each pair ``(a, b)`` of row ``p`` -> ``(a cos - b sin, a sin + b cos)`` of pθ."""
    x = np.asarray(x, dtype=np.float64)
    length, d = x.shape[-2:]
    r = d if rotary_dim is None else rotary_dim
    positions = np.arange(length) if positions is None else np.asarray(positions, np.float64)
    if frequencies is None:
        theta = [base ** (-2 * k / r) for k in range(r // 2)]
    else:
        theta = [float(w) for w in frequencies]
    out = x.copy()
    for idx in np.ndindex(x.shape[:-2]):
        for row in range(length):
            for k, (a, b) in enumerate(_pairs(layout, r)):
                angle = float(positions[row]) * theta[k]
                c, s = math.cos(angle), math.sin(angle)
                out[idx][row, a] = x[idx][row, a] * c - x[idx][row, b] * s
                out[idx][row, b] = x[idx][row, a] * s + x[idx][row, b] * c
    return out


def _rounded(a, dtype):
    """``a`` as the backend holds it in ``dtype`` (the reference sees the same inputs)."""
    return np.asarray(a).astype(dtype).astype(np.float64) if dtype != "float64" else np.asarray(a)


def test_reference_is_a_rotation():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 6))
    out = _rope_loop(x, [0.0, 1.5, -7.0])
    np.testing.assert_allclose(out[0], x[0])  # position 0: identity
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1))
    # the first pair turns by exactly p radians (θ_0 = 1)
    angle = np.arctan2(out[1, 1], out[1, 0]) - np.arctan2(x[1, 1], x[1, 0])
    assert math.isclose(math.remainder(angle - 1.5, 2 * math.pi), 0.0, abs_tol=1e-12)


# ===============================================================================================
# values on every backend
# ===============================================================================================

CASES = ["default", "lead-dims", "rotary_dim", "no-rotation", "frequencies", "offset", "real"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES)
def test_rope_matches_eq34(backend, dtype, rng, case, layout):
    length, d = 5, 8
    shape = (2, 3, length, d) if case == "lead-dims" else (length, d)
    x = rng.normal(size=shape)
    kwargs, positions, positions_np = {}, None, None
    if case in ("rotary_dim", "no-rotation"):
        kwargs["rotary_dim"] = 4 if case == "rotary_dim" else 0
    if case == "frequencies":
        freqs = 10000.0 ** (-np.arange(d // 2) / (d // 2)) / 4.0  # position interpolation by 4
        kwargs["frequencies"] = backend.asarray(freqs, dtype)
        freqs_ref = _rounded(freqs, dtype)
    if case == "offset":  # a decoder with a cache of 100 tokens
        positions_np = 100 + np.arange(length)
        positions = backend.asarray(positions_np)
    if case == "real":
        positions_np = np.array([-3.5, 0.25, 7.0, 1e3, -2e4])
        positions = backend.asarray(positions_np, dtype)
    out = relattn.rotary_position_embedding(
        backend.asarray(x, dtype), positions, layout=layout, **kwargs
    )
    expected = _rope_loop(
        x, positions_np, layout=layout, rotary_dim=kwargs.get("rotary_dim"),
        frequencies=freqs_ref if case == "frequencies" else None,
    )  # fmt: skip
    assert tuple(out.shape) == shape
    backend.assert_close(out, expected, dtype)
    if case in ("rotary_dim", "no-rotation"):
        r = kwargs["rotary_dim"]
        np.testing.assert_array_equal(backend.to_numpy(out)[..., r:], x[..., r:].astype(dtype))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_positions_per_batch_row(backend, dtype, rng, layout):
    """``positions (B, 1, L)``: each batch row rotated at its own positions (a left-padded
    batch, a cache filled to a different length per row), equal to eq. (34) per row."""
    x = rng.normal(size=(2, 3, 4, 8))
    positions = np.array([[0, 1, 2, 3], [7, 8, 9, 10]])[:, None, :]  # (B, 1, L)
    out = relattn.rotary_position_embedding(
        backend.asarray(x, dtype), backend.from_host(positions), layout=layout
    )
    expected = np.stack([_rope_loop(x[b], positions[b, 0], layout=layout) for b in range(2)])
    backend.assert_close(out, expected, dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_base(backend, dtype, rng, layout):
    x = rng.normal(size=(4, 6))
    out = relattn.rotary_position_embedding(backend.asarray(x, dtype), base=500000.0, layout=layout)
    backend.assert_close(out, _rope_loop(x, base=500000.0, layout=layout), dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_low_precision(backend, rng, dtype, layout):
    backend.dtype(dtype)  # skips where the library has no such dtype
    x = backend.asarray(rng.normal(size=(2, 6, 8)), dtype)
    out = relattn.rotary_position_embedding(x, layout=layout, rotary_dim=6)
    assert out.dtype == backend.dtype(dtype)
    # The reference rotates the inputs as the backend holds them, rounded to ``dtype``.
    exact = backend.to_host(x).astype(np.float64)
    expected = _rope_loop(exact, layout=layout, rotary_dim=6)
    backend.assert_close(out, expected, dtype)
    # Tighter, per element: a rotated ``a cos - b sin`` with cos and sin rounded to
    # ``dtype`` (relative error u each, u = 2^-11 or 2^-8), both products and the
    # difference rounded, is off by at most 2u(|a cos| + |b sin|) + u|out| <= (2√2 + 1)u
    # ‖(a, b)‖ to first order (a fused a·cos - b·sin only less); the pass-through features
    # are copied exactly. 4u‖(a, b)‖ per element, a pair's norm for both of its features.
    u = {"float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]
    norm = np.abs(exact)
    for a, b in _pairs(layout, 6):
        norm[..., a] = norm[..., b] = np.hypot(exact[..., a], exact[..., b])
    err = np.abs(backend.to_host(out).astype(np.float64) - expected)
    assert (err <= 4 * u * norm).all(), f"error {np.max(err / (u * norm)):.2f} u·‖pair‖ > 4"


def test_large_float32_positions(backend, rng):
    """Positions up to 1e8 in float32 agree with NumPy float64 angles (a float32 p·θ would not)."""
    positions = np.array([0.0, 1.0, 12345678.0, 1e8, -5e7, 98765432.0], dtype=np.float32)
    x = rng.normal(size=(6, 8))
    out = relattn.rotary_position_embedding(
        backend.asarray(x, "float32"), backend.asarray(positions, "float32"), layout="interleaved"
    )
    expected = _rope_loop(_rounded(x, "float32"), positions.astype(np.float64))
    backend.assert_close(out, expected, "float32")
    # the naive float32 angle is whole radians off at these positions
    naive = positions[:, None] * np.float32(10000.0) ** (-np.arange(4, dtype=np.float32) / 4)
    exact = positions.astype(np.float64)[:, None] * 10000.0 ** (-np.arange(4) / 4)
    assert np.abs(np.cos(naive) - np.cos(exact)).max() > 0.1


@pytest.mark.parametrize("layout", LAYOUTS)
def test_large_positions_without_float64(jax_backend, rng, layout):
    """JAX without x64: the exact per-digit angles of relattn.encodings keep float32 accuracy."""
    import jax

    positions = np.array([0, 1, 12345678, 100000000, -50000000, 98765432])
    x = rng.normal(size=(2, 6, 8)).astype(np.float32)
    if hasattr(jax, "enable_x64"):
        without_x64 = jax.enable_x64(False)
    else:  # JAX < 0.7
        from jax.experimental import disable_x64

        without_x64 = disable_x64()
    with without_x64:
        jnp = jax.numpy
        for p in (jnp.asarray(positions, dtype=jnp.int32),
                  jnp.asarray(positions.astype(np.float32))):  # fmt: skip
            out = relattn.rotary_position_embedding(jnp.asarray(x), p, layout=layout)
            assert out.dtype == jnp.float32
            expected = _rope_loop(x, np.asarray(p, dtype=np.float64), layout=layout)
            np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-4, atol=1e-5)


# ===============================================================================================
# the relative property and the complex-order identity
# ===============================================================================================


@settings(max_examples=40)
@given(
    m=st.integers(-1000, 1000),
    n=st.integers(-1000, 1000),
    shift=st.integers(-(10**6), 10**6),
    layout=st.sampled_from(LAYOUTS),
    rotary_dim=st.sampled_from([None, 2, 4]),
    seed=st.integers(0, 2**32 - 1),
)
def test_relative_property(m, n, shift, layout, rotary_dim, seed):
    """⟨RoPE(q, m), RoPE(k, n)⟩ = ⟨RoPE(q, m + s), RoPE(k, n + s)⟩: a function of n - m only."""
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(2, 1, 8))

    def score(a, b):
        options = {"layout": layout, "rotary_dim": rotary_dim}
        qa = relattn.rotary_position_embedding(q, np.array([a]), **options)
        kb = relattn.rotary_position_embedding(k, np.array([b]), **options)
        return float(qa[0] @ kb[0])

    here = score(m, n)
    assert math.isclose(here, score(m + shift, n + shift), rel_tol=1e-9, abs_tol=1e-9)
    expected = float(_rope_loop(q, [m], layout=layout, rotary_dim=rotary_dim)[0]
                     @ _rope_loop(k, [n], layout=layout, rotary_dim=rotary_dim)[0])  # fmt: skip
    assert math.isclose(here, expected, rel_tol=1e-9, abs_tol=1e-9)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_scores_are_toeplitz(backend, dtype, rng, layout):
    """The same q and k at every position: the scores depend on j - i only, not on the offset."""
    length, d = 6, 8
    q = np.broadcast_to(rng.normal(size=d), (length, d))
    k = np.broadcast_to(rng.normal(size=d), (length, d))
    xq, xk = backend.asarray(q, dtype), backend.asarray(k, dtype)
    scores = []
    for offset in (0, 1234):
        positions = backend.asarray(offset + np.arange(length))
        rq = relattn.rotary_position_embedding(xq, positions, layout=layout)
        rk = relattn.rotary_position_embedding(xk, positions, layout=layout)
        scores.append(rq @ backend.xp.matrix_transpose(rk))
    expected = _rope_loop(q, layout=layout) @ _rope_loop(k, layout=layout).T
    for i in range(length - 1):
        np.testing.assert_allclose(np.diag(expected, i)[1:], np.diag(expected, i)[:-1], rtol=1e-9)
    backend.assert_close(scores[0], expected, dtype)
    backend.assert_close(scores[1], expected, dtype)
    assert np.ptp(np.diag(expected, 1)) < 1e-9 < abs(expected[0, 1] - expected[1, 0])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_equals_complex_order_embedding(backend, dtype, rng, layout):
    """SPEC §2.8/§2.11: RoPE multiplies the pairs, as complex numbers, by f = 1·exp(i(θ·p + 0))."""
    length, d = 5, 8
    half = d // 2
    x = rng.normal(size=(length, d))
    positions = np.array([0, 3, -2, 11, 40])
    theta = 10000.0 ** (-np.arange(half) / half)
    f = relattn.complex_order_embedding(
        backend.asarray(np.ones((length, half)), dtype),
        backend.asarray(theta, dtype),
        backend.asarray(np.zeros((length, half)), dtype),
        backend.asarray(positions),
    )
    rotated = backend.to_numpy(
        relattn.rotary_position_embedding(
            backend.asarray(x, dtype), backend.asarray(positions), layout=layout
        )
    )
    first, second = zip(*_pairs(layout, d), strict=True)
    z = x[:, list(first)] + 1j * x[:, list(second)]
    product = z * backend.to_numpy(f)
    tolerance = (
        {"rtol": 1e-10, "atol": 1e-12} if dtype == "float64" else {"rtol": 1e-4, "atol": 1e-5}
    )
    np.testing.assert_allclose(rotated[:, list(first)], product.real, **tolerance)
    np.testing.assert_allclose(rotated[:, list(second)], product.imag, **tolerance)


# ===============================================================================================
# attention
# ===============================================================================================


def test_rope_attention_blockwise_equals_dense(backend, dtype, rng):
    """LLaMA layout, 3 new queries after a cache of 4: causal, Lk > Lq, block sizes 1, 3, 64."""
    batch, heads, lq, cache, d = 2, 2, 3, 4, 8
    lk = cache + lq
    q = rng.normal(size=(batch, heads, lq, d))
    k = rng.normal(size=(batch, heads, lk, d))
    v = rng.normal(size=(batch, heads, lk, 3))
    rq = relattn.rotary_position_embedding(
        backend.asarray(q, dtype), backend.asarray(cache + np.arange(lq)), layout="concatenated"
    )
    rk = relattn.rotary_position_embedding(backend.asarray(k, dtype), layout="concatenated")
    past = np.arange(lk)[None, :] <= np.arange(lq)[:, None] + cache
    expected = reference.attention(
        _rope_loop(q, cache + np.arange(lq), layout="concatenated"),
        _rope_loop(k, layout="concatenated"),
        v,
        mask=past,
    )
    xv = backend.asarray(v, dtype)
    for block_size in (None, 1, 3, 64):
        out = relattn.scaled_dot_product_attention(rq, rk, xv, causal=True, block_size=block_size)
        backend.assert_close(out, expected, dtype)


def _example():
    spec = importlib.util.spec_from_file_location("relattn_example_rope", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rope_example(backend, dtype, layout):
    """examples/rope.py decoding in two steps with a cache equals the whole sequence, per pair."""
    example = _example()
    p = example.inputs(0)
    x, heads = p["x"], example.HEADS
    rotary_dim = None if layout == "concatenated" else example.GPTJ_ROTARY_DIM
    xs = {name: backend.asarray(a, dtype) for name, a in p.items()}
    out = example.decode_in_two_steps(xs["x"], xs, layout=layout, rotary_dim=rotary_dim)
    batch, length, d_model = x.shape
    dh = d_model // heads

    def split(a):
        return a.reshape(batch, length, heads, dh).transpose(0, 2, 1, 3)

    q = _rope_loop(split(x @ p["w_q"]), layout=layout, rotary_dim=rotary_dim)
    k = _rope_loop(split(x @ p["w_k"]), layout=layout, rotary_dim=rotary_dim)
    z = reference.attention(
        q, k, split(x @ p["w_v"]), mask=np.tril(np.ones((length, length), bool))
    )
    backend.assert_close(out, z.transpose(0, 2, 1, 3).reshape(x.shape) @ p["w_o"], dtype)


def test_example_main(capsys):
    assert _example().main() < 1e-10
    assert "max |relattn - per-pair loop|" in capsys.readouterr().out


# ===============================================================================================
# transforms: jit, gradients
# ===============================================================================================


def test_jit_equals_eager(jit_backend, dtype, rng):
    x = rng.normal(size=(2, 5, 8))
    positions = np.array([3.0, -1.5, 0.0, 8.25, 100.0])
    freqs = rng.uniform(0.01, 1.0, size=2)

    def f(x, positions, freqs):
        return (
            relattn.rotary_position_embedding(x, layout="interleaved"),
            relattn.rotary_position_embedding(x, positions, layout="concatenated"),
            relattn.rotary_position_embedding(
                x, positions, layout="interleaved", rotary_dim=4, frequencies=freqs
            ),
        )

    arrays = (
        jit_backend.asarray(x, dtype),
        jit_backend.asarray(positions, dtype),
        jit_backend.asarray(freqs, dtype),
    )
    compiled = jit_backend.jit(f)(*arrays)
    eager = f(*arrays)
    for a, b in zip(compiled, eager, strict=True):
        jit_backend.assert_close(a, jit_backend.to_numpy(b), dtype)
    p32 = _rounded(positions, dtype)
    expected = (
        _rope_loop(x),
        _rope_loop(x, p32, layout="concatenated"),
        _rope_loop(x, p32, rotary_dim=4, frequencies=_rounded(freqs, dtype)),
    )
    for a, b in zip(compiled, expected, strict=True):
        jit_backend.assert_close(a, b, dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradcheck(torch_backend, rng, layout):
    """Gradients w.r.t. x, real positions and the frequencies."""
    torch = torch_backend.lib
    leaves = tuple(
        torch_backend.asarray(a, "float64").requires_grad_(True)
        for a in (rng.normal(size=(2, 3, 6)), np.array([0.5, -2.0, 7.0]), rng.uniform(0.1, 1, 2))
    )

    def f(x, positions, freqs):
        return relattn.rotary_position_embedding(
            x, positions, layout=layout, rotary_dim=4, frequencies=freqs
        )

    assert torch.autograd.gradcheck(f, leaves)
    assert torch.autograd.gradcheck(
        lambda x: relattn.rotary_position_embedding(x, layout=layout), leaves[:1]
    )


def test_jax_grad_matches_central_differences(jax_backend, rng):
    import jax
    import jax.numpy as jnp

    def on(a):
        return jax_backend.asarray(a, "float64")

    params = [on(rng.normal(size=(2, 4, 6))), on(np.array([0.5, -2.0, 7.0, 3.0])),
              on(rng.uniform(0.1, 1, 3))]  # fmt: skip
    weights = on(rng.normal(size=(2, 4, 6)))

    @jax.jit
    def loss(p):
        x, positions, freqs = p
        out = relattn.rotary_position_embedding(
            x, positions, layout="concatenated", frequencies=freqs
        )
        return jnp.sum(out * weights)

    grad = jax.jit(jax.grad(loss))(params)
    assert all(float(jnp.abs(g).max()) > 0 for g in grad)
    jax_backend.assert_directional_derivatives(loss, grad, params, rng)


# ===============================================================================================
# bad input
# ===============================================================================================

#: The unpatched function: arguments such as lists or None must not meet the jit wrapper.
_unpatched = relattn.rotary.rotary_position_embedding


def _rope(*args, layout="interleaved", **options):
    """The unpatched function with a layout, for the errors of the other arguments."""
    return _unpatched(*args, layout=layout, **options)


def _f(b, *shape, dtype="float64"):
    return b.asarray(np.zeros(shape), dtype)


V, T = ValueError, TypeError
ERRORS = [
    ("odd-d", lambda b: _rope(_f(b, 3, 5)), V, r"^x must have an even feature size"),
    ("rotary-dim-odd", lambda b: _rope(_f(b, 3, 8), rotary_dim=3), V, r"^rotary_dim must be even"),
    ("rotary-dim-big", lambda b: _rope(_f(b, 3, 8), rotary_dim=10), V, r"^rotary_dim .*10"),
    ("rotary-dim-negative", lambda b: _rope(_f(b, 3, 8), rotary_dim=-2), V, r"rotary_dim"),
    ("rotary-dim-float", lambda b: _rope(_f(b, 3, 8), rotary_dim=4.0), T, r"rotary_dim"),
    ("positions-length", lambda b: _rope(_f(b, 3, 8), _f(b, 4)), V, r"^positions must have shape"),
    ("positions-2d", lambda b: _rope(_f(b, 3, 8), _f(b, 3, 1)), V, r"^positions must have shape"),
    ("positions-bool", lambda b: _rope(_f(b, 3, 8), b.asarray(np.ones(3, bool))), T,
     r"^positions must be a real or integer"),
    ("positions-list", lambda b: _rope(_f(b, 3, 8), [0, 1, 2]), T, r"positions"),
    ("frequencies-shape", lambda b: _rope(_f(b, 3, 8), frequencies=_f(b, 3)), V, r"^frequencies"),
    ("frequencies-rotary", lambda b: _rope(_f(b, 3, 8), rotary_dim=4, frequencies=_f(b, 4)), V,
     r"^frequencies"),
    ("frequencies-int", lambda b: _rope(_f(b, 3, 8), frequencies=b.asarray(np.ones(4, int))), T,
     r"^frequencies"),
    ("x-int", lambda b: _rope(b.asarray(np.zeros((3, 8), int))), T, r"^x must"),
    ("x-1d", lambda b: _rope(_f(b, 8)), V, r"^x must"),
    ("x-none", lambda b: _rope(None), T, r"^x must"),
    ("layout", lambda b: _rope(_f(b, 3, 8), layout="halves"), V, r"^layout"),
    ("base", lambda b: _rope(_f(b, 3, 8), base=0.0), V, r"^base"),
    ("layout-missing", lambda b: _unpatched(_f(b, 3, 8)), T,
     r"^rotary_position_embedding: layout is required: 'concatenated' \(LLaMA.*\) "
     r"or 'interleaved' \(GPT-J"),
    ("layout-none", lambda b: _unpatched(_f(b, 3, 8), layout=None), T, r"layout is required"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "error", "match"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_bad_input(backend, call, error, match):
    with pytest.raises(error, match=match):
        call(backend)


def test_mixed_libraries(torch_backend):
    x = torch_backend.asarray(np.zeros((3, 8)))
    with pytest.raises(TypeError, match=r"different libraries"):
        _rope(x, np.arange(3))
    with pytest.raises(TypeError, match=r"different libraries"):
        _rope(x, frequencies=np.ones(4))


def test_layout_is_a_required_keyword_naming_the_models():
    """No default: the concatenated (LLaMA, HF) and interleaved (GPT-J) pairings both ship."""
    import inspect

    layout = inspect.signature(_unpatched).parameters["layout"]
    assert layout.kind is inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(TypeError, match=r"layout is required") as error:
        _unpatched(np.zeros((3, 8)), np.arange(3))
    for name in ("'concatenated'", "LLaMA", "rotate_half", "'interleaved'", "GPT-J", "RoFormer"):
        assert name in str(error.value), name
        assert name.strip("'") in _unpatched.__doc__, name
