"""CuPy: device-to-host copies."""

from __future__ import annotations

from typing import Any

from ._base import Backend


def _to_host(x: Any) -> Any:
    return x.get()


BACKEND = Backend(name="cupy", library="cupy", to_host=_to_host)
