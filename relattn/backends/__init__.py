"""What the array API standard lacks, per array library.

The generic code in :mod:`relattn` is written once against the array API
standard; it asks this package for the few things the standard does not define,
as a :class:`Backend` record: ``stop_gradient``, whether values can be read now,
traced loops and branches (JAX), a ring's collective, fused attention kernels
(the libraries', and relattn's own Triton and Pallas kernels of the relative
terms, :mod:`relattn.backends._relative`), chunking (Dask). A backend never
implements an algorithm: it supplies the primitive an algorithm asks for. Each
library's code sits in its own module and imports that library lazily, so
``import relattn`` needs NumPy alone; libraries that need nothing beyond the
standard (NumPy, CuPy, array-api-strict) have no module here.
"""

from __future__ import annotations

import functools
from types import ModuleType

import array_api_compat
import numpy as np

from .._namespace import TORCH_NAMESPACES, namespace_of_module, per_module
from ._base import Backend, Kernel

__all__ = ["MODULES", "Backend", "Kernel", "backend_for", "namespace_of_module"]

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
    # By name (TORCH_NAMESPACES): array-api-compat's is_torch_namespace would make a
    # torch.compile trace warn.
    if xp.__name__ in TORCH_NAMESPACES:
        from . import _torch

        return _torch.BACKEND
    if array_api_compat.is_jax_namespace(xp):
        from . import _jax

        return _jax.BACKEND
    if array_api_compat.is_dask_namespace(xp):
        from . import _dask

        return _dask.BACKEND
    return _generic(xp)


def _generic(xp: ModuleType) -> Backend:
    """A library that needs nothing beyond the standard: NumPy, CuPy, array-api-strict …
    (NumPy's floating-point warnings are silenced where relattn probes for a NaN; the
    others compute with NumPy or raise none.)"""
    name = xp.__name__.removeprefix("array_api_compat.")
    quiet = functools.partial(np.errstate, all="ignore")
    if name == "cupy":
        return Backend(name=name, quiet=quiet, free_memory=_cupy_free_memory)
    return Backend(name=name, quiet=quiet)


def _cupy_free_memory(device: object) -> int:
    """Free bytes on a CuPy array's device (``Device.mem_info``)."""
    with device:  # type: ignore[attr-defined]  # a cupy.cuda.Device
        return int(device.mem_info[0])  # type: ignore[attr-defined]
