"""PyTorch: autograd detaching; traceable by ``torch.compile``; fused attention."""

from __future__ import annotations

import math
from typing import Any

from ._base import Backend


def _stop_gradient(x: Any) -> Any:
    return x.detach()


def _has_values(x: Any) -> bool:
    import torch

    # Under torch.compile a value check would be a data-dependent guard.
    return not torch.compiler.is_compiling()


def _from_host(a: Any, device: Any = None, chunks: Any = None) -> Any:
    import numpy as np
    import torch

    return torch.from_numpy(np.array(a, copy=True)).to(device=device or "cpu")


def _to_host(x: Any) -> Any:
    import torch

    x = x.detach().cpu()
    return (x.float() if x.dtype == torch.bfloat16 else x).numpy()


def _ready(x: Any) -> Any:
    import torch

    if getattr(x, "is_cuda", False):
        torch.cuda.synchronize(x.device)
    return x


def _compile(fn: Any, **options: Any) -> Any:
    import torch

    return torch.compile(fn, fullgraph=True, **options)


def _device(kind: str) -> Any:
    import torch

    if kind == "cpu":
        return torch.device("cpu")
    if kind == "gpu":
        if not torch.cuda.is_available():
            raise LookupError("torch has no CUDA device")
        return torch.device("cuda")
    raise LookupError(f"unknown device kind {kind!r}")


def fused_attention(q: Any, k: Any, v: Any, *, bias: Any, mask: Any, scale: float) -> Any:
    """``torch.nn.functional.scaled_dot_product_attention`` with relattn's semantics.

    ``bias`` and ``mask`` become one ``attn_mask``: the boolean mask alone
    (``True`` = may attend, the polarity of both), or the bias with ``-inf``
    where the mask forbids. Rows with no allowed key are set to zero whatever
    the kernel gives them. Inputs of one dtype and device, as relattn's
    callers guarantee; leading dimensions broadcast as in the generic path.
    """
    import torch
    import torch.nn.functional as F

    if mask is None:
        attn_mask = bias
    elif bias is None:
        attn_mask = mask
    else:
        attn_mask = torch.where(mask, bias, -math.inf)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
    if mask is not None:
        out = torch.where(mask.any(dim=-1, keepdim=True), out, 0.0)
    return out


BACKEND = Backend(
    name="torch",
    library="torch",
    module="torch",
    stop_gradient=_stop_gradient,
    has_values=_has_values,
    from_host=_from_host,
    to_host=_to_host,
    ready=_ready,
    compile=_compile,
    device=_device,
    fused_attention=fused_attention,
)
