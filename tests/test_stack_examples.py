"""The examples for other stacks (``examples/``): JAX training, a PyTorch module, NumPy and CuPy.

Each example runs here at small sizes and is checked against the per-pair loop
references of ``reference.py`` (NumPy float64), which share no code with
relattn: the NumPy inference logits, the PyTorch module's forward pass, the
JAX training step's loss and gradient (by central differences). Training must
lower the loss. The CuPy example is skipped, with the reason, where CuPy or a
CUDA device is missing; its runner is still exercised with array-api-strict
standing in for CuPy.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import reference

EXAMPLES = Path(__file__).parents[1] / "examples"


@functools.cache
def load_example(name):
    """The example module, loaded once per session (JAX's jit cache lives on it)."""
    spec = importlib.util.spec_from_file_location(f"stack_examples_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def float64(tree):
    """A dict of arrays (any library that NumPy can read) as NumPy float64."""
    return {name: np.asarray(a, dtype=np.float64) for name, a in tree.items()}


def causal_sinusoid(length, d_model):
    """Causal-layout table, row m = sinusoid of i - j = length - 1 - m (Transformer-XL)."""
    return reference.sinusoid(np.arange(length - 1, -1, -1), d_model, layout="concatenated")


# -- NumPy inference ----------------------------------------------------------------------


def reference_lm_logits(weights, tokens, heads):
    """Logits of numpy_inference's model over whole sequences, per-pair loop attention."""
    w = float64(weights)
    layers = []
    for n in range(sum(name.endswith(".w_q") for name in w)):
        prefix = f"layer{n}."
        layers.append({name[len(prefix) :]: a for name, a in w.items() if name.startswith(prefix)})
    params = {"embedding": w["embedding"], "layers": layers}
    clamp_len = tokens.shape[-1]  # longer than any distance: no clamping
    return np.stack(
        [
            reference.transformer_xl(params, row, heads=heads, clamp_len=clamp_len)
            @ w["embedding"].T
            for row in tokens
        ]
    )


def test_numpy_inference_matches_loop_reference():
    example = load_example("numpy_inference")
    weights, tokens = example.init_weights(0), example.sample_tokens(1)
    logits = example.infer(tokens, weights, segment=4, memory_length=8, xp=np)
    assert logits.dtype == np.float32
    assert logits.shape == (*tokens.shape, example.VOCAB)
    expected = reference_lm_logits(weights, tokens, example.HEADS)
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)


def test_numpy_inference_memory_length():
    """The first segment never sees memory; later ones change when the memory is cut."""
    example = load_example("numpy_inference")
    weights, tokens = example.init_weights(0), example.sample_tokens(1)
    full = example.infer(tokens, weights, segment=4, memory_length=8, xp=np)
    short = example.infer(tokens, weights, segment=4, memory_length=2, xp=np)
    np.testing.assert_array_equal(short[:, :4], full[:, :4])
    assert np.max(np.abs(short[:, 4:] - full[:, 4:])) > 1e-2


def test_numpy_inference_weights_file_round_trip(tmp_path):
    example = load_example("numpy_inference")
    weights = example.init_weights(3)
    example.save_weights(tmp_path / "weights.npz", weights)
    loaded = example.load_weights(tmp_path / "weights.npz")
    assert loaded.keys() == weights.keys()
    for name, a in weights.items():
        assert loaded[name].dtype == np.float32
        np.testing.assert_array_equal(loaded[name], a)


def test_numpy_inference_script_imports_neither_torch_nor_jax():
    check = (
        "import runpy, sys\n"
        f"runpy.run_path({str(EXAMPLES / 'numpy_inference.py')!r}, run_name='__main__')\n"
        "loaded = sorted({'torch', 'jax', 'cupy'} & set(sys.modules))\n"
        "assert not loaded, f'numpy_inference imported {loaded}'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "error::RuntimeWarning"},
    )
    assert done.returncode == 0, done.stderr
    assert "max |Δ logits|" in done.stdout


# -- CuPy ---------------------------------------------------------------------------------


def cupy_or_skip():
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as e:
        pytest.skip(f"cupy finds no CUDA device ({e})")
    if not count:
        pytest.skip("cupy finds no CUDA device")
    return cupy


def test_cupy_inference_matches_numpy():
    cupy = cupy_or_skip()
    result = load_example("cupy_inference").run(cupy)
    for name, expected in result["numpy"].items():
        assert result["device"][name].dtype == np.float32
        np.testing.assert_allclose(result["device"][name], expected, rtol=1e-4, atol=1e-4)


def test_cupy_runner_with_array_api_strict_standing_in():
    """The runner's code path without a GPU: another array library in CuPy's place."""
    xp = pytest.importorskip("array_api_strict")
    result = load_example("cupy_inference").run(xp, memory_length=4)
    assert result["max_abs_difference"] < 1e-4
    for name, expected in result["numpy"].items():
        np.testing.assert_allclose(result["device"][name], expected, rtol=1e-4, atol=1e-4)


# -- PyTorch ------------------------------------------------------------------------------


@pytest.fixture
def torch_example():
    torch = pytest.importorskip("torch")
    # One thread: this tiny model only loses time to thread hand-offs on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_example("torch_module")
    torch.set_num_threads(threads)


def reference_module(layer, x, memory, mask):
    """RelativeSelfAttention's forward from its float64 weights, per-pair loop attention."""
    w = {name: p.detach().numpy() for name, p in layer.named_parameters()}
    x = x.numpy()
    context = x if memory is None else np.concatenate((memory.numpy(), x), axis=-2)
    lq, lk, d = x.shape[-2], context.shape[-2], x.shape[-1]
    heads = layer.heads
    dh = d // heads
    if layer.causal:
        table = causal_sinusoid(lk, d)
    else:  # full layout: row m is δ = m - (Lk - 1), encoded as i - j = -δ
        table = reference.sinusoid(-(np.arange(lq + lk - 1) - (lk - 1)), d, layout="concatenated")
    q, k, v = x @ w["w_q.weight"].T, context @ w["w_k.weight"].T, context @ w["w_v.weight"].T
    r = table @ w["w_r.weight"].T
    out = np.zeros_like(x)
    for b in range(x.shape[0]):
        heads_out = []
        for h in range(heads):
            cols = slice(h * dh, (h + 1) * dh)
            row_mask = None if mask is None else mask[b].numpy()
            heads_out.append(
                reference.relative_attention(
                    q[b][:, cols],
                    k[b][:, cols],
                    v[b][:, cols],
                    r[:, cols],
                    w["u"][h],
                    w["v"][h],
                    mask=row_mask,
                )
            )
        out[b] = np.concatenate(heads_out, axis=-1) @ w["w_o.weight"].T
    return out


@pytest.mark.parametrize(
    ("causal", "memory_length", "padded"),
    [(True, 0, False), (True, 3, False), (False, 0, True), (False, 2, False)],
    ids=["causal", "causal-memory", "full-padding", "full-memory"],
)
def test_torch_module_forward_matches_loop_reference(torch_example, causal, memory_length, padded):
    import torch

    torch.manual_seed(1)
    layer = torch_example.RelativeSelfAttention(8, 2, causal=causal).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    memory = torch.randn(2, memory_length, 8, dtype=torch.float64) if memory_length else None
    mask = None
    if padded:  # the second sequence has 2 padding keys at the end: (B, 1, Lq, Lk)
        mask = torch.ones(2, 1, 5, 5 + memory_length, dtype=torch.bool)
        mask[1, ..., -2:] = False
    with torch.no_grad():
        out = layer(x, memory, mask)
    assert out.dtype == torch.float64
    expected = reference_module(layer, x, memory, None if mask is None else mask[:, 0])
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-10, atol=1e-12)


def test_torch_module_gradient_reaches_u_and_v(torch_example):
    import torch

    torch.manual_seed(2)
    layer = torch_example.RelativeSelfAttention(8, 2).double()
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    memory = torch.randn(2, 2, 8, dtype=torch.float64)
    layer(x, memory).square().sum().backward()
    for name in ("u", "v", "w_r.weight"):
        grad = layer.get_parameter(name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().max() > 0, name

    def output(u, v):
        return torch.func.functional_call(layer, {"u": u, "v": v}, (x, memory))

    u = layer.u.detach().clone().requires_grad_()
    v = layer.v.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(output, (u, v))


def test_torch_training_lowers_the_loss(torch_example):
    model, losses = torch_example.train(steps=40, seed=0)
    assert all(math.isfinite(x) for x in losses)
    assert np.mean(losses[-5:]) < 0.5 * losses[0], losses
    assert model.attention.u.grad is not None


# -- JAX ----------------------------------------------------------------------------------


@pytest.fixture
def jax_example():
    pytest.importorskip("jax")
    return load_example("jax_training")


def reference_lag_loss(params, tokens, *, heads, lag):
    """jax_training.loss_fn from float64 NumPy parameters, per-pair loop attention."""
    p = params
    d = p["embedding"].shape[-1]
    dh = d // heads
    total = []
    for row in np.asarray(tokens):
        h = p["embedding"][row]
        r = causal_sinusoid(len(row), d) @ p["w_r"]
        q, k, v = h @ p["w_q"], h @ p["w_k"], h @ p["w_v"]
        per_head = [
            reference.relative_attention(q[:, c], k[:, c], v[:, c], r[:, c], p["u"][n], p["v"][n])
            for n, c in enumerate(slice(n * dh, (n + 1) * dh) for n in range(heads))
        ]
        h = reference.layer_norm(h + np.concatenate(per_head, axis=-1) @ p["w_o"])
        logits = h @ p["w_out"]
        top = logits.max(axis=-1, keepdims=True)
        log_p = logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))
        total += [-log_p[t, row[t - lag]] for t in range(lag, len(row))]
    return float(np.mean(total))


def test_jax_training_lowers_the_loss(jax_example):
    _, losses = jax_example.train(steps=40, seed=0)
    assert all(math.isfinite(x) for x in losses)
    assert np.mean(losses[-5:]) < 0.5 * losses[0], losses


def test_jax_jitted_step_matches_loop_reference(jax_example):
    """Loss and gradient of one jitted SGD step against a NumPy loop reference.

    The gradient is read back from the update, ``(p - p_new) / lr``, and its
    derivative along random directions (all parameters; ``u`` and ``v`` alone)
    is compared with central differences of the reference loss.
    """
    import jax

    ex = jax_example
    params = ex.init_params(jax.random.PRNGKey(0))
    tokens = ex.make_batch(jax.random.PRNGKey(1))  # the training shapes: the compiled step
    lr = ex.LEARNING_RATE
    new_params, loss = ex.jit_train_step(params, tokens, lr)
    assert {a.dtype for a in jax.tree_util.tree_leaves(new_params)} == {np.dtype("float32")}

    p0 = float64(params)
    grad = {name: (p0[name] - np.asarray(new_params[name], np.float64)) / lr for name in p0}
    options = {"heads": ex.HEADS, "lag": ex.LAG}
    np.testing.assert_allclose(float(loss), reference_lag_loss(p0, tokens, **options), rtol=1e-5)

    rng = np.random.default_rng(0)
    eps = 1e-6
    for names in (tuple(p0), ("u", "v")):
        direction = {name: rng.normal(size=p0[name].shape) if name in names else 0 for name in p0}
        shifted = [
            reference_lag_loss({n: p0[n] + s * eps * direction[n] for n in p0}, tokens, **options)
            for s in (1, -1)
        ]
        numeric = (shifted[0] - shifted[1]) / (2 * eps)
        analytic = sum(float(np.sum(grad[n] * direction[n])) for n in names)
        assert abs(analytic) > 1e-4, names
        np.testing.assert_allclose(analytic, numeric, rtol=1e-3, atol=1e-5, err_msg=str(names))
