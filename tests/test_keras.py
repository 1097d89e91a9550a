"""The Keras 3 layer, :class:`relattn.keras.RelativeAttention`, on the JAX and PyTorch backends.

Keras fixes its backend when it is first imported, and this test session may have
imported other things (or nothing may have set ``KERAS_BACKEND``): the checks run in
one worker process per backend, ``tests/_keras_worker.py`` (JAX's also on 2 host
devices for ``keras.distribution``), started together once per module; the tests here
assert on their JSON reports. This process does not import Keras.

Per backend: every scheme (causal and not where it allows) equals
:func:`relattn.layers.layer_attention` with the layer's own weights (float64 within
1e-12, float32 within 1e-5); the weights' names, shapes, dtypes and initial statistics
follow :meth:`relattn.layers.LayerConfig.parameters`; compiled ``predict`` equals eager;
gradients (``jax.grad`` through ``stateless_call``, torch's ``loss.backward()``) are
finite, nonzero where they should be and equal layer_attention's; ``model.fit`` lowers
the loss (``examples/keras_training.py``); ``.keras`` files round trip; Transformer-XL
memory and the decoder cache; Keras padding masks; bad arguments and the TensorFlow
backend. JAX: ``DataParallel`` and ``ModelParallel`` (with :func:`relattn.keras.layout_map`)
equal one device.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _workers import Worker, report

from relattn.layers import SCHEMES, LayerConfig

if importlib.util.find_spec("keras") is None:  # importorskip would import Keras here
    pytest.skip("keras is not installed", allow_module_level=True)

pytestmark = pytest.mark.subprocess

WORKER = Path(__file__).parent / "_keras_worker.py"
BACKENDS = ("jax", "torch")
TIMEOUT = 600.0
GRID_SCHEMES = ("swin", "decomposed")
VARIANTS = [(s, c) for s in SCHEMES for c in (False, True) if not (c and s in GRID_SCHEMES)]


def _tag(scheme: str, causal: bool) -> str:
    return f"{scheme}/{'causal' if causal else 'full'}"


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Both workers, started together (each imports Keras and its backend for seconds)."""
    folder = tmp_path_factory.mktemp("keras")
    started = {
        backend: Worker(WORKER, [backend], folder, backend)
        for backend in BACKENDS
        if importlib.util.find_spec(backend) is not None
    }
    yield started
    for worker in started.values():
        worker.stop()


@pytest.fixture(params=BACKENDS)
def backend_report(request: pytest.FixtureRequest, workers: Any) -> dict[str, Any]:
    backend = request.param
    if backend not in workers:
        pytest.skip(f"{backend} is not installed")
    result = report(workers, backend, TIMEOUT)
    assert result["backend"] == backend
    return result


def section(result: dict[str, Any], name: str) -> Any:
    """A section of the report, or the test fails with the worker's traceback."""
    failure = result.get("failures", {}).get(name)
    if failure:
        pytest.fail(f"the {result['backend']} worker's {name!r} section failed:\n{failure}")
    return result[name]


@pytest.mark.parametrize(("scheme", "causal"), VARIANTS, ids=[_tag(*v) for v in VARIANTS])
def test_layer_equals_functional(backend_report, scheme, causal):
    entry = section(backend_report, "equality")[_tag(scheme, causal)]
    assert entry["names"] == entry["expected_names"]
    assert entry["shapes"] == entry["expected_shapes"]
    assert entry["dtype64"] == "float64"
    assert entry["weight_dtypes"] == ["float64"]
    assert entry["float64"] <= 1e-12
    if "float32" in entry:  # JAX: one variant per scheme
        assert entry["dtype32"] == "float32"
        assert entry["weight_dtypes32"] == ["float32"]
        assert entry["float32"] <= 1e-5


def test_float32_on_every_scheme(backend_report):
    equality = section(backend_report, "equality")
    assert {tag.split("/")[0] for tag, e in equality.items() if "float32" in e} >= set(SCHEMES)


def test_param_dtype_makes_a_float64_layer(backend_report):
    entry = section(backend_report, "equality")["param_dtype"]
    assert entry["compute"] == "float64"
    assert entry["weights"] == ["float64"]
    assert entry["output"] == "float64"
    assert entry["diff"] <= 1e-12


@pytest.mark.parametrize("scheme", SCHEMES)
def test_initial_weights_follow_the_spec(backend_report, scheme):
    init = section(backend_report, "init")
    assert init[f"{scheme}/distinct"]
    assert init["seeded_equal"] == 0.0
    entries = {k.split("/", 1)[1]: v for k, v in init.items() if k.startswith(f"{scheme}/")}
    for name, e in entries.items():
        if name == "distinct":
            continue
        assert e["shape"] == e["shape_spec"], name
        assert e["dtype"] == "float32", name
        std = e["std_spec"]
        # Sampling error of a std over n draws is about std / sqrt(2n): 6 of those.
        tolerance = 6 / math.sqrt(2 * e["size"])
        if e["init"] == "zeros":
            assert e["max_abs"] == 0.0, name
        elif e["init"] == "normal":
            assert abs(e["std"] / std - 1) < tolerance, (name, e)
            assert abs(e["mean"]) < 6 * std / math.sqrt(e["size"]), (name, e)
        elif e["init"] == "truncated_normal":
            # N(0, σ²) cut at ±2σ and redrawn: std ≈ 0.8796 σ.
            assert e["max_abs"] <= 2 * std * (1 + 1e-6), (name, e)
            assert abs(e["std"] / (0.8796 * std) - 1) < tolerance, (name, e)
        else:
            bound = e["glorot_bound"]
            assert e["max_abs"] <= bound * (1 + 1e-6), (name, e)
            assert abs(e["std"] / (bound / math.sqrt(3)) - 1) < tolerance, (name, e)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_gradients_reach_every_weight(backend_report, scheme):
    entry = section(backend_report, "transforms")[scheme]
    if backend_report["backend"] == "jax":
        assert entry["jit"] <= 1e-12  # jax.jit of stateless_call == the eager call
    config = LayerConfig(16, 2, scheme, grid=(2, 3) if scheme in GRID_SCHEMES else None)
    names = [p.name for p in config.parameters()]
    assert sorted(entry["grads"]) == sorted(names)
    for name, g in entry["grads"].items():
        assert g["finite"], name
        assert g["diff"] <= 1e-12 * max(1.0, g["max_abs"]), (name, g)
        if backend_report["backend"] == "torch":
            assert g["is_parameter"], name
        if name == "b_k" and scheme != "deberta":
            # A bias on every key adds q·b_k to a whole row of scores, which softmax drops
            # (DeBERTa's p2c term k_j·Q_r[δ(i, j)] keeps it).
            assert g["max_abs"] < 1e-12, g
        else:
            # float64: a gradient that is there is far above rounding (the zeros-initialised
            # tables of 'decomposed' too).
            assert g["max_abs"] > 1e-7, (name, g)


def test_compiled_predict_and_keras_file(backend_report):
    model = section(backend_report, "model")
    assert model["compiled"] <= 1e-5
    assert set(model["compiled_schemes"]) <= set(SCHEMES)
    assert model["round_trip"] == 0.0
    assert sorted(model["layers"]) == sorted(SCHEMES)
    for name, layer in model["layers"].items():
        assert layer["class"] == "RelativeAttention", name
        assert layer["module"] == "relattn.keras", name
        assert layer["same_config"] and layer["same_get_config"], name
        assert layer["weights"] == 0.0, name
    assert model["rope_scaling"] == {"scaling": "linear", "factor": 2.0}
    assert model["json"] == [2, 3]


def test_fit_lowers_the_loss(backend_report):
    fit = section(backend_report, "fit")
    losses = fit["losses"]
    assert len(losses) == 3
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0] - 0.2, losses


def test_memory_and_cache(backend_report):
    decoding = section(backend_report, "decoding")
    memory = decoding["memory"]
    assert memory["shape"] == [2, 4, 16]
    assert memory["next_shape"] == [2, 4, 16]
    assert memory["diff"] <= 1e-12
    assert sorted(decoding["cache"]) == sorted(s for s in SCHEMES if s not in GRID_SCHEMES)
    for scheme, entry in decoding["cache"].items():
        assert entry["cache_shape"] == [2, 2, 4, 8], scheme
        assert entry["prefill"] <= 1e-12, scheme
        assert entry["step"] <= 1e-12, scheme


def test_keras_padding_mask_masks_padded_keys(backend_report):
    padding = section(backend_report, "padding")
    assert padding["diff"] <= 1e-12
    assert padding["explicit_mask_diff"] <= 1e-12
    assert padding["unmasked_diff"] > 1e-3  # the mask changed something


def test_bad_arguments_and_backends(backend_report):
    errors = section(backend_report, "errors")
    assert errors["scheme"].startswith("ValueError: scheme:")
    assert errors["d_model"].startswith("ValueError: x: expected shape")
    assert errors["functional"].startswith("ValueError: x: expected shape")
    assert errors["heads"].startswith("ValueError: d_model:")
    assert errors["grid"].startswith("ValueError: grid:")
    assert errors["grid_length"].startswith("ValueError:") and "L = h·w" in errors["grid_length"]
    assert errors["param_dtype"].startswith("TypeError: param_dtype:")
    assert errors["seed"].startswith("TypeError: seed:")
    message = errors["tensorflow"]
    assert message.startswith("RuntimeError:")
    for part in ("'tensorflow'", "'jax'", "'torch'", "KERAS_BACKEND"):
        assert part in message, part


def test_distribution_on_two_devices(workers):
    if "jax" not in workers:
        pytest.skip("jax is not installed")
    dist = section(report(workers, "jax", TIMEOUT), "distribution")
    assert dist["devices"] == 2
    assert dist["data_parallel"] <= 1e-6
    assert dist["model_parallel"] <= 1e-5
    assert max(dist["eager"].values()) <= 1e-5
    specs = dist["specs"]
    assert specs["t5/w_q"] == {"spec": [None, "model"], "shard": [16, 8]}
    assert specs["t5/w_o"] == {"spec": ["model", None], "shard": [8, 16]}
    assert specs["t5/relative_attention_bias"]["spec"] == [None, "model"]
    assert specs["transformer_xl/content_bias"] == {"spec": ["model", None], "shard": [1, 8]}
    assert specs["shaw/key_embeddings"]["spec"] == [None, None]  # head_dim: no rule
    assert specs["swin/b_o"]["spec"] == [None]
    assert abs(dist["sharded_loss"] - dist["single_loss"]) <= 1e-6
    assert dist["trained"] <= 1e-6


def test_import_and_tensorflow_default():
    """``import relattn`` leaves Keras alone; Keras set to a missing TensorFlow: ImportError."""
    code = (
        "import sys, relattn, relattn.layers\n"
        "assert 'keras' not in sys.modules\n"
        "try:\n"
        "    import relattn.keras\n"
        "except ImportError as exc:\n"
        "    print('ImportError:', exc)\n"
    )
    if importlib.util.find_spec("tensorflow") is not None:
        pytest.skip("TensorFlow is installed: Keras imports on it")
    env = {**os.environ, "KERAS_BACKEND": "tensorflow"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ImportError: relattn.keras:"), done.stdout
    for part in ("'tensorflow'", "'jax'", "'torch'", "KERAS_BACKEND"):
        assert part in done.stdout, part
