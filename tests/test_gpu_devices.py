"""What a GPU run needs of the harness and the namespace look-up, proven on the CPU.

Four causes failed GPU tests on a machine with one NVIDIA GPU, each shown here
without one (stand-ins for the device, the precision switch, the library):

- device identity: a target names the concrete device (``cuda:0``, as arrays
  made there report theirs), never ``cuda``, which compares unequal to it;
- precision: JAX's default float32 matrix products on NVIDIA GPUs are
  TF32-class; the harness checks in full float32 precision, for the block only,
  and refuses a float32 check where PyTorch's TF32 switch is on;
- ``torch.compile``: the namespace look-up of any tensor class (``nn.Parameter``)
  compiles on a cold cache, without a warning (the suite's warnings are errors);
- CuPy arrays hold NumPy's dtype objects: the harness tells libraries apart by
  the array's type, never by its dtype.

The tests that need a GPU skip without one (reason "no GPU").
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import relattn
from relattn import _namespace, testing

GPU_TARGETS = [t for t in testing.TARGETS if t.gpu]


def _available_gpu_targets() -> list[testing.Target]:
    return [t for t in GPU_TARGETS if t.unavailable is None]


# --------------------------------------------------------------------------------------------
# Device identity
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("index", [0, 1])
def test_torch_gpu_target_names_the_concrete_device(monkeypatch, index):
    """The CUDA device of a target is ``cuda:<current device>``, not ``cuda``."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: index)
    device = testing.Target("torch_cuda_stand_in", "torch", kind="gpu").device
    assert device == torch.device("cuda", index)
    assert str(device) == f"cuda:{index}"
    # Why it matters: a tensor made on "cuda" reports the concrete device, and the bare
    # device compares unequal to it.
    assert torch.device("cuda") != torch.device("cuda", 0)


def test_torch_gpu_target_is_unavailable_without_cuda(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    stand_in = testing.Target("torch_cuda_stand_in", "torch", kind="gpu")
    assert stand_in.unavailable == "torch has no gpu device (CUDA)"


@pytest.mark.parametrize("target", GPU_TARGETS, ids=lambda t: t.name)
def test_created_arrays_report_the_target_device(target):
    """On a GPU: arrays made on the target's device report that same, concrete device."""
    if target.unavailable is not None:
        pytest.skip("no GPU")
    import array_api_compat

    made = relattn.causal_mask(3, 4, xp=target.lib, device=target.device)
    converted = target.asarray(np.ones((2, 3)), "float32")
    for x in (made, converted):
        assert array_api_compat.device(x) == target.device
    assert "cuda" not in str(target.device) or ":" in str(target.device)
    target.assert_close(converted, np.ones((2, 3)), "float32")


# --------------------------------------------------------------------------------------------
# Precision
# --------------------------------------------------------------------------------------------


@pytest.fixture
def jax_gpu_stand_in(monkeypatch):
    """A JAX target of kind "gpu" on the CPU device: the harness's GPU code paths, here."""
    jax = pytest.importorskip("jax")
    cpu = jax.devices("cpu")[0]
    monkeypatch.setattr(testing._Jax, "device", lambda self, kind: cpu)
    return testing.Target("jax_gpu_stand_in", "jax", kind="gpu")


def test_jax_gpu_checks_run_in_highest_precision_for_the_block_only(jax_gpu_stand_in):
    import jax

    def precision():
        return jax.config.jax_default_matmul_precision

    with jax.default_matmul_precision("default"):  # JAX's own default, TF32 on a GPU
        with jax_gpu_stand_in.full_precision():
            assert precision() == "highest"
        assert precision() == "default"  # no global change
        with testing.target("jax").full_precision():  # the CPU target changes nothing
            assert precision() == "default"


@pytest.mark.parametrize("compiler", ["compile", "default_jit", "jit"])
def test_jax_gpu_compiled_functions_trace_in_highest_precision(jax_gpu_stand_in, compiler):
    """A target's jit traces (and lowers) each call in full precision, whatever the
    caller's, and leaves the caller's setting as it was."""
    import jax

    traced = []

    def f(x):
        traced.append(jax.config.jax_default_matmul_precision)  # at trace time
        return x @ x

    compiled = getattr(jax_gpu_stand_in, compiler)(f)
    x = jax_gpu_stand_in.asarray(np.eye(2), "float32")
    with jax.default_matmul_precision("default"):
        assert "precision = [HIGHEST, HIGHEST]" in compiled.lower(x).as_text()
        np.testing.assert_array_equal(jax_gpu_stand_in.to_host(compiled(x)), np.eye(2))
        assert jax.config.jax_default_matmul_precision == "default"
    assert traced and set(traced) == {"highest"}


@pytest.fixture
def torch_gpu_stand_in(monkeypatch):
    """A torch target of kind "gpu" on the CPU device."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(testing._Torch, "device", lambda self, kind: torch.device("cpu"))
    return testing.Target("torch_cuda_stand_in", "torch", kind="gpu")


def _enable_tf32(monkeypatch):
    """TF32 as torch reports it after ``torch.set_float32_matmul_precision("high")``,
    without changing torch's setting."""
    import torch

    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    if getattr(torch.backends.cuda.matmul, "fp32_precision", "none") != "none":
        pytest.skip("this process set torch's TF32 switch through its newer API")


def test_torch_cuda_float32_checks_refuse_tf32(torch_gpu_stand_in, monkeypatch):
    expected = np.array([1.0, 2.0])
    torch_gpu_stand_in.assert_close(
        torch_gpu_stand_in.asarray(expected, "float32"), expected, "float32"
    )
    with torch_gpu_stand_in.full_precision():
        pass
    _enable_tf32(monkeypatch)
    with pytest.raises(AssertionError, match=r"computes float32 products in TF32 \(.*'high'\)"):
        torch_gpu_stand_in.assert_close(
            torch_gpu_stand_in.asarray(expected, "float32"), expected, "float32"
        )
    with pytest.raises(RuntimeError, match="exactness check needs full float32"):
        torch_gpu_stand_in.full_precision()
    # float64 products do not use TF32, nor does the CPU.
    torch_gpu_stand_in.assert_close(
        torch_gpu_stand_in.asarray(expected, "float64"), expected, "float64"
    )
    cpu = testing.target("torch")
    cpu.assert_close(cpu.asarray(expected, "float32"), expected, "float32")
    with cpu.full_precision():
        pass


def test_torch_reports_tf32_through_its_newer_switch(monkeypatch):
    """torch >= 2.9 keeps the switch in ``torch.backends.cuda.matmul.fp32_precision``."""
    torch = pytest.importorskip("torch")
    matmul = types.SimpleNamespace(fp32_precision="tf32")
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    torch_library = testing._LIBRARIES["torch"]
    assert "fp32_precision is 'tf32'" in torch_library.imprecise("gpu")
    matmul.fp32_precision = "ieee"
    assert torch_library.imprecise("gpu") is None
    assert torch_library.imprecise("cpu") is None


def _relative_error(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_jax_gpu_default_precision_is_tf32_class_and_highest_is_float32():
    """The bound the guide gives: float32 products of JAX's default precision on a GPU
    within 2e-3 (relative, Frobenius norm) of float64, and within 1e-5 under "highest"."""
    found = [t for t in _available_gpu_targets() if t.is_jax]
    if not found:
        pytest.skip("no GPU")
    import jax

    gpu = found[0]
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 512, 512))
    want = a @ b
    x, y = gpu.asarray(a, "float32"), gpu.asarray(b, "float32")
    errors = {}
    for precision in ("default", "highest"):
        with jax.default_matmul_precision(precision):
            errors[precision] = _relative_error(gpu.to_host(jax.jit(jax.numpy.matmul)(x, y)), want)
    assert errors["default"] <= 2e-3, errors
    assert errors["highest"] <= 1e-5, errors


# --------------------------------------------------------------------------------------------
# torch.compile of the namespace look-up
# --------------------------------------------------------------------------------------------


@pytest.fixture
def cold_namespace_cache(monkeypatch):
    """The namespace caches emptied for the test (restored after), Dynamo's too."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(_namespace, "_NAMESPACE_OF_TYPE", {})
    monkeypatch.setattr(_namespace, "_RESOLVED", {})
    torch._dynamo.reset()
    yield torch
    torch._dynamo.reset()


@pytest.mark.parametrize("kind", ["tensor", "parameter", "both"])
def test_namespace_of_any_tensor_class_compiles_on_a_cold_cache(cold_namespace_cache, kind):
    """``torch.compile(fullgraph=True)`` of a first call on ``nn.Parameter`` inputs: no
    graph break, and no warning (array-api-compat's lru_cache-wrapped type tests, its
    set of modules) from the look-up."""
    torch = cold_namespace_cache
    x = torch.linspace(-1.0, 1.0, 6).reshape(2, 3)
    p = torch.nn.Parameter(x.clone())
    arrays = {"tensor": (x, x), "parameter": (p, p), "both": (x, p)}[kind]

    def call(a, b):
        xp = _namespace.namespace(a=a, b=b)
        return relattn.masked_softmax(xp.add(a, b)), _namespace.device_of(b)

    compiled = torch.compile(call, fullgraph=True, backend="eager")
    got, device = compiled(*arrays)
    want, _ = call(*arrays)
    torch.testing.assert_close(got, want)
    assert device == torch.device("cpu")


def test_is_array_of_tensors_and_scalars():
    torch = pytest.importorskip("torch")
    assert _namespace.is_array(torch.nn.Parameter(torch.zeros(1)))
    assert _namespace.is_array(torch.zeros(1))
    for scalar in (1, 1.5, True, 1j, np.float64(1.0)):
        assert not _namespace.is_array(scalar)
    assert _namespace.is_array(np.float32(1.0))  # a NumPy scalar of a non-Python type


# --------------------------------------------------------------------------------------------
# CuPy's arrays hold NumPy's dtypes
# --------------------------------------------------------------------------------------------


class _DeviceArray:
    """A stand-in for ``cupy.ndarray``: NumPy's dtype objects, a host copy by ``get()``."""

    __module__ = "cupy"

    def __init__(self, data):
        self._data = np.asarray(data)
        self.dtype, self.shape, self.ndim = self._data.dtype, self._data.shape, self._data.ndim

    def get(self):
        return self._data.copy()


@pytest.fixture
def cupy_stand_in(monkeypatch):
    """A module named ``cupy`` whose ``ndarray`` is :class:`_DeviceArray` (where CuPy is not
    installed: with CuPy present, the stand-in would replace it for the test only)."""
    module = types.ModuleType("cupy")
    module.ndarray = _DeviceArray
    monkeypatch.setitem(sys.modules, "cupy", module)
    return module


def test_harness_tells_cupy_from_numpy_by_the_array_not_its_dtype(cupy_stand_in):
    x = cupy_stand_in.ndarray(np.array([1.0, 2.0], dtype=np.float32))
    assert x.dtype is np.dtype(np.float32)  # NumPy's own dtype object, as CuPy's is
    assert testing._library_of(x).name == "cupy"
    assert not testing.target("numpy").is_array(x)
    host = testing.to_host(x)
    assert type(host) is np.ndarray and host.dtype == np.float32
    testing.assert_close(x, np.array([1.0, 2.0]))  # compared through the host copy
    assert testing.tolerance(x.dtype) == testing.tolerance("float32")
    assert _namespace.library(x) == "cupy"


def test_cupy_target_dtypes_are_numpys():
    """The CuPy target's dtype objects are NumPy's (CuPy's ``float32`` is NumPy's), and a
    target's ``assert_close`` checks its library by the array, not by that dtype."""
    cupy = testing.target("cupy")
    if cupy.unavailable is not None:
        pytest.skip("no GPU")
    assert cupy.dtype("float32") == np.float32
    numpy_array = np.ones(2, dtype=np.float32)
    with pytest.raises(AssertionError, match="returned a ndarray"):
        cupy.assert_close(numpy_array, np.ones(2), "float32")
