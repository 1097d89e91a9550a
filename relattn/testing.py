"""Testing helpers: run and check code that uses relattn on every array library.

For relattn's own test suite, its benchmarks, its demo and its documentation,
and for a user's tests of their own models built on relattn (as
``array_api_extra.testing`` and SciPy's ``xp_assert_close`` serve theirs):

- :class:`Target`: one array library on one device (NumPy, NumPy with
  read-only inputs, array-api-strict, PyTorch, JAX, Dask on the CPU; CuPy,
  PyTorch CUDA, JAX on a GPU), with its namespace, device, dtypes, host copies
  and compilers. :func:`target` finds one by name, :func:`selected_targets`
  lists those ``RELATTN_BACKENDS`` names, :func:`available_targets` those
  that can run here.
- :data:`TOLERANCES`, :func:`tolerance` and :func:`assert_close`: agreement
  with a NumPy float64 reference at the tolerances of SPEC §5.
- :func:`assert_directional_derivatives`: a gradient against central
  differences of the loss.
- :func:`skip_unless_capable`: a test's skip, read from the declarations of
  :mod:`relattn.capabilities`.
- :func:`gloo_world`: a script run once per rank of a ``torch.distributed`` gloo
  group of processes on this machine (the torch ring's and DTensor's tests);
  :func:`single_process_group`: a gloo group of this process alone.

Importing this module imports NumPy, array-api-compat and relattn only; each
array library is imported when a target first needs it.

Examples
--------
>>> import numpy as np
>>> import relattn
>>> from relattn.testing import assert_close, target
>>> numpy = target("numpy")
>>> x = numpy.asarray(np.arange(6.0).reshape(2, 3), "float32")
>>> out = relattn.masked_softmax(x)
>>> expected = np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True)
>>> numpy.assert_close(out, expected, "float32")
>>> assert_close(out, expected)  # tolerances of out's dtype, float32
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType, ModuleType
from typing import Any

import array_api_compat
import numpy as np

from .backends import namespace_of_module
from .capabilities import LIBRARIES, unsupported

__all__ = [
    "TARGETS",
    "TOLERANCES",
    "Target",
    "assert_close",
    "assert_directional_derivatives",
    "available_targets",
    "gloo_world",
    "selected_targets",
    "single_process_group",
    "skip_unless_capable",
    "target",
    "to_host",
    "tolerance",
]

#: SPEC §5: agreement with a NumPy float64 reference on unit-scale data, per
#: dtype name. Complex dtypes take the tolerances of their parts' precision.
TOLERANCES: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {
        "float64": MappingProxyType({"rtol": 1e-10, "atol": 1e-12}),
        "float32": MappingProxyType({"rtol": 1e-4, "atol": 1e-5}),
        "float16": MappingProxyType({"rtol": 1e-2, "atol": 1e-2}),
        "bfloat16": MappingProxyType({"rtol": 5e-2, "atol": 5e-2}),
    }
)
_PARTS = {"complex128": "float64", "complex64": "float32"}


def _dtype_name(dtype: Any) -> str:
    """``"float32"`` for a name or for any library's float32 (NumPy, torch, JAX, strict …)."""
    if isinstance(dtype, str):
        return dtype
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype).rpartition(".")[2]


def tolerance(dtype: Any) -> dict[str, float]:
    """The tolerances of SPEC §5 for results in ``dtype``.

    Parameters
    ----------
    dtype : str or dtype
        A name (``"float32"``) or a dtype object of any array library.
        Complex dtypes take the tolerances of their parts (``complex64``:
        float32's).

    Returns
    -------
    dict
        ``{"rtol": …, "atol": …}``, keywords for :func:`assert_close` or
        :func:`numpy.testing.assert_allclose`.

    Raises
    ------
    ValueError
        If ``dtype`` is not a floating or complex dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn.testing import tolerance
    >>> tolerance("float32")
    {'rtol': 0.0001, 'atol': 1e-05}
    >>> tolerance(np.complex128)
    {'rtol': 1e-10, 'atol': 1e-12}
    """
    name = _dtype_name(dtype)
    name = _PARTS.get(name, name)
    if name not in TOLERANCES:
        raise ValueError(
            f"dtype must be a floating or complex dtype with a tolerance ({', '.join(TOLERANCES)} "
            f"or complex), got {name}: compare other dtypes exactly"
        )
    return dict(TOLERANCES[name])


def to_host(x: Any) -> np.ndarray:
    """A NumPy copy of array ``x`` of any library, on the host.

    Waits for the device (CuPy, PyTorch CUDA, JAX) or computes the graph
    (Dask); a PyTorch tensor is detached first, and its bfloat16 becomes
    float32 (NumPy has no bfloat16; JAX's host copies keep theirs, through
    ``ml_dtypes``).

    Examples
    --------
    >>> import numpy as np
    >>> from relattn.testing import to_host
    >>> to_host(np.arange(3))
    array([0, 1, 2])
    """
    return _library_of(x).to_host(x)


def assert_close(
    actual: Any,
    desired: Any,
    *,
    dtype: Any = None,
    rtol: float | None = None,
    atol: float | None = None,
    err_msg: str = "",
) -> None:
    """Check that ``actual`` agrees with ``desired`` at the tolerances of ``dtype``.

    Parameters
    ----------
    actual : array
        An array of any library (host copies are compared).
    desired : array_like
        The reference, usually NumPy float64, of ``actual``'s shape.
    dtype : str or dtype, optional
        The dtype whose tolerances (:func:`tolerance`) apply; by default
        ``actual``'s. Integer and boolean results are compared exactly.
    rtol, atol : float, optional
        Override the tolerance of ``dtype``.
    err_msg : str, optional
        Printed with a failure.

    Raises
    ------
    AssertionError
        If the shapes differ or any element differs by more than
        ``atol + rtol * |desired|`` (NaNs must sit at the same places).

    Examples
    --------
    >>> import numpy as np
    >>> from relattn.testing import assert_close
    >>> assert_close(np.float32([1.0, 2.0]), [1.0, 2.00001])
    >>> assert_close(np.float64([1.0, 2.0]), [1.0, 2.00001])
    Traceback (most recent call last):
    ...
    AssertionError: ...
    """
    __tracebackhide__ = True
    got, want = _as_host(actual), _as_host(desired)
    if got.shape != want.shape:
        raise AssertionError(f"shapes differ: {got.shape} != {want.shape} {err_msg}".rstrip())
    if got.dtype.kind in "biu" and dtype is None:
        np.testing.assert_array_equal(got, want, err_msg=err_msg)
        return
    tol = tolerance(got.dtype if dtype is None else dtype)
    wide = np.complex128 if got.dtype.kind == "c" else np.float64
    np.testing.assert_allclose(
        got.astype(wide),
        want,
        rtol=tol["rtol"] if rtol is None else rtol,
        atol=tol["atol"] if atol is None else atol,
        err_msg=err_msg,
    )


def _as_host(x: Any) -> np.ndarray:
    """``x`` as a NumPy array: a host copy of another library's array, NumPy data as it is."""
    if array_api_compat.is_array_api_obj(x) and not array_api_compat.is_numpy_array(x):
        return to_host(x)
    return np.asarray(x)


def assert_directional_derivatives(
    loss: Callable[[Any], Any],
    grad: Any,
    params: Any,
    rng: np.random.Generator,
    *,
    count: int = 3,
    h: float = 1e-5,
    rtol: float = 1e-7,
) -> None:
    """Check a gradient against central differences of its loss, along random directions.

    Along each of ``count`` random directions ``u``, the derivative the
    gradient gives, ``⟨grad, u⟩``, and the central difference
    ``(loss(p + h·u) − loss(p − h·u)) / 2h`` agree to ``rtol`` (relative to
    ``max(1, |⟨grad, u⟩|)``). Use float64 parameters.

    Parameters
    ----------
    loss : callable
        ``params -> 0-d array`` (or a Python float).
    grad : array, or dict, list or tuple of them
        The gradient of ``loss`` at ``params``, structured like ``params``
        (``jax.grad``'s result; PyTorch's ``.grad`` of each leaf).
    params : array, or dict, list or tuple of them
        Where the gradient was taken: arrays of one library, nested in dicts
        (in key order), lists and tuples.
    rng : numpy.random.Generator
        Draws the directions.
    count : int, optional
        The number of directions.
    h : float, optional
        The step of the central differences.
    rtol : float, optional
        The tolerance.

    Raises
    ------
    AssertionError
        If a directional derivative disagrees.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn.testing import assert_directional_derivatives
    >>> params = {"w": np.array([1.0, -2.0, 0.5])}
    >>> def loss(p):
    ...     return np.sum(p["w"] ** 3)
    >>> assert_directional_derivatives(loss, {"w": 3 * params["w"] ** 2}, params,
    ...                                np.random.default_rng(0))
    >>> assert_directional_derivatives(loss, {"w": 2 * params["w"]}, params,
    ...                                np.random.default_rng(0))
    Traceback (most recent call last):
    ...
    AssertionError: ...
    """
    __tracebackhide__ = True
    leaves = _leaves(params)
    grads = _leaves(grad)
    if len(grads) != len(leaves):
        raise AssertionError(f"grad has {len(grads)} arrays, params {len(leaves)}")
    xp = array_api_compat.array_namespace(*leaves)
    for _ in range(count):
        u = [
            xp.asarray(
                rng.normal(size=tuple(a.shape)), dtype=a.dtype, device=array_api_compat.device(a)
            )
            for a in leaves
        ]

        def moved(sign: float, u: list[Any] = u) -> Any:
            return _rebuild(
                params, iter([a + sign * h * x for a, x in zip(leaves, u, strict=True)])
            )

        numeric = float((loss(moved(1.0)) - loss(moved(-1.0))) / (2 * h))
        analytic = float(sum(float(xp.sum(g * x)) for g, x in zip(grads, u, strict=True)))
        if not abs(numeric - analytic) <= rtol * max(1.0, abs(analytic)):
            raise AssertionError(
                f"directional derivative {analytic!r} from the gradient, {numeric!r} from "
                f"central differences (h = {h})"
            )


def _leaves(tree: Any) -> list[Any]:
    """The arrays of ``tree`` (dicts in key order, lists, tuples), depth first."""
    if isinstance(tree, Mapping):
        return [leaf for key in sorted(tree) for leaf in _leaves(tree[key])]
    if isinstance(tree, (list, tuple)):
        return [leaf for branch in tree for leaf in _leaves(branch)]
    return [tree]


def _rebuild(tree: Any, leaves: Iterator[Any]) -> Any:
    """``tree`` with its arrays replaced, in :func:`_leaves`' order, by ``leaves``."""
    if isinstance(tree, Mapping):
        return {key: _rebuild(tree[key], leaves) for key in sorted(tree)}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_rebuild(branch, leaves) for branch in tree)
    return next(leaves)


# ----------------------------------------------------------------------------------------
# What the harness does with each library (relattn's own code needs none of it)
# ----------------------------------------------------------------------------------------


class _Library:
    """Host copies, devices, waiting and compiling for one array library (the NumPy way)."""

    #: A key of :data:`relattn.capabilities.LIBRARIES`.
    name = "numpy"

    def is_array(self, x: Any) -> bool:
        return array_api_compat.is_numpy_array(x)

    def device(self, kind: str) -> Any:
        """The device of ``kind`` (``None`` where the library has one, implicit)."""
        if kind not in LIBRARIES[self.name].devices:
            raise LookupError(f"{self.name} has no {kind} device")
        return None

    def from_host(self, a: np.ndarray, device: Any, chunks: Any) -> Any:
        return np.array(a, copy=True)

    def to_host(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def ready(self, x: Any) -> Any:
        return x

    def default_jit(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return fn

    def compile(self, fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        raise TypeError(f"{self.name} has no compiler")

    def imprecise(self, kind: str) -> str | None:
        """The setting under which float32 products on ``kind`` run below float32 precision
        (TF32), or ``None``."""
        return None

    def full_precision(self, kind: str) -> contextlib.AbstractContextManager[Any]:
        """A context in which float32 products on ``kind`` run in float32 precision."""
        return contextlib.nullcontext()

    def peak_device_bytes(self, fn: Callable[[], Any], device: Any) -> int:
        raise LookupError(f"{self.name} keeps no device memory statistics")


class _ArrayApiStrict(_Library):
    name = "array_api_strict"

    def is_array(self, x: Any) -> bool:
        return type(x).__module__.startswith("array_api_strict")

    def device(self, kind: str) -> Any:
        super().device(kind)
        import array_api_strict

        return array_api_strict.__array_namespace_info__().default_device()

    def from_host(self, a: np.ndarray, device: Any, chunks: Any) -> Any:
        import array_api_strict

        return array_api_strict.asarray(np.array(a, copy=True), device=device)

    def to_host(self, x: Any) -> np.ndarray:
        # DLPack reaches NumPy from a strict array, which refuses np.asarray. NumPy before
        # 2.1 cannot export a read-only array (a broadcast view) by DLPack: a copy can.
        try:
            return np.from_dlpack(x)
        except BufferError:
            import array_api_strict

            return np.from_dlpack(array_api_strict.asarray(x, copy=True))


class _Torch(_Library):
    name = "torch"

    def is_array(self, x: Any) -> bool:
        return array_api_compat.is_torch_array(x)

    def device(self, kind: str) -> Any:
        import torch

        if kind == "cpu":
            return torch.device("cpu")
        if kind == "gpu" and torch.cuda.is_available():
            # The concrete device ("cuda:0"), as arrays made on it report theirs.
            return torch.device("cuda", torch.cuda.current_device())
        raise LookupError(f"torch has no {kind} device" + (" (CUDA)" if kind == "gpu" else ""))

    def from_host(self, a: np.ndarray, device: Any, chunks: Any) -> Any:
        import torch

        return torch.from_numpy(np.array(a, copy=True)).to(device=device)

    def to_host(self, x: Any) -> np.ndarray:
        import torch

        x = x.detach().cpu()
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy()

    def ready(self, x: Any) -> Any:
        import torch

        if getattr(x, "is_cuda", False):
            torch.cuda.synchronize(x.device)
        return x

    def compile(self, fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        import torch

        torch._dynamo.reset()  # a fresh cache: tests reuse code objects
        return torch.compile(fn, fullgraph=True, **options)

    def imprecise(self, kind: str) -> str | None:
        """TF32 matrix products, where the caller's torch settings allow them on CUDA.

        torch's default is full float32 (``get_float32_matmul_precision() ==
        "highest"``); relattn reads the setting and never changes it. cuDNN's own
        TF32 switch (on by default) governs convolutions, which relattn has none of,
        and cuDNN's fused attention takes half precision only.
        """
        if kind != "gpu":
            return None
        import torch

        # torch >= 2.9 keeps it here ("ieee", "tf32", or "none": not set this way); reading
        # get_float32_matmul_precision() after a setting made here is an error there.
        setting = getattr(torch.backends.cuda.matmul, "fp32_precision", "none")
        if setting != "none":
            where = f"torch.backends.cuda.matmul.fp32_precision is {setting!r}"
            return where if setting == "tf32" else None
        precision = torch.get_float32_matmul_precision()
        if precision == "highest":
            return None
        return f"torch.get_float32_matmul_precision() is {precision!r}"

    def full_precision(self, kind: str) -> contextlib.AbstractContextManager[Any]:
        """No change, where torch computes float32 in full precision; ``RuntimeError`` where
        the caller enabled TF32 (relattn does not turn a global switch back)."""
        setting = self.imprecise(kind)
        if setting is not None:
            raise RuntimeError(
                f"torch computes float32 matrix products in TF32 on CUDA ({setting}), about "
                "1e-3 relative: an exactness check needs full float32; run it with "
                'torch.set_float32_matmul_precision("highest")'
            )
        return contextlib.nullcontext()

    def peak_device_bytes(self, fn: Callable[[], Any], device: Any) -> int:
        """The CUDA caching allocator's peak while ``fn()`` runs, reset just before."""
        import torch

        device = torch.device(device)
        if device.type != "cuda":
            raise LookupError(f"torch counts device memory on CUDA devices, not on {device}")
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before


class _Jax(_Library):
    name = "jax"

    def is_array(self, x: Any) -> bool:
        return array_api_compat.is_jax_array(x)

    def device(self, kind: str) -> Any:
        import jax

        try:
            return jax.devices(kind)[0]
        except RuntimeError:
            raise LookupError(f"jax has no {kind.upper()} device") from None

    def from_host(self, a: np.ndarray, device: Any, chunks: Any) -> Any:
        import jax

        return jax.device_put(np.array(a, copy=True), device)

    def ready(self, x: Any) -> Any:
        import jax

        return jax.block_until_ready(x)

    def default_jit(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return self.compile(fn)

    def compile(self, fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        import jax

        return jax.jit(fn, **options)

    def full_precision(self, kind: str) -> contextlib.AbstractContextManager[Any]:
        """``jax.default_matmul_precision`` at its highest on an accelerator (JAX's default
        there is TF32 on NVIDIA GPUs, bfloat16 passes on TPUs), for the block only."""
        if kind == "cpu":
            return contextlib.nullcontext()
        import jax

        return jax.default_matmul_precision("highest")

    def peak_device_bytes(self, fn: Callable[[], Any], device: Any) -> int:
        """XLA's ``peak_bytes_in_use`` after ``fn()``, over ``bytes_in_use`` before.

        XLA keeps one peak per process and cannot reset it: the largest call
        made before on the same device shows through where it exceeds this one's.
        """
        stats = device.memory_stats()
        if not stats:
            raise LookupError(f"jax keeps no memory statistics on {device}")
        before = stats.get("bytes_in_use", 0)
        self.ready(fn())
        peak = (device.memory_stats() or {}).get("peak_bytes_in_use", 0)
        return max(peak - before, 0)


class _CuPy(_Library):
    name = "cupy"

    def is_array(self, x: Any) -> bool:
        return array_api_compat.is_cupy_array(x)

    def device(self, kind: str) -> Any:
        import cupy

        super().device(kind)
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except cupy.cuda.runtime.CUDARuntimeError as e:
            raise LookupError(f"cupy finds no CUDA device ({e})") from None
        if not count:
            raise LookupError("cupy finds no CUDA device")
        return cupy.cuda.Device(0)

    def from_host(self, a: np.ndarray, device: Any, chunks: Any) -> Any:
        import cupy

        with device:
            return cupy.asarray(a)

    def to_host(self, x: Any) -> np.ndarray:
        return x.get()

    def ready(self, x: Any) -> Any:
        import cupy

        cupy.cuda.get_current_stream().synchronize()
        return x

    def peak_device_bytes(self, fn: Callable[[], Any], device: Any) -> int:
        """Growth of CuPy's default memory pool while ``fn()`` runs, emptied of free blocks before.

        The pool keeps the blocks freed during the run, so its size afterwards
        bounds the peak from above (by the blocks it could not reuse).
        """
        import cupy

        with device:
            pool = cupy.get_default_memory_pool()
            cupy.cuda.get_current_stream().synchronize()
            pool.free_all_blocks()
            before = pool.total_bytes()
            self.ready(fn())
            return pool.total_bytes() - before


class _Dask(_Library):
    name = "dask"

    def is_array(self, x: Any) -> bool:
        return array_api_compat.is_dask_array(x)

    def from_host(self, a: np.ndarray, device: Any, chunks: Any) -> Any:
        import dask.array as da

        a = np.array(a, copy=True)
        return da.from_array(a, chunks=a.shape if chunks is None else chunks)

    def to_host(self, x: Any) -> np.ndarray:
        # Unoptimised: Dask's graph optimisation (blockwise fusion, culling, ordering) takes
        # longer than computing the small graphs of a check (a third of the Dask tests'
        # time). The values are the same; ``ready`` and the demo compute as users do.
        return np.asarray(x.compute(optimize_graph=False))

    def ready(self, x: Any) -> Any:
        return x.compute()


_LIBRARIES: dict[str, _Library] = {
    lib.name: lib for lib in (_Library(), _ArrayApiStrict(), _Torch(), _Jax(), _CuPy(), _Dask())
}


def _library_of(x: Any) -> _Library:
    for lib in _LIBRARIES.values():
        if lib.is_array(x):
            return lib
    raise TypeError(f"x must be an array of one of {tuple(_LIBRARIES)}, got {type(x).__name__}")


# ----------------------------------------------------------------------------------------
# Targets
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One array library on one device, as tests, benchmarks and the demo use it.

    Creating a target imports nothing; the library is imported when a
    property or method first needs it. :attr:`unavailable` says whether it can
    run here.

    Attributes
    ----------
    name : str
        ``"numpy"``, ``"numpy_readonly"``, ``"torch_cuda"``, ``"jax_gpu"`` … (a
        test id).
    library : str
        The array library, a key of :data:`relattn.capabilities.LIBRARIES`.
    kind : str
        The kind of device, ``"cpu"`` or ``"gpu"``.
    readonly : bool
        Arrays made by :meth:`from_host` and :meth:`asarray` cannot be written
        (NumPy only): a hidden in-place write fails.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn.testing import target
    >>> t = target("numpy_readonly")
    >>> x = t.asarray([[1.0, 2.0]], "float32")
    >>> x.dtype, x.flags.writeable, t.device is None
    (dtype('float32'), False, True)
    >>> t.to_host(t.ready(x * 2))
    array([[2., 4.]], dtype=float32)
    """

    name: str
    library: str
    kind: str = "cpu"
    readonly: bool = False

    # -- known without importing the library ---------------------------------------------
    @property
    def module(self) -> str:
        """The module a user passes as ``xp=`` (``"numpy"``, ``"jax.numpy"`` …)."""
        return LIBRARIES[self.library].module

    @property
    def gpu(self) -> bool:
        """The target's device is a GPU."""
        return self.kind == "gpu"

    @property
    def is_torch(self) -> bool:
        """The library is PyTorch."""
        return self.library == "torch"

    @property
    def is_jax(self) -> bool:
        """The library is JAX."""
        return self.library == "jax"

    @property
    def _lib(self) -> _Library:
        return _LIBRARIES[self.library]

    # -- the library -----------------------------------------------------------------------
    @cached_property
    def lib(self) -> ModuleType:
        """The library module a user passes as ``xp=`` (``numpy``, ``torch``, ``jax.numpy`` …)."""
        return importlib.import_module(self.module)

    @cached_property
    def xp(self) -> ModuleType:
        """The array-API namespace relattn resolves for the library."""
        return namespace_of_module(self.lib)

    @cached_property
    def device(self) -> Any:
        """The library's device object of :attr:`kind` (``None`` where it has one, implicit).

        Raises ``ImportError`` where the library is not installed and
        ``LookupError`` where it has no such device.
        """
        return self._lib.device(self.kind)

    @cached_property
    def unavailable(self) -> str | None:
        """Why this target cannot run here (its library or device is missing), or ``None``."""
        try:
            self.device  # noqa: B018 - imports the library and looks the device up
        except ImportError as e:
            return f"{self.module} is not installed ({e})"
        except LookupError as e:
            return str(e)
        return None

    def has_dtype(self, name: str) -> bool:
        """The library has the dtype called ``name`` (JAX's 64-bit ones need ``JAX_ENABLE_X64``)."""
        if name in ("float64", "complex128") and self.is_jax:
            import jax

            return bool(jax.config.read("jax_enable_x64"))
        if any(name in lib.dtypes for lib in LIBRARIES.values()):
            return name in LIBRARIES[self.library].dtypes
        return True  # the integer and boolean dtypes every library has

    def dtype(self, name: str) -> Any:
        """The library's dtype called ``name`` (``"float32"``, ``"bool"``, ``"int64"`` …).

        Raises
        ------
        LookupError
            If the library has no such dtype (NumPy's bfloat16, say).
        """
        if not self.has_dtype(name):
            hint = " (set JAX_ENABLE_X64=1 before importing jax)" if self.is_jax else ""
            raise LookupError(f"{self.name} has no {name}{hint}")
        for space in (self.xp, self.lib):
            if hasattr(space, name):
                return getattr(space, name)
        # Dask arrays hold NumPy dtypes; its namespaces name only the standard's.
        return np.dtype(name)

    # -- arrays ----------------------------------------------------------------------------
    def from_host(self, a: Any, *, chunks: Any = None) -> Any:
        """A copy of NumPy data ``a`` as this target's array on its device, dtype kept.

        ``chunks`` is Dask's chunking (one chunk by default), ignored by the
        other libraries.
        """
        x = self._lib.from_host(np.asarray(a), self.device, chunks)
        if self.readonly:
            x.setflags(write=False)
        return x

    def asarray(self, a: Any, dtype: str | None = None, *, chunks: Any = None) -> Any:
        """A copy of NumPy data ``a`` as this target's array, in the dtype called ``dtype``.

        ``None`` keeps ``a``'s dtype. ``"bfloat16"``, which NumPy lacks, is
        cast by the library from float64 data.
        """
        host = np.asarray(a)
        name = host.dtype.name if dtype is None else dtype
        want = self.dtype(name)
        x = self.from_host(
            host.astype(np.float64 if name == "bfloat16" else name, copy=False), chunks=chunks
        )
        if x.dtype != want:
            x = self.xp.astype(x, want)
        return x

    def to_host(self, x: Any) -> np.ndarray:
        """A NumPy copy of ``x``, an array of this target (:func:`to_host`)."""
        return self._lib.to_host(x)

    def to_numpy(self, x: Any) -> np.ndarray:
        """:meth:`to_host`, by the name the test suite's modules use."""
        return self._lib.to_host(x)

    def ready(self, x: Any) -> Any:
        """``x`` once computed: waits for the device, or computes a Dask graph (for timing)."""
        return self._lib.ready(x)

    def is_array(self, x: Any) -> bool:
        """``x`` is an array of this target's library (not NumPy's in disguise)."""
        return self._lib.is_array(x)

    # -- compilers -------------------------------------------------------------------------
    def default_jit(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` as the library runs it by default: ``jax.jit`` on JAX, ``fn`` elsewhere.

        JAX's op-by-op mode is slow, and its users jit; PyTorch's run eagerly.
        On a JAX GPU, each call traces and runs in :meth:`full_precision`.
        """
        return self._in_full_precision(self._lib.default_jit(fn))

    def compile(self, fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        """``fn`` compiled whole by the library's compiler, with ``options``.

        ``jax.jit`` on JAX, each call traced and run in :meth:`full_precision`
        on a GPU; ``torch.compile(fullgraph=True)`` on PyTorch (a graph break is
        an error), Dynamo's cache reset first.

        Raises
        ------
        TypeError
            Where the library has no compiler.
        """
        return self._in_full_precision(self._lib.compile(fn, **options))

    def _in_full_precision(self, compiled: Any) -> Any:
        """``compiled`` (a ``jax.jit`` function), called and lowered in :meth:`full_precision`
        where that is not a no-op (a JAX GPU); as it is elsewhere."""
        if not (self.is_jax and self.gpu):
            return compiled

        def precise(method: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(method)
            def run(*args: Any, **kwargs: Any) -> Any:
                with self.full_precision():
                    return method(*args, **kwargs)

            return run

        run = precise(compiled)
        run.lower = precise(compiled.lower)  # type: ignore[attr-defined]
        return run

    def full_precision(self) -> contextlib.AbstractContextManager[Any]:
        """A context in which this target multiplies float32 matrices in full float32 precision.

        The exactness tolerances (:data:`TOLERANCES`) hold in it. On a JAX
        accelerator, ``jax.default_matmul_precision("highest")`` for the block
        (JAX's default on NVIDIA GPUs is TF32, about 1e-3 relative). On PyTorch
        CUDA, no change, torch's default being full float32; where the caller
        has enabled TF32 it raises ``RuntimeError``, as relattn changes no
        global setting. Elsewhere, a no-op. relattn's own functions always
        follow the caller's settings.

        Examples
        --------
        >>> from relattn.testing import target
        >>> jax_cpu = target("jax")
        >>> with jax_cpu.full_precision():  # a no-op on the CPU
        ...     pass
        """
        return self._lib.full_precision(self.kind)

    def jit(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` traced whole, quickly, to test that it compiles (see :meth:`compile`).

        On PyTorch with ``torch.compile``'s ``aot_eager`` backend: Dynamo's
        capture and AOTAutograd, without Inductor's code generation.
        """
        return self.compile(fn, backend="aot_eager") if self.is_torch else self.compile(fn)

    def peak_device_bytes(self, fn: Callable[[], Any]) -> int:
        """Peak device bytes allocated while ``fn()`` runs, over what was allocated before.

        Raises
        ------
        LookupError
            Where the library keeps no statistics on this device.
        """
        if not self.gpu:
            raise LookupError(f"{self.name} runs on the host: it has no device memory counter")
        return self._lib.peak_device_bytes(fn, self.device)

    # -- checks ----------------------------------------------------------------------------
    def assert_close(
        self, actual: Any, expected: Any, dtype: str, *, result_dtype: str | None = None
    ) -> None:
        """Check ``actual``, a result of this target, against a NumPy float64 reference.

        ``actual`` must be an array of this library, on this target's device,
        in the dtype called ``result_dtype`` (``dtype`` unless given: a complex
        result of real inputs, say), and agree with ``expected`` at the
        tolerances of ``dtype`` (:func:`assert_close`). A float32 check fails
        up front where the library computes float32 products in TF32 (PyTorch
        CUDA with TF32 enabled): it could not tell a TF32-class error from a bug.
        """
        __tracebackhide__ = True
        name = _dtype_name(dtype)
        if _PARTS.get(name, name) == "float32":
            setting = self._lib.imprecise(self.kind)
            if setting is not None:
                raise AssertionError(
                    f"{self.name} computes float32 products in TF32 ({setting}): "
                    "float32 is checked in full precision only"
                )
        if not self.is_array(actual):
            raise AssertionError(f"{self.name} returned a {type(actual).__name__}")
        want = self.dtype(dtype if result_dtype is None else result_dtype)
        if actual.dtype != want:
            raise AssertionError(f"dtypes differ: {actual.dtype} != {want}")
        if self.device is not None and array_api_compat.device(actual) != self.device:
            raise AssertionError(
                f"devices differ: {array_api_compat.device(actual)} != {self.device}"
            )
        assert_close(actual, expected, dtype=dtype)

    def assert_directional_derivatives(self, *args: Any, **kwargs: Any) -> None:
        """:func:`assert_directional_derivatives`, for a loss of this target's arrays."""
        __tracebackhide__ = True
        assert_directional_derivatives(*args, **kwargs)


#: Every target relattn is tested on, CPU ones first.
TARGETS: tuple[Target, ...] = (
    Target("numpy", "numpy"),
    Target("numpy_readonly", "numpy", readonly=True),
    Target("array_api_strict", "array_api_strict"),
    Target("torch", "torch"),
    Target("jax", "jax"),
    Target("dask", "dask"),
    Target("cupy", "cupy", kind="gpu"),
    Target("torch_cuda", "torch", kind="gpu"),
    Target("jax_gpu", "jax", kind="gpu"),
)
_BY_NAME = {t.name: t for t in TARGETS}


def target(name: str) -> Target:
    """The target called ``name``, one of :data:`TARGETS`.

    The library is not imported yet: check :attr:`Target.unavailable` before
    using a target that may be missing here.

    Raises
    ------
    ValueError
        If no target has that name.

    Examples
    --------
    >>> from relattn.testing import target
    >>> target("jax_gpu").module, target("jax_gpu").kind
    ('jax.numpy', 'gpu')
    >>> target("tensorflow")
    Traceback (most recent call last):
    ...
    ValueError: target must be one of ('numpy', ...), got 'tensorflow'
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"target must be one of {tuple(_BY_NAME)}, got {name!r}") from None


def selected_targets(names: str | Iterable[str] | None = None) -> list[Target]:
    """The targets ``names`` lists, by default those the ``RELATTN_BACKENDS`` variable does.

    Parameters
    ----------
    names : str or iterable of str, optional
        Target names, or one string of them separated by commas. ``None``
        reads the environment variable ``RELATTN_BACKENDS``; where it is unset
        or empty, every target.

    Returns
    -------
    list of Target
        In the order of :data:`TARGETS`, available here or not.

    Raises
    ------
    ValueError
        If a name is not a target's.

    Examples
    --------
    >>> from relattn.testing import selected_targets
    >>> [t.name for t in selected_targets("torch,numpy")]
    ['numpy', 'torch']
    """
    if names is None:
        names = os.environ.get("RELATTN_BACKENDS") or [t.name for t in TARGETS]
    if isinstance(names, str):
        names = names.split(",")
    wanted = {target(name.strip()).name for name in names}
    return [t for t in TARGETS if t.name in wanted]


def available_targets(names: str | Iterable[str] | None = None) -> list[Target]:
    """The :func:`selected_targets` that can run here (library installed, device present).

    Examples
    --------
    >>> from relattn.testing import available_targets
    >>> [t.name for t in available_targets(["numpy", "numpy_readonly"])]
    ['numpy', 'numpy_readonly']
    """
    return [t for t in selected_targets(names) if t.unavailable is None]


def skip_unless_capable(target: Target, name: str, capability: str) -> None:
    """Skip the running pytest test where relattn declares ``name`` lacks ``capability``.

    The reason comes from :func:`relattn.capabilities.unsupported`: one
    declaration decides the documentation's table and the tests' skips.

    Parameters
    ----------
    target : Target
        The target the test runs on.
    name : str
        A public name of relattn.
    capability : str
        ``"run"``, ``"jit"``, ``"grad"``, ``"blockwise"``, ``"ring"`` or a
        dtype name.

    Examples
    --------
    >>> from relattn.testing import skip_unless_capable, target
    >>> skip_unless_capable(target("jax"), "ring_attention", "run")  # JAX has the ring
    """
    reason = unsupported(name, target.library, capability)
    if reason is not None:
        import pytest

        pytest.skip(f"{name} on {target.name}: {reason}")


def gloo_world(
    command: list[str], world: int, *, env: Mapping[str, str] | None = None, timeout: float = 300
) -> list[str]:
    """Run ``python command…`` once per rank of a ``world``-process gloo group on this machine.

    Each process gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``
    (127.0.0.1) and ``MASTER_PORT`` (a free port) for ``torch.distributed``'s
    ``env://`` initialisation, one thread (``OMP_NUM_THREADS=1``) and ``env`` on
    top; the processes run at once.

    Parameters
    ----------
    command : list of str
        The arguments after ``python`` (a script and its arguments).
    world : int
        The number of processes.
    env : mapping, optional
        More environment variables.
    timeout : float, optional
        Seconds the whole group may take; then every process is killed.

    Returns
    -------
    list of str
        Each rank's standard output, in rank order.

    Raises
    ------
    RuntimeError
        If a process exits with an error or the group runs past ``timeout``: the
        message holds the ranks' standard error.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}  # fmt: skip
    processes = [
        subprocess.Popen(
            [sys.executable, *command],
            env={**common, "RANK": str(rank), "LOCAL_RANK": str(rank), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    outputs: list[tuple[str, str]] = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=timeout))
    except subprocess.TimeoutExpired:
        for process in processes:
            process.kill()
        errors = [p.communicate()[1][-2000:] for p in processes[len(outputs) :]]
        raise RuntimeError(
            f"a gloo group of {world} ran past {timeout} s; their stderr:\n" + "\n".join(errors)
        ) from None
    failed = [
        f"rank {rank} (exit {p.returncode}):\n{err[-4000:]}"
        for rank, (p, (_, err)) in enumerate(zip(processes, outputs, strict=True))
        if p.returncode
    ]
    if failed:
        raise RuntimeError("\n".join(failed))
    return [out for out, _ in outputs]


@contextlib.contextmanager
def single_process_group() -> Iterator[None]:
    """A ``torch.distributed`` gloo group of this process alone, as the default group.

    For code that runs over a process group (``ring_attention(..., group=)``) in a
    test of one process. Where a default group exists already it is used and left
    alone; otherwise one is made (through a file store in a temporary directory: no
    port) and destroyed on exit.

    Examples
    --------
    >>> import torch, torch.distributed as dist
    >>> from relattn.testing import single_process_group
    >>> with single_process_group():
    ...     dist.get_world_size()
    1
    >>> dist.is_initialized()
    False
    """
    import tempfile

    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()
