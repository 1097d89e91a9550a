"""The Flax NNX layer, :class:`relattn.nnx.RelativeAttention`, on every scheme.

The layer is a thin wrapper of :func:`relattn.layers.layer_attention`: its output must
equal the functional call on NumPy float64 arrays with the layer's own parameter values
(``<= 1e-12`` in float64, ``<= 1e-5`` relative in float32), under ``nnx.jit`` as eagerly.
Besides: the parameters' initial values follow their :class:`relattn.layers.Parameter`
(shape, dtype, sharding axes, initialiser statistics); ``nnx.grad`` reaches every
parameter (the zero-initialised tables of ``decomposed`` included); a few
``nnx.Optimizer`` steps lower a loss; the state survives a round trip through Orbax and
through ``nnx.to_pure_dict`` + ``np.savez``; Transformer-XL's memory and a decoder's cache;
the bad inputs. The multi-device checks (Flax's eager
sharding on a ``(2, 2)`` mesh, sharded forward and training step) run in
``_nnx_worker.py``, on 4 host devices, started when this module's first test needs them.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402
from _workers import Worker, report  # noqa: E402

from relattn.layers import SCHEMES, LayerConfig, layer_attention  # noqa: E402
from relattn.nnx import RelativeAttention  # noqa: E402

D_MODEL, HEADS, BATCH, LENGTH = 16, 2, 2, 6  # LENGTH = 2·3, the grid of swin and decomposed
GRID_SCHEMES = ("swin", "decomposed")
#: (scheme, causal) pairs: every scheme both ways where it allows it (decomposed: SAM's
#: image attention has no causal form).
CASES = [(s, c) for s in SCHEMES for c in (False, True) if not (s == "decomposed" and c)]
#: The scheme of each one-layout check: causal where the scheme allows it.
ONE_CASE = [(s, s != "decomposed") for s in SCHEMES]
X64 = pytest.mark.skipif(
    not jax.config.jax_enable_x64, reason="float64 needs JAX_ENABLE_X64 (tests/conftest.py)"
)
EXAMPLE = Path(__file__).parents[1] / "examples" / "nnx_training.py"
WORKER = Path(__file__).parent / "_nnx_worker.py"


def make_layer(scheme, causal, *, dtype=jnp.float64, seed=0, **kwargs):
    grid = {"grid": (2, 3)} if scheme in GRID_SCHEMES else {}
    return RelativeAttention(
        D_MODEL, HEADS, scheme, causal=causal, param_dtype=dtype, rngs=nnx.Rngs(seed),
        **grid, **kwargs,
    )  # fmt: skip


def randomize_zeros(layer, seed=1):
    """Random values in the zero-initialised parameters (biases, decomposed tables), so
    that a comparison exercises them."""
    rng = np.random.default_rng(seed)
    for p in layer.config.parameters():
        if p.init == "zeros":
            param = getattr(layer, p.name)
            param[...] = jnp.asarray(0.3 * rng.normal(size=p.shape), dtype=param[...].dtype)


def numpy_params(layer):
    return {p.name: np.asarray(getattr(layer, p.name)[...], np.float64)
            for p in layer.config.parameters()}  # fmt: skip


def inputs(dtype=np.float64, length=LENGTH, seed=0, batch=BATCH):
    return np.random.default_rng(seed).normal(size=(batch, length, D_MODEL)).astype(dtype)


def max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


# -- equality to the functional call ------------------------------------------------------


@X64
@pytest.mark.parametrize(("scheme", "causal"), CASES)
def test_matches_functional_call_float64(scheme, causal):
    layer = make_layer(scheme, causal, initializer_range=0.3)
    randomize_zeros(layer)
    x = inputs()
    out = layer(jnp.asarray(x))
    assert isinstance(out, jax.Array) and out.dtype == jnp.float64
    expected = layer_attention(layer.config, numpy_params(layer), x)
    assert max_diff(out, expected) <= 1e-12 * max(1.0, float(np.max(np.abs(expected))))


@pytest.mark.parametrize(("scheme", "causal"), ONE_CASE)
def test_matches_functional_call_float32(scheme, causal):
    layer = make_layer(scheme, causal, dtype=jnp.float32, initializer_range=0.3)
    randomize_zeros(layer)
    assert {getattr(layer, p.name)[...].dtype for p in layer.config.parameters()} == {
        jnp.dtype(jnp.float32)
    }
    x = inputs(np.float32)
    out = layer(jnp.asarray(x))
    assert out.dtype == jnp.float32
    expected = layer_attention(layer.config, numpy_params(layer), x.astype(np.float64))
    assert max_diff(out, expected) <= 1e-5 * max(1.0, float(np.max(np.abs(expected))))


def test_takes_numpy_inputs():
    layer = make_layer("t5", True)
    x = inputs()
    out = layer(x)
    assert isinstance(out, jax.Array)
    assert max_diff(out, layer(jnp.asarray(x))) == 0.0


# -- initial parameters -------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", ["float32", pytest.param("float64", marks=X64)])
def test_parameters_follow_their_spec(scheme, dtype):
    layer = make_layer(scheme, False, dtype=dtype)
    parameters = layer.config.parameters()
    assert sorted(nnx.state(layer, nnx.Param)) == sorted(p.name for p in parameters)
    for p in parameters:
        param = getattr(layer, p.name)
        assert isinstance(param, nnx.Param), p.name
        value = np.asarray(param[...])
        assert value.shape == p.shape and value.dtype == np.dtype(dtype), p.name
        assert param.out_sharding == p.axes, p.name
        if p.init == "zeros":
            assert not value.any(), p.name
        elif p.init == "truncated_normal":
            assert np.abs(value).max() <= 2 * p.std * (1 + 1e-6), p.name
        elif p.init == "glorot_uniform":
            bound = math.sqrt(6.0 / (p.shape[0] + p.shape[-1]))
            assert np.abs(value).max() <= bound, p.name
        if p.init != "zeros":
            assert np.unique(value).size > 0.99 * value.size, p.name  # drawn, not constant
    # Same seed, same values; another seed, others.
    again, other = make_layer(scheme, False, dtype=dtype), make_layer(scheme, False, seed=1)
    for p in parameters:
        assert max_diff(getattr(again, p.name)[...], getattr(layer, p.name)[...]) == 0.0
        if p.init != "zeros":
            assert max_diff(getattr(other, p.name)[...], getattr(layer, p.name)[...]) > 0


@pytest.mark.parametrize(
    ("scheme", "name", "kwargs"),
    [
        ("rope", "w_q", {}),
        ("t5", "relative_attention_bias", {"num_buckets": 512, "max_distance": 1024}),
        ("t5", "w_q", {}),
        ("swin", "relative_position_bias_table", {"grid": (16, 16)}),
        ("shaw", "key_embeddings", {"max_relative_position": 64}),
    ],
)
def test_initial_statistics(scheme, name, kwargs):
    """Large parameters: the sample's spread is the initialiser's, within a few percent."""
    layer = RelativeAttention(256, 8, scheme, rngs=nnx.Rngs(3), **kwargs)
    (p,) = [p for p in layer.config.parameters() if p.name == name]
    value = np.asarray(getattr(layer, name)[...], np.float64)
    assert value.size >= 4000
    if p.init == "normal":
        expected_std = p.std
    elif p.init == "truncated_normal":  # N(0, σ²) cut at ±2σ: σ·√(1 − 4φ(2)/(2Φ(2) − 1))
        expected_std = p.std * 0.8796
        assert np.abs(value).max() <= 2 * p.std * (1 + 1e-6)
        assert np.abs(value).max() > 1.9 * p.std
    else:
        bound = math.sqrt(6.0 / (p.shape[0] + p.shape[-1]))
        expected_std = bound / math.sqrt(3.0)
        assert np.abs(value).max() <= bound and np.abs(value).max() > 0.98 * bound
    assert abs(value.std() / expected_std - 1) < 0.05, (value.std(), expected_std)
    assert abs(value.mean()) < 4 * expected_std / math.sqrt(value.size)


def test_config_and_keywords_reach_the_config():
    layer = RelativeAttention(
        16, 4, "t5", head_dim=8, causal=True, num_buckets=8, max_distance=20, scale=0.5,
        rngs=nnx.Rngs(0),
    )  # fmt: skip
    assert layer.config == LayerConfig(
        16, 4, "t5", head_dim=8, causal=True, num_buckets=8, max_distance=20, scale=0.5
    )
    assert layer.w_q[...].shape == (16, 32) and layer.relative_attention_bias[...].shape == (8, 4)


# -- nnx.jit and nnx.grad -----------------------------------------------------------------


@X64
@pytest.mark.parametrize(("scheme", "causal"), ONE_CASE)
def test_jit_and_grad(scheme, causal):
    layer = make_layer(scheme, causal)
    x = jnp.asarray(inputs())
    weights = jnp.asarray(inputs(seed=5))

    def loss(model, x):
        return jnp.sum(model(x) * weights)

    eager = layer(x)
    jitted = nnx.jit(lambda m, x: m(x))(layer, x)
    assert max_diff(jitted, eager) <= 1e-12

    value, grads = nnx.jit(nnx.value_and_grad(loss))(layer, x)
    assert abs(float(value) - float(loss(layer, x))) <= 1e-12
    for p in layer.config.parameters():
        g = np.asarray(grads[p.name][...])
        assert g.shape == p.shape and np.isfinite(g).all(), p.name
        # b_k shifts every score of a query by q·b_k, which the softmax ignores: its gradient
        # is zero up to rounding, but for DeBERTa's p2c term (k_j against the position table).
        if p.name != "b_k":
            assert np.abs(g).max() > 0, p.name  # decomposed's zero tables included


@pytest.mark.parametrize(("scheme", "causal"), ONE_CASE)
def test_optimizer_steps_lower_a_loss(scheme, causal):
    """Adam on the layer (``nnx.Optimizer``) towards another layer's outputs."""
    student = make_layer(scheme, causal, dtype=jnp.float32, initializer_range=0.3)
    teacher = make_layer(scheme, causal, dtype=jnp.float32, initializer_range=0.3, seed=7)
    x = jnp.asarray(inputs(np.float32, batch=4))
    target = teacher(x)
    optimizer = nnx.Optimizer(student, optax.adam(0.03), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, x, target):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - target) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    losses = [float(step(student, optimizer, x, target)) for _ in range(8)]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.9 * losses[0], losses


def load_example():
    spec = importlib.util.spec_from_file_location("nnx_training_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_example_lowers_the_loss():
    example = load_example()
    model, losses = example.train(steps=40, seed=0)
    assert isinstance(model.attention, RelativeAttention)
    assert all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-5:]) < 0.5 * losses[0], losses


# -- serialization ------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_round_trip_through_pure_dict_and_npz(scheme, tmp_path):
    layer = make_layer(scheme, False)
    randomize_zeros(layer)
    state = nnx.state(layer, nnx.Param)
    np.savez(
        tmp_path / "layer.npz", **{k: np.asarray(v) for k, v in nnx.to_pure_dict(state).items()}
    )

    restored = make_layer(scheme, False, seed=1)
    new_state = nnx.state(restored, nnx.Param)
    with np.load(tmp_path / "layer.npz") as saved:
        nnx.replace_by_pure_dict(new_state, {k: jnp.asarray(saved[k]) for k in saved.files})
    nnx.update(restored, new_state)
    x = jnp.asarray(inputs())
    assert max_diff(restored(x), layer(x)) == 0.0


def test_round_trip_through_orbax(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    layers = {s: make_layer(s, s != "decomposed") for s in SCHEMES}
    for layer in layers.values():
        randomize_zeros(layer)
    _, state = nnx.split({s: layer for s, layer in layers.items()})
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "ckpt", state)
        checkpointer.wait_until_finished()
        fresh = {s: make_layer(s, s != "decomposed", seed=2) for s in SCHEMES}
        graphdef, abstract = nnx.split(nnx.eval_shape(lambda: fresh))
        restored = nnx.merge(graphdef, checkpointer.restore(tmp_path / "ckpt", abstract))
    x = jnp.asarray(inputs())
    for s in SCHEMES:
        assert max_diff(restored[s](x), layers[s](x)) == 0.0, s
        assert max_diff(fresh[s](x), layers[s](x)) > 0.0, s  # another draw before the restore


# -- memory and cache ---------------------------------------------------------------------


def test_transformer_xl_memory():
    layer = make_layer("transformer_xl", True, memory_length=4, initializer_range=0.3)
    x = inputs(length=10)
    x1, x2 = jnp.asarray(x[:, :6]), jnp.asarray(x[:, 6:])
    memory = layer.next_memory(None, x1)
    assert memory.shape == (BATCH, 4, D_MODEL) and max_diff(memory, x1[:, 2:]) == 0.0
    out = layer(x2, memory=memory)
    params = numpy_params(layer)
    expected = layer_attention(layer.config, params, x[:, 6:], memory=x[:, 2:6])
    assert max_diff(out, expected) <= 1e-12
    # Memory holding the whole first segment: the second segment's rows of one call over both.
    full = make_layer("transformer_xl", True, memory_length=6, initializer_range=0.3)
    whole = layer_attention(full.config, numpy_params(full), x)
    assert max_diff(full(x2, memory=full.next_memory(None, x1)), whole[:, 6:]) <= 1e-12
    assert full.next_memory(full.next_memory(None, x1), x2).shape == (BATCH, 6, D_MODEL)


@pytest.mark.parametrize("scheme", [s for s in SCHEMES if s not in GRID_SCHEMES])
def test_decoder_cache(scheme):
    layer = make_layer(scheme, True, initializer_range=0.3)
    randomize_zeros(layer)
    x = jnp.asarray(inputs())
    out, cache = layer(x[:, :-1], return_cache=True)
    assert cache[0].shape == (BATCH, HEADS, LENGTH - 1, D_MODEL // HEADS)
    step, cache = layer(x[:, -1:], cache=cache, return_cache=True)
    assert cache[1].shape == (BATCH, HEADS, LENGTH, D_MODEL // HEADS)
    full = layer(x)
    assert max_diff(step, full[:, -1:]) <= 1e-12
    assert max_diff(out, full[:, :-1]) <= 1e-12


# -- sharding on several devices (a worker process) ----------------------------------------


@pytest.fixture(scope="module", autouse=True)
def sharding_worker(request, tmp_path_factory):
    """The worker, started with this module's first test (it runs beside the others) where
    a selected test of this module reads its report."""
    selected = any(
        getattr(item, "module", None) is request.module and "sharding_report" in item.fixturenames
        for item in request.session.items
    )
    workers = {}
    if selected:
        workers["nnx"] = Worker(WORKER, [], tmp_path_factory.mktemp("nnx_worker"), "nnx")
    try:
        yield workers
    finally:
        for worker in workers.values():
            worker.stop()


@pytest.fixture(scope="module")
def sharding_report(sharding_worker):
    return report(sharding_worker, "nnx", timeout=300)


@pytest.mark.subprocess
@pytest.mark.parametrize("scheme", SCHEMES)
def test_eager_sharding_on_a_mesh(sharding_report, scheme):
    assert sharding_report["devices"] == 4
    case = sharding_report[f"eager/{scheme}"]
    assert "error" not in case, case.get("traceback")
    for name, p in case["params"].items():
        assert p["matches"], (name, p)
        assert p["distinct_shards"] == p["expected_shards"], (name, p)
        assert p["value_diff"] == 0.0, (name, p)  # the same draw as without a mesh
    assert case["out_devices"] == 4
    assert case["forward_diff"] <= 1e-12 * max(1.0, case["out_scale"])


@pytest.mark.subprocess
def test_sharded_init_under_jit_and_training_step(sharding_report):
    assert sharding_report["jit_init"] == {
        "w_q": "P(None, 'model')",
        "w_o": "P('model',)",
        "relative_attention_bias": "P(None, 'model')",
    }
    case = sharding_report["train_step"]
    assert "error" not in case, case.get("traceback")
    assert case["w_q_spec"] == "P(None, 'model')"
    assert case["loss_diff"] <= 1e-12 and case["param_diff"] <= 1e-12


# -- bad input ----------------------------------------------------------------------------


def test_bad_input():
    with pytest.raises(ValueError, match="scheme"):
        RelativeAttention(16, 2, "relative", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="d_model"):
        RelativeAttention(15, 2, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="grid"):
        RelativeAttention(16, 2, "swin", rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="rngs"):
        RelativeAttention(16, 2, rngs=0)
    with pytest.raises(TypeError, match="param_dtype"):
        RelativeAttention(16, 2, param_dtype=jnp.int32, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="sharding_rules"):
        RelativeAttention(16, 2, sharding_rules="heads", rngs=nnx.Rngs(0))
    layer = RelativeAttention(16, 2, "rope", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="x: expected shape"):
        layer(jnp.ones((1, 4, 8)))
    with pytest.raises(ValueError, match="x: expected L"):
        make_layer("swin", False)(jnp.ones((1, 5, D_MODEL)))
    with pytest.raises(ValueError, match="memory"):
        make_layer("decomposed", False)(jnp.ones((1, 6, D_MODEL)), memory=jnp.ones((1, 2, 16)))


def test_sharding_metadata_without_a_mesh():
    """Rules given without a mesh: stored, the layer's other logical axes replicated."""
    layer = RelativeAttention(16, 2, "t5", sharding_rules=[("heads", "model")], rngs=nnx.Rngs(0))
    assert layer.w_q.sharding_rules == (("heads", "model"), ("embed", None))  # t5: no head_dim
    specs = nnx.get_partition_spec(nnx.state(layer, nnx.Param))
    assert tuple(specs["w_q"].get_value()) == (None, "model")
    assert tuple(specs["relative_attention_bias"].get_value()) == (None, "model")
    plain = RelativeAttention(16, 2, "t5", rngs=nnx.Rngs(0))
    assert not plain.w_q.has_metadata("sharding_rules") and plain.w_q.out_sharding == (
        "embed",
        "heads",
    )
