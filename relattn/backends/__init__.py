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

from .._namespace import namespace_of_module, per_module
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


def backend_for(xp: ModuleType) -> Backend:
    """The :class:`Backend` (library-specific operations) for namespace ``xp``."""
    return per_module(_BACKENDS, xp, _backend_for)


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
