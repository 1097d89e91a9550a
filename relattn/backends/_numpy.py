"""NumPy: the reference library; host arrays, no autograd, no compiler."""

from __future__ import annotations

from typing import Any

from ._base import Backend, host_only


def _from_host(a: Any, device: Any = None, chunks: Any = None) -> Any:
    import numpy as np

    return np.array(a, copy=True)


BACKEND = Backend(
    name="numpy", library="numpy", module="numpy", from_host=_from_host, device=host_only("numpy")
)
