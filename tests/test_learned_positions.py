"""FIRE and the dynamic position bias: learned MLPs of the positions (SPEC §2.16, §2.18).

Each against a float64 loop written from the formulas, sharing no code with relattn:
FIRE (Li et al. 2023, §3: ``f_θ(ψ(i - j) / ψ(max(L, i)))``, ``ψ(x) = log(|c·x| + 1)``,
``f_θ`` an MLP with ReLU, as the authors' reference code) and x-transformers'
``DynamicPositionBias`` (an MLP with SiLU of ``δ`` or ``sign(δ)·log(|δ| + 1)``). End to
end, ``scaled_dot_product_attention`` with ``score_mod=fire_score_mod(...)``,
``bias=fire_bias(...)`` or ``relative_bias=dynamic_position_bias(...)`` equals a loop over
the ``(i, j)`` pairs, for ``Lq = Lk`` and a decode step ``Lq < Lk`` (the query ``r`` at
``r + Lk - Lq``), dense and blockwise. Gradients reach every layer, ``c`` and ``L`` on torch
and JAX; ``jax.jit`` and ``torch.compile`` equal eager; FlexAttention runs the score_mod.

Last, NeMo 1.23's Kerple and Sandwich distances with a cache (``Lq < Lk``), restated in
NumPy from its code, against relattn's; and, where x-transformers 2.31.10 is importable
(not a dependency), its own ``DynamicPositionBias`` with its weights copied, float64, to
1e-10 (x-transformers ships no FIRE).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import relattn
from relattn.learned_positions import dynamic_position_bias, fire_bias, fire_score_mod

BATCH, HEADS, D = 2, 3, 4

#: name -> (Lq, Lk): a causal model and a decode step over a cache.
CASES = {"causal": (5, 5), "decode": (2, 7)}


# ===============================================================================================
# Float64 loop references
# ===============================================================================================


def _mlp_loop(x: float, weights, biases, activation, norms=None) -> np.ndarray:
    """``x @ W_1 + b_1 → [LayerNorm] → act → … → @ W_K + b_K``, one unit at a time."""
    units = [x]
    for layer, (w, b) in enumerate(zip(weights, biases, strict=True)):
        last = layer == len(weights) - 1
        out = [float(b[m]) + sum(units[n] * float(w[n, m]) for n in range(w.shape[0]))
               for m in range(w.shape[1])]  # fmt: skip
        if not last and norms is not None:
            gamma, beta = norms[layer]
            mean = sum(out) / len(out)
            var = sum((o - mean) ** 2 for o in out) / len(out)
            out = [(o - mean) / math.sqrt(var + 1e-5) * gamma[m] + beta[m]
                   for m, o in enumerate(out)]  # fmt: skip
        units = out if last else [activation(o) for o in out]
    return np.array(units)


def _relu(s: float) -> float:
    return max(s, 0.0)


def _silu(s: float) -> float:
    return s / (1.0 + math.exp(-s))


def _fire_loop(i: float, j: float, weights, biases, c: float, threshold: float, eps: float):
    """Li et al. 2023, §3: ``f_θ(ψ(i - j) / (ψ(max(i, |L|)) + eps))`` per head."""

    def psi(x: float) -> float:
        return math.log(abs(c * x) + 1.0)

    x = psi(i - j) / (psi(max(i, abs(threshold))) + eps)
    return _mlp_loop(x, weights, biases, _relu)


def _dpb_loop(delta: int, weights, biases, log_distance: bool, norms=None) -> np.ndarray:
    """x-transformers' DynamicPositionBias: Linear, [LayerNorm], SiLU, …, Linear."""
    x = float(delta)
    if log_distance:
        x = math.copysign(math.log(abs(x) + 1.0), x) if x else 0.0
    return _mlp_loop(x, weights, biases, _silu, norms)


def _attention_loop(q, k, v, bias):
    """``softmax(q_i·k_j / √d + bias(b, h, i, j)) v`` over the keys with ``j <= i + Lk - Lq``."""
    b_, h_, lq, d = q.shape
    lk = k.shape[2]
    out = np.zeros((b_, h_, lq, v.shape[-1]))
    for b in range(b_):
        for h in range(h_):
            for i in range(lq):
                keys = range(i + lk - lq + 1)
                scores = [float(q[b, h, i] @ k[b, h, j]) / math.sqrt(d) + bias(b, h, i, j)
                          for j in keys]  # fmt: skip
                w = np.exp(np.array(scores) - max(scores))
                out[b, h, i] = (w / w.sum()) @ v[b, h, : len(scores)]
    return out


def _layers(rng, sizes):
    """Weights ``(n_in, n_out)`` and biases ``(n_out,)`` of an MLP through ``sizes``."""
    weights = [rng.normal(size=(a, b)) for a, b in itertools.pairwise(sizes)]
    biases = [rng.normal(size=b) for b in sizes[1:]]
    return weights, biases


def _qkv(rng, lq, lk):
    return (
        rng.normal(size=(BATCH, HEADS, lq, D)),
        rng.normal(size=(BATCH, HEADS, lk, D)),
        rng.normal(size=(BATCH, HEADS, lk, 3)),
    )


def _on(backend, arrays, dtype):
    return [backend.asarray(a, dtype) for a in arrays]


#: MLP shapes: FIRE's one hidden layer, a deeper one, and no hidden layer.
SIZES = {"hidden": (1, 5, HEADS), "deep": (1, 4, 3, HEADS), "linear": (1, HEADS)}


# ===============================================================================================
# FIRE: values, decode rows, attention
# ===============================================================================================


@pytest.mark.parametrize("sizes", list(SIZES))
def test_fire_bias_values(backend, dtype, rng, sizes):
    weights, biases = _layers(rng, SIZES[sizes])
    c, threshold, eps = 0.7, 3.5, 1e-6
    qpos, kpos = np.arange(3, 7), np.arange(7)
    want = np.array(
        [[_fire_loop(i, j, weights, biases, c, threshold, eps) for j in kpos] for i in qpos]
    ).transpose(2, 0, 1)
    got = fire_bias(
        backend.asarray(qpos), backend.asarray(kpos),
        _on(backend, weights, dtype), _on(backend, biases, dtype),
        backend.asarray(np.array(c), dtype), backend.asarray(np.array(threshold), dtype),
    )  # fmt: skip
    assert backend.is_array(got)
    assert got.dtype == backend.dtype(dtype)
    assert tuple(got.shape) == (HEADS, 4, 7)
    backend.assert_close(got, want, dtype)


def test_fire_bias_python_scalars_and_leading_dims(backend, rng):
    """``c`` and ``L`` as Python floats; positions per batch row give ``(B, H, Lq, Lk)``."""
    weights, biases = _layers(rng, SIZES["hidden"])
    qpos = np.array([[2, 3], [5, 6]])
    kpos = np.arange(7)
    got = fire_bias(
        backend.asarray(qpos), backend.asarray(kpos),
        _on(backend, weights, "float64"), _on(backend, biases, "float64"), 0.3, 0.0, eps=0.0,
    )  # fmt: skip
    want = np.array(
        [
            [[_fire_loop(i, j, weights, biases, 0.3, 0.0, 0.0) for j in kpos] for i in row]
            for row in qpos
        ]
    ).transpose(0, 3, 1, 2)
    backend.assert_close(got, want, "float64")


@given(lk=st.integers(1, 12), lq=st.integers(1, 12), threshold=st.floats(0.0, 20.0))
def test_fire_decode_rows_are_the_full_rows(lk, lq, threshold):
    """A decode step's bias (queries at ``Lk - Lq + arange(Lq)``) is the last ``Lq`` rows of
    the full computation's ``(Lk, Lk)`` bias."""
    lq = min(lq, lk)
    rng = np.random.default_rng(lk * 13 + lq)
    weights, biases = _layers(rng, SIZES["hidden"])
    full = fire_bias(np.arange(lk), np.arange(lk), weights, biases, 0.5, threshold)
    step = fire_bias(np.arange(lk - lq, lk), np.arange(lk), weights, biases, 0.5, threshold)
    np.testing.assert_array_equal(step, full[:, lk - lq :])


@pytest.mark.parametrize("case", list(CASES))
def test_fire_attention(backend, dtype, rng, case):
    lq, lk = CASES[case]
    q, k, v = _qkv(rng, lq, lk)
    weights, biases = _layers(rng, SIZES["hidden"])
    c, threshold = 0.9, 2.0

    def bias(b, h, i, j):
        return _fire_loop(i + lk - lq, j, weights, biases, c, threshold, 1e-6)[h]

    expected = _attention_loop(q, k, v, bias)
    ws, bs = _on(backend, weights, dtype), _on(backend, biases, dtype)
    cc, tt = (backend.asarray(np.array(x), dtype) for x in (c, threshold))
    mod = fire_score_mod(ws, bs, cc, tt)
    dense = fire_bias(
        backend.asarray(np.arange(lk - lq, lk)), backend.asarray(np.arange(lk)), ws, bs, cc, tt
    )
    xq, xk, xv = (backend.asarray(a, dtype) for a in (q, k, v))
    for block_size in (None, 3):
        for kw in ({"score_mod": mod}, {"bias": dense}):
            out = relattn.scaled_dot_product_attention(
                xq, xk, xv, causal=True, block_size=block_size, **kw
            )
            backend.assert_close(out, expected, dtype)


def test_fire_score_mod_with_positions(backend, rng):
    """``positions=`` of a cache at offset 4: the score_mod sees the queries' own positions."""
    lq, lk = 2, 6
    q, k, v = _qkv(rng, lq, lk)
    weights, biases = _layers(rng, SIZES["deep"])
    qpos, kpos = np.arange(8, 10), np.arange(4, 10)

    def bias(b, h, i, j):
        return _fire_loop(qpos[i], kpos[j], weights, biases, 0.4, 6.0, 1e-6)[h]

    expected = _attention_loop(q, k, v, bias)
    mod = fire_score_mod(_on(backend, weights, "float64"), _on(backend, biases, "float64"),
                         0.4, 6.0)  # fmt: skip
    xq, xk, xv = (backend.asarray(a, "float64") for a in (q, k, v))
    positions = (backend.asarray(qpos), backend.asarray(kpos))
    for block_size in (None, 4):
        out = relattn.scaled_dot_product_attention(
            xq, xk, xv, score_mod=mod, causal=True, positions=positions, block_size=block_size
        )
        backend.assert_close(out, expected, "float64")


# ===============================================================================================
# Dynamic position bias
# ===============================================================================================


@pytest.mark.parametrize("log_distance", [False, True])
@pytest.mark.parametrize("sizes", ["hidden", "deep", "linear"])
def test_dynamic_position_bias_values(backend, dtype, rng, sizes, log_distance):
    weights, biases = _layers(rng, SIZES[sizes])
    delta = np.arange(-9, 6)
    want = np.array([_dpb_loop(d, weights, biases, log_distance) for d in delta]).T
    got = dynamic_position_bias(
        backend.asarray(delta), _on(backend, weights, dtype), _on(backend, biases, dtype),
        log_distance=log_distance,
    )  # fmt: skip
    assert backend.is_array(got)
    assert got.dtype == backend.dtype(dtype)
    backend.assert_close(got, want, dtype)


def _norms(rng, sizes):
    return [(rng.uniform(0.5, 1.5, n), rng.normal(size=n)) for n in sizes[1:-1]]


def test_dynamic_position_bias_layer_norm(backend, dtype, rng):
    """x-transformers' ``norm=True``: a LayerNorm between each hidden layer and its SiLU."""
    sizes = (1, 5, 4, HEADS)
    weights, biases = _layers(rng, sizes)
    norms = _norms(rng, sizes)
    delta = np.arange(-9, 6)
    want = np.array([_dpb_loop(d, weights, biases, True, norms) for d in delta]).T
    got = dynamic_position_bias(
        backend.asarray(delta), _on(backend, weights, dtype), _on(backend, biases, dtype),
        log_distance=True, norms=[tuple(_on(backend, pair, dtype)) for pair in norms],
    )  # fmt: skip
    assert got.dtype == backend.dtype(dtype)
    backend.assert_close(got, want, dtype)


def test_dynamic_position_bias_keeps_the_shape_of_the_distances(backend, rng):
    weights, biases = _layers(rng, (1, 2, 4))
    delta = backend.asarray(np.array([[0, -1, -2], [3, 4, 5]]))
    got = dynamic_position_bias(delta, _on(backend, weights, "float64"),
                                _on(backend, biases, "float64"))  # fmt: skip
    assert tuple(got.shape) == (4, 2, 3)


@given(lk=st.integers(1, 12), lq=st.integers(1, 12), causal=st.booleans())
def test_dynamic_position_bias_decode_rows_are_the_full_rows(lk, lq, causal):
    """The values of a decode step's layout, expanded, are the last ``Lq`` rows of the full
    computation's ``(Lk, Lk)`` bias."""
    lq = min(lq, lk)
    weights, biases = _layers(np.random.default_rng(lk + 17 * lq), (1, 4, 2))

    def expanded(lq):
        delta = relattn.relative_distances(lq, lk, causal=causal, xp=np)
        values = dynamic_position_bias(delta, weights, biases, log_distance=True)
        return relattn.relative_bias_matrix(values, lq, lk)

    np.testing.assert_array_equal(expanded(lq), expanded(lk)[:, lk - lq :])


@pytest.mark.parametrize("layout", ["causal", "full"])
@pytest.mark.parametrize("case", list(CASES))
def test_dynamic_position_bias_attention(backend, dtype, rng, case, layout):
    lq, lk = CASES[case]
    q, k, v = _qkv(rng, lq, lk)
    weights, biases = _layers(rng, (1, 6, 6, HEADS))

    def bias(b, h, i, j):
        return _dpb_loop(j - i - (lk - lq), weights, biases, True)[h]

    expected = _attention_loop(q, k, v, bias)
    distances = relattn.relative_distances(
        lq, lk, causal=layout == "causal", xp=backend.lib, device=backend.device
    )
    values = dynamic_position_bias(
        distances, _on(backend, weights, dtype), _on(backend, biases, dtype), log_distance=True
    )
    xq, xk, xv = (backend.asarray(a, dtype) for a in (q, k, v))
    for block_size in (None, 3):
        out = relattn.scaled_dot_product_attention(
            xq, xk, xv, relative_bias=values, causal=True, block_size=block_size
        )
        backend.assert_close(out, expected, dtype)


# ===============================================================================================
# Gradients to every learned parameter; jit and compile
# ===============================================================================================


def _fire_params(rng, sizes=SIZES["hidden"]):
    weights, biases = _layers(rng, sizes)
    # L above the first queries' positions, so that max(i, L) takes L for some rows.
    return [*weights, *biases, np.array(0.8), np.array(3.5)]


def _fire_attend(params, q, k, v, n_layers, how, block_size):
    weights, biases = params[:n_layers], params[n_layers : 2 * n_layers]
    c, threshold = params[-2:]
    lq, lk = q.shape[-2], k.shape[-2]
    if how == "score_mod":
        kw = {"score_mod": fire_score_mod(weights, biases, c, threshold)}
    else:
        qpos = _arange_like(q, lk - lq, lk)
        kpos = _arange_like(q, 0, lk)
        kw = {"bias": fire_bias(qpos, kpos, weights, biases, c, threshold)}
    return relattn.scaled_dot_product_attention(q, k, v, causal=True, block_size=block_size, **kw)


def _arange_like(x, start, stop):
    from relattn._namespace import device_of, namespace

    return namespace(x=x).arange(start, stop, device=device_of(x))


def _dpb_attend(params, q, k, v, n_layers, block_size):
    """``params``: the weights, the biases, then (optionally) each LayerNorm's γ and β."""
    weights, biases = params[:n_layers], params[n_layers : 2 * n_layers]
    rest = params[2 * n_layers :]
    norms = [(rest[2 * n], rest[2 * n + 1]) for n in range(len(rest) // 2)] or None
    lk = k.shape[-2]
    distances = _arange_like(q, -(lk - 1), 1)
    values = dynamic_position_bias(distances, weights, biases, log_distance=True, norms=norms)
    return relattn.scaled_dot_product_attention(
        q, k, v, relative_bias=values, causal=True, block_size=block_size
    )


@pytest.mark.parametrize("how", ["score_mod", "bias"])
def test_fire_torch_gradients(torch_backend, rng, how):
    torch = torch_backend.lib
    params = [torch_backend.asarray(a, "float64").requires_grad_(True) for a in _fire_params(rng)]
    q, k, v = (torch_backend.asarray(a, "float64") for a in _qkv(rng, 2, 5))
    for block_size in (None, 3):
        out = _fire_attend(params, q, k, v, 2, how, block_size)
        grads = torch.autograd.grad(out.sum() + (out**2).sum(), params)
        assert all(bool(torch.isfinite(g).all()) and float(g.abs().max()) > 0 for g in grads)

        def f(*p, b=block_size):
            return _fire_attend(list(p), q, k, v, 2, how, b)

        assert torch.autograd.gradcheck(f, tuple(params))


def test_dynamic_position_bias_torch_gradients(torch_backend, rng):
    torch = torch_backend.lib
    sizes = (1, 4, 4, HEADS)
    weights, biases = _layers(rng, sizes)
    norms = [a for pair in _norms(rng, sizes) for a in pair]
    params = [torch_backend.asarray(a, "float64").requires_grad_(True)
              for a in (*weights, *biases, *norms)]  # fmt: skip
    q, k, v = (torch_backend.asarray(a, "float64") for a in _qkv(rng, 2, 5))
    for block_size in (None, 3):
        out = _dpb_attend(params, q, k, v, 3, block_size)
        grads = torch.autograd.grad((out**2).sum(), params)
        assert all(float(g.abs().max()) > 0 for g in grads)
        assert torch.autograd.gradcheck(
            lambda *p, b=block_size: _dpb_attend(list(p), q, k, v, 3, b), tuple(params)
        )


@pytest.mark.parametrize("scheme", ["fire-score_mod", "fire-bias", "dynamic"])
def test_jax_gradients(jax_backend, rng, scheme):
    import jax
    import jax.numpy as jnp

    q, k, v = (jax_backend.asarray(a, "float64") for a in _qkv(rng, 2, 5))
    if scheme == "dynamic":
        weights, biases = _layers(rng, (1, 4, 4, HEADS))
        norms = [a for pair in _norms(rng, (1, 4, 4, HEADS)) for a in pair]
        params = [jax_backend.asarray(a, "float64") for a in (*weights, *biases, *norms)]
    else:
        params = [jax_backend.asarray(a, "float64") for a in _fire_params(rng)]
    weights_out = jax_backend.asarray(rng.normal(size=(BATCH, HEADS, 2, 3)), "float64")

    def loss(p, block_size):
        if scheme == "dynamic":
            out = _dpb_attend(p, q, k, v, 3, block_size)
        else:
            out = _fire_attend(p, q, k, v, 2, scheme.removeprefix("fire-"), block_size)
        return jnp.sum(out * weights_out)

    for block_size in (None, 3):
        f = jax.jit(lambda p, b=block_size: loss(p, b))
        grad = jax.jit(jax.grad(f))(params)
        assert all(bool(jnp.all(jnp.isfinite(g))) and float(jnp.abs(g).max()) > 0 for g in grad)
        jax_backend.assert_directional_derivatives(f, grad, params, rng)


def test_jit_equals_eager(jit_backend, dtype, rng):
    q, k, v = _qkv(rng, 2, 6)
    fire = _fire_params(rng)
    dyn_w, dyn_b = _layers(rng, (1, 4, HEADS))
    arrays = [jit_backend.asarray(a, dtype) for a in (q, k, v, *fire, *dyn_w, *dyn_b)]

    def f(q, k, v, w1, w2, b1, b2, c, threshold, dw1, dw2, db1, db2):
        lq, lk = q.shape[-2], k.shape[-2]
        mod = fire_score_mod([w1, w2], [b1, b2], c, threshold)
        dense = fire_bias(_arange_like(q, lk - lq, lk), _arange_like(q, 0, lk),
                          [w1, w2], [b1, b2], c, threshold)  # fmt: skip
        values = dynamic_position_bias(_arange_like(q, -(lk - 1), 1), [dw1, dw2], [db1, db2])
        return (
            dense,
            values,
            relattn.scaled_dot_product_attention(q, k, v, score_mod=mod, causal=True, block_size=4),
            relattn.scaled_dot_product_attention(q, k, v, relative_bias=values, causal=True),
        )

    compiled = jit_backend.jit(f)(*arrays)
    eager = f(*arrays)
    for a, b in zip(compiled, eager, strict=True):
        jit_backend.assert_close(a, jit_backend.to_numpy(b), dtype)


# ===============================================================================================
# FlexAttention on torch
# ===============================================================================================


def _flex_case(torch, rng, dtype):
    weights, biases = _layers(rng, SIZES["hidden"])
    as_t = [torch.asarray(a, dtype=dtype) for a in (*weights, *biases)]
    mod = fire_score_mod(as_t[:2], as_t[2:], torch.tensor(0.5, dtype=dtype),
                         torch.tensor(4.0, dtype=dtype))  # fmt: skip
    q, k, v = (torch.asarray(a, dtype=dtype) for a in _qkv(rng, 3, 9))
    return q, k, v, mod


def test_fire_score_mod_runs_in_flex_attention(rng):
    """FlexAttention's eager reference calls the score_mod with 0-d tensors under vmap."""
    torch = pytest.importorskip("torch")
    from relattn import problem
    from relattn.backends import _flex

    q, k, v, mod = _flex_case(torch, rng, torch.float64)
    p = problem.check(q, k, v, score_mod=mod, causal=True)
    assert _flex.refusal(p, compiled=False) is None
    out = _flex.flex_run(p, compiled=False)
    expected = relattn.scaled_dot_product_attention(q, k, v, score_mod=mod, causal=True,
                                                    block_size=4)  # fmt: skip
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.slow
@pytest.mark.subprocess
def test_fire_score_mod_compiles_in_flex_attention(rng):
    """Inductor's CPU FlexAttention kernel lowers the score_mod (elementwise operations only)."""
    torch = pytest.importorskip("torch")
    from relattn import problem
    from relattn.backends import _flex
    from relattn.testing import tolerance

    q, k, v, mod = _flex_case(torch, rng, torch.float32)
    p = problem.check(q, k, v, score_mod=mod, causal=True)
    assert _flex.refusal(p, compiled=True) is None
    out = _flex.flex_run(p, compiled=True)
    expected = relattn.scaled_dot_product_attention(q, k, v, score_mod=mod, causal=True,
                                                    block_size=4)  # fmt: skip
    np.testing.assert_allclose(out.numpy(), expected.numpy(), **tolerance(q.dtype))


# ===============================================================================================
# NeMo 1.23's Kerple and Sandwich with a cache
# ===============================================================================================


def _nemo_distances(lq: int, lk: int, bidirectional: bool) -> np.ndarray:
    """NeMo 1.23's ``SandwichRelativePositionEmbedding.forward`` distances, restated: the
    ``|i - j|`` matrix of ``max(Lq, Lk)`` positions, its last ``Lq`` rows and ``Lk``
    columns, then ``torch.tril`` when not bidirectional (its Kerple applies the same
    ``tril``)."""
    n = max(lq, lk)
    positions = np.arange(n)
    full = np.abs(positions[:, None] - positions[None, :])
    window = full[-lq:, -lk:]
    return window if bidirectional else np.tril(window)


@pytest.mark.parametrize("lq, lk", [(4, 4), (1, 6), (3, 8)])
def test_nemo_zeroes_past_distances_with_a_cache(lq, lk):
    """``torch.tril`` of a ``(Lq, Lk)`` window keeps ``j <= i`` (top-left aligned), but query
    ``i`` sits at ``i + Lk - Lq``: the past keys ``i < j <= i + Lk - Lq`` get distance 0,
    so Kerple's and Sandwich's bias 0 (no decay). relattn aligns the ends: equal to NeMo at
    ``Lq = Lk``, different exactly on those keys when ``Lq < Lk``."""
    nemo = _nemo_distances(lq, lk, bidirectional=False)
    delta = relattn.relative_distances(lq, lk, causal=True, xp=np)
    ours = relattn.relative_bias_matrix(np.abs(delta).astype(np.float64), lq, lk)
    past = np.arange(lk)[None, :] <= np.arange(lq)[:, None] + (lk - lq)
    r = np.array([0.8]), np.array([0.6])
    kerple_nemo = relattn.kerple_bias(nemo, *r, kind="log")[0]
    kerple_ours = relattn.kerple_bias(np.where(past, ours, 0).astype(np.int64), *r, kind="log")[0]
    sandwich_nemo = relattn.sandwich_bias(nemo, 8)
    zeroed = past & (np.arange(lk)[None, :] > np.arange(lq)[:, None]) & (ours > 0)
    assert zeroed.sum() == lq * max(lk - lq - 1, 0)  # all past keys but the query's own
    np.testing.assert_array_equal(nemo[past & ~zeroed], ours[past & ~zeroed])
    np.testing.assert_array_equal(nemo[zeroed], 0)
    np.testing.assert_array_equal(kerple_nemo[zeroed], 0)
    assert np.all(kerple_ours[zeroed] < 0)
    np.testing.assert_allclose(sandwich_nemo[zeroed], 4.0)  # Σ cos 0 = d'/2: "no distance"
    if lq == lk:
        np.testing.assert_array_equal(np.where(past, nemo, 0), np.where(past, ours, 0))


# ===============================================================================================
# x-transformers 2.31.10's DynamicPositionBias (optional; it ships no FIRE)
# ===============================================================================================

#: x-transformers' ``attend.py`` calls ``torch.jit.script`` at import, which torch deprecates.
_XT_IMPORT = "ignore:`torch.jit.script` is deprecated:DeprecationWarning"


def _x_transformers_arrays(module, torch):
    """relattn's arrays from x-transformers' ``DynamicPositionBias.mlp``: each hidden block
    ``Sequential(Linear, [norm], SiLU)``, then ``Linear(dim, heads)``. Its first norm is
    its own ``LayerNorm`` (``nn.LayerNorm`` without affine, times ``gamma``: no bias), the
    others ``nn.LayerNorm``."""
    *blocks, last = module.mlp
    linears, norms = [], []
    for block in blocks:
        layers = list(block)
        assert isinstance(layers[0], torch.nn.Linear)
        assert isinstance(layers[-1], torch.nn.SiLU)
        linears.append(layers[0])
        if len(layers) == 3:
            norm = layers[1]
            if isinstance(norm, torch.nn.LayerNorm):
                assert norm.eps == 1e-5
                norms.append((norm.weight, norm.bias))
            else:
                assert not norm.unit_offset and norm.ln.eps == 1e-5
                assert not norm.ln.elementwise_affine
                norms.append((norm.gamma, torch.zeros_like(norm.gamma)))
        else:
            assert len(layers) == 2
    assert isinstance(last, torch.nn.Linear)
    linears.append(last)
    weights = [lin.weight.detach().numpy().T for lin in linears]
    biases = [lin.bias.detach().numpy() for lin in linears]
    pairs = [tuple(a.detach().numpy() for a in pair) for pair in norms] if norms else None
    return weights, biases, pairs


@pytest.mark.filterwarnings(_XT_IMPORT)
@pytest.mark.parametrize("lq, lk", [(5, 5), (2, 7), (1, 12)])
@pytest.mark.parametrize("depth", [2, 3])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("log_distance", [False, True])
def test_x_transformers_dynamic_position_bias_agrees(
    monkeypatch, rng, log_distance, norm, depth, lq, lk
):
    """x-transformers 2.31.10's ``x_transformers.x_transformers.DynamicPositionBias``, its
    random weights (LayerNorms' included) copied into relattn's arrays, float64: its
    ``forward(Lq, Lk)``, ``(H, Lq, Lk)`` with query ``r`` at ``r + Lk - Lq``, equals
    ``dynamic_position_bias(-δ)`` to 1e-10, ``δ = key - query``: its MLP sees
    ``query - key``. Also through the relative layout (``relative_distances``, then
    ``relative_bias_matrix``). Its ``forward`` casts the distances with ``.float()``; for
    the call, ``Tensor.float`` is ``Tensor.double``, so that its ``log_distance`` is taken
    in float64 too (its code runs otherwise unchanged)."""
    torch = pytest.importorskip("torch")
    xt = pytest.importorskip("x_transformers.x_transformers")
    heads, dim = 3, 6
    module = xt.DynamicPositionBias(
        dim, heads=heads, depth=depth, log_distance=log_distance, norm=norm
    ).double()
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.from_numpy(rng.normal(size=tuple(param.shape))))
    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "float", torch.Tensor.double)
        with torch.no_grad():
            want = module(lq, lk)
    assert want.dtype == torch.float64
    assert tuple(want.shape) == (heads, lq, lk)
    want = want.numpy()
    weights, biases, norms = _x_transformers_arrays(module, torch)
    assert len(weights) == depth + 1
    assert (norms is not None) == norm

    def ours(distances):
        return dynamic_position_bias(
            distances, weights, biases, log_distance=log_distance, norms=norms
        )

    delta = np.arange(lk)[None, :] - (np.arange(lq)[:, None] + lk - lq)
    got = ours(-delta)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    layout = ours(-relattn.relative_distances(lq, lk, xp=np))
    np.testing.assert_allclose(
        relattn.relative_bias_matrix(layout, lq, lk), want, rtol=1e-10, atol=1e-10
    )
    # The sign matters: relattn's δ itself is not x-transformers' input.
    assert np.abs(ours(delta) - want).max() > 1e-3


# ===============================================================================================
# Bad input
# ===============================================================================================

_W = [np.ones((1, 3)), np.ones((3, 2))]
_B = [np.zeros(3), np.zeros(2)]
_P = np.arange(4)

BAD = {
    "weights-array": (
        lambda: fire_bias(_P, _P, _W[0], _B, 1.0, 1.0),
        TypeError,
        r"^weights must be a list or tuple of arrays, one per layer, got ndarray",
    ),
    "weights-empty": (
        lambda: dynamic_position_bias(_P, [], [], log_distance=False),
        ValueError,
        r"^weights must hold at least one layer",
    ),
    "biases-count": (
        lambda: fire_score_mod(_W, _B[:1], 1.0, 1.0),
        ValueError,
        r"^biases must hold one array per layer of weights \(2 layers\), got 1",
    ),
    "weights-chain": (
        lambda: fire_bias(_P, _P, [_W[0], np.ones((2, 2))], _B, 1.0, 1.0),
        ValueError,
        r"^weights must chain 1 → n_1 → … → H, each \(in features, out features\): "
        r"weights\[1\] must have shape \(3, n_out\), got shape \(2, 2\)",
    ),
    "weights-first": (
        lambda: dynamic_position_bias(_P, [np.ones((2, 3)), _W[1]], _B),
        ValueError,
        r"^weights must chain .*: weights\[0\] must have shape \(1, n_out\)",
    ),
    "biases-shape": (
        lambda: fire_bias(_P, _P, _W, [np.zeros(3), np.zeros(3)], 1.0, 1.0),
        ValueError,
        r"^biases must match the layers: biases\[1\] must have shape \(2,\), the out features "
        r"of weights\[1\], got shape \(3,\)",
    ),
    "weights-int": (
        lambda: dynamic_position_bias(_P, [np.ones((1, 3), dtype=int), _W[1]], _B),
        TypeError,
        r"^weights must have a real floating dtype: weights\[0\] has dtype int64",
    ),
    "weights-none": (
        lambda: fire_bias(_P, _P, [None, _W[1]], _B, 1.0, 1.0),
        TypeError,
        r"^weights must be an array per layer: weights\[0\] is not, got None",
    ),
    "c-2d": (
        lambda: fire_bias(_P, _P, _W, _B, np.ones((1,)), 1.0),
        ValueError,
        r"^c must be a real number or a 0-d array, got shape \(1,\)",
    ),
    "threshold-str": (
        lambda: fire_score_mod(_W, _B, 1.0, "512"),
        TypeError,
        r"^threshold must be an array \(0-d, real floating\) or a real number, got str",
    ),
    "c-int-array": (
        lambda: fire_bias(_P, _P, _W, _B, np.asarray(1), 1.0),
        TypeError,
        r"^c must have a real floating dtype",
    ),
    "eps-negative": (
        lambda: fire_bias(_P, _P, _W, _B, 1.0, 1.0, eps=-1.0),
        ValueError,
        r"^eps must be a real number >= 0, got -1.0",
    ),
    "query_positions-0d": (
        lambda: fire_bias(np.asarray(3), _P, _W, _B, 1.0, 1.0),
        ValueError,
        r"^query_positions must have shape \(\.\.\., L\), got shape \(\)",
    ),
    "key_positions-bool": (
        lambda: fire_bias(_P, _P > 1, _W, _B, 1.0, 1.0),
        TypeError,
        r"^key_positions must be a real or integer array, got dtype bool",
    ),
    "positions-lead": (
        lambda: fire_bias(np.ones((2, 3), dtype=int), np.ones((3, 4), dtype=int), _W, _B, 1.0, 1.0),
        ValueError,
        r"^leading \(batch, head\) dimensions do not broadcast",
    ),
    "positions-none": (
        lambda: fire_bias(None, _P, _W, _B, 1.0, 1.0),
        TypeError,
        r"^query_positions must be an array, got None",
    ),
    "distances-float": (
        lambda: dynamic_position_bias(_P * 1.0, _W, _B),
        TypeError,
        r"^distances must be an integer array",
    ),
    "norms-count": (
        lambda: dynamic_position_bias(_P, _W, _B, norms=[]),
        TypeError,
        r"^norms must be a list or tuple of \(weight, bias\) pairs, one per hidden layer \(1\), "
        r"got 0",
    ),
    "norms-pair": (
        lambda: dynamic_position_bias(_P, _W, _B, norms=[np.ones(3)]),
        TypeError,
        r"^norms\[0\] must be a \(weight, bias\) pair of arrays",
    ),
    "norms-none": (
        lambda: dynamic_position_bias(_P, _W, _B, norms=[(np.ones(3), None)]),
        TypeError,
        r"^norms\[0\] bias must be an array, got None",
    ),
    "norms-width": (
        lambda: dynamic_position_bias(_P, _W, _B, norms=[(np.ones(2), np.ones(3))]),
        ValueError,
        r"^norms\[0\] weight must have shape \(3,\), the out features of weights\[0\], "
        r"got shape \(2,\)",
    ),
    "norms-int": (
        lambda: dynamic_position_bias(_P, _W, _B, norms=[(np.ones(3, dtype=int), np.ones(3))]),
        TypeError,
        r"^norms\[0\] weight must have a real floating dtype",
    ),
    "log_distance-str": (
        lambda: dynamic_position_bias(_P, _W, _B, log_distance="yes"),
        TypeError,
        r"^log_distance must be a bool, got str 'yes'",
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
        fire_bias(_P, _P, [torch.ones(1, 3, dtype=torch.float64), _W[1]], _B, 1.0, 1.0)
