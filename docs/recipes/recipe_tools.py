"""Helpers of the recipe pages: load an example script, run it on every CPU library.

The recipe pages are executed when the documentation is built (myst-nb); each
loads ``examples/<name>.py`` from the repository, runs its ``run(xp)`` on the
array libraries that are installed, and compares every result with NumPy's.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

os.environ.setdefault("JAX_ENABLE_X64", "1")  # the recipes compute in float64

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LIBRARIES = ("numpy", "array_api_strict", "torch", "jax.numpy")


def load(name: str) -> ModuleType:
    """``examples/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def libraries() -> dict[str, Any]:
    """The installed array libraries, by the module name a user passes as ``xp``."""
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = importlib.import_module(name)
        except ImportError:
            continue
    return found


def _arrays(result: dict[str, Any]) -> dict[str, np.ndarray]:
    return {
        k: np.asarray(v)
        for k, v in result.items()
        if isinstance(v, np.ndarray) and np.asarray(v).dtype.kind in "fc"
    }


def run_everywhere(example: ModuleType, **kwargs: Any) -> dict[str, dict[str, Any]]:
    """``example.run(lib)`` for every installed library; prints max |Δ| from NumPy."""
    results = {name: example.run(lib, **kwargs) for name, lib in libraries().items()}
    reference = _arrays(results["numpy"])
    width = max(len(k) for k in reference)
    print(f"{'result':<{width}}  shape          " + "  ".join(f"{n:>16}" for n in results))
    for key, want in reference.items():
        gaps = [
            np.max(np.abs(_arrays(r)[key] - want)) if want.size else 0.0 for r in results.values()
        ]
        shape = str(want.shape)
        print(f"{key:<{width}}  {shape:<14} " + "  ".join(f"{g:16.1e}" for g in gaps))
    return results


def to_numpy(x: Any) -> np.ndarray:
    """A NumPy copy of an array of any of :data:`LIBRARIES` (through DLPack)."""
    try:
        return np.from_dlpack(x)
    except (TypeError, BufferError, RuntimeError):
        return np.asarray(x)


def compare_everywhere(
    compute: Any, inputs: dict[str, np.ndarray]
) -> dict[str, dict[str, np.ndarray]]:
    """``compute(xp, arrays)`` on every installed library; prints max |Δ| from NumPy.

    For the examples without a ``run(xp)``: ``inputs`` (NumPy) are converted
    with each library's ``asarray``, ``compute`` returns a dict of arrays of
    that library, and the results come back as NumPy arrays, by library.
    """
    results = {}
    for name, lib in libraries().items():
        arrays = {key: lib.asarray(value) for key, value in inputs.items()}
        results[name] = {key: to_numpy(out) for key, out in compute(lib, arrays).items()}
    reference = results["numpy"]
    width = max(len(k) for k in reference)
    print(f"{'result':<{width}}  shape          " + "  ".join(f"{n:>16}" for n in results))
    for key, want in reference.items():
        gaps = [np.max(np.abs(r[key] - want)) if want.size else 0.0 for r in results.values()]
        shape = str(want.shape)
        print(f"{key:<{width}}  {shape:<14} " + "  ".join(f"{g:16.1e}" for g in gaps))
    return results
