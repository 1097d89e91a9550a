"""One test suite, every backend.

The ``backend`` fixture runs a test once per :class:`Target`, an array library
on one device: NumPy, NumPy with read-only inputs (catches hidden in-place
writes), array-api-strict, PyTorch (CPU), JAX (CPU), Dask, and CuPy / PyTorch
CUDA / JAX GPU. A target whose library is not installed or has no such device
is skipped at run time with the reason shown. ``RELATTN_BACKENDS=numpy,torch``
restricts the run to some targets, by name. Tests of one library's own
transforms take ``torch_backend`` (``torch.autograd``, ``torch.compile``),
``jax_backend`` (``jax.grad``) or ``jit_backend`` (either compiler) instead,
so that the other libraries do not even appear as skipped.

A target is a test configuration over :mod:`relattn.backends`: the library,
its namespace, its devices, host copies and its compiler all come from the
:class:`relattn.backends.Backend` record that relattn itself uses.

Tests build their inputs in NumPy float64, convert them with
``backend.asarray(a, dtype)``, and compare results with
``backend.assert_close(result, expected, dtype)`` against a float64 reference:
the tolerances (SPEC §5) live here and nowhere else. Naive references, written
from the papers' formulas with loops over ``(i, j)``, are in ``reference.py``.

Laziness: a test module that tags relattn's functions with
:func:`array_api_extra.testing.lazy_xp_function` (and lists ``relattn`` in
``lazy_xp_modules`` where it calls them as ``relattn.name``) has them run under
``jax.jit`` on JAX and fail on Dask if they compute the graph, for every test
that takes the ``backend`` fixture.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from types import ModuleType
from typing import Any

# JAX reads this when it is first imported: float64 must be on for the float64 tests.
os.environ.setdefault("JAX_ENABLE_X64", "1")

import array_api_compat
import numpy as np
import pytest
from array_api_extra import testing as xpx_testing
from hypothesis import HealthCheck, settings

from relattn.backends import MODULES, Backend, load, namespace_of_module

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

#: dtype name -> the modules (``xp=``) whose library has no such dtype.
_MISSING_DTYPES = {
    "bfloat16": ("numpy", "array_api_strict", "cupy", "dask.array"),
    "float16": ("array_api_strict",),
}

#: Module -> "``x`` is an array of this library" (not NumPy in disguise).
_IS_ARRAY: dict[str, Callable[[Any], bool]] = {
    "numpy": array_api_compat.is_numpy_array,
    "cupy": array_api_compat.is_cupy_array,
    "torch": array_api_compat.is_torch_array,
    "jax.numpy": array_api_compat.is_jax_array,
    "dask.array": array_api_compat.is_dask_array,
    "array_api_strict": lambda a: type(a).__module__.startswith("array_api_strict"),
}


@dataclass(frozen=True)
class Target:
    """One array library on one device, as the tests see it.

    Attributes
    ----------
    name : str
        The test id: ``"numpy_readonly"``, ``"torch_cuda"``, ``"jax_gpu"`` …
    backend_name : str
        The relattn backend (a key of :data:`relattn.backends.MODULES`).
    kind : str
        The device kind, ``"cpu"`` or ``"gpu"``, passed to ``Backend.device``.
    readonly : bool
        Inputs made by :meth:`asarray` cannot be written (NumPy only).
    """

    name: str
    backend_name: str
    kind: str = "cpu"
    readonly: bool = False

    # -- known without importing the library ----------------------------
    @property
    def module(self) -> str:
        """The module a user passes as ``xp=`` (``"numpy"``, ``"jax.numpy"`` …)."""
        return MODULES[self.backend_name]

    @property
    def gpu(self) -> bool:
        return self.kind == "gpu"

    @property
    def is_torch(self) -> bool:
        return self.module == "torch"

    @property
    def is_jax(self) -> bool:
        return self.module == "jax.numpy"

    # -- from relattn.backends ------------------------------------------
    @cached_property
    def _loaded(self) -> tuple[ModuleType, Backend]:
        return load(self.backend_name)

    @property
    def lib(self) -> Any:
        """The library module a user would pass as ``xp=`` (``numpy``, ``torch`` …)."""
        return self._loaded[0]

    @property
    def record(self) -> Backend:
        """relattn's :class:`~relattn.backends.Backend` record of the library."""
        return self._loaded[1]

    @cached_property
    def xp(self) -> Any:
        """The array-API namespace relattn resolves for this library."""
        return namespace_of_module(self.lib)

    @cached_property
    def device(self) -> Any:
        """``Backend.device(kind)``: the library's device object (``None`` where implicit)."""
        return self.record.device(self.kind)

    @cached_property
    def unavailable(self) -> str | None:
        """Why this target cannot run here, or None."""
        try:
            self.device  # noqa: B018 - imports the library and looks the device up
        except ImportError as e:
            return f"{self.module} is not installed ({e})"
        except LookupError as e:
            return str(e)
        return None

    def dtype(self, name: str) -> Any:
        """The library's dtype called ``name``; skips the test if it has none."""
        if self.module in _MISSING_DTYPES.get(name, ()):
            pytest.skip(f"{self.name} has no {name}")
        if self.is_jax and name in ("float64", "complex128"):
            import jax

            if not jax.config.read("jax_enable_x64"):
                pytest.skip(f"{self.name} runs without {name} (JAX_ENABLE_X64 unset)")
        for space in (self.xp, self.lib):
            if hasattr(space, name):
                return getattr(space, name)
        # Dask arrays hold NumPy dtypes; its namespaces name only the standard's.
        return np.dtype(name)

    # -- conversion -----------------------------------------------------
    def asarray(self, a: Any, dtype: str | None = None) -> Any:
        """A copy of NumPy data ``a`` as this target's array on its device, cast to ``dtype``."""
        host = np.asarray(a)
        name = str(host.dtype) if dtype is None else dtype
        want = self.dtype(name)  # first: skips where the library has no such dtype
        # NumPy has no bfloat16: the library casts float64 data itself.
        host = np.asarray(host, dtype=np.float64 if name == "bfloat16" else name)
        x = self.record.from_host(host, device=self.device)
        if x.dtype != want:
            x = self.xp.astype(x, want)
        if self.readonly:
            x.setflags(write=False)
        return x

    def to_numpy(self, x: Any) -> np.ndarray:
        """Host NumPy copy of an array of this target (``Backend.to_host``)."""
        return self.record.to_host(x)

    def array_module_of(self, x: Any) -> bool:
        """``x`` is an array of this target's library (not NumPy in disguise)."""
        return _IS_ARRAY[self.module](x)

    def assert_close(
        self, actual: Any, expected: Any, dtype: str, *, result_dtype: str | None = None
    ) -> None:
        """``actual`` against a float64 NumPy reference, at SPEC §5 tolerances for ``dtype``.

        ``actual`` must be an array of this library, on this target's device,
        with ``expected``'s shape and dtype ``result_dtype`` (``dtype`` unless
        given: a complex result of real inputs, say), checked by
        :func:`array_api_extra.testing.assert_close` against ``expected``
        converted to that dtype.
        """
        __tracebackhide__ = True
        assert self.array_module_of(actual), f"{self.name} returned a {type(actual)}"
        want = dtype if result_dtype is None else result_dtype
        desired = self.asarray(expected, want)
        if want == "bfloat16":
            # NumPy cannot read bfloat16 arrays: the dtype is checked here, the values in float32.
            assert actual.dtype == desired.dtype, f"dtypes do not match: {actual.dtype} != {want}"
            f32 = self.dtype("float32")
            actual, desired = self.xp.astype(actual, f32), self.xp.astype(desired, f32)
        xpx_testing.assert_close(actual, desired, **TOLERANCES[dtype])

    def assert_directional_derivatives(
        self, loss: Callable[[Any], Any], grad: Any, params: Any, rng: np.random.Generator,
        *, count: int = 3, h: float = 1e-5, rtol: float = 1e-7,
    ) -> None:  # fmt: skip
        """``grad`` (a pytree like ``params``) against central differences of ``loss``.

        Along ``count`` random directions ``u``: ``⟨grad, u⟩`` and
        ``(loss(p + h·u) − loss(p − h·u)) / 2h`` agree to ``rtol`` (float64).
        """
        import jax

        __tracebackhide__ = True
        leaves, tree = jax.tree_util.tree_flatten(params)
        grads = jax.tree_util.tree_leaves(grad)
        for _ in range(count):
            u = [self.asarray(rng.normal(size=tuple(a.shape)), "float64") for a in leaves]

            def moved(sign: float, u: list[Any] = u) -> Any:
                return jax.tree_util.tree_unflatten(
                    tree, [a + sign * h * x for a, x in zip(leaves, u, strict=True)]
                )

            numeric = float((loss(moved(1.0)) - loss(moved(-1.0))) / (2 * h))
            analytic = float(sum(self.xp.sum(g * x) for g, x in zip(grads, u, strict=True)))
            assert abs(numeric - analytic) <= rtol * max(1.0, abs(analytic)), (numeric, analytic)

    def jit(self, fn: Any) -> Any:
        """``fn`` compiled whole by ``Backend.compile`` (take the ``jit_backend`` fixture).

        JAX: ``jax.jit``. PyTorch: ``torch.compile(fullgraph=True)``, so a graph
        break fails the test, with the ``aot_eager`` backend: Dynamo's capture
        and AOTAutograd, without Inductor's C++ build (``test_compile.py`` runs
        Inductor on the attention functions).
        """
        if self.record.compile is None:
            raise TypeError(f"{self.name} has no compiler: the test should take jit_backend")
        if self.is_torch:
            import torch._dynamo

            torch._dynamo.reset()  # a fresh cache: tests reuse code objects
            return self.record.compile(fn, backend="aot_eager")
        return self.record.compile(fn)


TARGETS = [
    Target("numpy", "numpy"),
    Target("numpy_readonly", "numpy", readonly=True),
    Target("array_api_strict", "array_api_strict"),
    Target("torch", "torch"),
    Target("jax", "jax"),
    Target("dask", "dask"),
    Target("cupy", "cupy", kind="gpu"),
    Target("torch_cuda", "torch", kind="gpu"),
    Target("jax_gpu", "jax", kind="gpu"),
]
_SELECTED = os.environ.get("RELATTN_BACKENDS")
if _SELECTED:
    TARGETS = [t for t in TARGETS if t.name in _SELECTED.split(",")]


def target_fixture(name: str, select: Callable[[Target], bool], *, lazy: bool = False) -> Any:
    """A fixture ``name`` running a test once per target that ``select`` keeps.

    A target that cannot run here skips the test with the reason. With ``lazy``,
    the functions the test module tags with ``lazy_xp_function`` are patched for
    the test (``jax.jit`` on JAX, no graph computation on Dask).
    """

    @pytest.fixture(name=name, params=[t for t in TARGETS if select(t)], ids=lambda t: t.name)
    def fixture(request: pytest.FixtureRequest) -> Iterator[Target]:
        target: Target = request.param
        if target.unavailable:
            pytest.skip(f"{target.name}: {target.unavailable}")
        if not lazy:
            yield target
            return
        with xpx_testing.patch_lazy_xp_functions(request, xp=target.xp):
            yield target

    return fixture


#: Every target.
backend = target_fixture("backend", lambda t: True, lazy=True)
#: PyTorch on the CPU and on CUDA: autograd, ``torch.compile``.
torch_backend = target_fixture("torch_backend", lambda t: t.is_torch)
#: JAX on the CPU and on a GPU: ``jax.grad``, ``jax.jit``.
jax_backend = target_fixture("jax_backend", lambda t: t.is_jax)
#: The targets with a compiler (``Target.jit``).
jit_backend = target_fixture("jit_backend", lambda t: t.is_torch or t.is_jax)
#: The CPU targets that the examples' recipes hand results back from through DLPack.
RECIPE_TARGETS = ("numpy", "array_api_strict", "torch", "jax")
recipe_backend = target_fixture("recipe_backend", lambda t: t.name in RECIPE_TARGETS)


@pytest.fixture(params=FLOAT_DTYPES)
def dtype(request: pytest.FixtureRequest) -> str:
    """Name of a floating dtype; ``backend.dtype(name)`` gives the library's."""
    return request.param


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261121)
