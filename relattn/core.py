"""The relative-attention core: one computation that every attention function runs.

Every scheme in relattn is a set of per-distance terms over the relative layout
(column ``m = δ + Lk - 1`` of the pair ``(i, j)``, ``δ = j - (i + Lk - Lq)``):

.. code-block:: text

    score[i, j] = scale · ( (q_i + u) · k_j                 content, (a) + (c)
                          + (q_i + v) · Kʳ[m(i, j)]          content-to-position
                          +  k_j      · Qʳ[m(i, j)] )        position-to-content
                  + b[m(i, j)] + bias[i, j]                  per-distance and additive biases
    out[i]      = Σ_j α_ij (v_j + Vʳ[m(i, j)])               value term

masked by ``mask``, by ``causal`` and by the causal layout. The public
functions (:func:`relattn.relative_attention`, :func:`relattn.shaw_attention`,
:func:`relattn.disentangled_attention`, :func:`relattn.scaled_dot_product_attention`)
turn their paper's parameters into these terms, check them once
(:func:`relattn.problem.check`) and call :func:`attention` on the
:class:`~relattn.problem.Problem`. It runs it densely (the whole ``(Lq, Lk)``
scores, the backend's fused kernel where one fits) or blockwise (the block
fold of :mod:`relattn.fold`).

Each relative input is in the full layout (width ``Lq + Lk - 1``) or the causal
layout (width ``Lk``, ``δ <= 0`` only, the prefix of the full one). A causal
layout or ``causal=True`` masks ``δ > 0``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ._config import config
from ._memo import constant, memo
from ._namespace import device_of
from .backends import backend_for
from .fold import (
    blockwise,
    clean_unless_finite,
    dense_chunk,
    dense_in_query_blocks,
    is_finite,
    select_visible_keys,
)
from .plan import Explaining, Plan, Planned, choose, device_kind, plan_for
from .problem import Problem
from .shift import unshift
from .terms import grid_term, matmul_transposed, relative_term, visible_mask

__all__ = ["attend_generic", "attention", "softmax"]


# -------------------------------------------------------------------------------------------
# Softmax and plain attention
# -------------------------------------------------------------------------------------------
def softmax(scores: Any, mask: Any, axis: int, xp: Any, *, empty_rows: bool = True) -> Any:
    """Masked softmax over ``axis`` without argument checks; fully masked rows are 0.

    ``empty_rows=False``: the caller knows that every row has a visible key whose score
    is finite (no mask but the causal one with ``Lq <= Lk``, no bias that may hold
    ``-inf``, finite inputs), and the guards for a row with no finite score are left out.
    ``scores`` is released as soon as it has been read: a caller that passes a
    temporary holds at most two score-sized arrays at once here.
    """
    if math.prod(scores.shape) == 0:
        return scores  # nothing to normalise (Dask cannot reduce empty chunks either)
    dtype, device = scores.dtype, device_of(scores)
    backend = backend_for(xp)
    eager = backend.has_values(scores)

    def fill(value: float) -> Any:
        return constant(xp, eager, value, dtype, device)

    if mask is not None:
        # -inf, not the dtype's lowest value: exp gives exactly 0 for masked keys,
        # with no overflow in ``scores - peak`` even in float16. Selected, not added:
        # whatever a masked score holds (inf, NaN) is gone.
        scores = xp.where(mask, scores, fill(-math.inf))
    # The shift cancels in the quotient: no gradient flows through the peak (and no
    # operation below keeps a constant for the backward pass).
    peak = backend.stop_gradient(xp.max(scores, axis=axis, keepdims=True))
    if empty_rows:
        # A row with no finite score (fully masked, or a -inf bias) has the peak -inf, and
        # ``scores - peak`` would be inf - inf: raising the peak to the lowest finite value
        # leaves every other row alone and makes that row's weights exp(-inf) = 0.
        peak = xp.maximum(peak, fill(float(xp.finfo(dtype).min)))
    shifted = scores - peak
    del scores
    weights = xp.exp(shifted)
    del shifted
    total = xp.sum(weights, axis=axis, keepdims=True)
    if empty_rows:
        # Each row's total is 0 (no key: all weights 0) or at least 1 (its peak's exp(0)):
        # raised to the smallest normal number, an empty row's is 0 / tiny = 0, never 0/0,
        # and no other row changes. Not max(total, 1), whose gradient splits at a total
        # of 1; a maximum, not a select, which XLA's CPU fuses with the products.
        total = xp.maximum(total, fill(float(xp.finfo(dtype).smallest_normal)))
    return weights / total


def fused_kernel(q: Any, k: Any, v: Any, xp: Any) -> Any:
    """The backend's attention kernel for these inputs, or ``None`` (generic path).

    Empty axes always take the generic path, which gives the empty or zero
    result (relattn's conventions: no key gives a zero row) on every backend.
    """
    offer = backend_for(xp).fused_attention
    if offer is None or min((*q.shape, *k.shape, *v.shape)) <= 0:
        return None
    return offer(q, k, v)


def attend_generic(q: Any, k: Any, v: Any, bias: Any, mask: Any, scale: Any, xp: Any) -> Any:
    """``softmax(q kᵀ · scale + bias) v`` (masked) in array-API calls only, on inputs
    already checked and cast: the reference the backends' fused kernels are tested
    against (``tests/test_fast_paths.py``)."""
    return softmax(scores(q, k, bias, scale, xp), mask, -1, xp) @ v


def scores(q: Any, k: Any, bias: Any, scale: Any, xp: Any) -> Any:
    """``q kᵀ · scale + bias``; scaling ``q``, not the scores, saves a pass over ``(Lq, Lk)``.

    One expression, so that libraries that reuse temporaries (NumPy) add the
    bias in the product's buffer.
    """
    if not (isinstance(scale, float) and scale == 1.0):
        q = q * scale
    if bias is None:
        return matmul_transposed(q, k, xp)
    return matmul_transposed(q, k, xp) + bias


# -------------------------------------------------------------------------------------------
# The core
# -------------------------------------------------------------------------------------------
def attention(p: Problem) -> Any:
    """Relative attention with every term of the module docstring, on a checked problem.

    The path is the problem's :class:`~relattn.plan.Plan`, chosen once per call
    signature (:func:`relattn.plan.plan_for`): the library's kernel, FlexAttention,
    the dense array-API path or the block fold. An eager call on a library with
    ``Backend.staged`` (JAX) first compiles the plan and its computation whole,
    once per problem and shapes. Under :func:`relattn.explain` the plan is raised
    (:class:`~relattn.plan.Planned`) instead of run.
    """
    xp = p.xp
    explaining = Explaining.active
    if p.lq == 0 or p.lk == 0 or 0 in p.lead or p.v.shape[-1] == 0:
        # An empty result, or zero rows where no key is (SPEC §1).
        if explaining:
            raise Planned(_empty_plan(p))
        shape = (*p.lead, p.lq, p.v.shape[-1])
        return xp.zeros(shape, dtype=p.dtype, device=device_of(p.q))
    backend = backend_for(xp)
    staged = backend.staged
    if staged is not None and not explaining:
        arrays = p.arrays()
        blank = _staged_problem(p, arrays, backend)
        if blank is not None:
            # Compiled per problem and settings: a program traced under one
            # relattn.config (path, budget) is not reused under another.
            return staged(_attention_of, (blank, config.settings), arrays)
    # Explained, a staged call is planned as its trace would be: without values.
    eager = not (explaining and staged is not None) and backend.has_values(p.q)
    if p.has_positions and eager and p.score_mod is None and p.mask_mod is None:
        if _default_positions(p, backend):
            # Positions that are today's (up to a shift per row): the shift path.
            p = dataclasses.replace(p, query_positions=None, key_positions=None)
    plan = plan_for(p, backend, eager, count=not explaining)
    if explaining:
        raise Planned(plan)
    return _run(p, plan, backend)


def _empty_plan(p: Problem) -> Plan:
    backend = backend_for(p.xp)
    kind = device_kind(device_of(p.q), backend)
    return Plan("empty", None, kind, backend.name, 0, 0, detail="no query or no key: zeros")


def _fused(p: Problem, plan: Plan, backend: Any) -> Any:
    """The library's attention kernel; a checked one's output where it is finite."""
    kernel = fused_kernel(p.q, p.k, p.v, p.xp)
    if plan.causal_kernel:
        return kernel(bias=None, mask=None, causal=True, scale=1.0)
    out = _kernel(p, kernel)
    if not plan.checked or is_finite(out, p.xp):
        return out
    # A non-finite key or value met the kernel's mask: relattn's own paths, chosen as
    # where there is no kernel.
    return _fallback(p, plan, backend)


def _kernel_path(p: Problem, plan: Plan, backend: Any) -> Any:
    """A kernel of :attr:`Backend.kernels` (FlexAttention); its output where finite
    under a mask of data (a NaN in a masked slot meets the kernel's ``-inf``)."""
    assert plan.run is not None
    out = plan.run(p)
    masked = p.mask is not None or p.query_segments is not None or p.mask_mod is not None
    if not (masked and backend.has_values(out)) or is_finite(out, p.xp):
        return out
    return _fallback(p, plan, backend)


def _fallback(p: Problem, plan: Plan, backend: Any) -> Any:
    settings = dataclasses.replace(config.settings, path=None)
    grad = backend.needs_grad(p.arrays())
    other = choose(p, backend, device_of(p.q), True, grad, settings, excluded=(plan.path,))
    return _run(p, other, backend)


def _fold(p: Problem, plan: Plan, backend: Any) -> Any:
    assert plan.block_size is not None
    return blockwise(p, plan.block_size, plan.compile_step)


def _dense_path(p: Problem, plan: Plan, backend: Any) -> Any:
    """The whole scores in array-API calls (a block of queries at a time on libraries
    that run one operation at a time); masked keys selected out where not finite."""
    xp = p.xp
    mask = _causal(p)
    nonempty = p.q.shape[-1] > 0
    if backend.query_chunks and nonempty and dense_chunk(p) < p.lq:
        if backend.takes_blockwise(p.q):
            return dense_in_query_blocks(p)
    if p.mask is None:
        return _dense(p, mask, backend)
    keys = tuple(x for x in (p.k, p.ks) if x is not None)

    def first() -> tuple[Any, Any]:
        # A NaN key's scores are selected out of the output but not of q's gradient: its
        # sum tells (the scores themselves are released inside the softmax).
        out = _dense(p, mask, backend)
        return out, (out, *keys)

    def clean() -> Any:
        # Keys that no query may see are selected out, whatever they hold (NaN in an
        # unfilled cache slot): neither q kᵀ nor P v (nor a gradient) meets them.
        def visible(x: Any) -> Any:
            return None if x is None else select_visible_keys(x, mask, xp)

        clean = dataclasses.replace(p, k=visible(p.k), v=visible(p.v), ks=visible(p.ks))
        return _dense(clean, mask, backend)

    return clean_unless_finite(first, clean, (p.v, *keys), mask, xp)


#: Path name -> ``run(problem, plan, backend)``; any other path is a kernel of
#: ``Backend.kernels``, which runs its own prepared function (:func:`_kernel_path`).
_PATHS = {"fused": _fused, "dense": _dense_path, "fold": _fold}


def _run(p: Problem, plan: Plan, backend: Any) -> Any:
    return _PATHS.get(plan.path, _kernel_path)(p, plan, backend)


def _staged_problem(p: Problem, arrays: tuple[Any, ...], backend: Any) -> Problem | None:
    """``p`` without its arrays, the key under which ``Backend.staged`` compiles an eager
    call on a library whose users compile (JAX) once per problem and shapes, rather than
    an operation (and a traced loop) at a time; ``None`` for a traced call, or where the
    rest is not hashable (a 0-d array ``scale``, an unhashable ``score_mod``), which then
    runs an operation at a time."""
    if not all(backend.has_values(x) for x in arrays if x is not None):
        return None
    blank = p.with_arrays((None,) * len(arrays))
    try:
        hash(blank)
    except TypeError:
        return None
    return blank


def _attention_of(blank: Problem, settings: Any, *arrays: Any) -> Any:
    """:func:`attention` of ``blank`` given its arrays (for ``Backend.staged``), traced
    under ``settings`` (:data:`relattn.config`'s, which the trace reads)."""
    return attention(blank.with_arrays(arrays))


def _kernel(p: Problem, kernel: Any) -> Any:
    """The call on the backend's fused kernel with the terms as a bias, the masks as a
    mask. Built where it is consumed: no local holds the (Lq, W) buffer of the term."""
    # A causal term filled with -inf beyond δ = 0 is the causal mask itself.
    fills = p.causal and (p.key_table is not None or p.relative_bias is not None)
    mask = p.mask if fills and p.lq <= p.lk else _causal(p)
    return kernel(bias=_position(p, fill=-math.inf if fills else 0.0), mask=mask,
                  causal=False, scale=1.0)  # fmt: skip


def _dense(p: Problem, mask: Any, backend: Any) -> Any:
    """The dense path's output. The scores are a temporary, released inside the softmax:
    at most two score-sized arrays at once."""
    xp, q = p.xp, p.q
    mask, bias = backend.join(mask, q), backend.join(_position(p), q)
    # A row may have no visible key with a finite score only under a mask of the caller's,
    # a bias that may hold -inf, or a causal mask with Lq > Lk (whose first rows see no
    # key); otherwise the causal mask keeps δ = 0 and the softmax needs no empty-row guard.
    empty_rows = (
        p.mask is not None or p.bias is not None or p.relative_bias is not None
        or (p.causal and p.lq > p.lk)
    )  # fmt: skip
    weights = softmax(scores(q, p.k, bias, 1.0, xp), mask, -1, xp, empty_rows=empty_rows)
    out = weights @ p.v
    if p.value_table is not None:
        out = out + value_term(weights, p.value_table, xp)
    return out


def _default_positions(p: Problem, backend: Any) -> bool:
    """Eager explicit positions equal to the contiguous default: query ``i`` at
    ``i + Lk - Lq + c`` and key ``j`` at ``j + c``, ``c`` one offset per row (a prefill at
    ``c``, a left-padded row). ``δ`` is then the default one and the shift path computes
    every term."""
    qpos, kpos = p.query_positions, p.key_positions
    whole = p.q.shape[-2] == p.lq and p.k.shape[-2] == p.lk  # not a block or a shard
    if not (whole and backend.has_values(qpos) and backend.has_values(kpos)):
        return False
    xp = p.xp
    device = device_of(qpos)
    q_start = qpos - xp.astype(xp.arange(p.lq, device=device), qpos.dtype)
    k_start = kpos - xp.astype(xp.arange(p.lk, device=device), kpos.dtype)
    # One start per side, the queries' Lk - Lq after the keys': δ(i, j) = j - (i + Lk - Lq).
    first = k_start[..., :1]
    same = xp.all(k_start == first) and xp.all(q_start - first[..., :1] == p.lk - p.lq)
    return bool(same)


def _causal(p: Problem) -> Any:
    """``p.mask`` with the causal mask (``δ > 0`` blocked) where the problem is causal.

    With ``Lq > Lk`` the first ``Lq - Lk`` queries have no key at all: the mask keeps
    their rows zero.
    """
    if not p.causal:
        return p.mask
    device = device_of(p.q)
    blocked = memo(  # None: all visible
        p.xp, backend_for(p.xp).has_values(p.q), ("causal", p.lq, p.lk, device),
        lambda: visible_mask(p, (0, p.lq, 0, p.lk), device, causal=True),
    )  # fmt: skip
    if blocked is None:
        return p.mask
    return blocked if p.mask is None else p.mask & blocked


def _position(p: Problem, fill: float = 0.0) -> Any:
    """The whole problem's relative terms plus its ``bias`` (any may be absent: ``None``).

    The absent ``δ > 0`` cells of a causal-layout term are 0: the causal mask selects
    them out (an added ``-inf`` would meet a NaN score as NaN)."""
    whole = (0, p.lq, 0, p.lk)
    position = relative_term(p, p.qp, p.ks, whole, fill=fill)
    for term in (grid_term(p, p, whole), p.bias):
        if term is not None:
            position = term if position is None else position + term
    return position


def value_term(weights: Any, value_table: Any, xp: Any) -> Any:
    """``Σ_j α_ij Vʳ[m(i, j)] = rel_unshift(α) Vʳ`` (Shaw et al. 2018, eq. (3)).

    A causal-layout table (width ``Lk``) meets the first ``Lk`` columns of
    ``rel_unshift(α)``: the others belong to ``δ > 0``, whose weights are 0.
    """
    spread = unshift(weights, xp)
    width = value_table.shape[-2]
    if width != spread.shape[-1]:
        spread = spread[..., :width]
    return spread @ value_table
