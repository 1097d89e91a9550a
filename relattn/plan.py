"""Plans: the path a call takes, chosen once per call signature (SPEC §2.14b).

A call's path is a function of static facts only: the library, the device, the
dtype, the shapes, which terms are present, the layouts, the kinds of mask and
positions, whether a gradient is wanted, and :data:`relattn.config`. relattn
chooses it once per such signature and keeps the choice, with what the path
prepared (a compiled kernel, a mask made of the shapes alone), as a
:class:`Plan`. A plan is the core's routing remembered, not a second engine: the
core (:func:`relattn.core.attention`) runs the path it names, and every path is
tested against the block fold.

The paths, fastest first; a plan takes the first that computes the problem
exactly and records why it passed over the others (:attr:`Plan.refused`):

============ ===================================================================
``fused``    the library's attention kernel (torch SDPA, cuDNN through
             ``jax.nn.dot_product_attention``) with nothing of ``(Lq, Lk)`` to
             pass: plain or causal attention (flash kernels, ``O(L)`` memory)
``flex``     FlexAttention (torch): per-distance biases (ALiBi, T5), positions,
             segments, masks and the caller's ``score_mod``/``mask_mod`` as
             functions of the indices, never an ``(Lq, Lk)`` array; compiled on
             its first call of each shape, so taken where that pays
             (:attr:`relattn.config.compile <relattn._config.Settings.compile>`)
``triton``   relattn's own kernels (:mod:`relattn.backends._relative`), on a GPU:
``pallas``   the terms no library kernel has (Transformer-XL's ``(q + v)·Kʳ[δ]``,
             DeBERTa's ``k·Qʳ[δ]``, with per-distance biases and the causal mask)
             formed inside the tiles, ``O(L)`` memory, forward and backward
``fused``    the same kernel given the relative terms as an ``(Lq, Lk)`` bias and
             the masks as a mask, while that fits the budget
``dense``    relattn's array-API path with the whole ``(Lq, Lk)`` scores, while
             its peak (:func:`dense_peak_bytes`) fits the budget
``fold``     the block fold (:mod:`relattn.fold`), ``O(L)`` memory, block sizes
             from the device (:data:`BLOCK_SIZES`)
============ ===================================================================

The budget is :attr:`relattn.config.max_score_bytes
<relattn._config.Settings.max_score_bytes>`, by default from the device
(:func:`device_budget`). :func:`explain` tells which path a call takes and why.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from ._checks import itemsize
from ._config import Settings, config
from ._namespace import device_of
from .backends import Backend
from .problem import Problem

__all__ = [
    "BLOCK_SIZES",
    "CPU_BUDGET",
    "Explaining",
    "Plan",
    "Planned",
    "block_sizes",
    "choose",
    "dense_budget",
    "dense_peak_bytes",
    "device_budget",
    "device_kind",
    "explain",
    "plan_for",
]

#: The dense path's budget on a CPU: the bytes its temporaries may take at their peak.
#: 64 MiB keeps the crossover measured on a 2-core CPU (causal Transformer-XL, H = 8,
#: float32, ``asv_bench/long_sequences.py speed``): dense at L = 512 (8 MiB of scores,
#: a peak of five such arrays), blockwise from L = 1024, where the fold is the faster on
#: NumPy, PyTorch and JAX.
CPU_BUDGET = 1 << 26
#: Query and key block sizes of the automatic fold per device kind. On a CPU query blocks
#: half as long as key blocks: a block pair's position term has ``bq + bk - 1`` columns,
#: so it costs ``(bq + bk - 1) / bk`` times the content term. On a GPU (an H200, bf16,
#: B = 2, H = 16, d = 64) ``(1024, 2048)`` ran 3.5–5.6 times faster than ``(256, 512)``
#: on every backend: the fold's Python loop is launch-bound there.
BLOCK_SIZES = {"cpu": (256, 512), "gpu": (1024, 2048)}
#: On a CPU, with ``relattn.config.compile=None``, a kernel that compiles on its first
#: call of a shape (FlexAttention: 9–12 s on a 2-core CPU, cold) is taken from the
#: :data:`CPU_COMPILE_AFTER`-th call of one signature on (a loop that repeats the shape),
#: where the scores have at least :data:`CPU_COMPILE_ELEMENTS` elements and a mask
#: leaves blocks out (causal, segments, ``mask_mod``). Measured on an idle 2-core
#: CPU, B = 1, H = 8, d = 64, float32, compiled FlexAttention ÷ the fold: causal ALiBi
#: 0.44 at L = 1024 and 0.45 at 4096 (0.30 against 0.66 s), four packed documents 0.32
#: and 0.24; a T5 bias over every distance with no mask 1.18 and 1.0–2.1, so it is not
#: taken there. At L = 4096 the compile is repaid after about 30 calls, at L = 1024
#: after about 400: the threshold is 2^26 elements (H = 8, L ≈ 2900).
CPU_COMPILE_AFTER = 16
CPU_COMPILE_ELEMENTS = 1 << 26
#: Fraction of a GPU's free memory the dense path may take.
GPU_BUDGET_FRACTION = 0.25


def device_kind(device: Any, backend: Backend) -> str:
    """``"cpu"`` or ``"gpu"`` (CUDA, ROCm, any accelerator) for an array's ``device``."""
    kind = getattr(device, "type", None) or getattr(device, "platform", None)
    if kind is None:
        kind = "gpu" if backend.name == "cupy" else "cpu"
    return "cpu" if kind == "cpu" else "gpu"


def device_budget(kind: str, device: Any, backend: Backend) -> int:
    """The dense path's default budget: :data:`CPU_BUDGET` on a CPU; on a GPU a quarter
    of its free memory (``torch.cuda.mem_get_info``, JAX's ``memory_stats``, CuPy's
    ``mem_info``), never the CPU's figure."""
    if kind == "cpu":
        return CPU_BUDGET
    free = backend.free_memory(device)
    if free is None:
        return CPU_BUDGET
    return max(CPU_BUDGET, int(free * GPU_BUDGET_FRACTION))


def dense_budget(device: Any, backend: Backend, settings: Settings | None = None) -> int:
    """The dense path's budget for a call on ``device``: ``max_score_bytes`` of
    ``settings`` (default: :data:`relattn.config`'s) where set, else the device's
    (:func:`device_budget`)."""
    settings = config.settings if settings is None else settings
    return settings.max_score_bytes or device_budget(device_kind(device, backend), device, backend)


def block_sizes(kind: str) -> tuple[int, int]:
    """The automatic fold's ``(query block, key block)`` on a device kind."""
    return BLOCK_SIZES.get(kind, BLOCK_SIZES["gpu"])


def _score_bytes(p: Problem) -> int:
    return math.prod(p.lead) * p.lq * p.lk * itemsize(p.xp, p.dtype)


def dense_peak_bytes(p: Problem) -> int:
    """The dense path's temporaries at their peak, in bytes: score-sized arrays times
    their count.

    Three for plain attention (the scores, their exponentials, the weights), two
    more per table term (``q·Rᵀ`` over the relative layout and its shift), one for
    a per-distance bias or the grid terms expanded to ``(Lq, Lk)``, two for a value table (the
    weights spread over the relative layout, and its product); with explicit
    positions a value table's row per pair multiplies its share by ``d_v``.
    Measured with tracemalloc on NumPy at L = 1024, H = 2: ``shaw_attention``
    (key and value terms, seven arrays) 58.5 MiB against 56 MiB here;
    ``scaled_dot_product_attention`` with an ``(L, L)`` bias 24.0 MiB against 24.
    """
    count = 3
    count += 2 * (p.key_table is not None) + 2 * (p.query_table is not None)
    count += p.relative_bias is not None or p.grid_rows is not None
    if p.value_table is not None:
        count += 2 * (p.v.shape[-1] if p.has_positions else 1)
    return count * _score_bytes(p)


def _fold_peak_bytes(p: Problem, block: tuple[int, int]) -> int:
    """The fold's temporaries at their peak: one block pair's share of the dense count,
    and the running state (accumulator, output) of every query."""
    bq, bk = min(block[0], max(p.lq, 1)), min(block[1], max(p.lk, 1))
    size = itemsize(p.xp, p.dtype)
    pair = dense_peak_bytes(p) * bq * bk // max(p.lq * p.lk, 1)
    state = 2 * math.prod(p.lead) * p.lq * p.v.shape[-1] * max(size, 4)
    return pair + state


def _kernel_peak_bytes(p: Problem) -> int:
    """A flash kernel's output and its statistics."""
    return math.prod(p.lead) * p.lq * (p.v.shape[-1] + 2) * max(itemsize(p.xp, p.dtype), 4)


@dataclass(frozen=True, eq=False)
class Plan:
    """The path a call signature takes, and why (:func:`explain` returns one).

    Attributes
    ----------
    path : str
        ``"empty"`` (an empty result or no key: zeros), ``"fused"``, ``"flex"``,
        ``"triton"``, ``"pallas"``, ``"dense"`` or ``"fold"`` (the module
        docstring's table).
    block_size : tuple of int or None
        The fold's ``(query block, key block)``; ``None`` off the fold.
    device : str
        ``"cpu"`` or ``"gpu"``.
    library : str
        The array library (``"numpy"``, ``"torch"``, ``"jax"`` …).
    peak_bytes : int
        The path's temporaries at their peak, expected (bytes).
    budget : int
        The dense path's budget the choice was made with (bytes).
    refused : tuple of (str, str)
        Each faster path passed over, with the reason.
    detail : str
        What runs, in words.
    causal_kernel : bool
        ``fused``: the kernel's own causal mask (``is_causal``, aligned to the last
        key), no mask array.
    checked : bool
        ``fused`` with a mask: the kernel adds ``-inf`` where a masked key may hold a
        NaN, so its output is checked and the fold runs where it is not finite.
    run : callable or None
        A kernel's prepared ``run(problem) -> out`` (:class:`relattn.backends.Kernel`).
    compile_step : callable or None
        The fold's block step compiler (``Backend.step_compiler``), where the
        plan compiles the step; ``None``: the fold runs eagerly.
    compile_after : int or None
        Calls of this signature after which a kernel that compiles is worth its
        compile (:data:`CPU_COMPILE_AFTER`), and the plan is chosen again with
        ``compile=True``; ``None``: the plan stays.
    """

    path: str
    block_size: tuple[int, int] | None
    device: str
    library: str
    peak_bytes: int
    budget: int
    refused: tuple[tuple[str, str], ...] = ()
    detail: str = ""
    causal_kernel: bool = False
    checked: bool = False
    run: Callable[[Problem], Any] | None = None
    compile_step: Callable[..., Any] | None = None
    compile_after: int | None = None

    def __str__(self) -> str:
        mib = 1 << 20
        lines = [
            f"path: {self.path} ({self.detail})",
            f"device: {self.device} ({self.library})",
            f"expected peak: {self.peak_bytes / mib:.1f} MiB"
            f" (dense budget {self.budget / mib:.1f} MiB)",
        ]
        if self.block_size is not None:
            lines.append(f"block size: {self.block_size}")
        if self.compile_after is not None:
            lines.append(f"compiles its kernel from call {self.compile_after} of this signature")
        if self.refused:
            lines.append("passed over:")
            lines += [f"  {path}: {why}" for path, why in self.refused]
        return "\n".join(lines)


class _Refused(Exception):
    """A forced path that cannot compute the problem."""


#: Signature -> plan; cleared when full (a loop over many shapes starts again).
_PLANS: dict[Hashable, Plan] = {}
#: Signature -> its calls so far, for plans with ``compile_after``.
_CALLS: dict[Hashable, int] = {}
_MAX_PLANS = 256


def plan_for(p: Problem, backend: Backend, eager: bool, *, count: bool = True) -> Plan:
    """The plan of ``p``'s signature, chosen on its first call and kept.

    ``eager``: the call's values can be read (no JAX tracer, not under
    ``torch.compile``). ``count``: the call counts towards ``compile_after``
    (:func:`explain`'s do not).

    Raises
    ------
    ValueError
        If :attr:`relattn.config.path` forces a path that cannot compute ``p``.
    TypeError
        If ``block_size`` or positions ask for the fold where it cannot run.
    """
    settings = config.settings
    device = device_of(p.q)
    arrays = p.arrays()
    grad = backend.needs_grad(arrays)
    if not eager:
        # A trace (jax.jit, torch.compile) plans once per compilation anyway; a lookup in
        # the store would make torch.compile guard on its contents, and recompile each
        # time another signature is planned.
        return choose(p, backend, device, eager, grad, settings)
    try:
        key: Hashable = (
            id(backend), type(p.q), device, p.dtype, p.lq, p.lk, p.lead, p.causal,
            p.block_size,
            *[None if a is None else a.shape for a in arrays],
            p.score_mod is None, p.mask_mod is None, eager, grad, settings,
        )  # fmt: skip
        found = _PLANS.get(key)
    except TypeError:  # an unhashable device or shape: chosen every time
        return choose(p, backend, device, eager, grad, settings)
    if found is None:
        found = choose(p, backend, device, eager, grad, settings)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
            _CALLS.clear()
        _PLANS[key] = found
    elif found.compile_after is not None and count:
        calls = _CALLS[key] = _CALLS.get(key, 1) + 1
        if calls >= found.compile_after:
            # A loop repeats this signature: its kernel is now worth compiling.
            compiled = dataclasses.replace(settings, compile=True)
            found = _PLANS[key] = choose(p, backend, device, eager, grad, compiled)
    return found


def choose(
    p: Problem,
    backend: Backend,
    device: Any,
    eager: bool,
    grad: bool,
    settings: Settings,
    *,
    excluded: tuple[str, ...] = (),
) -> Plan:
    """The plan for ``p``: the table of the module docstring, in order. ``excluded``:
    paths not to take (the fallback of a checked kernel)."""
    kind = device_kind(device, backend)
    budget = dense_budget(device, backend, settings)
    forced = settings.path
    refused: list[tuple[str, str]] = []
    blockable = backend.takes_blockwise(p.q)

    compile_after = None

    def plan(path: str, block: Any, peak: int, detail: str, **extra: Any) -> Plan:
        return Plan(path, block, kind, backend.name, peak, budget, tuple(refused), detail,
                    compile_after=compile_after, **extra)  # fmt: skip

    if p.block_size is not None and not blockable:
        raise TypeError(
            f"block_size: the blockwise path does not run on {type(p.q).__name__} arrays;"
            f" pass block_size=None, got {p.block_size}"
        )
    if p.programmable and not blockable:
        raise TypeError(
            "positions, segment_ids, score_mod and mask_mod are evaluated by the block fold,"
            f" which does not run on {type(p.q).__name__} arrays; pass plain arrays"
        )

    def fold(block: tuple[int, int], detail: str) -> Plan:
        # The step compiled (torch) where compiling pays: GPUs, or a caller's compile=True.
        compiles = settings.compile if settings.compile is not None else kind != "cpu"
        if compiles and eager and backend.step_compiler is not None:
            step = backend.step_compiler()
            detail += ", each block step compiled"
            return plan("fold", block, _fold_peak_bytes(p, block), detail, compile_step=step)
        return plan("fold", block, _fold_peak_bytes(p, block), detail)

    def take(path: str, why: str | None) -> bool:
        """Whether ``path`` is taken: ``why`` (its refusal) is None and nothing forces
        another; a forced path that refuses raises."""
        if path in excluded:
            why = why or "its output was not finite (a NaN or inf key met its mask)"
        elif forced is not None and forced != path:
            why = why or f"relattn.config.path forces {forced!r}"
        if why is None:
            return True
        if forced == path and path not in excluded:
            raise ValueError(f"relattn.config.path={path!r} cannot compute this call: {why}")
        refused.append((path, why))
        return False

    offered = ("fused",) * (backend.fused_attention is not None)
    offered += (*(kernel.name for kernel in backend.kernels), "dense", "fold")
    if forced is not None and forced not in offered:
        raise ValueError(
            f"relattn.config.path={forced!r} cannot compute this call: {backend.name} offers "
            f"the paths {offered}"
        )
    zero_d = p.q.shape[-1] == 0 and not p.programmable  # scores of zeros: no fold needed
    if p.block_size is not None and not zero_d:
        # The caller's blocks: the fold, whatever else could run.
        if forced not in (None, "fold"):
            take(forced, "block_size asks for the block fold")
        for path in offered[:-1]:
            refused.append((path, f"block_size={p.block_size} asks for the block fold"))
        return fold(p.block_size, "the block fold with the caller's block_size")

    offer = backend.fused_attention
    plain = not (p.has_terms or p.value_table is not None or p.programmable)
    flash = plain and p.bias is None and p.mask is None
    causal_kernel = flash and p.causal and p.lq <= p.lk
    kernel_name = backend.kernel_name
    # 1. The library kernel with nothing of (Lq, Lk) to pass (else tried again at 3).
    if (
        flash
        and (not p.causal or causal_kernel)
        and _fused_refusal(p, backend, offer, kernel_name, kind, forced) is None
        and take("fused", None)
    ):
        detail = kernel_name + (", its own causal mask" if causal_kernel else "")
        return plan("fused", None, _kernel_peak_bytes(p), detail, causal_kernel=causal_kernel)
    # 2. Kernels of their own terms (FlexAttention, relattn's Triton and Pallas kernels).
    for kernel in backend.kernels:
        why = kernel.refuse(p)
        if why is None and kernel.gpu_only and kind == "cpu":
            # Interpreted there (nothing compiles), and only where the caller asks.
            if forced != kernel.name:
                why = (
                    "a GPU kernel, which a CPU runs only in its interpreter (slow): taken"
                    f" there where relattn.config.path={kernel.name!r} forces it"
                )
        elif why is None and kernel.compiles and not settings.compile:
            if settings.compile is False:
                why = "it compiles, and relattn.config.compile is False"
            elif kind == "cpu":
                why = (
                    "it compiles on its first call of each shape (about 10 s on a CPU):"
                    " relattn.config.compile=True takes it"
                )
                large = math.prod(p.lead) * p.lq * p.lk >= CPU_COMPILE_ELEMENTS
                # Masks whose blocks FlexAttention skips: causal, documents, mask_mod.
                sparse = p.causal or p.query_segments is not None or p.mask_mod is not None
                if large and eager and sparse:
                    compile_after = CPU_COMPILE_AFTER
        if take(kernel.name, why):
            return plan(kernel.name, None, _kernel_peak_bytes(p), kernel.name,
                        run=kernel.prepare(p))  # fmt: skip
    dense_peak = dense_peak_bytes(p)
    over = None
    if dense_peak > budget:
        mib = 1 << 20
        over = (
            f"its peak, {dense_peak / mib:.1f} MiB, exceeds the dense budget of "
            f"{budget / mib:.1f} MiB (relattn.config.max_score_bytes)"
        )
    # 3. The library kernel given the terms as a bias and the masks as a mask.
    why = _fused_refusal(p, backend, offer, kernel_name, kind, forced) or over
    checked = p.mask is not None or (p.causal and p.lq > 1)
    if why is None and checked and not eager:
        why = "a masked kernel's output is checked for NaN, which a traced call cannot read"
    if take("fused", why):
        detail = f"{kernel_name} with an (Lq, Lk) bias or mask"
        return plan("fused", None, dense_peak, detail, checked=checked)
    # 4. The array-API dense path (the one-block fold where positions, segments or the
    #    caller's functions are evaluated).
    # Over the budget, still dense where the fold cannot run (DTensor).
    why = over if blockable else None
    if why is None and p.programmable:
        why = "positions, segment ids, score_mod and mask_mod are evaluated by the fold"
    if take("dense", why):
        detail = "the whole (Lq, Lk) scores in array-API calls"
        if not blockable:
            detail += f" (the fold does not run on {type(p.q).__name__} arrays)"
        return plan("dense", None, dense_peak, detail)
    if over is None or zero_d:
        return fold((max(p.lq, 1), max(p.lk, 1)), "the block fold in one block")
    return fold(block_sizes(kind), f"the block fold with {kind} block sizes")


#: (library, device kind) -> why its attention kernel is passed over there unless a call
#: forces it: measured slower than relattn's own path (``asv_bench/compare.py --only
#: plans`` measures each plan against the forced paths).
SLOWER_KERNELS = {
    ("jax", "cpu"): (
        "its XLA implementation ran 1.3–1.9 times as long as relattn's dense path on a CPU"
        " (B = 1, H = 8, d = 64, float32, L = 512 and 1024, plain and causal)"
    ),
}


def _fused_refusal(
    p: Problem, backend: Backend, offer: Any, name: str, kind: str, forced: str | None
) -> str | None:
    """Why the library's attention kernel cannot take ``p`` (static facts), or None."""
    if offer is None:
        return f"{backend.name} has no attention kernel relattn lowers to"
    if p.value_table is not None:
        return "a value table (Shaw) is not a term of an attention kernel"
    if p.programmable:
        return "positions, segment ids, score_mod and mask_mod are not terms of " + name
    if min((*p.q.shape, *p.k.shape, *p.v.shape)) <= 0:
        return "an empty axis (d = 0): the kernels' results differ, relattn's path is defined"
    if offer(p.q, p.k, p.v) is None:
        return f"{name} does not take these inputs"
    if forced != "fused":
        return SLOWER_KERNELS.get((backend.name, kind))
    return None


# -------------------------------------------------------------------------------------------
# Which path a call takes
# -------------------------------------------------------------------------------------------
class Planned(Exception):
    """Raised by the core under :func:`explain`, carrying the plan instead of running it."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan.path)
        self.plan = plan


class Explaining:
    """``active`` while :func:`explain` runs: the core plans its call and raises
    :class:`Planned` (a plain attribute: ``torch.compile`` traces it)."""

    active = False


def explain(function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Plan:
    """The path ``function(*args, **kwargs)`` takes, and why the faster ones were refused.

    Checks the call's arguments as the call would and plans it, without computing
    it.

    Parameters
    ----------
    function : callable
        One of relattn's attention functions (:func:`relattn.relative_attention`,
        :func:`relattn.scaled_dot_product_attention`, :func:`relattn.shaw_attention`,
        :func:`relattn.disentangled_attention`), or any function that calls one.
    *args, **kwargs
        The call's arguments.

    Returns
    -------
    Plan
        ``str(plan)`` is a table: the path, the device, the expected peak memory and
        the budget, the block sizes, and each faster path passed over with its
        reason.

    Raises
    ------
    ValueError
        If ``function`` computes without attention (nothing to plan), or as the call
        itself would raise (its arguments are checked).

    See Also
    --------
    relattn.config : The budget and a forced path.

    Examples
    --------
    >>> import numpy as np
    >>> import relattn
    >>> q = k = v = np.zeros((2, 8, 16, 4))
    >>> table = np.zeros((31, 4))  # Transformer-XL, full layout
    >>> plan = relattn.explain(relattn.relative_attention, q, k, v, table)
    >>> plan.path
    'dense'
    >>> print(plan)  # doctest: +ELLIPSIS
    path: dense (the whole (Lq, Lk) scores in array-API calls)
    device: cpu (numpy)
    expected peak: 0.2 MiB (dense budget 64.0 MiB)
    passed over:
      fused: numpy has no attention kernel relattn lowers to
    """
    saved, Explaining.active = Explaining.active, True
    try:
        function(*args, **kwargs)
    except Planned as planned:
        return planned.plan
    finally:
        Explaining.active = saved
    raise ValueError(f"{getattr(function, '__name__', function)!r} ran no attention to plan")
