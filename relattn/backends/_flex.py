"""FlexAttention (``torch.nn.attention.flex_attention``) as a kernel a plan lowers a problem to.

Every term of relattn's core that is a function of one ``(query, key)`` pair
of positions is a FlexAttention ``score_mod`` or ``mask_mod`` (He et al.
2024): the per-distance bias ``b[δ]`` in either layout (T5, ALiBi), an
additive ``bias``, ``causal``, explicit positions (SPEC §2.15), segment ids,
a boolean ``mask``, and the caller's own ``score_mod`` and ``mask_mod``
(§2.16), which receive relattn's positions, not FlexAttention's indices. The
terms that are products with a table (Transformer-XL's ``q·Kʳ[δ]``, DeBERTa's
``k·Qʳ[δ]``) and Shaw's value table are not: :func:`refuse` says so.

:data:`KERNEL` is the :class:`relattn.backends.Kernel` record;
:func:`flex_run` runs one problem with or without ``torch.compile`` (eager
FlexAttention is an unfused reference that forms the whole scores).

Compilation. Each plan (:func:`prepare`) compiles its own copy of one small
function (its own code object), which builds the call's ``BlockMask`` and
calls ``flex_attention``: Dynamo keeps compiled code per code object and
recompiles a code object at most ``recompile_limit`` (8) times, so one
``torch.compile(flex_attention)`` shared by every shape would fall back to
eager after eight signatures. The arrays of a call (positions, segment ids,
a mask, biases, what the caller's functions close over) reach the compiled
code through the closures of ``score_mod`` and ``mask_mod``, which Dynamo
lifts to graph inputs: a new call with new arrays of the same shapes,
dtypes and strides runs the compiled code again, without recompiling.
"""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._base import Kernel
from ._torch_types import is_dtensor, own_code

__all__ = ["KERNEL", "flex_run", "prepare", "refusal", "refuse"]

#: Devices whose FlexAttention forward torch compiles (Inductor's C++ template on the
#: CPU, Triton on GPUs); the eager reference runs wherever ``flex_attention`` does.
_COMPILED_DEVICES = frozenset({"cpu", "cuda", "xpu"})
_EAGER_DEVICES = frozenset({"cpu", "cuda", "xpu", "hpu", "mps"})
#: Devices whose FlexAttention has no backward (``flex_attention`` raises).
_NO_BACKWARD = frozenset({"cpu", "mps"})
#: The dtypes FlexAttention's compiled kernels take (float64: eager only).
_KERNEL_DTYPES = ("float32", "float16", "bfloat16")


def refusal(p: Any, *, compiled: bool = True) -> str | None:
    """``None`` where FlexAttention computes the checked problem ``p`` exactly; else why not.

    Reads static facts only: which fields are present, shapes, dtypes, the
    device type, whether an input requires a gradient (torch >= 2.10, the project's
    floor, has FlexAttention and its compiled CPU kernel).
    ``compiled``: the fused kernel of ``torch.compile`` (the :data:`KERNEL`);
    ``False``: the eager reference, which also takes float64.
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(p.q, torch.Tensor):
        return "the inputs are not torch tensors (FlexAttention is PyTorch's)"
    version = torch.__version__.split("+")[0]
    if p.key_table is not None:
        return (
            "a content-to-position table (Transformer-XL, XLNet, TENER, Shaw keys, DeBERTa) "
            "is a product q·Kʳ[δ], not a score_mod term"
        )
    if p.query_table is not None:
        return "a position-to-content table (DeBERTa) is a product k·Qʳ[δ], not a score_mod term"
    if p.value_table is not None:
        return "a value table (Shaw) adds to the output, which FlexAttention does not express"
    if p.grid_rows is not None:
        return "the decomposed 2-D terms (SAM) are not among relattn's score_mod terms"
    arrays = [a for a in p.arrays() if a is not None]
    if is_dtensor(*arrays):
        return "a DTensor: FlexAttention takes plain tensors"
    if any(not isinstance(a, torch.Tensor) for a in arrays):
        return "an input is not a torch tensor"
    if len(p.lead) > 2:
        return f"more than two leading dims {tuple(p.lead)}: FlexAttention takes (B, H, L, d)"
    d, d_v = p.q.shape[-1], p.v.shape[-1]
    if 0 in (p.lq, p.lk, d, d_v, *p.lead):
        return "an empty axis (Lq, Lk, d, d_v or a leading dim is 0)"
    device = p.q.device.type
    if any(a.device != p.q.device for a in arrays):
        return "the inputs are on more than one device"
    if not p.dtype.is_floating_point:
        return f"FlexAttention takes real floating inputs, not {p.dtype}"
    if compiled:
        if device not in _COMPILED_DEVICES:
            return f"FlexAttention's compiled kernel does not run on {device} devices"
        name = str(p.dtype).removeprefix("torch.")
        if name not in _KERNEL_DTYPES:
            return (
                f"FlexAttention's compiled kernels take float32, float16 and bfloat16, not {name}"
            )
        if device != "cpu" and min(d, d_v) < 16:
            return f"FlexAttention's GPU kernel needs d, d_v >= 16, got d = {d}, d_v = {d_v}"
    elif device not in _EAGER_DEVICES:
        return f"FlexAttention does not run on {device} devices"
    if device in _NO_BACKWARD and torch.is_grad_enabled() and any(a.requires_grad for a in arrays):
        where = "CPU" if device == "cpu" else device.upper()
        return f"FlexAttention has no backward on the {where} in torch {version}"
    return None


def refuse(p: Any) -> str | None:
    """:func:`refusal` for the compiled kernel (:attr:`relattn.backends.Kernel.refuse`)."""
    return refusal(p, compiled=True)


# -------------------------------------------------------------------------------------------
# The static structure of a problem: what every call of one signature shares
# -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Layout:
    """FlexAttention's ``(B, H)`` for the scores' ``lead`` and what the terms need."""

    lead: tuple[int, ...]
    batch: int
    heads: int
    lq: int
    lk: int
    d_v: int
    causal: bool
    #: A data mask (positions under causal, segments, a mask, the caller's mask_mod):
    #: the BlockMask is built per call, over these batch and head sizes (None: broadcast).
    per_call_mask: bool
    mask_batch: int | None
    mask_heads: int | None
    #: The causal mask of default positions alone: one BlockMask for every call.
    static_mask: bool
    scores: bool


def _batch_heads(lead: tuple[int, ...]) -> tuple[int, int]:
    if len(lead) == 2:
        return lead[0], lead[1]
    return 1, (lead[0] if lead else 1)


def _lift(x: Any, lead: tuple[int, ...], trailing: int) -> Any:
    """``x (..., *trailing dims)``, leading dims broadcasting to ``lead``, as ``(nb, nh,
    *trailing)``, ``nb``, ``nh`` each 1 or the full size (a view)."""
    if x is None:
        return None
    shape = tuple(x.shape)
    shape = (1,) * (len(lead) + trailing - len(shape)) + shape
    shape = (1,) * (2 - len(lead)) + shape
    return x.reshape(shape)


def _layout(p: Any) -> _Layout:
    lead = tuple(p.lead)
    batch, heads = _batch_heads(lead)
    data = [
        _lift(x, lead, t)
        for x, t in (
            (p.query_positions if p.causal else None, 1),
            (p.key_positions if p.causal else None, 1),
            (p.query_segments, 1),
            (p.key_segments, 1),
            (p.mask, 2),
        )
        if x is not None
    ]
    user = p.mask_mod is not None
    per_call = bool(data) or user
    by_batch = user or any(x.shape[0] > 1 for x in data)
    by_head = user or any(x.shape[1] > 1 for x in data)
    return _Layout(
        lead=lead, batch=batch, heads=heads, lq=p.lq, lk=p.lk, d_v=p.v.shape[-1],
        causal=bool(p.causal), per_call_mask=per_call,
        mask_batch=batch if by_batch else None, mask_heads=heads if by_head else None,
        static_mask=bool(p.causal) and not per_call,
        scores=p.relative_bias is not None or p.bias is not None or p.score_mod is not None,
    )  # fmt: skip


# -------------------------------------------------------------------------------------------
# score_mod and mask_mod: relattn's terms as functions of one (query, key) pair
# -------------------------------------------------------------------------------------------
def _at(x: Any, b: Any, h: Any, *index: Any) -> Any:
    """``x[b, h, *index]`` of ``x (nb, nh, …)`` lifted by :func:`_lift`, reading index 0
    along each axis of size 1 (broadcast)."""
    shape = x.shape
    picks = (b, h, *index)
    return x[tuple(0 if shape[n] == 1 else i for n, i in enumerate(picks))]


def _positions(
    qpos: Any, kpos: Any, offset: int, b: Any, h: Any, q_idx: Any, kv_idx: Any
) -> tuple[Any, Any]:
    """The pair's query and key positions: explicit (``qpos[b, h, q_idx]``) or the default
    (query ``i`` at ``i + Lk - Lq``, key ``j`` at ``j``), as the block fold passes them."""
    qp = q_idx + offset if qpos is None else _at(qpos, b, h, q_idx)
    kp = kv_idx if kpos is None else _at(kpos, b, h, kv_idx)
    return qp, kp


def _make_score_mod(
    relative_bias: Any, bias: Any, qpos: Any, kpos: Any, user: Any, offset: int, lk: int
) -> Callable[..., Any]:
    """``score + b[m(δ)] + bias[i, j]``, then the caller's ``score_mod`` at the positions
    (the order of :func:`relattn.fold.pair_scores`)."""

    def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        qp, kp = _positions(qpos, kpos, offset, b, h, q_idx, kv_idx)
        if relative_bias is not None:
            # Column of δ in the layout, clipped to its edge columns (SPEC §2.15); the
            # causal layout's absent δ > 0 columns are masked.
            column = (kp - qp + (lk - 1)).clamp(0, relative_bias.shape[-1] - 1)
            score = score + _at(relative_bias, b, h, column)
        if bias is not None:
            score = score + _at(bias, b, h, q_idx, kv_idx)
        if user is not None:
            score = user(score, b, h, qp, kp)
        return score

    return score_mod


def _make_mask_mod(
    causal: bool,
    qpos: Any,
    kpos: Any,
    qseg: Any,
    kseg: Any,
    mask: Any,
    user: Any,
    offset: int,
) -> Callable[..., Any]:
    """Where a pair may attend: ``causal`` (``δ <= 0``), same segment, ``mask``, the
    caller's ``mask_mod`` at the positions (the parts of :func:`relattn.fold.pair_visible`)."""

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        qp, kp = _positions(qpos, kpos, offset, b, h, q_idx, kv_idx)
        parts = []
        if causal:
            parts.append(kp <= qp)
        if qseg is not None:
            parts.append(_at(qseg, b, h, q_idx) == _at(kseg, b, h, kv_idx))
        if mask is not None:
            parts.append(_at(mask, b, h, q_idx, kv_idx))
        if user is not None:
            parts.append(user(b, h, qp, kp))
        out = parts[0]
        for part in parts[1:]:
            out = out & part
        return out

    return mask_mod


# -------------------------------------------------------------------------------------------
# The call, and its compiled copies
# -------------------------------------------------------------------------------------------
def _call(
    q: Any,
    k: Any,
    v: Any,
    score_mod: Any,
    mask_mod: Any,
    block_mask: Any,
    mask_batch: Any,
    mask_heads: Any,
    lq: int,
    lk: int,
) -> Any:
    """One FlexAttention call: the ``BlockMask`` of ``mask_mod`` (where the mask is data)
    or ``block_mask`` (made of the shapes), then ``flex_attention`` at scale 1 (``q`` is
    scaled already)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if mask_mod is not None:
        block_mask = create_block_mask(mask_mod, mask_batch, mask_heads, lq, lk, device=q.device)
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=1.0)


def _compiled_call() -> Callable[..., Any]:
    """``torch.compile`` of a fresh copy of :func:`_call`: its own code object, so that
    Dynamo's cache and recompile limit are this plan's alone."""
    import torch

    code = own_code(_call)
    copy = types.FunctionType(code, _call.__globals__, code.co_name, _call.__defaults__)
    compiled = torch.compile(copy, dynamic=False)

    def call(*args: Any) -> Any:
        with warnings.catch_warnings():
            # Dynamo's tracing of an indexing mask_mod under create_block_mask's vmap
            # instantiates an autograd Function of torch's own, which torch deprecates.
            warnings.filterwarnings(
                "ignore", message=".*should not be instantiated", category=DeprecationWarning
            )
            return compiled(*args)

    return call


def _eager_call(*args: Any) -> Any:
    with warnings.catch_warnings():
        # "flex_attention called without torch.compile()": relattn's eager reference.
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return _call(*args)


def _static_block_mask(layout: _Layout, device: Any) -> Any:
    """The BlockMask of the causal mask under default positions (lower right when Lk > Lq)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(
        _make_mask_mod(True, None, None, None, None, None, None, layout.lk - layout.lq),
        None, None, layout.lq, layout.lk, device=device,
    )  # fmt: skip


def _as_4d(x: Any, layout: _Layout, detach: bool) -> Any:
    """``x (..., L, d)`` as FlexAttention's ``(B, H, L, d)`` (a view, broadcast dims of
    stride 0)."""
    x = x.detach() if detach else x
    shape = (layout.batch, layout.heads, *x.shape[-2:])
    x = x.reshape((1,) * (4 - x.ndim) + tuple(x.shape))
    return x if tuple(x.shape) == shape else x.expand(shape)


def prepare(p: Any, *, compiled: bool = True) -> Callable[[Any], Any]:
    """What every call of ``p``'s signature shares; returns ``run(problem) -> out``.

    ``compiled``: the fused kernel (``torch.compile`` of this plan's own copy of
    the call, compiled on the first call); ``False``: eager FlexAttention, an
    unfused reference that forms the whole scores. The causal mask of default
    positions is made into a ``BlockMask`` here, once; masks of data
    (positions under ``causal``, segment ids, ``mask``, the caller's
    ``mask_mod``) are made per call, inside the compiled code.
    """
    import torch

    layout = _layout(p)
    call = _compiled_call() if compiled else _eager_call
    block_mask = _static_block_mask(layout, p.q.device) if layout.static_mask else None
    lead, offset = layout.lead, layout.lk - layout.lq
    no_backward = p.q.device.type in _NO_BACKWARD

    def run(p: Any) -> Any:
        detach = no_backward and not torch.is_grad_enabled()
        q, k, v = (_as_4d(x, layout, detach) for x in (p.q, p.k, p.v))
        qpos, kpos = _lift(p.query_positions, lead, 1), _lift(p.key_positions, lead, 1)
        score_mod = mask_mod = None
        if layout.scores:
            score_mod = _make_score_mod(
                _lift(p.relative_bias, lead, 1), _lift(p.bias, lead, 2), qpos, kpos,
                p.score_mod, offset, layout.lk,
            )  # fmt: skip
        if layout.per_call_mask:
            mask_mod = _make_mask_mod(
                layout.causal, qpos, kpos, _lift(p.query_segments, lead, 1),
                _lift(p.key_segments, lead, 1), _lift(p.mask, lead, 2), p.mask_mod, offset,
            )  # fmt: skip
        # Inside the caller's torch.compile the call is traced into their graph.
        out = (_call if torch.compiler.is_compiling() else call)(
            q, k, v, score_mod, mask_mod, block_mask, layout.mask_batch, layout.mask_heads,
            layout.lq, layout.lk,
        )  # fmt: skip
        out = out.reshape((*lead, layout.lq, layout.d_v))
        return out if out.dtype == p.dtype else out.to(p.dtype)

    return run


def _signature(p: Any, compiled: bool) -> tuple[Any, ...]:
    """What :func:`prepare` reads of ``p``: each array's type, dtype, shape, strides and
    device, the flags, and which of the caller's functions are present."""

    def of(a: Any) -> Any:
        return None if a is None else (type(a), a.dtype, tuple(a.shape), a.stride(), a.device)

    return (
        compiled, tuple(of(a) for a in p.arrays()), tuple(p.lead), p.lq, p.lk, bool(p.causal),
        p.score_mod is None, p.mask_mod is None,
    )  # fmt: skip


#: Signature (:func:`_signature`) -> its prepared run, for :func:`flex_run`.
_PREPARED: dict[tuple[Any, ...], Callable[[Any], Any]] = {}
#: Signatures kept at most (a loop over many shapes starts again from empty).
_MAX_PREPARED = 32


def flex_run(p: Any, compiled: bool = True) -> Any:
    """FlexAttention's output for the checked problem ``p`` (which :func:`refusal` takes),
    ``(*lead, Lq, d_v)`` in ``p.dtype``, rows with no visible key zero.

    ``compiled``: the fused kernel, compiled on the first call of each signature
    (seconds); ``False``: eager FlexAttention (an unfused reference). The
    prepared function is kept per signature for later calls.
    """
    why = refusal(p, compiled=compiled)
    if why is not None:
        raise ValueError(f"FlexAttention cannot compute this problem: {why}")
    key = _signature(p, compiled)
    run = _PREPARED.get(key)
    if run is None:
        if len(_PREPARED) >= _MAX_PREPARED:
            _PREPARED.clear()
        run = _PREPARED[key] = prepare(p, compiled=compiled)
    return run(p)


#: The FlexAttention kernel of :attr:`relattn.backends.Backend.kernels` (torch).
KERNEL = Kernel(name="flex", refuse=refuse, prepare=prepare, compiles=True)
