"""JAX: immutable arrays, traced under ``jax.jit``, ``lax.stop_gradient``."""

from __future__ import annotations

from typing import Any

from ._base import Backend


def _stop_gradient(x: Any) -> Any:
    import jax

    return jax.lax.stop_gradient(x)


def _has_values(x: Any) -> bool:
    import jax

    return not isinstance(x, jax.core.Tracer)


def _to_host(x: Any) -> Any:
    import numpy as np

    return np.asarray(x)


def _jit(fn: Any) -> Any:
    import jax

    return jax.jit(fn)


BACKEND = Backend(
    name="jax",
    library="jax",
    jit_traceable=True,
    writeable=False,
    stop_gradient=_stop_gradient,
    has_values=_has_values,
    to_host=_to_host,
    jit=_jit,
)
