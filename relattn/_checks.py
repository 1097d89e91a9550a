"""Argument checks shared by the public functions.

They read metadata only (type, dtype, shape), never array values, so they run
unchanged under ``jax.jit`` and ``torch.compile``. Each error names the
argument, what was expected and what was given.
"""

from __future__ import annotations

import operator
from types import ModuleType
from typing import Any

import array_api_compat
import numpy as np

from .backends import namespace_of_module


def _library(x: Any) -> str:
    return type(x).__module__.partition(".")[0]


def namespace(**arrays: Any) -> ModuleType:
    """Array-API namespace shared by the named arrays; ``None`` values are skipped.

    Raises ``TypeError`` naming the argument that is not an array, or the
    arguments whose libraries differ.
    """
    given = {name: a for name, a in arrays.items() if a is not None}
    for name, a in given.items():
        if not array_api_compat.is_array_api_obj(a):
            raise TypeError(f"{name} must be an array, got {type(a).__name__}")
    try:
        return array_api_compat.array_namespace(*given.values())
    except TypeError:
        found = ", ".join(f"{name} is a {_library(a)} array" for name, a in given.items())
        raise TypeError(f"arrays from different libraries cannot be mixed: {found}") from None


def creation_namespace(xp: Any, **arrays: Any) -> ModuleType:
    """Namespace for a function that takes ``xp=`` and possibly arrays."""
    given = {name: a for name, a in arrays.items() if a is not None}
    if not given:
        return namespace_of_module(xp)
    found = namespace(**given)
    if xp is not None and namespace_of_module(xp) is not found:
        names = ", ".join(given)
        raise TypeError(f"xp={xp.__name__} does not match the library of {names}")
    return found


def length(name: str, value: Any, *, minimum: int = 1) -> int:
    """A Python integer ``>= minimum`` (a sequence length, radius or count)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if n < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {n}")
    return n


def floating(xp: ModuleType, **arrays: Any) -> Any:
    """Check the named arrays are real floating; return their promoted dtype."""
    given = {name: a for name, a in arrays.items() if a is not None}
    for name, a in given.items():
        if not xp.isdtype(a.dtype, "real floating"):
            raise TypeError(f"{name} must have a real floating dtype, got {a.dtype}")
    return xp.result_type(*given.values())


def cast(xp: ModuleType, x: Any, dtype: Any) -> Any:
    """``x`` as ``dtype``, without a copy when it already is."""
    return x if x is None or x.dtype == dtype else xp.astype(x, dtype)


def boolean(name: str, x: Any, xp: ModuleType) -> None:
    if x.dtype != xp.bool:
        raise TypeError(f"{name} must be a boolean array (True = may attend), got dtype {x.dtype}")


def ndim(name: str, x: Any, minimum: int, layout: str) -> None:
    if x.ndim < minimum:
        raise ValueError(f"{name} must have shape {layout}, got shape {tuple(x.shape)}")


def query_key(q: Any, k: Any, *, same_features: bool = True) -> None:
    """``q (..., Lq, d)`` and ``k (..., Lk, d)``: at least 2-D, one feature size if asked."""
    ndim("q", q, 2, "(..., Lq, d)")
    ndim("k", k, 2, "(..., Lk, d)")
    if same_features and k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k must have the feature size of q, d = {q.shape[-1]}, got k of shape {tuple(k.shape)}"
        )


def broadcastable(name: str, shape: tuple[int, ...], target: tuple[int, ...], what: str) -> None:
    """Check ``shape`` broadcasts to exactly ``target`` (shapes only, no arrays)."""
    try:
        result = np.broadcast_shapes(shape, target)
    except ValueError:
        result = None
    if result != tuple(target):
        raise ValueError(
            f"{name} must be broadcastable to {what} {tuple(target)}, got shape {tuple(shape)}"
        )


def broadcast(**shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The broadcast of the named leading shapes, or ``ValueError`` naming them."""
    try:
        return tuple(np.broadcast_shapes(*shapes.values()))
    except ValueError:
        found = ", ".join(f"{name} {tuple(s)}" for name, s in shapes.items())
        raise ValueError(f"leading (batch, head) dimensions do not broadcast: {found}") from None


def exact_shape(name: str, x: Any, expected: tuple[int, ...], layout: str) -> None:
    """``x`` has exactly ``expected`` shape, described as ``layout`` in the message."""
    if tuple(x.shape) != expected:
        raise ValueError(
            f"{name} must have shape {layout} = {expected}, got shape {tuple(x.shape)}"
        )


def choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return value
