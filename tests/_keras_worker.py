"""Keras 3 checks of :mod:`relattn.keras` for ``tests/test_keras.py``, one process per backend.

Keras fixes its backend when it is first imported (``KERAS_BACKEND``), and JAX its
device count: so these checks run here, in a fresh interpreter per backend.
``python tests/_keras_worker.py BACKEND OUT.json`` (``jax`` or ``torch``) sets the
environment before importing Keras (JAX: float64 on, 2 host devices, XLA's fast
compile flags as in ``tests/conftest.py``) and writes one JSON object of figures
(max abs differences, losses, statistics, error types and messages, seconds per
section) that the tests assert on. Each section is caught on its own, so that one
failure is reported by name and does not hide the others.

Sections: ``equality`` (every scheme, causal and not, float64 and float32, against
:func:`relattn.layers.layer_attention`), ``init`` (the weights' statistics),
``transforms`` (JAX: ``jax.jit`` and ``jax.grad`` through ``stateless_call``;
torch: autograd), ``model`` (all schemes stacked in one functional model: compiled
``predict`` equals eager, ``.keras`` round trip), ``fit`` (``examples/keras_training.py``),
``decoding`` (Transformer-XL memory, the key-value cache), ``padding`` (a Keras
padding mask), ``errors`` and, on JAX, ``distribution`` (``DataParallel`` and
``ModelParallel`` on 2 devices).
"""

from __future__ import annotations

import os
import sys

DEVICES = 2
if __name__ == "__main__":
    # Before Keras (and JAX) are imported. Not on import: pytest's --doctest-modules
    # imports this file into the test session, whose environment it must leave alone.
    BACKEND = sys.argv[1]
    os.environ["KERAS_BACKEND"] = BACKEND
    if BACKEND == "jax":
        from _workers import use_host_devices

        use_host_devices(DEVICES)
        os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "float32")

import importlib.util  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from _workers import error_of, max_diff  # noqa: E402

from relattn.layers import SCHEMES, layer_attention  # noqa: E402

GRID = (2, 3)
D_MODEL, HEADS, LENGTH, BATCH = 16, 2, 6, 2
#: The schemes of the torch.compile check (Dynamo's capture of each takes seconds).
JIT_SCHEMES = ("t5", "rope")
EXAMPLE = Path(__file__).parents[1] / "examples" / "keras_training.py"


def variants() -> list[tuple[str, bool]]:
    """(scheme, causal): every scheme, causal and not where the scheme allows it."""
    out = []
    for scheme in SCHEMES:
        out.append((scheme, False))
        if scheme not in ("swin", "decomposed"):
            out.append((scheme, True))
    return out


def grid_of(scheme: str) -> tuple[int, int] | None:
    return GRID if scheme in ("swin", "decomposed") else None


def numpy(t: Any) -> np.ndarray:
    import keras

    return np.asarray(keras.ops.convert_to_numpy(t))


def weights_of(layer: Any, dtype: str = "float64") -> dict[str, np.ndarray]:
    """The layer's weights as NumPy arrays, by parameter name."""
    return {p.name: numpy(getattr(layer, p.name).value).astype(dtype)
            for p in layer.config.parameters()}  # fmt: skip


def make_layer(scheme: str, causal: bool, **kwargs: Any) -> Any:
    from relattn.keras import RelativeAttention

    return RelativeAttention(D_MODEL, HEADS, scheme, causal=causal, grid=grid_of(scheme), **kwargs)


def inputs(seed: int = 0, length: int = LENGTH, batch: int = BATCH) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(batch, length, D_MODEL))


def tag(scheme: str, causal: bool) -> str:
    return f"{scheme}/{'causal' if causal else 'full'}"


# -- sections -----------------------------------------------------------------------------


def check_equality(report: dict[str, Any], backend: str) -> None:
    """Every variant against layer_attention in float64; float32 too (JAX: once per scheme,
    each new dtype and shape costing eager JAX a compile per operation)."""
    out: dict[str, Any] = {}
    x64 = inputs()
    x32 = x64.astype("float32")
    seen = set()
    for n, (scheme, causal) in enumerate(variants()):
        layer = make_layer(scheme, causal, dtype="float64", seed=n)
        y = layer(x64)
        expected = layer_attention(layer.config, weights_of(layer), x64)
        entry = {
            "float64": max_diff(numpy(y), expected),
            "dtype64": str(numpy(y).dtype),
            "weight_dtypes": sorted({str(w.dtype) for w in layer.weights}),
            "names": [w.name for w in layer.weights],
            "expected_names": [p.name for p in layer.config.parameters()],
            "shapes": [list(w.shape) for w in layer.weights],
            "expected_shapes": [list(p.shape) for p in layer.config.parameters()],
        }
        if backend == "torch" or scheme not in seen:
            seen.add(scheme)
            layer32 = make_layer(scheme, causal, seed=n)
            y32 = layer32(x32)
            expected32 = layer_attention(layer32.config, weights_of(layer32), x32.astype("float64"))
            entry["float32"] = max_diff(numpy(y32).astype("float64"), expected32)
            entry["dtype32"] = str(numpy(y32).dtype)
            entry["weight_dtypes32"] = sorted({str(w.dtype) for w in layer32.weights})
        out[tag(scheme, causal)] = entry
    # param_dtype alone makes a float64 layer.
    from relattn.keras import RelativeAttention

    layer = RelativeAttention(D_MODEL, HEADS, "t5", param_dtype="float64")
    y = layer(x64)
    out["param_dtype"] = {
        "compute": layer.compute_dtype,
        "weights": sorted({str(w.dtype) for w in layer.weights}),
        "output": str(numpy(y).dtype),
        "diff": max_diff(numpy(y), layer_attention(layer.config, weights_of(layer), x64)),
    }
    report["equality"] = out


def check_init(report: dict[str, Any]) -> None:
    """Statistics of the weights of larger layers, per parameter, with the spec's figures."""
    from relattn.keras import RelativeAttention

    out: dict[str, Any] = {}
    sizes = dict(d_model=128, num_heads=4, grid=(12, 12), max_relative_position=256)
    for n, scheme in enumerate(SCHEMES):
        kwargs = {k: v for k, v in sizes.items() if k in ("d_model", "num_heads")}
        if scheme in ("swin", "decomposed"):
            kwargs["grid"] = sizes["grid"]
        if scheme == "shaw":
            kwargs["max_relative_position"] = sizes["max_relative_position"]
        layer = RelativeAttention(scheme=scheme, seed=100 + n, **kwargs)
        layer.build((None, None, kwargs["d_model"]))
        values = weights_of(layer)
        for p in layer.config.parameters():
            v = values[p.name]
            variable = getattr(layer, p.name)
            out[f"{scheme}/{p.name}"] = {
                "init": p.init,
                "std_spec": p.std,
                "shape": list(variable.shape),
                "shape_spec": list(p.shape),
                "dtype": str(variable.dtype),
                "std": float(v.std()),
                "mean": float(v.mean()),
                "max_abs": float(np.abs(v).max()),
                "glorot_bound": float(np.sqrt(6.0 / (p.shape[0] + p.shape[-1]))),
                "size": int(v.size),
            }
        out[f"{scheme}/distinct"] = bool(not np.array_equal(values["w_q"], values["w_k"]))
    # The same seed draws the same weights; Keras's global seed otherwise.
    a = RelativeAttention(16, 2, "t5", seed=7)
    b = RelativeAttention(16, 2, "t5", seed=7)
    a.build((None, None, 16))
    b.build((None, None, 16))
    out["seeded_equal"] = max_diff(weights_of(a)["w_q"], weights_of(b)["w_q"])
    report["init"] = out


def loss_weights(shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(5).normal(size=shape)


def check_transforms_jax(report: dict[str, Any]) -> None:
    """jax.jit of stateless_call equals eager; jax.grad through it, finite and nonzero."""
    import jax
    import jax.numpy as jnp

    out: dict[str, Any] = {}
    x = jnp.asarray(inputs(1))
    w = jnp.asarray(loss_weights(x.shape))
    for n, scheme in enumerate(SCHEMES):
        causal = scheme not in ("swin", "decomposed")
        layer = make_layer(scheme, causal, dtype="float64", seed=10 + n)
        eager = layer(x)
        trainable = [v.value for v in layer.trainable_variables]
        names = [v.name for v in layer.trainable_variables]

        def loss(values, x, layer=layer):
            y, _ = layer.stateless_call(values, [], x)
            return jnp.sum(y * w), y

        def both(values, x, layer=layer, loss=loss, names=names):
            (_, y), grads = jax.value_and_grad(loss, has_aux=True)(values, x)
            expected = jax.grad(
                lambda params: jnp.sum(layer_attention(layer.config, params, x) * w)
            )(dict(zip(names, values, strict=True)))
            return y, grads, expected

        # One compile per scheme: the layer's gradient and layer_attention's side by side.
        jitted, grads, expected = jax.jit(both)(trainable, x)
        out[scheme] = {
            "jit": max_diff(jitted, eager),
            "grads": {
                name: {
                    "finite": bool(np.isfinite(np.asarray(g)).all()),
                    "max_abs": float(np.abs(np.asarray(g)).max()),
                    "diff": max_diff(g, expected[name]),
                }
                for name, g in zip(names, grads, strict=True)
            },
        }
    report["transforms"] = out


def check_transforms_torch(report: dict[str, Any]) -> None:
    """loss.backward() puts gradients on the variables, equal to autograd of layer_attention."""
    import torch

    out: dict[str, Any] = {}
    x_np = inputs(1)
    w_np = loss_weights(x_np.shape)
    for n, scheme in enumerate(SCHEMES):
        causal = scheme not in ("swin", "decomposed")
        layer = make_layer(scheme, causal, dtype="float64", seed=10 + n)
        y = layer(x_np)
        w = torch.as_tensor(w_np, device=y.device)
        (y * w).sum().backward()
        params = {
            p.name: torch.tensor(weights_of(layer)[p.name], device=y.device, requires_grad=True)
            for p in layer.config.parameters()
        }
        x = torch.as_tensor(x_np, device=y.device)
        (layer_attention(layer.config, params, x) * w).sum().backward()
        grads = {}
        for p in layer.config.parameters():
            g = getattr(layer, p.name).value.grad
            grads[p.name] = {
                "finite": g is not None and bool(torch.isfinite(g).all()),
                "max_abs": None if g is None else float(g.abs().max()),
                "diff": None if g is None else max_diff(g.cpu(), params[p.name].grad.cpu()),
                "is_parameter": isinstance(getattr(layer, p.name).value, torch.nn.Parameter),
            }
        out[scheme] = {"grads": grads}
    report["transforms"] = out


def stacked_model(seed: int = 0, schemes: tuple[str, ...] = SCHEMES) -> Any:
    """A layer of every scheme in one functional model (L = 6 = 2·3, the grids' size)."""
    import keras

    from relattn.keras import RelativeAttention

    keras.utils.set_random_seed(seed)
    tokens = keras.Input((LENGTH, D_MODEL))
    h = tokens
    for scheme in schemes:
        extra: dict[str, Any] = {}
        if scheme == "rope":
            extra["rope_scaling"] = {"scaling": "linear", "factor": 2.0}
            extra["rotary_dim"] = 4
        if scheme == "t5":
            extra.update(num_buckets=8, max_distance=16)
        if scheme == "shaw":
            extra["max_relative_position"] = 3
        if scheme == "deberta":
            extra.update(position_buckets=4, max_relative_positions=8)
        causal = scheme not in ("swin", "decomposed")
        h = h + RelativeAttention(
            D_MODEL, HEADS, scheme, causal=causal, grid=grid_of(scheme), name=scheme, **extra
        )(h)
    return keras.Model(tokens, keras.layers.Dense(4)(h))


def check_model(report: dict[str, Any], backend: str) -> None:
    """One model of every scheme: compiled predict == eager predict; .keras round trip."""
    import keras

    out: dict[str, Any] = {}
    x = inputs(2, batch=3).astype("float32")
    model = stacked_model()
    model.compile(run_eagerly=True)
    eager = model.predict(x, verbose=0)
    start = time.perf_counter()
    if backend == "torch":
        # Keras compiles with torch.compile, whose Inductor C++ build takes a minute on
        # 2 cores: Dynamo's capture and AOT autograd (aot_eager) are what meet relattn,
        # here on two schemes (each capture takes seconds).
        import functools

        import torch

        small = stacked_model(schemes=JIT_SCHEMES)
        small.compile(run_eagerly=True)
        small_eager = small.predict(x, verbose=0)
        compile_ = torch.compile
        torch.compile = functools.partial(compile_, backend="aot_eager")
        try:
            small.compile(jit_compile=True)
            out["compiled"] = max_diff(small.predict(x, verbose=0), small_eager)
        finally:
            torch.compile = compile_
        out["compiled_schemes"] = list(JIT_SCHEMES)
    else:
        model.compile(jit_compile=True)
        out["compiled"] = max_diff(model.predict(x, verbose=0), eager)
        out["compiled_schemes"] = list(SCHEMES)
    out["compile_seconds"] = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.keras"
        model.save(path)
        loaded = keras.saving.load_model(path)
    loaded.compile(run_eagerly=True)
    out["round_trip"] = max_diff(loaded.predict(x, verbose=0), eager)
    configs = {}
    for layer in model.layers:
        if hasattr(layer, "config") and layer.name in SCHEMES:
            twin = loaded.get_layer(layer.name)
            configs[layer.name] = {
                "class": type(twin).__name__,
                "module": type(twin).__module__,
                "same_config": twin.config == layer.config,
                "same_get_config": twin.get_config() == layer.get_config(),
                "weights": max(
                    max_diff(numpy(a), numpy(b))
                    for a, b in zip(layer.weights, twin.weights, strict=True)
                ),
            }
    out["layers"] = configs
    out["rope_scaling"] = model.get_layer("rope").get_config()["rope_scaling"]
    out["json"] = json.loads(json.dumps(model.get_layer("swin").get_config()))["grid"]
    report["model"] = out


def check_fit(report: dict[str, Any]) -> None:
    """examples/keras_training.py: model.fit lowers the loss."""
    spec = importlib.util.spec_from_file_location("keras_training", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model, losses = example.train(3, 0, samples=128)
    held_out, _ = example.make_data(1234, samples=64)
    report["fit"] = {"losses": losses, "accuracy": example.accuracy(model, held_out)}


def check_decoding(report: dict[str, Any]) -> None:
    """Transformer-XL's memory through next_memory; prefill + one cached step == full call."""
    out: dict[str, Any] = {}
    layer = make_layer("transformer_xl", True, dtype="float64", memory_length=4, seed=3)
    x1, x2 = inputs(3, length=5), inputs(4, length=3)
    memory = layer.next_memory(None, x1)
    y2 = layer(x2, memory=memory)
    expected = layer_attention(layer.config, weights_of(layer), x2, memory=x1[:, -4:])
    out["memory"] = {
        "shape": list(memory.shape),
        "diff": max_diff(numpy(y2), expected),
        "next_shape": list(layer.next_memory(memory, x2).shape),
    }
    cache = {}
    for scheme in ("transformer_xl", "t5", "alibi", "rope", "deberta", "shaw"):
        layer = make_layer(scheme, True, dtype="float64", seed=20)
        x = inputs(5, length=5)
        full = numpy(layer(x))
        prefill, kv = layer(x[:, :4], return_cache=True)
        step = layer(x[:, 4:], cache=kv)
        cache[scheme] = {
            "prefill": max_diff(numpy(prefill), full[:, :4]),
            "step": max_diff(numpy(step), full[:, 4:]),
            "cache_shape": list(kv[0].shape),
        }
    out["cache"] = cache
    report["decoding"] = out


def check_padding(report: dict[str, Any]) -> None:
    """A padding mask from Embedding(mask_zero=True) masks the padded keys."""
    import keras

    from relattn.keras import RelativeAttention

    tokens = np.array([[3, 1, 4, 1, 5, 0], [2, 7, 0, 0, 0, 0]], dtype="int32")
    embed = keras.layers.Embedding(9, D_MODEL, mask_zero=True, dtype="float64")
    layer = RelativeAttention(D_MODEL, HEADS, "t5", dtype="float64", seed=4)
    h = embed(tokens)
    y = layer(h)
    keep = tokens != 0
    expected = layer_attention(
        layer.config, weights_of(layer), numpy(h), mask=keep[:, None, None, :]
    )
    unmasked = layer_attention(layer.config, weights_of(layer), numpy(h))
    rows = keep[..., None]  # padded queries' outputs are not compared
    report["padding"] = {
        "diff": max_diff(np.where(rows, numpy(y), 0), np.where(rows, expected, 0)),
        "unmasked_diff": max_diff(np.where(rows, numpy(y), 0), np.where(rows, unmasked, 0)),
        "explicit_mask_diff": max_diff(numpy(layer(h, mask=keep[:, None, None, :])), expected),
    }


def check_errors(report: dict[str, Any]) -> None:
    """Bad arguments and the TensorFlow backend (Keras's backend() patched)."""
    import keras

    from relattn.keras import RelativeAttention

    def error(fn: Callable[[], Any]) -> str | None:
        try:
            fn()
        except Exception as exc:
            return error_of(exc)
        return None

    layer = RelativeAttention(D_MODEL, HEADS, "t5")
    out = {
        "scheme": error(lambda: RelativeAttention(D_MODEL, HEADS, "nope")),
        "d_model": error(lambda: layer(np.ones((1, 4, D_MODEL + 1), "float32"))),
        "heads": error(lambda: RelativeAttention(15, 2, "t5")),
        "grid": error(lambda: RelativeAttention(D_MODEL, HEADS, "swin")),
        "grid_length": error(
            lambda: RelativeAttention(D_MODEL, HEADS, "swin", grid=GRID)(
                np.ones((1, 5, D_MODEL), "float32")
            )
        ),
        "param_dtype": error(lambda: RelativeAttention(D_MODEL, HEADS, param_dtype="int32")),
        "seed": error(lambda: RelativeAttention(D_MODEL, HEADS, seed=1.5)),
        "functional": error(lambda: layer(keras.Input((4, D_MODEL + 1)))),
    }
    original = keras.backend.backend
    keras.backend.backend = lambda: "tensorflow"
    try:
        out["tensorflow"] = error(lambda: RelativeAttention(D_MODEL, HEADS))
    finally:
        keras.backend.backend = original
    report["errors"] = out


def check_distribution(report: dict[str, Any]) -> None:
    """DataParallel and ModelParallel (layout_map) on 2 host devices == one device."""
    import jax
    import keras

    from relattn.keras import layout_map

    out: dict[str, Any] = {"devices": len(jax.devices())}
    x = inputs(6, batch=4).astype("float32")
    single = stacked_model()
    expected = single.predict(x, verbose=0)
    weights = single.get_weights()
    devices = keras.distribution.list_devices()

    data = keras.distribution.DataParallel(devices=devices)
    with data.scope():
        model = stacked_model()
        model.set_weights(weights)
        out["data_parallel"] = max_diff(model.predict(x, verbose=0), expected)

    mesh = keras.distribution.DeviceMesh((1, DEVICES), ("batch", "model"), devices)
    layouts = layout_map(mesh, {"heads": "model"})
    sharded = keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch")
    with sharded.scope():
        model = stacked_model()
        model.set_weights(weights)
        out["model_parallel"] = max_diff(model.predict(x, verbose=0), expected)
        # Eager calls on the sharded weights (relattn.keras runs them under jax.jit).
        out["eager"] = {
            name: max_diff(numpy(model.get_layer(name)(x)), numpy(single.get_layer(name)(x)))
            for name in ("shaw", "t5")
        }
        specs = {}
        for layer_name, weight in (("t5", "w_q"), ("t5", "w_o"), ("t5", "relative_attention_bias"),
                                   ("transformer_xl", "content_bias"), ("shaw", "key_embeddings"),
                                   ("swin", "b_o")):  # fmt: skip
            value = getattr(model.get_layer(layer_name), weight).value
            specs[f"{layer_name}/{weight}"] = {
                "spec": [None if a is None else str(a) for a in value.sharding.spec],
                "shard": list(value.addressable_shards[0].data.shape),
            }
        out["specs"] = specs
        # One training step, sharded and not: the same loss and weights.
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        y = np.zeros((4, LENGTH, 4), "float32")
        out["sharded_loss"] = float(model.train_on_batch(x, y))
        trained = model.get_weights()
    single.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    out["single_loss"] = float(single.train_on_batch(x, y))
    out["trained"] = max(max_diff(a, b) for a, b in zip(trained, single.get_weights(), strict=True))
    report["distribution"] = out


# -- driver -------------------------------------------------------------------------------


def run(report: dict[str, Any], name: str, fn: Callable[[], None]) -> None:
    start, cpu = time.perf_counter(), time.process_time()
    try:
        fn()
    except Exception as exc:
        report.setdefault("failures", {})[name] = error_of(exc) + "\n" + traceback.format_exc()
    report.setdefault("seconds", {})[name] = time.perf_counter() - start
    report.setdefault("cpu_seconds", {})[name] = time.process_time() - cpu


def main(backend: str, path: str) -> None:
    warnings.simplefilter("ignore")  # Dynamo's notes on array_api_compat's lru_cache
    start = time.perf_counter()
    import keras

    report: dict[str, Any] = {
        "backend": keras.backend.backend(),
        "keras": keras.__version__,
        "import_seconds": time.perf_counter() - start,
    }
    run(report, "equality", lambda: check_equality(report, backend))
    run(report, "init", lambda: check_init(report))
    if backend == "jax":
        run(report, "transforms", lambda: check_transforms_jax(report))
    else:
        run(report, "transforms", lambda: check_transforms_torch(report))
    run(report, "model", lambda: check_model(report, backend))
    run(report, "fit", lambda: check_fit(report))
    run(report, "decoding", lambda: check_decoding(report))
    run(report, "padding", lambda: check_padding(report))
    run(report, "errors", lambda: check_errors(report))
    if backend == "jax":
        run(report, "distribution", lambda: check_distribution(report))
    report["total_seconds"] = time.perf_counter() - start
    report["total_cpu_seconds"] = time.process_time()
    Path(path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
