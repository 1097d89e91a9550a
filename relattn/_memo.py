"""Small arrays that eager calls would otherwise rebuild every time: 0-d constants and
the causal mask of a short problem.

A decode loop calls attention per token and layer with the same shapes, where making
a 0-d ``-inf`` or an ``(Lq, Lk)`` mask from two ranges costs as much as the arithmetic
(microseconds each). Only arrays with values (:attr:`relattn.backends.Backend.has_values`:
not a JAX tracer, not a Dask graph, not under ``torch.compile``) are kept, so that no
traced value outlives its trace; the kept arrays are read, never written, by relattn.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["constant", "memo"]

#: Key -> array; cleared when full (a loop over many shapes starts again from empty).
_KEPT: dict[Hashable, Any] = {}
_MAX_KEPT = 256
#: Elements an array may have to be kept: the masks of problems up to 256 × 256.
MAX_ELEMENTS = 1 << 16


def memo(xp: Any, eager: bool, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
    """``make()``, kept under ``(xp, *key)`` when the call is ``eager`` (its inputs have
    values: :attr:`relattn.backends.Backend.has_values`) and the result has at most
    :data:`MAX_ELEMENTS` elements; ``key`` holds all that ``make`` depends on (lengths,
    dtype, device). Traced calls make it every time and never touch the store; so does
    an unhashable key (a device without a hash)."""
    if not eager:
        return make()
    full_key = (xp, *key)
    try:
        found = _KEPT.get(full_key)
    except TypeError:
        return make()
    if found is not None:
        return found
    made = make()
    if made is None or math.prod(made.shape) > MAX_ELEMENTS:
        return made
    if len(_KEPT) >= _MAX_KEPT:
        _KEPT.clear()
    _KEPT[full_key] = made
    return made


def constant(xp: Any, eager: bool, value: float, dtype: Any, device: Any) -> Any:
    """The 0-d array ``value`` in ``dtype`` on ``device`` (a fill for ``where`` or
    ``maximum``), kept for ``eager`` calls as :func:`memo` keeps arrays."""
    return memo(
        xp, eager, ("constant", value, dtype, device),
        lambda: xp.full((), value, dtype=dtype, device=device),
    )  # fmt: skip
