"""Type aliases for the public signatures."""

from __future__ import annotations

from typing import Any, TypeAlias

#: An array of any array-API library (NumPy, CuPy, PyTorch, JAX, Dask,
#: array-api-strict …). The standard defines no runtime protocol a type
#: checker could verify across libraries, so this is ``Any`` under its name:
#: it tells a reader which arguments take arrays.
Array: TypeAlias = Any

#: An array library module or namespace passed as ``xp=`` (``numpy``,
#: ``torch``, ``jax.numpy`` …), or ``None`` for NumPy.
Namespace: TypeAlias = Any
