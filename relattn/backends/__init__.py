"""What the array API standard lacks, per array library.

The generic code in :mod:`relattn` is written once against the array API
standard; it asks this package for the namespace of its inputs and for the few
things the standard does not define (``stop_gradient``, whether arrays are
traced under a jit, whether they can be written in place). Each library's code
sits in its own module and imports that library lazily, so ``import relattn``
needs NumPy alone.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import array_api_compat

from ._base import Backend

__all__ = ["MODULES", "Backend", "backend_for", "load", "namespace_of_module"]

#: Backend name -> the module a user passes as ``xp`` for it: the libraries
#: relattn is tested on, by the names the demo, the tests and the benchmarks use.
MODULES = {
    "numpy": "numpy",
    "array_api_strict": "array_api_strict",
    "torch": "torch",
    "jax": "jax.numpy",
    "cupy": "cupy",
    "dask": "dask.array",
}


_XP_EXPECTED = (
    "xp must be an array library module (numpy, torch, jax.numpy, cupy, dask.array, "
    "array_api_strict) or its array-API namespace"
)


def _compat_numpy() -> ModuleType:
    from array_api_compat import numpy

    return numpy


def _compat_torch() -> ModuleType:
    from array_api_compat import torch

    return torch


def _compat_cupy() -> ModuleType:
    from array_api_compat import cupy

    return cupy


def _compat_dask() -> ModuleType:
    from array_api_compat.dask import array

    return array


def _jax_numpy() -> ModuleType:
    from jax import numpy

    return numpy


# Library -> the array-API namespace whose functions return that library's arrays.
# Plain import statements, not importlib: torch.compile can trace them.
_NAMESPACES = (
    (array_api_compat.is_numpy_namespace, _compat_numpy),
    (array_api_compat.is_torch_namespace, _compat_torch),
    (array_api_compat.is_cupy_namespace, _compat_cupy),
    (array_api_compat.is_dask_namespace, _compat_dask),
    (array_api_compat.is_jax_namespace, _jax_numpy),
)


def namespace_of_module(xp: Any) -> ModuleType:
    """Array-API namespace for a library module or a namespace given as ``xp``.

    ``None`` means NumPy. The library module itself (``numpy``, ``torch``,
    ``jax.numpy``, ``cupy``, ``dask.array``, ``array_api_strict``) and its
    array-api-compat namespace both resolve to the namespace whose functions
    return that library's arrays.

    Raises
    ------
    TypeError
        If ``xp`` is not an array library relattn can use.
    """
    if xp is None:
        import numpy as xp
    if not isinstance(xp, ModuleType):
        raise TypeError(f"{_XP_EXPECTED}, got {xp!r}")
    return _per_module(_RESOLVED, xp, _namespace_of_module)


def _per_module(cache: dict[str, tuple[ModuleType, Any]], xp: ModuleType, compute: Any) -> Any:
    """``compute(xp)``, computed once per module and kept in ``cache``.

    A dict keyed by the module's name (checked to be the same module), not
    ``functools.cache``: torch.compile traces a dict look-up with a string key,
    but would trace through a cache wrapper, into importlib and with a warning.
    """
    given, found = cache.get(xp.__name__, (None, None))
    if given is not xp:
        found = compute(xp)
        cache[xp.__name__] = (xp, found)
    return found


#: Module name -> (the module, its namespace), filled by :func:`namespace_of_module`.
_RESOLVED: dict[str, tuple[ModuleType, ModuleType]] = {}


def _namespace_of_module(xp: ModuleType) -> ModuleType:
    for is_library, namespace in _NAMESPACES:
        if is_library(xp):
            return namespace()
    if hasattr(xp, "__array_namespace_info__"):
        # array_api_strict and any other namespace that declares compliance.
        return xp
    raise TypeError(f"{_XP_EXPECTED}, got the module {xp.__name__}")


def backend_for(xp: ModuleType) -> Backend:
    """The :class:`Backend` (library-specific operations) for namespace ``xp``."""
    return _per_module(_BACKENDS, xp, _backend_for)


#: Namespace name -> (the namespace, its Backend), filled by :func:`backend_for`.
_BACKENDS: dict[str, tuple[ModuleType, Backend]] = {}


def _backend_for(xp: ModuleType) -> Backend:
    if array_api_compat.is_torch_namespace(xp):
        from . import _torch

        return _torch.BACKEND
    if array_api_compat.is_jax_namespace(xp):
        from . import _jax

        return _jax.BACKEND
    if array_api_compat.is_numpy_namespace(xp):
        from . import _numpy

        return _numpy.BACKEND
    if array_api_compat.is_cupy_namespace(xp):
        from . import _cupy

        return _cupy.BACKEND
    if array_api_compat.is_dask_namespace(xp):
        from . import _dask

        return _dask.BACKEND
    return _generic(xp)


def _generic(xp: ModuleType) -> Backend:
    """A namespace with nothing beyond the standard (array-api-strict and the like)."""

    def from_host(a: Any, device: Any = None, chunks: Any = None) -> Any:
        import numpy as np

        return xp.asarray(np.array(a, copy=True), device=device)

    def device(kind: str) -> Any:
        if kind == "cpu":
            return xp.__array_namespace_info__().default_device()
        raise LookupError(f"{xp.__name__} has no {kind} device")

    name = xp.__name__
    return Backend(
        name=name, library=name.partition(".")[0], module=name, from_host=from_host, device=device
    )


def load(name: str) -> tuple[ModuleType, Backend]:
    """The library module of backend ``name`` (a key of :data:`MODULES`) and its :class:`Backend`.

    Raises
    ------
    ValueError
        If ``name`` is not a key of :data:`MODULES`.
    ImportError
        If the library is not installed.
    """
    if name not in MODULES:
        raise ValueError(f"backend must be one of {tuple(MODULES)}, got {name!r}")
    import importlib

    lib = importlib.import_module(MODULES[name])
    return lib, backend_for(namespace_of_module(lib))
