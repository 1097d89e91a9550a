"""The record of what one array library can do beyond the array API standard."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _identity(x: Any) -> Any:
    return x


def _always(x: Any) -> bool:
    return True


def _never(x: Any) -> bool:
    return False


def _host_copy(x: Any) -> Any:
    import numpy as np

    # DLPack reaches NumPy from any CPU array-API library, strict ones included.
    return np.asarray(x) if isinstance(x, np.ndarray) else np.from_dlpack(x)


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
    has_values : callable
        ``x -> bool``: the values of ``x`` can be read now (False for JAX
        tracers under a jit and for Dask graphs), so checks may look at them.
    to_host : callable
        ``x -> numpy.ndarray``: a host copy, waiting for the device or graph.
    materialize : callable
        ``x -> x`` computed now (Dask ``persist``), so that a cache such as a
        segment memory does not drag its whole history along.
    jit : callable
        ``fn -> fn`` compiled by the library's tracing jit (``jax.jit``), or
        ``fn`` itself.
    fused_attention : callable or None
        ``(q, k, v, *, bias, mask, scale) -> out or None``: the library's own
        attention kernel for ``softmax(q kᵀ · scale + bias, mask) v`` with
        relattn's semantics (fully masked rows are zero), or ``None`` where the
        inputs do not fit it. ``None`` (the field) where the library has none
        worth using; relattn then runs the generic array-API path.
    """

    name: str
    library: str
    jit_traceable: bool = False
    writeable: bool = True
    stop_gradient: Callable[[Any], Any] = _identity
    has_values: Callable[[Any], bool] = _always
    to_host: Callable[[Any], Any] = _host_copy
    materialize: Callable[[Any], Any] = _identity
    jit: Callable[[Any], Any] = _identity
    fused_attention: Callable[..., Any] | None = None
