"""PyTorch: autograd detaching; traceable by ``torch.compile``."""

from __future__ import annotations

from typing import Any

from ._base import Backend


def _stop_gradient(x: Any) -> Any:
    return x.detach()


BACKEND = Backend(name="torch", library="torch", jit_traceable=True, stop_gradient=_stop_gradient)
