"""Argument checks shared by the public functions.

They read metadata only (type, dtype, shape), never array values, so they run
unchanged under ``jax.jit`` and ``torch.compile``. Each error names the
argument, what was expected and what was given.
"""

from __future__ import annotations

import math
import numbers
import operator
from types import ModuleType
from typing import Any

import array_api_compat
import numpy as np

from ._namespace import is_array, library, namespace, namespace_of_module


def creation_namespace(xp: Any, **arrays: Any) -> ModuleType:
    """Namespace for a function that takes ``xp=`` and possibly (optional) arrays."""
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


def flag(name: str, value: Any) -> bool:
    """A Python (or NumPy) boolean: ``causal="yes"`` must not pass as true."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def scale(value: Any, d: int, xp: ModuleType) -> Any:
    """The score scale: ``1/√d`` for ``None``, else a finite real number (or a 0-d array).

    A 0-d real floating array of the inputs' library passes as it is, so that a
    learned temperature can be traced under a jit.
    """
    if value is None:
        if d == 0:
            raise ValueError(
                "q must have a feature size d >= 1 for the default scale 1/√d, got d = 0 "
                "(pass scale= to attend over zero features)"
            )
        return 1.0 / math.sqrt(d)
    if is_array(value):
        if isinstance(value, np.generic):
            value = value.item()
        else:
            if value.ndim != 0 or not xp.isdtype(value.dtype, "real floating"):
                raise TypeError(
                    f"scale must be a real number or a 0-d real floating array, got an array "
                    f"of shape {tuple(value.shape)} and dtype {value.dtype}"
                )
            if namespace(scale=value) is not xp:
                raise TypeError(
                    f"scale must be an array of the inputs' library, got {library(value)}"
                )
            return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"scale must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"scale must be finite, got {value}")
    return value


def dtype(name: str, value: Any, xp: ModuleType, kind: str = "real floating") -> Any:
    """``value`` is a ``kind`` dtype object of ``xp`` (not a string, not another library's)."""
    library = xp.__name__.removeprefix("array_api_compat.")
    if isinstance(value, str):
        raise TypeError(
            f"{name} must be a dtype object of {library} (e.g. its float32), "
            f"got the string {value!r}"
        )
    try:
        ok = bool(xp.isdtype(value, kind))
    except (TypeError, AttributeError, ValueError):
        raise TypeError(f"{name} must be a {kind} dtype of {library}, got {value!r}") from None
    if not ok:
        raise TypeError(f"{name} must be a {kind} dtype, got {value}")
    return value


def axis(name: str, value: Any, ndim: int) -> int:
    """An axis index of an array with ``ndim`` dimensions, as a non-negative integer."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool")
    try:
        index = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if not -ndim <= index < ndim:
        raise ValueError(
            f"{name} must be in [-{ndim}, {ndim}) for an array of {ndim} dimensions, got {index}"
        )
    return index % ndim


def floating(xp: ModuleType, **arrays: Any) -> Any:
    """Check the named arrays are real floating; return their promoted dtype."""
    dtypes = {name: a.dtype for name, a in arrays.items() if a is not None}
    for name, dtype in dtypes.items():
        if not _is_real_floating(xp, dtype):
            raise TypeError(f"{name} must have a real floating dtype, got {dtype}")
    return _result_type(xp, *dtypes.values())


#: (namespace name, dtype) -> is real floating; dicts rather than functools caches,
#: which torch.compile traces through with a warning.
_REAL_FLOATING: dict[tuple[str, Any], bool] = {}


def _is_real_floating(xp: ModuleType, dtype: Any) -> bool:
    if isinstance(dtype, np.dtype):
        # NumPy's dtypes (NumPy, CuPy, Dask, JAX; ml_dtypes' bfloat16 and float8 kinds are
        # "V") say it themselves: no dict key, which torch.compile cannot hash on every
        # torch relattn admits (2.11 sees its bfloat16 as one).
        return dtype.kind == "f" or (dtype.kind == "V" and "float" in dtype.name)
    key = (xp.__name__, dtype)
    found = _REAL_FLOATING.get(key)
    if found is None:
        found = _REAL_FLOATING[key] = bool(xp.isdtype(dtype, "real floating"))
    return found


def _result_type(xp: ModuleType, *dtypes: Any) -> Any:
    first = dtypes[0]
    if all(dtype == first for dtype in dtypes):
        return first
    return xp.result_type(*dtypes)


#: (namespace name, floating dtype) -> bytes per element, for dtypes that do not say.
_ITEMSIZE: dict[tuple[str, Any], int] = {}


def itemsize(xp: ModuleType, dtype: Any) -> int:
    """Bytes per element of a real floating ``dtype`` (``finfo(dtype).bits // 8``)."""
    size = getattr(dtype, "itemsize", None)  # NumPy's and torch's dtypes say it
    if isinstance(size, int):
        return size
    key = (xp.__name__, dtype)
    found = _ITEMSIZE.get(key)
    if found is None:
        found = _ITEMSIZE[key] = xp.finfo(dtype).bits // 8
    return found


def cast(xp: ModuleType, x: Any, dtype: Any) -> Any:
    """``x`` as ``dtype`` of namespace ``xp``, without a copy when it already is.

    A NumPy operand of a JAX or Dask call (see :func:`namespace`) becomes an
    array of that library here.
    """
    if x is None:
        return x
    if converts(xp, x):
        return xp.asarray(x, dtype=dtype)
    return x if x.dtype == dtype else xp.astype(x, dtype)


def converts(xp: ModuleType, x: Any) -> bool:
    """``x`` is a NumPy operand of another library's call: :func:`cast` and
    :func:`cast_integer` make it an array of ``xp``."""
    return isinstance(x, np.ndarray) and not array_api_compat.is_numpy_namespace(xp)


def is_integer_dtype(xp: ModuleType, dtype: Any) -> bool:
    """``dtype`` is a (signed or unsigned) integer dtype of ``xp``."""
    if isinstance(dtype, np.dtype):
        return dtype.kind in "iu"
    return bool(xp.isdtype(dtype, "integral"))


def index_dtype(xp: ModuleType, device: Any) -> Any:
    """``xp``'s default integer dtype for indexing on ``device`` (the standard's
    ``__array_namespace_info__().default_dtypes()["indexing"]``: int32 for JAX without
    x64)."""
    return xp.__array_namespace_info__().default_dtypes(device=device)["indexing"]


def cast_integer(xp: ModuleType, x: Any) -> Any:
    """An integer array of ``xp`` as it is; a NumPy one beside JAX or Dask arrays converted."""
    return xp.asarray(x) if converts(xp, x) else x


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


def features(name: str, x: Any, weight_name: str, weight: Any, axis: int, layout: str) -> None:
    """``x``'s last axis has the size of ``weight``'s ``axis``, or ``ValueError`` naming ``x``."""
    expected = weight.shape[axis]
    if x.shape[-1] != expected:
        raise ValueError(
            f"{name} must have {expected} features to match {weight_name} {layout} of shape "
            f"{tuple(weight.shape)}, got {name} of shape {tuple(x.shape)}"
        )


def broadcastable(name: str, shape: tuple[int, ...], target: tuple[int, ...], what: str) -> None:
    """Check ``shape`` broadcasts to exactly ``target`` (shapes only, no arrays)."""
    if broadcast_shapes(tuple(shape), tuple(target)) != tuple(target):
        raise ValueError(
            f"{name} must be broadcastable to {what} {tuple(target)}, got shape {tuple(shape)}"
        )


def broadcast(**shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The broadcast of the named leading shapes, or ``ValueError`` naming them."""
    result = broadcast_shapes(*(tuple(s) for s in shapes.values()))
    if result is None:
        found = ", ".join(f"{name} {tuple(s)}" for name, s in shapes.items())
        raise ValueError(f"leading (batch, head) dimensions do not broadcast: {found}")
    return result


def exact_shape(name: str, x: Any, expected: tuple[int, ...], layout: str) -> None:
    """``x`` has exactly ``expected`` shape, described as ``layout`` in the message."""
    if tuple(x.shape) != expected:
        raise ValueError(
            f"{name} must have shape {layout} = {expected}, got shape {tuple(x.shape)}"
        )


def choice(name: str, value: Any, options: tuple[str | None, ...]) -> Any:
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return value


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast of ``shapes`` (array API rules), or ``None`` where they do not broadcast."""
    shapes = tuple(tuple(shape) for shape in shapes)
    first = shapes[0]
    if all(shape == first for shape in shapes):
        return first
    ndim = max(len(shape) for shape in shapes)
    result = []
    for axis in range(-ndim, 0):
        size = 1
        for shape in shapes:
            if len(shape) >= -axis and shape[axis] != 1:
                if size != 1 and shape[axis] != size:
                    return None
                size = shape[axis]
        result.append(size)
    return tuple(result)
