"""PyTorch: autograd detaching; traceable by ``torch.compile``; fused attention."""

from __future__ import annotations

import functools
import math
import types
import warnings
from collections.abc import Callable
from typing import Any

from ._base import Backend
from ._flex import KERNEL as FLEX
from ._relative import TRITON
from ._torch_distributed import COLLECTIVE
from ._torch_types import is_dtensor, own_code


def _stop_gradient(x: Any) -> Any:
    return x.detach()


def _has_values(x: Any) -> bool:
    import torch

    # Under torch.compile a value check would be a data-dependent guard.
    return not torch.compiler.is_compiling()


def _checkpoint(fn: Any, *args: Any) -> Any:
    """``fn(*args)``; under autograd, recomputed in the backward pass instead of kept."""
    if not _needs_grad(args):
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
    if is_dtensor(q, k, v):
        return None
    return functools.partial(fused_attention, q, k, v)


def _join(x: Any, like: Any) -> Any:
    """Plain tensor ``x`` as a DTensor replicated on ``like``'s mesh when ``like`` is one.

    A bias or mask relattn builds (the causal mask) is the same on every rank;
    DTensor refuses to mix the two kinds in one operation.
    """
    if x is None or not is_dtensor(like) or is_dtensor(x):
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
    ``causal`` (``Lq <= Lk``, no bias or mask: query ``i`` sees keys up to
    ``i + Lk - Lq``) is SDPA's ``is_causal`` for ``Lq = Lk`` and
    ``torch.nn.attention.bias.causal_lower_right`` otherwise, neither an ``(Lq, Lk)``
    array. Rows with no
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
    lq, lk = q.shape[-2], k.shape[-2]
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    # SDPA's fused CPU and CUDA kernels take (B, H, L, d): with more leading dims (Swin's
    # (B, windows, H, N, d)) it falls back to its math kernel, materialising the scores
    # and more. Those dims become one, the mask's too (not a DTensor's, nor under compile).
    flatten = (
        len(lead) > 2
        and not (causal and lq != lk)
        and (attn_mask is None or type(attn_mask) is torch.Tensor)
        and not torch.compiler.is_compiling()
    )
    if flatten:
        merged = (-1, *lead[-1:])

        def flat(x: Any) -> Any:
            return x.expand(*lead, *x.shape[-2:]).reshape(*merged, *x.shape[-2:])

        q, k, v = flat(q), flat(k), flat(v)
        attn_mask = None if attn_mask is None else flat(attn_mask)
    if attn_mask is not None:
        attn_mask = aligned_mask(attn_mask)
    if causal and lq != lk:
        from torch.nn.attention.bias import causal_lower_right

        attn_mask, causal = causal_lower_right(lq, lk), False
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=causal, scale=scale
    )
    if flatten:
        out = out.reshape(*lead, lq, out.shape[-1])
    if mask is not None:
        out = torch.where(mask.any(dim=-1, keepdim=True), out, 0.0)
    return out


def aligned_mask(attn_mask: Any) -> Any:
    """``attn_mask`` starting on a 16-element boundary of its storage.

    SDPA's memory-efficient CUDA kernel reads the mask in vectors: torch pads a mask
    whose strides are not multiples of 16 elements, but does not look at where a view
    starts, and one starting mid-vector (``rel_shift``'s strided view of a padded
    buffer) stops the kernel with "misaligned address" (seen on an H200 in bfloat16).
    Such a view is copied; broadcast dimensions (stride 0) stay broadcast, so the copy
    is no larger than the data the view holds. A compiled call is left to Inductor.
    """
    import torch

    # Under torch.compile Inductor lays the mask out itself (and Dynamo cannot trace
    # storage_offset).
    if torch.compiler.is_compiling() or attn_mask.storage_offset() % 16 == 0:
        return attn_mask
    lead = tuple(slice(0, 1) if stride == 0 else slice(None) for stride in attn_mask.stride()[:-2])
    return attn_mask[lead].contiguous().expand(attn_mask.shape)


def _cumulative_sum(x: Any, axis: int) -> Any:
    import torch

    return torch.cumsum(x, dim=axis)


def _needs_grad(arrays: tuple[Any, ...]) -> bool:
    """A gradient will be taken: autograd records and one of ``arrays`` (tensors or
    ``None``) requires one."""
    import torch

    if not torch.is_grad_enabled():
        return False
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in arrays)


def _step_compiler() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A compiler of the block fold's step for one plan (``Backend.step_compiler``).

    Each step is a new closure of one function of :mod:`relattn.fold`; Dynamo keeps
    compiled code per code object, at most ``recompile_limit`` (8) versions of it. So
    the plan compiles its own copy of the step's code object, once: its blocks then
    reuse the copy's compiled code (the offsets of interior blocks become symbolic
    after the first recompile; the last, shorter blocks and the causal diagonal take a
    few versions more), and other plans do not evict them. ``fullgraph=True``: a graph
    break inside the step is an error, not a silent fallback.
    """
    import torch

    copies: dict[types.CodeType, types.CodeType] = {}

    def compile_step(fn: Callable[..., Any]) -> Callable[..., Any]:
        if torch.compiler.is_compiling():
            return fn  # inside the caller's own torch.compile: traced into their graph
        code = copies.get(fn.__code__)
        if code is None:
            code = copies[fn.__code__] = own_code(fn)
        step = types.FunctionType(code, fn.__globals__, code.co_name, None, fn.__closure__)
        compiled = torch.compile(step, fullgraph=True)

        def run(*args: Any) -> Any:
            with warnings.catch_warnings():
                # Dynamo reads .grad of the non-leaf tensors the step closes over (the
                # scaled queries) while it builds its guards; torch warns of its own read.
                warnings.filterwarnings("ignore", message=_NON_LEAF_GRAD, category=UserWarning)
                return compiled(*args)

        return run

    return compile_step


_NON_LEAF_GRAD = "The .grad attribute of a Tensor that is not a leaf Tensor"


def _free_memory(device: Any) -> int | None:
    """Free bytes on a CUDA device (``torch.cuda.mem_get_info``); ``None`` elsewhere."""
    if getattr(device, "type", None) != "cuda":
        return None
    import torch

    return int(torch.cuda.mem_get_info(device)[0])


BACKEND = Backend(
    name="torch",
    stop_gradient=_stop_gradient,
    has_values=_has_values,
    checkpoint=_checkpoint,
    fused_attention=_fused_attention,
    kernel_name="torch SDPA",
    kernels=(FLEX, TRITON),
    needs_grad=_needs_grad,
    step_compiler=_step_compiler,
    free_memory=_free_memory,
    takes_blockwise=lambda x: not is_dtensor(x),
    join=_join,
    cumulative_sum=_cumulative_sum,
    collective=COLLECTIVE,
)
