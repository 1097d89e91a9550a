"""relattn.testing and relattn.capabilities: the harness itself.

``assert_close`` fails where it must (values, shapes, NaNs, dtype, library,
device), the tolerances are SPEC §5's, targets load by name and by
``RELATTN_BACKENDS`` with clear errors, each target converts, copies and
compiles as its library does, and the capability table covers every public
name and agrees with the signatures.
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import numpy as np
import pytest
from conftest import target_fixture
from test_transforms import CASES

import relattn
from relattn import testing
from relattn.capabilities import (
    CAPABILITIES,
    CAPABILITY_NAMES,
    LIBRARIES,
    SETTINGS,
    dtypes,
    unsupported,
)

# --------------------------------------------------------------------------------------------
# Tolerances and assert_close
# --------------------------------------------------------------------------------------------


def test_tolerances_are_spec_section_5():
    assert testing.tolerance("float64") == {"rtol": 1e-10, "atol": 1e-12}
    assert testing.tolerance("float32") == {"rtol": 1e-4, "atol": 1e-5}
    assert testing.tolerance(np.complex64) == testing.tolerance("float32")
    assert testing.tolerance(np.dtype("complex128")) == testing.tolerance("float64")


def test_tolerance_of_library_dtypes(backend):
    assert testing.tolerance(backend.dtype("float32")) == testing.tolerance("float32")


@pytest.mark.parametrize("dtype", ["int64", "bool", "float8"])
def test_tolerance_of_a_dtype_without_one(dtype):
    with pytest.raises(ValueError, match=rf"^dtype must be a floating .*got {dtype}"):
        testing.tolerance(dtype)


def test_tolerance_is_a_copy():
    testing.tolerance("float32")["rtol"] = 1.0
    assert testing.tolerance("float32")["rtol"] == 1e-4


@pytest.mark.parametrize(
    ("dtype", "inside", "outside"),
    [("float64", 1e-11, 1e-9), ("float32", 5e-5, 5e-4)],
)
def test_assert_close_at_the_edge_of_the_tolerance(dtype, inside, outside):
    desired = np.array([1.0, -2.0, 3.0])
    testing.assert_close((desired * (1 + inside)).astype(dtype), desired)
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        testing.assert_close((desired * (1 + outside)).astype(dtype), desired)


def test_assert_close_uses_the_given_dtype():
    actual, desired = np.array([1.0 + 5e-5]), np.array([1.0])
    testing.assert_close(actual, desired, dtype="float32")
    with pytest.raises(AssertionError):
        testing.assert_close(actual, desired)
    with pytest.raises(AssertionError):
        testing.assert_close(actual, desired, dtype="float32", rtol=1e-6, atol=0.0)


def test_assert_close_fails_on_shapes():
    with pytest.raises(AssertionError, match=r"^shapes differ: \(2, 1\) != \(2,\)"):
        testing.assert_close(np.zeros((2, 1)), np.zeros(2))


def test_assert_close_fails_on_nan():
    with pytest.raises(AssertionError):
        testing.assert_close(np.array([np.nan, 1.0]), np.array([0.0, 1.0]))
    testing.assert_close(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]))


def test_assert_close_compares_integers_exactly():
    testing.assert_close(np.array([1, 2]), np.array([1, 2]))
    with pytest.raises(AssertionError, match="Mismatched elements"):
        testing.assert_close(np.array([1, 2]), np.array([1, 3]))


def test_assert_close_compares_complex_parts():
    with pytest.raises(AssertionError):
        testing.assert_close(np.array([1 + 1j]), np.array([1 - 1j]))


def test_assert_close_reads_any_library(backend):
    x = backend.asarray(np.array([1.0, 2.0]), "float64")
    testing.assert_close(x, np.array([1.0, 2.0]))
    testing.assert_close(np.array([1.0, 2.0]), x)
    with pytest.raises(AssertionError):
        testing.assert_close(x, np.array([1.0, 2.5]))


def test_target_assert_close_checks_dtype_library_and_values(backend):
    expected = np.array([1.0, 2.0])
    backend.assert_close(backend.asarray(expected, "float32"), expected, "float32")
    with pytest.raises(AssertionError, match=r"^dtypes differ"):
        backend.assert_close(backend.asarray(expected, "float64"), expected, "float32")
    with pytest.raises(AssertionError, match="returned a"):
        backend.assert_close(
            [1.0, 2.0] if backend.library == "numpy" else expected, expected, "float64"
        )
    with pytest.raises(AssertionError):
        backend.assert_close(backend.asarray(expected + 1e-3, "float32"), expected, "float32")


def test_target_assert_close_of_a_complex_result(backend):
    z = np.array([1 + 2j, -1j])
    backend.assert_close(backend.asarray(z, "complex64"), z, "float32", result_dtype="complex64")
    with pytest.raises(AssertionError, match=r"^dtypes differ"):
        backend.assert_close(backend.asarray(z, "complex64"), z, "float32")


def test_target_assert_close_checks_the_device(torch_backend):
    """A tensor on the wrong device fails even where its values agree."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("one device only: nothing to mix up")
    other = "cpu" if torch_backend.gpu else "cuda"
    x = torch.ones(2, dtype=torch.float64, device=other)
    with pytest.raises(AssertionError, match=r"^devices differ"):
        torch_backend.assert_close(x, np.ones(2), "float64")


# --------------------------------------------------------------------------------------------
# Directional derivatives
# --------------------------------------------------------------------------------------------


def _cubic(p):
    """``Σ w³ + (b₀ w₁)²`` of ``{"w": (3,), "b": [(1,)]}``: nested dicts and lists."""
    w, b = p["w"], p["b"][0][0]
    return np.sum(w**3) + (b * w[1]) ** 2


def _cubic_grad(p):
    w, b = p["w"], p["b"][0][0]
    gw = 3 * w**2
    gw[1] += 2 * b**2 * w[1]
    return {"w": gw, "b": [np.array([2 * b * w[1] ** 2])]}


def test_directional_derivatives_pass_for_the_gradient(rng):
    params = {"w": np.array([0.5, -1.0, 2.0]), "b": [np.array([0.3])]}
    testing.assert_directional_derivatives(_cubic, _cubic_grad(params), params, rng)


@pytest.mark.parametrize("wrong", ["scaled", "swapped", "missing"])
def test_directional_derivatives_fail_for_a_wrong_gradient(rng, wrong):
    params = {"w": np.array([0.5, -1.0, 2.0]), "b": [np.array([0.3])]}
    grad = _cubic_grad(params)
    if wrong == "scaled":
        grad["w"] = 1.01 * grad["w"]
    elif wrong == "swapped":
        grad["w"] = grad["w"][::-1].copy()
    else:
        grad["b"] = []
    with pytest.raises(AssertionError):
        testing.assert_directional_derivatives(_cubic, grad, params, rng)


def test_directional_derivatives_of_jax_grad(jax_backend, rng):
    import jax
    import jax.numpy as jnp

    params = {"a": jax_backend.asarray(rng.normal(size=(3,)), "float64"),
              "b": jax_backend.asarray(rng.normal(size=(2, 3)), "float64")}  # fmt: skip

    def loss(p):
        return jnp.sum(jnp.tanh(p["b"] @ p["a"]) ** 2)

    jax_backend.assert_directional_derivatives(loss, jax.grad(loss)(params), params, rng)
    wrong = jax.tree_util.tree_map(lambda g: 1.001 * g, jax.grad(loss)(params))
    with pytest.raises(AssertionError):
        jax_backend.assert_directional_derivatives(loss, wrong, params, rng)


# --------------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------------


def test_target_names_are_unique_and_known():
    names = [t.name for t in testing.TARGETS]
    assert len(names) == len(set(names))
    assert {t.library for t in testing.TARGETS} == set(LIBRARIES)
    for t in testing.TARGETS:
        assert testing.target(t.name) is t
        assert t.kind in LIBRARIES[t.library].devices


def test_unknown_target_is_a_value_error():
    with pytest.raises(ValueError, match=r"^target must be one of \('numpy', .*got 'tensorflow'"):
        testing.target("tensorflow")


def test_selected_targets_from_names():
    assert [t.name for t in testing.selected_targets("jax, numpy")] == ["numpy", "jax"]
    assert [t.name for t in testing.selected_targets(["dask"])] == ["dask"]
    with pytest.raises(ValueError, match="got 'nupmy'"):
        testing.selected_targets("numpy,nupmy")


def test_selected_targets_read_relattn_backends(monkeypatch):
    monkeypatch.setenv("RELATTN_BACKENDS", "torch_cuda,torch")
    assert [t.name for t in testing.selected_targets()] == ["torch", "torch_cuda"]
    monkeypatch.setenv("RELATTN_BACKENDS", "")
    assert testing.selected_targets() == list(testing.TARGETS)
    monkeypatch.setenv("RELATTN_BACKENDS", "cuda")
    with pytest.raises(ValueError, match="got 'cuda'"):
        testing.selected_targets()


def test_available_targets_can_run(monkeypatch):
    monkeypatch.delenv("RELATTN_BACKENDS", raising=False)
    available = testing.available_targets()
    assert [t.name for t in available[:2]] == ["numpy", "numpy_readonly"]
    for t in available:
        assert t.unavailable is None
        assert t.is_array(t.from_host(np.zeros(2)))


@pytest.mark.subprocess
def test_a_missing_library_is_unavailable_with_the_reason():
    """In a fresh interpreter where importing torch fails, as if it were not installed."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from relattn.testing import target, available_targets\n"
        "print(target('torch').unavailable)\n"
        "print('torch' in [t.name for t in available_targets()])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    assert out[0].startswith("torch is not installed (")
    assert out[1] == "False"


def test_cpu_targets_have_no_gpu_device():
    assert testing.target("numpy").unavailable is None
    with pytest.raises(LookupError, match=r"^numpy has no gpu device"):
        testing.Target("numpy_gpu", "numpy", kind="gpu").device  # noqa: B018


@pytest.mark.subprocess
def test_importing_relattn_testing_imports_no_array_library():
    code = (
        "import sys\nimport relattn.testing\n"
        "print(sorted(m for m in ('torch', 'jax', 'dask', 'cupy', 'array_api_strict', 'pytest')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def test_asarray_converts_dtype_and_device(backend):
    x = backend.asarray(np.arange(6.0).reshape(2, 3), "float32")
    assert backend.is_array(x)
    assert x.dtype == backend.dtype("float32")
    assert tuple(x.shape) == (2, 3)
    np.testing.assert_array_equal(backend.to_host(x), np.arange(6.0).reshape(2, 3))
    assert backend.asarray(np.array([True])).dtype == backend.xp.bool


def test_from_host_copies(backend):
    a = np.arange(3.0)
    x = backend.from_host(a)
    a[0] = 100.0
    np.testing.assert_array_equal(backend.to_host(x), [0.0, 1.0, 2.0])
    assert backend.to_host(x).dtype == np.float64


def test_readonly_target_makes_readonly_arrays():
    t = testing.target("numpy_readonly")
    with pytest.raises(ValueError, match="read-only"):
        t.asarray(np.zeros(2), "float64")[0] = 1.0
    t = testing.target("numpy")
    t.asarray(np.zeros(2), "float64")[0] = 1.0


def test_missing_dtype_is_a_lookup_error():
    with pytest.raises(LookupError, match=r"^numpy has no bfloat16"):
        testing.target("numpy").dtype("bfloat16")
    with pytest.raises(LookupError, match=r"^array_api_strict has no float16"):
        testing.target("array_api_strict").asarray(np.zeros(2), "float16")
    assert not testing.target("dask").has_dtype("bfloat16")
    assert testing.target("dask").has_dtype("int32")


def test_to_host_of_any_library(backend):
    x = backend.asarray(np.array([[1.5, -2.0]]), "float64")
    host = testing.to_host(x)
    assert type(host) is np.ndarray
    np.testing.assert_array_equal(host, [[1.5, -2.0]])
    with pytest.raises(TypeError, match=r"^x must be an array of one of"):
        testing.to_host([1.0])


def test_ready_returns_the_computed_array(backend):
    x = backend.asarray(np.ones(3), "float64") * 2
    np.testing.assert_array_equal(np.asarray(backend.to_host(x)), [2.0, 2.0, 2.0])
    done = backend.ready(x)
    if backend.library == "dask":
        assert type(done) is np.ndarray  # the graph computed
    else:
        assert done is x


def test_default_jit_is_jax_jit_on_jax_only(backend):
    def f(x):
        return x + 1

    jitted = backend.default_jit(f)
    if backend.is_jax:
        assert jitted is not f
        assert hasattr(jitted, "lower")  # a jax.jit wrapper
    else:
        assert jitted is f


#: The targets whose library has no compiler.
eager_backend = target_fixture("eager_backend", lambda t: LIBRARIES[t.library].compiler is None)


def test_compile_where_there_is_no_compiler(eager_backend):
    with pytest.raises(TypeError, match="has no compiler"):
        eager_backend.compile(lambda x: x)
    with pytest.raises(TypeError, match="has no compiler"):
        eager_backend.jit(lambda x: x)


def test_jit_compiles_whole(jit_backend):
    """A graph break is an error: a data-dependent Python branch does not compile."""

    def branches(x):
        return x + 1 if float(x.sum()) > 0 else x - 1

    x = jit_backend.asarray(np.ones(3), "float64")
    np.testing.assert_array_equal(jit_backend.to_host(jit_backend.jit(lambda x: x * 2)(x)), 2.0)
    with pytest.raises(Exception) as info:
        jit_backend.jit(branches)(x)
    assert not isinstance(info.value, AssertionError)


def test_peak_device_bytes_needs_a_gpu(backend):
    if backend.gpu:
        pytest.skip("a GPU target counts its memory")
    with pytest.raises(LookupError, match="runs on the host"):
        backend.peak_device_bytes(lambda: None)


def test_skip_unless_capable_skips_with_the_declared_reason():
    with pytest.raises(pytest.skip.Exception, match="ring_attention on numpy: runs inside jax"):
        testing.skip_unless_capable(testing.target("numpy"), "ring_attention", "run")
    testing.skip_unless_capable(testing.target("torch"), "relative_attention", "grad")


# --------------------------------------------------------------------------------------------
# Capabilities
# --------------------------------------------------------------------------------------------


def _floating_input(case) -> bool:
    """A call of the call table (test_transforms.CASES) takes a floating array."""
    return any(a.dtype.kind == "f" for a in case.inputs(np.random.default_rng(0)))


def test_every_public_name_is_declared():
    assert set(CAPABILITIES) == set(relattn.__all__) - SETTINGS


@pytest.mark.parametrize("name", sorted(CAPABILITIES))
def test_declaration_agrees_with_the_signature_and_the_calls(name):
    declared = CAPABILITIES[name]
    obj = getattr(relattn, name)
    parameters = {} if inspect.isclass(obj) else inspect.signature(obj).parameters
    floating = [_floating_input(case) for n, case in CASES.items() if n.partition("[")[0] == name]
    assert (declared.grad is None) == (not any(floating)), f"{name}: grad is {declared.grad}"
    if "block_size" in parameters:
        assert declared.blockwise
    if declared.blockwise and "block_size" not in parameters:
        assert "block" in name.lower(), f"{name} is declared blockwise without block_size"
    for capability in ("jit", "grad"):
        if getattr(declared, capability) is False:
            assert declared.why[capability]
    if declared.ring:
        assert name == "ring_attention" or "block_size" in parameters, name


def test_unsupported_reasons():
    assert (
        unsupported("stop_gradient", "torch", "grad") == CAPABILITIES["stop_gradient"].why["grad"]
    )
    assert unsupported("relative_attention", "dask", "grad") == (
        "dask has no automatic differentiation"
    )
    assert unsupported("ring_attention", "jax", "ring") is None
    assert unsupported("masked_softmax", "jax", "ring") == "masked_softmax has no ring form"
    assert unsupported("complex_attention", "torch", "float32").startswith(
        "complex_attention computes in complex floating dtypes"
    )
    assert unsupported("complex_attention", "torch", "complex64") is None
    assert unsupported("causal_mask", "array_api_strict", "float16") == (
        "array_api_strict has no float16"
    )


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("relative_bias_v2", "numpy", "run"), "^name must be a public name"),
        (("relative_attention", "mxnet", "run"), "^library must be one of"),
        (("relative_attention", "numpy", "fast"), "^capability must be one of"),
    ],
)
def test_unsupported_rejects_unknown_names(args, match):
    with pytest.raises(ValueError, match=match):
        unsupported(*args)


def test_dtypes_follow_the_library():
    assert dtypes("relative_attention", "torch") == ("bfloat16", "float16", "float32", "float64")
    assert dtypes("relative_attention", "array_api_strict") == ("float32", "float64")
    assert dtypes("ring_attention", "numpy") == ()
    assert dtypes("causal_mask", "jax") == ()
    assert set(CAPABILITY_NAMES) == {"run", "jit", "grad", "blockwise", "ring"}
