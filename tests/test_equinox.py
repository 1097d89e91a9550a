"""The Equinox layer (:mod:`relattn.equinox`): one :class:`RelativeAttention` per scheme.

For every scheme of :data:`relattn.layers.SCHEMES` (d_model 16, 2 heads, 7
tokens or a 2 × 3 grid): the layer's output equals the functional
:func:`relattn.layers.layer_attention` on NumPy with the layer's own parameter
values (float64 to 1e-12, float32 to 1e-5 relative to the output's scale); its
parameters follow their :class:`~relattn.layers.Parameter` specs; it runs under
``eqx.filter_jit`` as it does eagerly, and ``eqx.filter_grad`` reaches every
parameter (zeros-initialised tables included); ``eqx.tree_serialise_leaves``
and ``eqx.tree_deserialise_leaves`` round-trip it into a freshly built layer;
its parameters laid out on a 2 × 2 mesh of host devices by their logical axes
give the same forward and gradients (``_equinox_worker.py``, a subprocess: JAX
fixes its device count on first import). Also: Transformer-XL's memory and a
decoder's cache through the layer, a few optax steps of
``examples/equinox_training.py`` lowering the loss, and the errors for bad
input.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

eqx = pytest.importorskip("equinox")
jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402 - after the importorskip above
from _workers import Worker, report  # noqa: E402

from relattn.backends._jax import random_parameter  # noqa: E402
from relattn.equinox import (  # noqa: E402
    RelativeAttention,
    named_shardings,
    partition_specs,
)
from relattn.layers import SCHEMES, Parameter, layer_attention  # noqa: E402

TESTS = Path(__file__).parent
EXAMPLES = TESTS.parent / "examples"
GRID_SCHEMES = ("swin", "decomposed")
#: Schemes that take no causal mask (SAM's decomposed tables span the whole grid).
NOT_CAUSAL = ("decomposed",)
#: Schemes whose layers also run as decoders with a key–value cache.
CACHE_SCHEMES = tuple(s for s in SCHEMES if s not in GRID_SCHEMES)
D_MODEL, HEADS, BATCH = 16, 2, 2
WORKER_TIMEOUT = 300

needs_x64 = pytest.mark.skipif(
    not jax.config.jax_enable_x64, reason="float64 needs jax_enable_x64 (tests/conftest.py)"
)


def make(scheme, *, causal=False, dtype=jnp.float64, seed=0, **keywords):
    """A small layer of ``scheme`` (grid (2, 3) for the grid schemes)."""
    grid = (2, 3) if scheme in GRID_SCHEMES else None
    return RelativeAttention(
        D_MODEL, HEADS, scheme, causal=causal, grid=grid, param_dtype=dtype,
        key=jax.random.key(seed), **keywords,
    )  # fmt: skip


def length_of(scheme):
    return 6 if scheme in GRID_SCHEMES else 7


def inputs(scheme, seed=1, batch=BATCH):
    """NumPy float64 input ``(batch, L, d_model)``."""
    return np.random.default_rng(seed).normal(size=(batch, length_of(scheme), D_MODEL))


def numpy_params(layer):
    return {name: np.asarray(value, dtype=np.float64) for name, value in layer.params.items()}


def max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))


def causal_settings(scheme):
    return (False,) if scheme in NOT_CAUSAL else (False, True)


SCHEME_CAUSAL = [(s, c) for s in SCHEMES for c in causal_settings(s)]


# -- the forward equals the functional call ---------------------------------------------


@needs_x64
@pytest.mark.parametrize(("scheme", "causal"), SCHEME_CAUSAL)
def test_matches_functional_float64(scheme, causal):
    layer = make(scheme, causal=causal)
    x = inputs(scheme)
    out = layer(jnp.asarray(x))
    expected = layer_attention(layer.config, numpy_params(layer), x)
    assert isinstance(out, jax.Array) and out.dtype == jnp.float64
    assert out.shape == x.shape
    assert max_diff(out, expected) <= 1e-12


@pytest.mark.parametrize("scheme", SCHEMES)
def test_matches_functional_float32(scheme):
    layer = make(scheme, causal=scheme not in NOT_CAUSAL, dtype=jnp.float32)
    x = inputs(scheme).astype(np.float32)
    out = layer(jnp.asarray(x))
    assert out.dtype == jnp.float32
    assert all(p.dtype == jnp.float32 for p in layer.params.values())
    # Against the float64 NumPy call on the same (float32) values.
    expected = layer_attention(layer.config, numpy_params(layer), x.astype(np.float64))
    assert max_diff(out, expected) <= 1e-5 * max(1e-3, float(np.max(np.abs(expected))))


# -- parameters -----------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_parameters_follow_their_specs(scheme):
    layer = make(scheme, dtype=jnp.float32)
    specs = layer.config.parameters()
    assert list(layer.params) == [p.name for p in specs]
    for p in specs:
        value = np.asarray(layer.params[p.name])
        assert layer.params[p.name].dtype == jnp.float32
        assert value.shape == p.shape, p.name
        if p.init == "zeros":
            assert not value.any(), p.name
        elif p.init == "truncated_normal":
            assert np.max(np.abs(value)) <= 2 * p.std * (1 + 1e-6), p.name
        elif p.init == "glorot_uniform":
            assert np.max(np.abs(value)) <= math.sqrt(6 / (p.shape[0] + p.shape[-1])), p.name
        if p.init != "zeros":
            assert np.std(value) > 0, p.name
    # One key per parameter: no two parameters draw the same numbers.
    drawn = [np.asarray(v).ravel()[:4] for p, v in zip(specs, layer.params.values(), strict=True)
             if p.init != "zeros"]  # fmt: skip
    assert len({tuple(d) for d in drawn}) == len(drawn)


@pytest.mark.parametrize(
    ("init", "std", "expected_std"),
    [
        ("normal", 0.02, 0.02),
        # N(0, σ²) cut at ±2σ: σ·√(1 - 4φ(2) / (2Φ(2) - 1)).
        ("truncated_normal", 0.02, 0.02 * 0.8796),
        ("glorot_uniform", 0.0, math.sqrt(6 / (300 + 100)) / math.sqrt(3)),
    ],
)
def test_initialiser_statistics(init, std, expected_std):
    parameter = Parameter("p", (300, 100), ("embed", "heads"), init, std)
    value = np.asarray(
        random_parameter(init, std, parameter.shape, jax.random.key(3), "float32"), dtype=np.float64
    )
    assert value.shape == (300, 100)
    assert abs(value.mean()) < 0.05 * expected_std
    assert abs(value.std() / expected_std - 1) < 0.03
    bound = {"normal": np.inf, "truncated_normal": 2 * std}.get(init, math.sqrt(3) * expected_std)
    assert np.max(np.abs(value)) <= bound * (1 + 1e-6)


def test_layer_statistics_on_a_large_layer():
    """The layer's normal projections: σ = initializer_range, T5's own σ for T5."""
    layer = RelativeAttention(64, 4, "t5", key=jax.random.key(5))
    stds = {p.name: p.std for p in layer.config.parameters()}
    for name in ("w_q", "w_k", "w_v", "w_o", "relative_attention_bias"):
        value = np.asarray(layer.params[name], dtype=np.float64)
        assert abs(value.std() / stds[name] - 1) < 0.1, name
    layer = RelativeAttention(64, 4, "rope", initializer_range=0.5, key=jax.random.key(5))
    assert abs(float(np.std(np.asarray(layer.params["w_q"]))) / 0.5 - 1) < 0.1


def test_same_key_same_layer_other_key_other_layer():
    a, b, c = (make("t5", seed=s) for s in (0, 0, 1))
    assert all(np.array_equal(a.params[n], b.params[n]) for n in a.params)
    assert not np.array_equal(a.params["w_q"], c.params["w_q"])


# -- jit and grad ---------------------------------------------------------------------


@eqx.filter_jit
def jitted_call(layer, x):
    return layer(x)


@eqx.filter_jit
def gradients(layer, x, target):
    return eqx.filter_grad(lambda m: jnp.sum(m(x) * target))(layer)


@needs_x64
@pytest.mark.parametrize("scheme", SCHEMES)
def test_jit_and_grad(scheme):
    causal = scheme in ("transformer_xl", "t5", "alibi", "rope")
    layer = make(scheme, causal=causal)
    x = jnp.asarray(inputs(scheme))
    assert max_diff(jitted_call(layer, x), layer(x)) <= 1e-12
    target = jnp.asarray(inputs(scheme, seed=2))
    grads = gradients(layer, x, target)
    assert isinstance(grads, RelativeAttention) and grads.config == layer.config
    for name, g in grads.params.items():
        g = np.asarray(g)
        assert g.shape == layer.params[name].shape and np.isfinite(g).all(), name
        scale = np.max(np.abs(g))
        if name == "b_k" and scheme != "deberta":
            # q·b_k is the same for every key of a query: softmax cancels it (not in
            # DeBERTa, whose position-to-content term takes k_j·table[δ]).
            assert scale < 1e-12, name
        else:
            assert scale > 1e-6, f"{name}: no gradient"


# -- serialization --------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_serialise_round_trip(scheme, tmp_path):
    causal = scheme not in NOT_CAUSAL  # the float32 test's layers: its compiled operations
    layer = make(scheme, causal=causal, dtype=jnp.float32, seed=0)
    path = tmp_path / f"{scheme}.eqx"
    eqx.tree_serialise_leaves(path, layer)
    like = make(scheme, causal=causal, dtype=jnp.float32, seed=1)
    loaded = eqx.tree_deserialise_leaves(path, like)
    assert isinstance(loaded, RelativeAttention) and loaded.config == layer.config
    x = jnp.asarray(inputs(scheme), dtype=jnp.float32)
    assert np.array_equal(loaded(x), layer(x))
    assert not np.array_equal(like(x), layer(x))


# -- memory and cache -----------------------------------------------------------------


@needs_x64
def test_transformer_xl_memory():
    layer = make("transformer_xl", causal=True, memory_length=4)
    x1, x2 = jnp.asarray(np.random.default_rng(3).normal(size=(2, BATCH, 4, D_MODEL)))
    memory = layer.next_memory(None, x1)
    assert np.array_equal(memory, x1)
    second = layer(x2, memory=memory)
    expected = layer_attention(layer.config, numpy_params(layer), np.asarray(x2),
                               memory=np.asarray(x1))  # fmt: skip
    assert max_diff(second, expected) <= 1e-12
    # The same as the second segment's rows of one causal call over both segments.
    whole = layer(jnp.concatenate((x1, x2), axis=1))
    assert max_diff(second, whole[:, 4:]) <= 1e-12
    # The memory keeps the last memory_length positions and is cut from the gradient.
    assert np.array_equal(layer.next_memory(memory, x2), x2)
    grad = jax.grad(lambda x: jnp.sum(layer.next_memory(None, x)))(x1)
    assert not np.asarray(grad).any()


@needs_x64
@pytest.mark.parametrize("scheme", CACHE_SCHEMES)
def test_decoder_cache(scheme):
    layer = make(scheme, causal=True)
    x = jnp.asarray(inputs(scheme))
    prefill, cache = layer(x[:, :-1], return_cache=True)
    assert cache[0].shape == (BATCH, HEADS, x.shape[1] - 1, D_MODEL // HEADS)
    step = layer(x[:, -1:], cache=cache)
    full = layer(x)
    assert max_diff(prefill, full[:, :-1]) <= 1e-12
    assert max_diff(step, full[:, -1:]) <= 1e-12


# -- training -------------------------------------------------------------------------


@functools.cache
def training_example():
    spec = importlib.util.spec_from_file_location(
        "equinox_training", EXAMPLES / "equinox_training.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Equinox modules are dataclasses: they look it up
    spec.loader.exec_module(module)
    return module


def test_optax_training_lowers_the_loss(tmp_path):
    example = training_example()
    model, losses = example.train(steps=40, seed=0)
    assert len(losses) == 40 and all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-5:]) < 0.6 * losses[0]
    assert model.attention.params["w_q"].dtype == jnp.float32
    loaded = example.save_and_load(model, tmp_path / "model.eqx")
    tokens = example.batch(jax.random.key(9))
    assert np.array_equal(loaded(tokens), model(tokens))


# -- sharding -------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_partition_specs(scheme):
    layer = make(scheme)
    specs = partition_specs(layer, {"heads": "model", "embed": None})
    assert isinstance(specs, RelativeAttention) and specs.config == layer.config
    for p in layer.config.parameters():
        expected = tuple("model" if axis == "heads" else None for axis in p.axes)
        assert tuple(specs.params[p.name]) == expected, p.name
    both = partition_specs(layer, {"heads": "model", "embed": "data"})
    assert tuple(both.params["w_q"]) == ("data", "model")
    assert tuple(both.params["w_o"]) == ("model", "data")


def test_named_shardings_on_one_device():
    layer = make("t5", dtype=jnp.float32)
    mesh = jax.sharding.Mesh(jax.devices()[:1], ("model",))
    shardings = named_shardings(layer, mesh, {"heads": "model"})
    sharded = eqx.filter_shard(layer, shardings)
    for name, value in sharded.params.items():
        assert value.sharding.is_equivalent_to(shardings.params[name], value.ndim), name
    x = jnp.asarray(inputs("t5"), dtype=jnp.float32)
    assert np.array_equal(jitted_call(sharded, x), jitted_call(layer, x))


@pytest.fixture(scope="module", autouse=True)
def worker(request, tmp_path_factory):
    """The 4-device worker, started with the module's first test so that it runs beside
    the others; not started where the sharding test is deselected (``-m "not subprocess"``)."""
    if not any(item.name == "test_sharded_layer_matches_one_device" for item in
               request.session.items):  # fmt: skip
        yield {}
        return
    folder = tmp_path_factory.mktemp("equinox_worker")
    started = {"sharding": Worker(TESTS / "_equinox_worker.py", [], folder, "sharding")}
    yield started
    started["sharding"].stop()


@pytest.mark.subprocess
def test_sharded_layer_matches_one_device(worker):
    result = report(worker, "sharding", WORKER_TIMEOUT)
    assert result["devices"] == 4
    assert set(result["schemes"]) == set(SCHEMES)
    for scheme, figures in result["schemes"].items():
        assert "error" not in figures, f"{scheme}:\n{figures.get('error')}"
        assert figures["forward"] <= 1e-12, scheme
        assert figures["eager_forward"] <= 1e-12, scheme
        assert figures["grads"] <= 1e-11, scheme
        assert figures["params_sharded"] and figures["grads_sharded_like_params"], scheme
        assert figures["out_batch_sharded"], scheme
        assert {"w_q", "w_k", "w_v", "w_o"} <= set(figures["sharded_params"]), scheme
    step = result["step"]
    assert "error" not in step, step.get("error")
    assert step["params_sharded"] and step["changed"] > 0


# -- bad input and imports ------------------------------------------------------------


def test_bad_input():
    with pytest.raises(ValueError, match="scheme"):
        RelativeAttention(D_MODEL, HEADS, "sinusoid", key=jax.random.key(0))
    with pytest.raises(ValueError, match="d_model"):
        RelativeAttention(15, HEADS, "rope", key=jax.random.key(0))
    with pytest.raises(ValueError, match="grid"):
        RelativeAttention(D_MODEL, HEADS, "swin", key=jax.random.key(0))
    with pytest.raises(TypeError, match="key"):
        RelativeAttention(D_MODEL, HEADS, "rope")
    with pytest.raises(TypeError, match="key"):
        RelativeAttention(D_MODEL, HEADS, "rope", key=0)
    with pytest.raises(TypeError, match="param_dtype"):
        RelativeAttention(D_MODEL, HEADS, "rope", param_dtype=jnp.int32, key=jax.random.key(0))
    with pytest.raises(TypeError, match="param_dtype"):
        RelativeAttention(D_MODEL, HEADS, "rope", param_dtype="banana", key=jax.random.key(0))
    layer = make("rope", dtype=jnp.float32)
    with pytest.raises(ValueError, match="d_model"):
        layer(jnp.ones((BATCH, 5, D_MODEL + 1), dtype=jnp.float32))
    with pytest.raises(ValueError, match="causal"):
        make("decomposed", causal=True, dtype=jnp.float32)(jnp.ones((1, 6, D_MODEL)))
    with pytest.raises(ValueError, match="L = h·w"):
        make("swin", dtype=jnp.float32)(jnp.ones((1, 5, D_MODEL), dtype=jnp.float32))
    with pytest.raises(TypeError, match="rules"):
        partition_specs(layer, ["heads"])
    with pytest.raises(TypeError, match="rules"):
        partition_specs(layer, {"heads": 1})
    with pytest.raises(ValueError, match="rules"):
        partition_specs(layer, {"heads": "model", "embed": "model"})
    with pytest.raises(TypeError, match="layer"):
        partition_specs(layer.params, {"heads": "model"})


def test_import_relattn_does_not_import_equinox():
    check = "import relattn, sys; assert 'equinox' not in sys.modules, 'equinox imported'"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
