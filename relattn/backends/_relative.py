"""relattn's fused relative-position kernels as plan kernels: Triton for PyTorch
(:mod:`relattn.backends._triton`), Pallas for JAX (:mod:`relattn.backends._pallas`).

Each computes the content, content-to-position ``(q + v)·Kʳ[δ]``, position-to-content
``k·Qʳ[δ]``, per-distance ``b[δ]`` and decomposed 2-D (grid) terms inside its tiles
(the block fold's step as one GPU kernel), which no library kernel forms. A plan takes
one on a GPU for a problem with such a term and nothing the kernels lack (a value
table, an ``(Lq, Lk)`` mask or bias, the caller's functions); on a
CPU only when ``relattn.config.path`` forces it, where it runs in the library's
interpreter (slow: for tests). Both take positions as data, segment ids and a key mask
(``(Lk,)`` or ``(..., 1, Lk)``) besides the causal mask, and share the refusals and the
``(B, H)`` layout here.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Callable
from typing import Any

from ._base import Kernel
from ._kernel_limits import MAX_GRID, MAX_HEAD_DIM

__all__ = ["PALLAS", "TRITON", "refusal"]

#: The input dtypes the kernels take (float32 accumulation).
DTYPES = ("float16", "bfloat16", "float32")
#: Triton is installed (looked up once: a plan under torch.compile must not import).
_HAS_TRITON = importlib.util.find_spec("triton") is not None


def refusal(p: Any, library: str) -> str | None:
    """``None`` where relattn's kernel for ``library`` (``"torch"``, ``"jax"``) computes
    the checked problem ``p`` exactly, else why not (static facts only)."""
    kernel = "relattn's Triton kernel" if library == "torch" else "relattn's Pallas kernel"
    arrays = [a for a in p.arrays() if a is not None]
    module = sys.modules.get(library)
    array_type = None if module is None else (
        module.Tensor if library == "torch" else module.Array
    )  # fmt: skip
    if array_type is None or any(not isinstance(a, array_type) for a in arrays):
        return f"the inputs are not {library} arrays"
    if not p.has_terms:
        return "no per-distance term (Kʳ, Qʳ or b): the library's kernels compute the rest"
    if p.value_table is not None:
        return f"a value table (Shaw) adds P·Vʳ to the output, which {kernel} does not form"
    if p.grid_rows is not None and max(p.grid_rows.shape[-1], p.grid_cols.shape[-1]) > MAX_GRID:
        return (
            f"{kernel} holds a key grid of at most {MAX_GRID} × {MAX_GRID}, got"
            f" {p.grid_rows.shape[-1]} × {p.grid_cols.shape[-1]}"
        )
    if p.score_mod is not None or p.mask_mod is not None:
        return "score_mod and mask_mod are the caller's functions, evaluated in the block fold"
    if p.bias is not None:
        return f"an (Lq, Lk) bias is not formed in {kernel}'s tiles"
    if p.mask is not None and not _is_key_mask(p.mask):
        return (
            f"an (Lq, Lk) mask is not formed in {kernel}'s tiles (a key mask, (..., 1, Lk)"
            " or (Lk,), is)"
        )
    d, d_v = p.q.shape[-1], p.v.shape[-1]
    if 0 in (p.lq, p.lk, d, d_v, *p.lead):
        return "an empty axis (Lq, Lk, d, d_v or a leading dim is 0)"
    if max(d, d_v) > MAX_HEAD_DIM:
        return f"{kernel} holds d, d_v <= {MAX_HEAD_DIM} in a tile, got d = {d}, d_v = {d_v}"
    name = str(p.dtype).removeprefix("torch.")
    if name not in DTYPES:
        return f"{kernel} takes {', '.join(DTYPES)}, not {name}"
    if library == "torch":
        from ._torch_types import is_dtensor

        if is_dtensor(*arrays):
            return "a DTensor: the kernel takes plain tensors"
        if any(a.device != p.q.device for a in arrays):
            return "the inputs are on more than one device"
        if p.q.device.type not in ("cpu", "cuda"):
            return f"{kernel} runs on CUDA devices, not {p.q.device.type}"
        if not _HAS_TRITON:
            return "triton is not installed (pip install triton)"
    else:
        # Traced arrays report no device: the program runs on JAX's default backend.
        platforms = {device.platform for a in arrays for device in _devices(a)}
        platforms = platforms or {sys.modules["jax"].default_backend()}
        if not platforms <= {"cpu", "gpu", "cuda", "rocm"}:
            return f"{kernel} is written for GPUs (Triton lowering), not {sorted(platforms)}"
    return None


def _is_key_mask(mask: Any) -> bool:
    """A mask that is the same for every query: ``(Lk,)`` or ``(..., 1, Lk)``."""
    return mask.ndim == 1 or mask.shape[-2] == 1


def _key_mask(mask: Any, xp: Any) -> Any:
    """A key mask ``(..., 1, Lk)`` or ``(Lk,)`` without its query axis: ``(..., Lk)``."""
    if mask is None or mask.ndim == 1:
        return mask
    return xp.reshape(mask, (*mask.shape[:-2], mask.shape[-1]))


def _devices(x: Any) -> Any:
    try:
        return x.devices()
    except Exception:  # a tracer: its devices are its inputs', checked where they have values
        return ()


def _batch_heads(lead: tuple[int, ...]) -> tuple[int, int]:
    """The kernels' ``(B, H)`` for the scores' leading dims ``lead``."""
    if len(lead) >= 2:
        return math.prod(lead[:-1]), lead[-1]
    return 1, (lead[0] if lead else 1)


def _four(x: Any, lead: tuple[int, ...], trailing: int, xp: Any) -> Any:
    """``x (..., *trailing dims)``, leading dims broadcasting to ``lead``, with two leading
    dims: a view (dims of 1 the kernel broadcasts) where ``lead`` has at most two, else
    broadcast and merged into ``(B, H)``."""
    if x is None:
        return None
    tail = tuple(x.shape[x.ndim - trailing :])
    if len(lead) > 2:
        batch, heads = _batch_heads(lead)
        return xp.reshape(xp.broadcast_to(x, (*lead, *tail)), (batch, heads, *tail))
    shape = (1,) * (2 + trailing - x.ndim) + tuple(x.shape)
    return xp.reshape(x, shape)


def _triton() -> Any:
    from . import _triton

    return _triton


def _pallas() -> Any:
    from . import _pallas

    return _pallas


#: The kernels' modules, imported where first used (an ``import`` statement, which
#: torch.compile traces; ``importlib.import_module`` would break its graph).
_KERNELS = {"_triton": _triton, "_pallas": _pallas}


def _prepare(module: str) -> Callable[[Any], Callable[[Any], Any]]:
    def prepare(p: Any) -> Callable[[Any], Any]:
        kernel = _KERNELS[module]().relative_attention_kernel
        lead = tuple(p.lead)

        def run(p: Any) -> Any:
            xp = p.xp
            batch, heads = _batch_heads(lead)

            def rows(x: Any) -> Any:
                x = _four(x, lead, 2, xp)
                return None if x is None else xp.broadcast_to(x, (batch, heads, *x.shape[2:]))

            q, k, v, qp, ks = (rows(x) for x in (p.q, p.k, p.v, p.qp, p.ks))
            out = kernel(
                q, k, v, qp=qp, key_table=_four(p.key_table, lead, 2, xp), ks=ks,
                query_table=_four(p.query_table, lead, 2, xp),
                relative_bias=_four(p.relative_bias, lead, 1, xp),
                query_segments=_four(p.query_segments, lead, 1, xp),
                key_segments=_four(p.key_segments, lead, 1, xp),
                key_mask=_four(_key_mask(p.mask, xp), lead, 1, xp),
                grid_rows=_four(p.grid_rows, lead, 2, xp),
                grid_cols=_four(p.grid_cols, lead, 2, xp),
                grid_width=None if p.grid_cols is None else p.grid_cols.shape[-1],
                query_positions=_four(p.query_positions, lead, 1, xp),
                key_positions=_four(p.key_positions, lead, 1, xp),
                causal=bool(p.causal),
            )  # fmt: skip
            return xp.reshape(out, (*lead, p.lq, p.v.shape[-1]))

        return run

    return prepare


#: relattn's Triton kernel, a plan kernel of the torch backend.
TRITON = Kernel(
    name="triton", refuse=lambda p: refusal(p, "torch"), prepare=_prepare("_triton"),
    compiles=True, gpu_only=True,
)  # fmt: skip
#: relattn's Pallas kernel, a plan kernel of the JAX backend.
PALLAS = Kernel(
    name="pallas", refuse=lambda p: refusal(p, "jax"), prepare=_prepare("_pallas"),
    gpu_only=True,
)  # fmt: skip
