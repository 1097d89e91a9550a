"""The record of what one array library can do beyond the array API standard."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _identity(x: Any) -> Any:
    return x


@dataclass(frozen=True)
class Backend:
    """Library-specific capabilities and operations.

    Attributes
    ----------
    name : str
        Short name of the backend (``"numpy"``, ``"torch"``, ``"jax"`` …).
    library : str
        Import name of the array library, for version look-ups.
    jit_traceable : bool
        Functions can be traced with static shapes and compiled (``jax.jit``,
        ``torch.compile``).
    writeable : bool
        Arrays support in-place item assignment.
    stop_gradient : callable
        ``x -> x`` cut from the autograd graph (identity where the library has
        no autograd).
    """

    name: str
    library: str
    jit_traceable: bool = False
    writeable: bool = True
    stop_gradient: Callable[[Any], Any] = _identity
