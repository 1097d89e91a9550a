"""PyTorch: autograd detaching; traceable by ``torch.compile``."""

from __future__ import annotations

from typing import Any

from ._base import Backend


def _stop_gradient(x: Any) -> Any:
    return x.detach()


def _to_host(x: Any) -> Any:
    import torch

    x = x.detach().cpu()
    return (x.float() if x.dtype == torch.bfloat16 else x).numpy()


BACKEND = Backend(
    name="torch",
    library="torch",
    jit_traceable=True,
    stop_gradient=_stop_gradient,
    to_host=_to_host,
)
