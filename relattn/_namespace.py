"""Array namespaces: of the arrays a function is given, and of a library module passed as ``xp``.

The bottom of relattn: it imports no other relattn module. Both look-ups are
cached in plain dicts keyed by type or module name, which ``torch.compile``
traces as constants (a ``functools`` cache or a ``set`` of modules it cannot
hash would break its graph), so that a small call pays them once.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import array_api_compat

__all__ = [
    "TORCH_NAMESPACES", "device_of", "is_array", "known_namespace", "library", "namespace",
    "namespace_of_module", "require_array",
]  # fmt: skip

_XP_EXPECTED = (
    "xp must be an array library module (numpy, torch, jax.numpy, cupy, dask.array, "
    "array_api_strict) or its array-API namespace"
)


def library(x: Any) -> str:
    """The top-level package of ``x``'s type (``"numpy"``, ``"torch"``, ``"jaxlib"`` …)."""
    return type(x).__module__.partition(".")[0]


#: Libraries whose arrays hold their device in the standard's ``device`` attribute, as
#: ``array_api_compat.device`` returns it (NumPy >= 2, the ``numpy>=2.0`` of relattn).
_DEVICE_ATTRIBUTE = ("numpy", "torch", "cupy", "array_api_strict")


def device_of(x: Any) -> Any:
    """The device of array ``x``: its ``device`` attribute where the library keeps the
    standard's there, else ``array_api_compat.device`` (JAX, whose tracers have none, and
    Dask). The attribute is read directly for a call's every array: ``array_api_compat``
    would first ask ``functools.lru_cache``-wrapped type tests, through which
    ``torch.compile`` warns at every call it traces (and which a short call feels).
    A PyTorch tensor of any class (``nn.Parameter`` too) is known by ``isinstance``,
    which Dynamo traces, where it may not split a class's module name."""
    if _is_torch_tensor(x) or library(x) in _DEVICE_ATTRIBUTE:
        return x.device
    device = array_api_compat.device(x)
    # JAX: the arrays a call makes (distances, index vectors) stay uncommitted, for JAX to
    # place with the inputs, where the input is uncommitted (made without a device) or
    # spread over several devices (its "device" is then its sharding). An array made on a
    # named device would be committed there, and JAX refuses to mix it with the sharded.
    # (A tracer has neither: it raises on ``committed``, and reports no device.)
    uncommitted = type(x).__name__ == "ArrayImpl" and not x.committed
    if uncommitted or len(getattr(device, "device_set", ())) > 1:
        return None
    return device


def is_array(a: Any) -> bool:
    """``a`` is an array of an array-API library (not a Python scalar).

    Python scalars, types seen before, and PyTorch's tensors of any class, are
    known without array-api-compat's ``is_array_api_obj``, whose
    ``functools.lru_cache``-wrapped type tests make ``torch.compile`` warn where
    its trace calls them; each test here is one that Dynamo traces on every
    torch relattn admits (an ``isinstance``, a dict look-up by type).
    """
    if isinstance(a, (int, float, complex)):
        return False
    if type(a) in _NAMESPACE_OF_TYPE or _is_torch_tensor(a):
        return True
    return array_api_compat.is_array_api_obj(a)


def require_array(name: str, a: Any) -> None:
    """``TypeError`` naming ``name`` unless ``a`` is an array of an array-API library."""
    if not is_array(a):
        what = "None" if a is None else type(a).__name__
        raise TypeError(f"{name} must be an array, got {what}")


#: Array type -> its namespace, filled by :func:`namespace` (the types are few).
_NAMESPACE_OF_TYPE: dict[type, ModuleType] = {}


def known_namespace(x: Any) -> ModuleType | None:
    """The namespace of ``x``'s type once :func:`namespace` has resolved it alone, else
    ``None``: a dict look-up, for a call that only needs the library."""
    return _NAMESPACE_OF_TYPE.get(type(x))


def namespace(*, optional: dict[str, Any] | None = None, **arrays: Any) -> ModuleType:
    """Array-API namespace shared by the named arrays.

    Every keyword argument is a required array; ``optional`` holds the
    arguments that may be ``None`` (skipped when they are). Raises
    ``TypeError`` naming an argument that is not an array (``None``, a list, a
    scalar), or the arguments whose libraries differ, except NumPy arrays
    beside JAX or Dask ones, which those libraries accept themselves: the
    namespace is then JAX's or Dask's (``relattn._checks.cast`` converts the
    NumPy operands).
    """
    if optional:
        arrays.update((name, a) for name, a in optional.items() if a is not None)
    first = None
    for a in arrays.values():
        found = _NAMESPACE_OF_TYPE.get(type(a))
        if found is None or (first is not None and found is not first):
            break
        first = found
    else:
        if first is not None:
            return first
    xp = _resolve(arrays)
    # Kept where the arrays share one type: compared, not gathered in a set of types,
    # which Dynamo would have to hash.
    kinds = [type(a) for a in arrays.values()]
    if all(kind is kinds[0] for kind in kinds):
        _NAMESPACE_OF_TYPE[kinds[0]] = xp
    return xp


def _resolve(arrays: dict[str, Any]) -> ModuleType:
    """:func:`namespace` of ``arrays``, not yet known by their types."""
    if arrays and all(_is_torch_tensor(a) for a in arrays.values()):
        # By isinstance (nn.Parameter too), not through array_api_compat.array_namespace:
        # its type tests are functools.lru_cache-wrapped (torch.compile warns when its
        # trace makes a program's first call) and it gathers the namespaces in a set of
        # modules, which Dynamo would have to hash.
        return _compat_torch()
    for name, a in arrays.items():
        require_array(name, a)
    try:
        return array_api_compat.array_namespace(*arrays.values())
    except TypeError:
        # JAX and Dask take NumPy operands themselves: so does relattn, converting them
        # to the library of the other inputs.
        others = [a for a in arrays.values() if library(a) != "numpy"]
        if {library(a) for a in others} in ({"jax"}, {"jaxlib"}, {"jax", "jaxlib"}, {"dask"}):
            return array_api_compat.array_namespace(*others)
        found_names = ", ".join(f"{name} is a {library(a)} array" for name, a in arrays.items())
        raise TypeError(f"arrays from different libraries cannot be mixed: {found_names}") from None


def _is_torch_tensor(a: Any) -> bool:
    """``a`` is a ``torch.Tensor`` of any class (``nn.Parameter``, ``DTensor`` …), known
    without importing torch: no tensor exists before torch is imported."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor)


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
    return per_module(_RESOLVED, xp, _namespace_of_module)


def per_module(cache: dict[str, tuple[ModuleType, Any]], xp: ModuleType, compute: Any) -> Any:
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


#: Namespaces known by name: array-api-compat's ``is_*_namespace`` ask a
#: ``functools.lru_cache``-wrapped helper, through which torch.compile warns when its trace
#: resolves a namespace for the first time. PyTorch's two (``torch`` and its
#: array-api-compat namespace) also name its backend (:mod:`relattn.backends`); the others
#: are their own array-API namespace.
TORCH_NAMESPACES = ("torch", "array_api_compat.torch")
_OWN_NAMESPACES = (
    "array_api_compat.numpy", "array_api_compat.cupy", "array_api_compat.dask.array",
    "jax.numpy",
)  # fmt: skip


def _namespace_of_module(xp: ModuleType) -> ModuleType:
    if xp.__name__ in TORCH_NAMESPACES:
        return _compat_torch()
    if xp.__name__ in _OWN_NAMESPACES:
        return xp
    for is_library, namespace in _NAMESPACES:
        if is_library(xp):
            return namespace()
    if hasattr(xp, "__array_namespace_info__"):
        # array_api_strict and any other namespace that declares compliance.
        return xp
    raise TypeError(f"{_XP_EXPECTED}, got the module {xp.__name__}")
