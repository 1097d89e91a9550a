"""PyTorch: autograd detaching; traceable by ``torch.compile``; fused attention."""

from __future__ import annotations

import functools
import math
import sys
from typing import Any

from ._base import Backend


def _stop_gradient(x: Any) -> Any:
    return x.detach()


def _has_values(x: Any) -> bool:
    import torch

    # Under torch.compile a value check would be a data-dependent guard.
    return not torch.compiler.is_compiling()


def _checkpoint(fn: Any, *args: Any) -> Any:
    """``fn(*args)``; under autograd, recomputed in the backward pass instead of kept."""
    import torch

    needs_grad = torch.is_grad_enabled() and any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in args
    )
    if not needs_grad:
        return fn(*args)
    from torch.utils.checkpoint import checkpoint

    return checkpoint(fn, *args, use_reentrant=False)


def _fused_attention(q: Any, k: Any, v: Any) -> Any:
    """The kernel below, except for DTensors.

    DTensor has no sharding rule for the CPU fused kernel and propagates
    shardings through its whole decomposition, which takes minutes on the first
    call: DTensors take relattn's generic path, every operation of which has a
    sharding rule (batch or head shardings pass through without
    communication).
    """
    if _is_dtensor(q, k, v):
        return None
    return functools.partial(fused_attention, q, k, v)


def _is_dtensor(*xs: Any) -> bool:
    """Any of ``xs`` is a ``torch.distributed.tensor.DTensor``.

    Looked up in ``sys.modules``, not imported: importing
    ``torch.distributed.tensor`` takes seconds, and no DTensor exists before it
    has been imported.
    """
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and any(isinstance(x, module.DTensor) for x in xs)


def _join(x: Any, like: Any) -> Any:
    """Plain tensor ``x`` as a DTensor replicated on ``like``'s mesh when ``like`` is one.

    A bias or mask relattn builds (the causal mask) is the same on every rank;
    DTensor refuses to mix the two kinds in one operation.
    """
    if x is None or not _is_dtensor(like) or _is_dtensor(x):
        return x
    from torch.distributed.tensor import DTensor, Replicate

    mesh = like.device_mesh
    return DTensor.from_local(x, mesh, [Replicate()] * mesh.ndim, run_check=False)


def fused_attention(
    q: Any, k: Any, v: Any, *, bias: Any, mask: Any, causal: bool, scale: float
) -> Any:
    """``torch.nn.functional.scaled_dot_product_attention`` with relattn's semantics.

    ``bias`` and ``mask`` become one ``attn_mask``: the boolean mask alone (``True`` =
    may attend, the polarity of both), or the bias with ``-inf`` where the mask forbids;
    ``causal`` (``Lq = Lk``, no bias or mask) is SDPA's ``is_causal``. Rows with no
    allowed key are set to zero whatever the kernel gives them. SDPA adds the ``-inf``
    of a mask to the scores, so relattn offers it masks only for finite keys.
    """
    import torch
    import torch.nn.functional as F

    if mask is None:
        attn_mask = bias
    elif bias is None:
        attn_mask = mask
    else:
        attn_mask = torch.where(mask, bias, -math.inf)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=causal, scale=scale
    )
    if mask is not None:
        out = torch.where(mask.any(dim=-1, keepdim=True), out, 0.0)
    return out


BACKEND = Backend(
    name="torch",
    stop_gradient=_stop_gradient,
    has_values=_has_values,
    checkpoint=_checkpoint,
    fused_attention=_fused_attention,
    takes_blockwise=lambda x: not _is_dtensor(x),
    join=_join,
)
