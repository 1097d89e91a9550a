"""One test suite, every backend.

The ``backend`` fixture runs a test once per array library: NumPy, NumPy with
read-only inputs (catches hidden in-place writes), array-api-strict, PyTorch
(CPU), JAX (CPU), Dask, and CuPy / PyTorch CUDA / JAX GPU. A backend that is
not installed or has no device is skipped at run time with the reason shown.
``RELATTN_BACKENDS=numpy,torch`` restricts the run to some backends.

Tests build their inputs in NumPy float64, convert them with
``backend.asarray(a, dtype)``, and compare results with
``backend.assert_close(result, expected, dtype)`` against a float64 reference:
the tolerances (SPEC §5) live here and nowhere else. Naive references, written
from the papers' formulas with loops over ``(i, j)``, are in ``reference.py``.
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass, field
from typing import Any

# JAX reads this when it is first imported: float64 must be on for the float64 tests.
os.environ.setdefault("JAX_ENABLE_X64", "1")

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile("default")

#: SPEC §5, on unit-scale data.
TOLERANCES = {
    "float64": {"rtol": 1e-10, "atol": 1e-12},
    "float32": {"rtol": 1e-4, "atol": 1e-5},
    "float16": {"rtol": 1e-2, "atol": 1e-2},
    "bfloat16": {"rtol": 5e-2, "atol": 5e-2},
}

FLOAT_DTYPES = ("float32", "float64")


def _probe_gpu_torch() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "torch has no CUDA device"


def _probe_gpu_jax() -> str | None:
    import jax

    try:
        jax.devices("gpu")
    except RuntimeError:
        return "jax has no GPU device"
    return None


def _probe_cupy() -> str | None:
    import cupy

    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as e:
        return f"cupy finds no CUDA device ({e})"
    return None if count else "cupy finds no CUDA device"


@dataclass
class Backend:
    """One array library on one device, as the tests see it."""

    name: str
    module: str
    gpu: bool = False
    readonly: bool = False
    probe: Any = None
    _cache: dict = field(default_factory=dict, repr=False)

    # -- availability -------------------------------------------------
    @functools.cached_property
    def unavailable(self) -> str | None:
        """Why this backend cannot run here, or None."""
        try:
            importlib.import_module(self.module)
        except ImportError as e:
            return f"{self.module} is not installed ({e})"
        if self.probe is not None:
            return self.probe()
        return None

    # -- namespace and device -----------------------------------------
    @functools.cached_property
    def lib(self) -> Any:
        """The library module a user would pass as ``xp=`` (``numpy``, ``torch`` …)."""
        return importlib.import_module(self.module)

    @functools.cached_property
    def xp(self) -> Any:
        """The array-API namespace relattn resolves for this library."""
        from relattn.backends import namespace_of_module

        return namespace_of_module(self.lib)

    @functools.cached_property
    def device(self) -> Any:
        if self.name == "torch_cuda":
            return self.lib.device("cuda")
        if self.name == "torch":
            return self.lib.device("cpu")
        if self.name == "jax":
            import jax

            return jax.devices("cpu")[0]
        if self.name == "jax_gpu":
            import jax

            return jax.devices("gpu")[0]
        return None

    @property
    def is_jax(self) -> bool:
        return self.name.startswith("jax")

    @property
    def is_torch(self) -> bool:
        return self.name.startswith("torch")

    def dtype(self, name: str) -> Any:
        """The library's dtype called ``name``; skips the test if it has none."""
        if name == "bfloat16" and self.module in (
            "numpy",
            "array_api_strict",
            "cupy",
            "dask.array",
        ):
            pytest.skip(f"{self.name} has no bfloat16")
        if name == "float16" and self.module == "array_api_strict":
            pytest.skip("array_api_strict has no float16")
        for space in (self.xp, self.lib):
            if hasattr(space, name):
                return getattr(space, name)
        # Dask arrays hold NumPy dtypes; its namespaces name only the standard's.
        return np.dtype(name)

    # -- conversion ---------------------------------------------------
    def asarray(self, a: Any, dtype: str | None = None) -> Any:
        """A copy of NumPy data ``a`` as this backend's array, optionally cast to ``dtype``."""
        a = np.asarray(a)
        if dtype is None:
            dtype = str(a.dtype)
        if self.module in ("numpy",):
            out = np.array(a, dtype=np.dtype(dtype))
            if self.readonly:
                out.setflags(write=False)
            return out
        if self.module == "array_api_strict":
            return self.xp.asarray(np.array(a, dtype=np.dtype(dtype)))
        if self.module == "dask.array":
            import dask.array as da

            return da.from_array(np.array(a, dtype=np.dtype(dtype)))
        if self.module == "cupy":
            return self.lib.asarray(np.array(a, dtype=np.dtype(dtype)))
        if self.is_torch:
            t = self.lib.asarray(np.array(a, dtype=np.float64 if dtype == "bfloat16" else dtype))
            return t.to(device=self.device, dtype=self.dtype(dtype))
        if self.is_jax:
            import jax

            host = np.array(a, dtype=np.float64 if dtype == "bfloat16" else dtype)
            return jax.device_put(host, self.device).astype(self.dtype(dtype))
        raise AssertionError(self.name)

    def to_numpy(self, x: Any) -> np.ndarray:
        """Host NumPy copy of a backend array (float for bfloat16)."""
        if self.module == "dask.array":
            x = x.compute()
        if self.is_torch:
            x = x.detach().cpu()
            if x.dtype == self.lib.bfloat16:
                x = x.float()
            return x.numpy()
        if self.module == "cupy":
            return self.lib.asnumpy(x)
        if self.is_jax:
            return np.asarray(x)
        if self.module == "array_api_strict":
            return np.from_dlpack(x)
        return np.asarray(x)

    def array_module_of(self, x: Any) -> bool:
        """``x`` is an array of this backend's library (not NumPy in disguise)."""
        import array_api_compat

        checks = {
            "numpy": array_api_compat.is_numpy_array,
            "cupy": array_api_compat.is_cupy_array,
            "torch": array_api_compat.is_torch_array,
            "jax.numpy": array_api_compat.is_jax_array,
            "dask.array": array_api_compat.is_dask_array,
            "array_api_strict": lambda a: type(a).__module__.startswith("array_api_strict"),
        }
        return checks[self.module](x)

    def assert_close(self, actual: Any, expected: Any, dtype: str) -> None:
        """Compare a result with a float64 NumPy reference at SPEC §5 tolerances for ``dtype``."""
        assert self.array_module_of(actual), f"{self.name} returned a {type(actual)}"
        np.testing.assert_allclose(
            np.asarray(self.to_numpy(actual), dtype=np.float64),
            np.asarray(expected, dtype=np.float64),
            **TOLERANCES[dtype],
        )

    def jit(self, fn: Any) -> Any:
        """``fn`` compiled by this backend's tracing jit, or skip the test.

        JAX: ``jax.jit``. PyTorch: ``torch.compile(fullgraph=True)``, so a graph
        break fails the test, with the ``aot_eager`` backend: Dynamo's capture
        and AOTAutograd, without Inductor's C++ build (``test_compile.py`` runs
        Inductor on the attention functions).
        """
        if self.is_jax:
            import jax

            return jax.jit(fn)
        if self.module == "torch":
            import torch

            torch._dynamo.reset()  # a fresh cache: tests reuse code objects
            return torch.compile(fn, fullgraph=True, backend="aot_eager")
        pytest.skip(f"{self.name} has no jit (jax.jit and torch.compile tests)")


BACKENDS = [
    Backend("numpy", "numpy"),
    Backend("numpy_readonly", "numpy", readonly=True),
    Backend("array_api_strict", "array_api_strict"),
    Backend("torch", "torch"),
    Backend("jax", "jax.numpy"),
    Backend("dask", "dask.array"),
    Backend("cupy", "cupy", gpu=True, probe=_probe_cupy),
    Backend("torch_cuda", "torch", gpu=True, probe=_probe_gpu_torch),
    Backend("jax_gpu", "jax.numpy", gpu=True, probe=_probe_gpu_jax),
]
_SELECTED = os.environ.get("RELATTN_BACKENDS")
if _SELECTED:
    BACKENDS = [b for b in BACKENDS if b.name in _SELECTED.split(",")]


@pytest.fixture(params=BACKENDS, ids=lambda b: b.name)
def backend(request: pytest.FixtureRequest) -> Backend:
    b: Backend = request.param
    if b.unavailable:
        pytest.skip(f"{b.name}: {b.unavailable}")
    return b


@pytest.fixture(params=FLOAT_DTYPES)
def dtype(request: pytest.FixtureRequest) -> str:
    """Name of a floating dtype; ``backend.dtype(name)`` gives the library's."""
    return request.param


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261121)
