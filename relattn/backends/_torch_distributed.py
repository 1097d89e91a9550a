"""torch.distributed: the collectives of relattn's ring and Ulysses drivers for PyTorch tensors.

A process group takes the place of JAX's mesh axis: ``axis_size`` and ``axis_index`` are the
group's size and this process's rank in it (plain ints: every rank runs the same Python
program), ``rotate`` passes tensors to the next rank with point-to-point sends
(``batch_isend_irecv``) that run while the caller computes, and ``all_to_all`` and
``all_gather`` are the group's collectives. ``rotate`` and ``all_to_all`` are autograd
functions (``torch.autograd.Function``) whose backward runs the transposed communication
(the rotation the other way round, the inverse all-to-all), so gradients reach the rank
that owns each input; ``all_gather`` serves integer arrays (positions, segment ids) only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["COLLECTIVE"]


def _group(group: Any) -> Any:
    """The process group (``None``: the default group), checked to exist."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "group: ring and Ulysses attention on torch tensors run over torch.distributed; "
            "call torch.distributed.init_process_group first (got no initialized default "
            "process group)"
        )
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            f"group must be a torch.distributed.ProcessGroup or None (the default group), got "
            f"{type(group).__name__}"
        )
    if group is not None and dist.get_rank(group) < 0:
        raise ValueError("group: this process is not a member of the given process group")
    return group


def _size(group: Any) -> int:
    return dist.get_world_size(_group(group))


def _rank(group: Any) -> int:
    return dist.get_rank(_group(group))


class _Transfer:
    """Point-to-point sends of ``tensors`` to the rank ``step`` ahead in ``group`` and
    receives of the same shapes from the rank ``step`` behind, started at once (gloo and
    NCCL run them while the caller computes); :meth:`wait` gives what arrived."""

    def __init__(self, tensors: Sequence[torch.Tensor], group: Any, step: int) -> None:
        n, me = _size(group), _rank(group)
        ahead, behind = (me + step) % n, (me - step) % n
        ops = []
        self.received = []
        for x in tensors:
            x = x.contiguous()
            buffer = torch.empty_like(x)
            ops.append(dist.P2POp(dist.isend, x, group=group, group_peer=ahead))
            ops.append(dist.P2POp(dist.irecv, buffer, group=group, group_peer=behind))
            self.received.append(buffer)
        self._works = dist.batch_isend_irecv(ops) if ops else []

    def wait(self) -> list[torch.Tensor]:
        for work in self._works:
            work.wait()
        self._works = []
        return self.received


class _Rotate(torch.autograd.Function):
    """Tensors passed one rank ahead round the group. The forward returns the receive
    buffers at once, the transfer still running: the caller waits on the :class:`_Transfer`
    it is handed (in ``started``) before reading them. The backward passes each gradient
    one rank back (the transpose), and waits for it."""

    @staticmethod
    def forward(ctx: Any, group: Any, started: list[Any], *tensors: torch.Tensor) -> Any:
        ctx.group = group
        ctx.floating = [x.is_floating_point() for x in tensors]
        transfer = _Transfer(tensors, group, 1)
        started.append(transfer)
        ctx.mark_non_differentiable(
            *(b for b, f in zip(transfer.received, ctx.floating, strict=True) if not f)
        )
        return tuple(transfer.received)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        floating = [g for g, f in zip(grads, ctx.floating, strict=True) if f]
        back = iter(_Transfer(floating, ctx.group, -1).wait())
        return (None, None, *(next(back) if f else None for f in ctx.floating))


def _rotate(tensors: tuple[Any, ...], group: Any) -> Callable[[], tuple[Any, ...]]:
    """Start passing ``tensors`` (``None`` entries stay ``None``) to the next rank of
    ``group``; the returned function waits for the previous rank's and returns them."""
    present = [x for x in tensors if x is not None]
    started: list[_Transfer] = []
    arrived = _Rotate.apply(_group(group), started, *present) if present else ()

    def receive() -> tuple[Any, ...]:
        for transfer in started:
            transfer.wait()
        rest = iter(arrived)
        return tuple(None if x is None else next(rest) for x in tensors)

    return receive


class _Depend(torch.autograd.Function):
    """``x`` unchanged, with zero gradients for ``others``: a rank's backward then reaches
    every transfer it made, including those whose tensors its fold skipped (a causal
    ring's key blocks after its queries), so each runs its transposed transfer as its
    peers do. Zeros, not a product: NaN in a masked cache slot stays out."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, *others: torch.Tensor) -> Any:
        ctx.others = [(o.shape, o.dtype, o.device) for o in others]
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        zeros = (torch.zeros(shape, dtype=dtype, device=device)
                 for shape, dtype, device in ctx.others)  # fmt: skip
        return (grad, *zeros)


def _depend(x: Any, others: Sequence[Any]) -> Any:
    """``x``, its backward also reaching ``others`` (the tensors that transfers gave)."""
    tied = [o for o in others if o is not None and o.requires_grad]
    if not tied or not torch.is_grad_enabled():
        return x
    return _Depend.apply(x, *tied)


def _all_to_all_raw(x: torch.Tensor, split: int, concat: int, group: Any) -> torch.Tensor:
    n = _size(group)
    split, concat = split % x.ndim, concat % x.ndim
    if x.shape[split] % n:
        raise ValueError(
            f"all_to_all: axis {split} of length {x.shape[split]} does not split into "
            f"{n} equal parts"
        )
    parts = x.movedim(split, 0).reshape(n, x.shape[split] // n, *_without(x.shape, split))
    parts = parts.contiguous()
    out = torch.empty_like(parts)
    dist.all_to_all_single(out, parts, group=group)
    # out[r]: rank r's part for this rank, in rank order along the concatenated axis.
    pieces = [out[r].movedim(0, split) for r in range(n)]
    return torch.cat(pieces, dim=concat)


def _without(shape: Sequence[int], axis: int) -> tuple[int, ...]:
    return tuple(s for i, s in enumerate(shape) if i != axis)


class _AllToAll(torch.autograd.Function):
    """:func:`_all_to_all`, differentiable: the backward is the inverse all-to-all."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, split: int, concat: int, group: Any) -> Any:
        ctx.split, ctx.concat, ctx.group = split, concat, group
        return _all_to_all_raw(x, split, concat, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return _all_to_all_raw(grad, ctx.concat, ctx.split, ctx.group), None, None, None


def _all_to_all(x: Any, split_axis: int, concat_axis: int, group: Any) -> Any:
    """``x`` split along ``split_axis`` into one part per rank, part ``r`` sent to rank
    ``r``; the parts received, in rank order, concatenated along ``concat_axis`` (JAX's
    ``lax.all_to_all(..., tiled=True)``)."""
    group = _group(group)
    if x.is_floating_point() and x.requires_grad:
        return _AllToAll.apply(x, split_axis, concat_axis, group)
    return _all_to_all_raw(x, split_axis, concat_axis, group)


def _all_gather(x: Any, dim: int, group: Any) -> Any:
    """Every rank's ``x`` concatenated along ``dim`` in rank order (for integer arrays:
    positions, segment ids; not differentiated)."""
    group = _group(group)
    if x.is_floating_point() and x.requires_grad:
        raise TypeError("all_gather is for integer arrays (positions, segment ids)")
    pieces = [torch.empty_like(x) for _ in range(_size(group))]
    dist.all_gather(pieces, x.contiguous(), group=group)
    return torch.cat(pieces, dim=dim)


class _Collective:
    """The ring's and Ulysses's communication over a ``torch.distributed`` process group
    (``None``: the default group). See :class:`relattn.backends._base.Backend`."""

    axis_size = staticmethod(_size)
    axis_index = staticmethod(_rank)
    rotate = staticmethod(_rotate)
    depend = staticmethod(_depend)
    all_to_all = staticmethod(_all_to_all)
    all_gather = staticmethod(_all_gather)


COLLECTIVE = _Collective
