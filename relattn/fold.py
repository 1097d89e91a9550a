"""The block fold: blockwise attention with the online softmax, written once.

A query block's output is a fold over key blocks (Milakov & Gimelshein 2018;
Dao et al. 2022): a running row maximum, a running sum of ``exp(score - max)``
and a rescaled accumulator (:class:`BlockState`), so that memory is
``O(Lq·d + bq·bk)`` per head instead of ``O(Lq·Lk)``. :func:`fold_keys` is the
fold itself: the state start, the causal skip, the block step and the finish.
Four drivers run it, differing only in the primitives a backend supplies
(:class:`relattn.backends.Backend`: ``fori_loop``, ``cond``, ``map``,
``dynamic_slice``, ``checkpoint``, ``align``, ``chunk_pairs``):

- :func:`blockwise` with Python loops over static blocks (every eager library);
- :func:`blockwise` with the library's own traced loops (JAX: ``lax.map`` over
  query blocks, ``lax.fori_loop`` over key blocks, ``lax.cond`` for the causal
  skip), so that a jit compiles one block step;
- :func:`blockwise` over the chunks of a chunked library (Dask,
  ``Backend.chunk_pairs``): each (query chunk, key chunk) pair is one task that
  runs the Python loops on the chunks' own arrays, and the pairs' states are
  merged per query chunk, so that the graph grows with the chunk pairs;
- the ring of :func:`relattn.ring_attention`, whose key blocks arrive from the
  next device instead of from a slice.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import array_api_extra as xpx

from ._checks import index_dtype, itemsize
from ._memo import constant
from ._namespace import device_of, namespace
from .backends import backend_for
from .problem import ARRAYS, Problem
from .shift import unshift
from .terms import (
    Block,
    block_positions,
    grid_term,
    matmul_transposed,
    relative_term,
    relative_term_at,
    value_rows_at,
    value_slice,
    visible_mask,
)

__all__ = [
    "BlockState",
    "KeyBlock",
    "all_finite",
    "block_finish",
    "block_merge",
    "block_start",
    "block_step",
    "blockwise",
    "dense_in_query_blocks",
    "fold_keys",
    "is_finite",
    "key_slice",
    "pair_scores",
    "query_rows",
    "rows_of",
    "static_slice",
]


class BlockState(NamedTuple):
    """The unnormalised statistics of the online softmax for a block of queries.

    Parameters
    ----------
    accumulator : array of shape (..., bq, d_v)
        ``Σ_j exp(s_ij - peak_i) (v_j + Vʳ[m(i, j)])`` over the keys seen.
    peak : array of shape (..., bq, 1)
        The largest score seen per row (``-inf`` while every key seen is
        masked).
    total : array of shape (..., bq, 1)
        ``Σ_j exp(s_ij - peak_i)``.

    See Also
    --------
    attention_block : Fold a key block into a state.
    merge_block_states : Combine two states.
    finish_block_state : The output of a state.

    Notes
    -----
    Milakov & Gimelshein 2018; Dao et al. 2022, algorithm 1: the statistics
    ``(O, m, ℓ)`` kept per query block.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import attention_block
    >>> state = attention_block(xp.zeros((1, 2)), xp.zeros((3, 2)), xp.ones((3, 1)),
    ...                         query_start=0, key_start=0, query_length=1, key_length=3)
    >>> state.total          # three keys, equal scores: exp(0) each
    array([[3.]])
    """

    accumulator: Any
    peak: Any
    total: Any


def _finite_or_zero(peak: Any, xp: Any) -> Any:
    # A row whose keys are all masked so far has peak -inf: shift it by 0, so that
    # exp(-inf - 0) = 0 and no inf - inf appears.
    return xp.where(xp.isfinite(peak), peak, xp.zeros_like(peak))


def accumulator_dtype(dtype: Any, xp: Any) -> Any:
    """float32 for half-precision inputs (float16, bfloat16), else the inputs' dtype."""
    return xp.float32 if itemsize(xp, dtype) < 4 else dtype


def block_start(shape: tuple[int, ...], dtype: Any, device: Any, xp: Any) -> BlockState:
    """The state before any key block: zero accumulator ``shape``, peak ``-inf``, total 0."""
    rows = (*shape[:-1], 1)
    return BlockState(
        xp.zeros(shape, dtype=dtype, device=device),
        xp.full(rows, -math.inf, dtype=dtype, device=device),
        xp.zeros(rows, dtype=dtype, device=device),
    )


def block_step(
    state: BlockState,
    scores: Any,
    v: Any,
    xp: Any,
    *,
    value_table: Any = None,
    value_rows: Any = None,
    visible: Any = None,
    branch: bool = False,
) -> BlockState:
    """Fold one key block into ``state``.

    ``scores (..., bq, bk)`` are the block's finished scores, ``-inf`` where a
    key is masked; ``v (..., bk, d_v)`` its values; ``value_table
    (..., w, d_v)`` the block's slice of a value table (``w <= bq + bk - 1``
    columns of its relative layout), or ``value_rows (..., bq, bk, d_v)`` its
    row for each pair (explicit positions), or neither. ``visible (..., bq,
    bk)``: the pairs that may attend (``None``: all); the values of keys that
    no query of the block may see are left out, whatever they hold (NaN in an
    unfilled cache slot), by :func:`clean_unless_finite` (``branch``: its traced
    branch is allowed). Scores and values are promoted to the state's dtype
    (float32 accumulators for half-precision inputs).
    """
    dtype = state.accumulator.dtype
    if scores.dtype != dtype:
        scores = xp.astype(scores, dtype)
    # The shift by the peak changes no result (it cancels between the accumulator and the
    # total): no gradient flows through it, as in every flash kernel.
    peak = backend_for(xp).stop_gradient(
        xp.maximum(state.peak, xp.max(scores, axis=-1, keepdims=True))
    )
    safe = _finite_or_zero(peak, xp)
    weights = xp.exp(scores - safe)
    rescale = xp.exp(state.peak - safe)

    def product(v: Any) -> Any:
        return weights @ (v if v.dtype == dtype else xp.astype(v, dtype))

    def checked() -> tuple[Any, Any]:
        update = product(v)
        return update, update  # the product is its own probe

    if visible is None:
        update = product(v)
    else:
        # A non-finite value makes its whole feature column of P v non-finite (0 · NaN
        # included): only then are the values that no query sees selected out and the
        # product taken again.
        update = clean_unless_finite(
            checked,
            lambda: product(select_visible_keys(v, visible, xp)),
            (v,),
            visible,
            xp,
            branch=branch,
        )
    if value_table is not None:
        spread = unshift(weights, xp)[..., : value_table.shape[-2]]
        table = value_table if value_table.dtype == dtype else xp.astype(value_table, dtype)
        update = update + spread @ table
    if value_rows is not None:
        rows = value_rows if value_rows.dtype == dtype else xp.astype(value_rows, dtype)
        update = update + xp.sum(weights[..., None] * rows, axis=-2)
    total = state.total * rescale + xp.sum(weights, axis=-1, keepdims=True)
    return BlockState(state.accumulator * rescale + update, peak, total)


def clean_unless_finite(
    first: Callable[[], tuple[Any, Any]],
    clean: Callable[[], Any],
    inputs: tuple[Any, ...],
    visible: Any,
    xp: Any,
    *,
    branch: bool = False,
) -> Any:
    """``first() = (result, probe)``'s result where no NaN from a masked slot can be in it,
    else ``clean()``: the same computation with the keys or values that no query sees
    (``visible (..., bq, bk)``) selected out (:func:`select_visible_keys`), whatever
    those hold.

    Where some query sees every key of the block, ``first()`` is the result. Otherwise,
    on values at hand, ``first()`` runs and ``clean()`` only if its ``probe`` is not all
    finite: a NaN or inf in a key makes its column of ``q kᵀ`` non-finite, and in a value
    its feature column of ``P v`` (``0 · NaN`` is NaN), so ``bq × bk`` or ``bq × d_v``
    cells tell whether a pass over the block's ``bk × d`` keys or values is needed.
    Traced, with ``branch`` and the backend's ``cond`` (``jax.jit``, ``jax.grad``), the
    branch is chosen on ``inputs`` (the block's keys or values) and both computations
    sit inside it, so that a gradient never passes through the unclean one (its
    ``0 · NaN`` would reach it). A branch on values reduces over every batch row and
    head: a collective where those are sharded, which the fold already makes for data
    masks (positions, segments, ``mask_mod``) and a plain ``mask`` must not, so its
    callers pass ``branch`` for those only. Traced otherwise (``torch.compile``, a plain
    ``mask``): ``clean()``. A NaN in an unseen slot reaches neither the output nor a
    gradient.
    """
    backend = backend_for(xp)
    every_key_seen = xp.all(xp.any(visible, axis=-2)) if visible.ndim >= 2 else xp.all(visible)
    if backend.has_values(inputs[0]):
        if bool(every_key_seen):
            return first()[0]
        with backend.quiet():
            result, probe = first()
            probes = probe if isinstance(probe, tuple) else (probe,)
            if all(is_finite(x, xp) for x in probes):
                return result
        return clean()
    cond = backend.cond
    if cond is None or not branch:
        return clean()

    def unless_finite(_: Any) -> Any:
        finite = all_finite(inputs[0], xp)
        for x in inputs[1:]:
            finite = finite & all_finite(x, xp)
        return cond(finite, lambda _: first()[0], lambda _: clean(), None)

    return cond(every_key_seen, lambda _: first()[0], unless_finite, None)


def all_finite(x: Any, xp: Any) -> Any:
    """Whether ``x`` holds no NaN or inf, as a 0-d boolean: its sum is finite (a reduction
    that writes nothing; an overflowing sum of finite values says False, which costs a
    clean pass, never a wrong result). :func:`is_finite` where ``x`` has values."""
    return xp.isfinite(_total(x, xp))


def is_finite(x: Any, xp: Any) -> bool:
    """:func:`all_finite` read now, as a Python bool, on an array with values: one reduction
    and its read (``isfinite`` of a 0-d array is more operations than the sum itself on
    libraries that run one at a time), outside any gradient."""
    return math.isfinite(float(_total(backend_for(xp).stop_gradient(x), xp)))


def _total(x: Any, xp: Any) -> Any:
    """The sum of ``x``, accumulated in float32 at least (no ``dtype`` argument where that is
    ``x``'s own: PyTorch's reduction is then a call shorter)."""
    dtype = accumulator_dtype(x.dtype, xp)
    return xp.sum(x) if dtype == x.dtype else xp.sum(x, dtype=dtype)


def select_visible_keys(v: Any, visible: Any, xp: Any) -> Any:
    """``v (..., Lk, d)`` (keys or values) with the rows of keys that no query may see
    (``visible (..., Lq, Lk)``) set to 0: selected out, so that a NaN or inf there meets
    no product (``0 · NaN``, ``inf - inf``)."""
    seen = xp.any(visible, axis=-2) if visible.ndim >= 2 else visible
    eager = backend_for(xp).has_values(v)
    zero = constant(xp, eager, 0.0, v.dtype, device_of(v))
    return xp.where(seen[..., :, None], v, zero)


def block_merge(a: BlockState, b: BlockState, xp: Any) -> BlockState:
    """Two states of the same queries over disjoint key sets, as one state.

    Rows that no key of either set reaches keep a zero accumulator and total.
    """
    peak = xp.maximum(a.peak, b.peak)
    safe = _finite_or_zero(peak, xp)
    scale_a, scale_b = xp.exp(a.peak - safe), xp.exp(b.peak - safe)
    return BlockState(
        a.accumulator * scale_a + b.accumulator * scale_b,
        peak,
        a.total * scale_a + b.total * scale_b,
    )


def block_finish(state: BlockState, dtype: Any, xp: Any) -> Any:
    """The attention output ``accumulator / total``; rows with no key stay exactly 0."""
    total = state.total
    out = state.accumulator / xp.where(total > 0, total, xp.ones_like(total))
    return out if out.dtype == dtype else xp.astype(out, dtype)


# -------------------------------------------------------------------------------------------
# One block pair
# -------------------------------------------------------------------------------------------
def pair_scores(
    p: Problem,
    rows: Problem,
    kb: KeyBlock,
    block: Block,
    at: Any,
    visible: Any,
    *,
    unseen_keys: bool = False,
    branch: bool = False,
) -> Any:
    """The finished scores of one block pair: content, relative terms, bias, the caller's
    ``score_mod``; ``-inf`` where ``visible`` (:func:`pair_visible`) is False.

    ``rows`` holds the query block's slices, ``kb`` the key block's; ``block = (i0, bq,
    j0, bk)`` their offsets (static or traced); ``at`` the block's positions
    (:func:`relattn.terms.block_positions`). ``unseen_keys``: the keys that no query of
    the block sees are set to 0 before any product (masks from data: an unfilled cache
    slot's NaN meets no ``q·k``; ``branch``: see :func:`clean_unless_finite`).
    """
    xp = p.xp
    if visible is None or not unseen_keys:
        return _pair_scores(p, rows, kb.k, kb.ks, kb.bias, block, at, visible)[0]

    def clean() -> Any:
        # Keys that no query of the block may see, whatever they hold, meet no product:
        # their NaN would reach q's gradient as 0 · NaN.
        k = select_visible_keys(kb.k, visible, xp)
        ks = None if kb.ks is None else select_visible_keys(kb.ks, visible, xp)
        return _pair_scores(p, rows, k, ks, kb.bias, block, at, visible)[0]

    return clean_unless_finite(
        lambda: _pair_scores(p, rows, kb.k, kb.ks, kb.bias, block, at, visible),
        clean,
        (kb.k,) if kb.ks is None else (kb.k, kb.ks),
        visible,
        xp,
        branch=branch,
    )


def _pair_scores(
    p: Problem, rows: Problem, k: Any, ks: Any, bias: Any, block: Block, at: Any, visible: Any
) -> tuple[Any, Any]:
    """:func:`pair_scores` with the given keys, and the content product ``q kᵀ``."""
    xp = p.xp
    content = s = matmul_transposed(rows.q, k, xp)
    if p.has_positions:
        term = relative_term_at(p, rows.qp, ks, at[1] - at[0])
    else:
        # The absent δ > 0 cells of a causal term are 0 here: the mask selects them out.
        term = relative_term(p, rows.qp, ks, block, fill=0.0)
    if term is not None:
        s = s + term
    grid = grid_term(p, rows, block)
    if grid is not None:
        s = s + grid
    if bias is not None:
        s = s + bias
    if p.score_mod is not None:
        s = _score_mod(p, s, at)
    if visible is not None:
        # Selected, not added: a NaN or inf in a masked score is gone.
        eager = backend_for(xp).has_values(s)
        lowest = constant(xp, eager, -math.inf, s.dtype, device_of(s))
        s = xp.where(visible, s, lowest)
    return s, content


def pair_visible(
    p: Problem, rows: Problem, kb: KeyBlock, block: Block, at: Any, *, key_limit: Any = None
) -> Any:
    """Where the block's queries may attend its keys: ``mask``, ``causal`` (``δ <= 0``),
    ``segment_ids``, ``mask_mod`` and keys before ``key_limit`` (the padding of a traced
    loop); ``None`` where every pair may."""
    device = device_of(rows.q)
    contiguous = not p.has_positions
    visible = visible_mask(p, block, device, causal=p.causal and contiguous, key_limit=key_limit)
    parts = [visible, kb.mask]
    if p.causal and not contiguous:
        parts.append(at[1] <= at[0])
    if p.query_segments is not None:
        parts.append(rows.query_segments[..., :, None] == kb.segments[..., None, :])
    if p.mask_mod is not None:
        parts.append(_mask_mod(p, at))
    out = None
    for part in parts:
        if part is not None:
            out = part if out is None else out & part
    return out


def _mod_indices(p: Problem, device: Any) -> tuple[Any, Any]:
    """``batch`` and ``head`` indices that broadcast against the scores ``(B, H, bq, bk)``
    (0 where the scores have no such axis)."""
    xp = p.xp
    lead = p.lead
    zero = xp.zeros((), dtype=index_dtype(xp, device), device=device)
    if len(lead) == 0:
        return zero, zero
    if len(lead) == 1:
        return zero, xp.reshape(xp.arange(lead[0], device=device), (lead[0], 1, 1))
    b, h = lead
    return (
        xp.reshape(xp.arange(b, device=device), (b, 1, 1, 1)),
        xp.reshape(xp.arange(h, device=device), (1, h, 1, 1)),
    )


def _score_mod(p: Problem, s: Any, at: Any) -> Any:
    xp = p.xp
    batch, head = _mod_indices(p, device_of(s))
    assert p.score_mod is not None
    out = p.score_mod(s, batch, head, at[0], at[1])
    if not hasattr(out, "shape") or not hasattr(out, "dtype"):
        raise TypeError(f"score_mod must return an array, got {type(out).__name__}")
    if tuple(out.shape) != tuple(s.shape):
        try:
            out = xp.broadcast_to(out, s.shape)
        except (ValueError, RuntimeError, TypeError):
            raise ValueError(
                f"score_mod must return the block's scores' shape {tuple(s.shape)}, "
                f"got {tuple(out.shape)}"
            ) from None
    return out if out.dtype == s.dtype else xp.astype(out, s.dtype)


def _mask_mod(p: Problem, at: Any) -> Any:
    xp = p.xp
    batch, head = _mod_indices(p, device_of(at[0]))
    assert p.mask_mod is not None
    out = p.mask_mod(batch, head, at[0], at[1])
    if not hasattr(out, "dtype") or out.dtype != xp.bool:
        what = getattr(out, "dtype", type(out).__name__)
        raise TypeError(f"mask_mod must return a boolean array (True = may attend), got {what}")
    return out


class KeyBlock(NamedTuple):
    """One key block as the fold sees it: its first key ``j0`` (static or traced), its
    keys, values and scaled keys ``ks``, its columns of the query rows' ``bias`` and
    ``mask``, and its keys' positions and segment ids (``None``: not given)."""

    j0: Any
    k: Any
    v: Any
    ks: Any
    bias: Any
    mask: Any
    positions: Any = None
    segments: Any = None


def key_slice(
    keys: Problem, rows: Problem, j0: Any, start: Any, size: int, cut: Callable[..., Any]
) -> KeyBlock:
    """The key block ``[start, start + size)`` of ``keys``' ``k``, ``v`` and ``ks`` and of
    ``rows``' ``bias`` and ``mask`` columns, whose first key is ``j0`` in the whole problem.

    ``cut(x, start, size, axis)`` slices one array (:func:`static_slice`, or a backend's
    ``dynamic_slice`` for a traced ``start``).
    """
    return KeyBlock(
        j0, cut(keys.k, start, size, -2), cut(keys.v, start, size, -2),
        cut(keys.ks, start, size, -2), cut(rows.bias, start, size, -1),
        cut(rows.mask, start, size, -1), cut(keys.key_positions, start, size, -1),
        cut(keys.key_segments, start, size, -1),
    )  # fmt: skip


def static_slice(x: Any, start: int, size: int, axis: int) -> Any:
    """``x[start : start + size]`` along ``axis`` (-2 or -1) for a static ``start``."""
    return rows_of(x, start, start + size, axis)


def _python_loop(n: int, body: Callable[[int, Any], Any], carry: Any) -> Any:
    for step in range(n):
        carry = body(step, carry)
    return carry


def _python_cond(pred: Any, true_fn: Callable[[Any], Any], false_fn: Any, operand: Any) -> Any:
    return true_fn(operand) if pred else false_fn(operand)


def fold_keys(
    p: Problem,
    rows: Problem,
    i0: Any,
    steps: int,
    key_block: Callable[[int, Any], tuple[KeyBlock, Any]],
    source: Any,
    *,
    loop: Callable[..., Any] | None = None,
    cond: Callable[..., Any] | None = None,
    key_limit: Any = None,
    state: BlockState | None = None,
    compile_step: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
) -> BlockState:
    """The fold: the query rows ``rows`` (from ``i0``) over ``steps`` key blocks.

    ``key_block(step, source) -> (KeyBlock, source)`` gives each step's block
    (a slice, or the block at hand on a ring, ``source`` carrying what moves
    between steps). ``loop(n, body, carry)`` and ``cond(pred, f, g, x)`` are the
    backend's (``None``: Python's). Under a causal mask, a key block wholly
    after the query block is skipped. ``state``: the statistics of the keys
    folded before (default: none). ``compile_step(fn) -> fn``: the block step
    (scores, terms, masks, online-softmax update) as one compiled function
    (:attr:`relattn.plan.Plan.compile_step`); ``None``: run as it is.
    """
    xp, backend = p.xp, backend_for(p.xp)
    loop = loop or _python_loop
    cond = cond or _python_cond
    bq = rows.q.shape[-2]
    offset = p.lk - p.lq
    work = accumulator_dtype(p.dtype, xp)
    device = device_of(rows.q)
    # Inside JAX's shard_map the state must vary over the mesh axes of what is folded in.
    inputs = (*p.arrays(), *rows.arrays())
    if state is None:
        state = block_start((*p.lead, bq, p.v.shape[-1]), work, device, xp)
    state = BlockState(*(backend.align(x, inputs) for x in state))

    # Blocks that no pair of may attend are skipped where that is data (segments, positions,
    # mask_mod) and the backend can branch on it: a traced cond, or values at hand.
    data_masked = p.query_segments is not None or p.mask_mod is not None or p.has_positions
    sparse = data_masked and (backend.cond is not None or backend.has_values(rows.q))

    def body(step: Any, carry: tuple[BlockState, Any]) -> tuple[BlockState, Any]:
        state, source = carry
        kb, source = key_block(step, source)
        block = (i0, bq, kb.j0, kb.k.shape[-2])
        at = None
        if p.programmable:
            at = block_positions(p, rows.query_positions, kb.positions, block, device)
        visible = pair_visible(p, rows, kb, block, at, key_limit=key_limit)
        # Keys masked by data (a mask, segments, mask_mod, positions) may hold anything: the
        # ones no query of the block sees are left out of the products. The contiguous
        # causal structure needs no such pass (its masked scores are selected out).
        unseen = visible if (data_masked or kb.mask is not None) else None

        def fold(state: BlockState) -> BlockState:
            s = pair_scores(p, rows, kb, block, at, visible, unseen_keys=unseen is not None,
                            branch=data_masked)  # fmt: skip
            if at is not None and p.has_positions:
                values = {"value_rows": value_rows_at(p, at[1] - at[0])}
            else:
                values = {"value_table": value_slice(p, block)}
            return block_step(state, s, kb.v, xp, visible=unseen, branch=data_masked, **values)

        if compile_step is not None:
            fold = compile_step(fold)
        if p.causal and not p.has_positions:
            state = cond(kb.j0 <= i0 + bq - 1 + offset, fold, _unchanged, state)
        elif sparse and visible is not None:
            state = cond(xp.any(visible), fold, _unchanged, state)
        else:
            state = fold(state)
        return state, source

    state, _ = loop(steps, body, (state, source))
    return state


def _unchanged(state: BlockState) -> BlockState:
    return state


# -------------------------------------------------------------------------------------------
# Driving the fold over a whole problem
# -------------------------------------------------------------------------------------------
def rows_of(x: Any, start: int, stop: int, axis: int) -> Any:
    """``x[..., start:stop, (:)]`` along ``axis`` (-2 or -1), unless that axis broadcasts."""
    if x is None or x.ndim < -axis or x.shape[axis] == 1:
        return x
    return x[..., start:stop, :] if axis == -2 else x[..., start:stop]


def query_rows(p: Problem, i0: int, i1: int) -> Problem:
    """The problem restricted to the query rows ``[i0, i1)`` (static), keys and tables whole."""
    return dataclasses.replace(
        p,
        q=rows_of(p.q, i0, i1, -2),
        qp=rows_of(p.qp, i0, i1, -2),
        bias=rows_of(p.bias, i0, i1, -2),
        mask=rows_of(p.mask, i0, i1, -2),
        query_positions=rows_of(p.query_positions, i0, i1, -1),
        query_segments=rows_of(p.query_segments, i0, i1, -1),
        grid_rows=rows_of(p.grid_rows, i0, i1, -2),
        grid_cols=rows_of(p.grid_cols, i0, i1, -2),
    )


def blockwise(
    p: Problem,
    block_size: tuple[int, int],
    compile_step: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
) -> Any:
    """The problem's attention, a query block and a key block at a time.

    The backend's traced loops run it where it has them (``Backend.fori_loop``:
    JAX, so that a jit compiles one block step); a chunked library's chunk pairs
    where it offers them (``Backend.chunk_pairs``: Dask, one task per pair of
    chunks, the Python loops inside; not for the caller's ``score_mod`` and
    ``mask_mod``, which take the library's arrays); otherwise Python loops over
    static blocks, each block step compiled where ``compile_step`` is given
    (:func:`fold_keys`).
    Each query block is recomputed in the backward pass (``Backend.checkpoint``)
    instead of keeping its key blocks' probabilities: memory ``O(Lq·d +
    block_size·Lk)`` for gradients too.
    """
    backend = backend_for(p.xp)
    if backend.fori_loop is not None:
        return _traced_blocks(p, block_size)
    if backend.chunk_pairs is not None and p.score_mod is None and p.mask_mod is None:
        # The caller's score_mod and mask_mod take the library's arrays (Dask's, which
        # they may close over), not a task's chunks: those run the eager loops.
        return _chunk_pair_blocks(p, block_size)
    return _static_blocks(p, block_size, recompute=True, compile_step=compile_step)


#: Scores computed at once by the dense path of a library that runs one operation at a
#: time: a block of queries against every key (float32: 64 MiB).
DENSE_CHUNK_ELEMENTS = 1 << 24


def dense_in_query_blocks(p: Problem) -> Any:
    """The dense path a block of queries at a time, every key at once.

    For libraries that run one operation at a time (``Backend.query_chunks``):
    the same work as one ``(Lq, Lk)`` softmax, but the relative terms'
    ``(Lq, W)`` intermediates and the scores exist for one block of queries
    only, and the causal queries read only the keys they see.
    """
    return _static_blocks(p, (dense_chunk(p), max(p.lk, 1)), recompute=False)


def dense_chunk(p: Problem) -> int:
    """The query rows of one chunk of :func:`dense_in_query_blocks`."""
    per_query = math.prod(p.lead) * p.lk
    return max(1, min(p.lq, DENSE_CHUNK_ELEMENTS // max(per_query, 1)))


def _static_blocks(
    p: Problem,
    block_size: tuple[int, int],
    *,
    recompute: bool,
    compile_step: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
) -> Any:
    """The eager driver: Python loops over static query and key blocks (the last ones
    shorter); under a causal mask each query block reads the keys it can see only."""
    xp, backend = p.xp, backend_for(p.xp)
    query_block, key_block = block_size
    outputs = []
    for i0 in range(0, p.lq, query_block):
        rows = query_rows(p, i0, min(i0 + query_block, p.lq))

        def run(*arrays: Any, rows: Problem = rows, i0: int = i0) -> Any:
            rows = rows.with_arrays(arrays)
            state = _query_block_state(rows, rows, i0, 0, p.lk, key_block, compile_step)
            return block_finish(state, p.dtype, xp)

        if recompute:
            outputs.append(backend.checkpoint(run, *rows.arrays()))
        else:
            outputs.append(run(*rows.arrays()))
    out = outputs[0] if len(outputs) == 1 else xp.concat(outputs, axis=-2)
    if tuple(out.shape[:-1]) == tuple(p.q.shape[:-1]):
        # Chunked libraries (Dask): the queries' chunks, not the union of theirs and the
        # block boundaries (chunks of 100 in blocks of 256 came out 100, 100, 56, 44, …).
        out = backend.rechunk_like(out, p.q)
    return out


def _query_block_state(
    p: Problem,
    rows: Problem,
    i0: int,
    j0: int,
    j1: int,
    key_block: int,
    compile_step: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
) -> BlockState:
    """The state of the query rows ``rows`` (its first is query ``i0`` of the whole
    problem) over the keys of ``rows``' arrays (its first is key ``j0``, its last key
    ``j1 - 1``), a static key block at a time; under a contiguous causal mask only the
    keys some query of the block may see."""
    last = j1
    if p.causal and not p.has_positions:
        # Key j is visible to some query of the block only if j <= i1 - 1 + Lk - Lq.
        last = max(min(j1, i0 + rows.q.shape[-2] + p.lk - p.lq), j0)
    keys = last - j0

    def key_block_at(step: int, source: None) -> tuple[KeyBlock, None]:
        t = step * key_block
        size = min(key_block, keys - t)
        return key_slice(rows, rows, j0 + t, t, size, static_slice), source

    steps = -(-keys // key_block)
    return fold_keys(p, rows, i0, steps, key_block_at, None, compile_step=compile_step)


#: The trailing axes of each array of a :class:`Problem` for ``Backend.chunk_pairs``:
#: ``"q"`` the query axis, ``"k"`` the key axis, ``"-"`` whole (tables, features).
_CHUNK_AXES = {
    "q": "q-", "k": "k-", "v": "k-", "key_table": "--", "query_table": "--",
    "value_table": "--", "relative_bias": "-", "qp": "q-", "ks": "k-", "bias": "qk",
    "mask": "qk", "query_positions": "q", "key_positions": "k", "query_segments": "q",
    "key_segments": "k", "grid_rows": "q-", "grid_cols": "q-",
}  # fmt: skip


def _chunk_pair_blocks(p: Problem, block_size: tuple[int, int]) -> Any:
    """The chunked driver (``Backend.chunk_pairs``): each (query chunk, key chunk) pair is
    one task that folds the pair's blocks on the chunks' own arrays (:func:`_pair_state`,
    the eager loops with the pair's global offsets), the states of a query chunk's key
    chunks are merged and finished into its output chunk. Under a causal mask the pairs
    wholly after the diagonal have no task."""
    backend = backend_for(p.xp)
    assert backend.chunk_pairs is not None
    arrays = p.arrays()
    # The scale is in q, qp and ks already: a 0-d array there stays out of the tasks.
    blank = dataclasses.replace(p.with_arrays((None,) * len(arrays)), scale=1.0)
    contiguous_causal = p.causal and not p.has_positions
    out = backend.chunk_pairs(
        functools.partial(_pair_state, blank, block_size),
        _merge_states,
        functools.partial(_finish_state, p.dtype),
        arrays,
        tuple(_CHUNK_AXES[name] for name in ARRAYS),
        p.lead,
        functools.partial(_pair_kept, p.lk - p.lq if contiguous_causal else None),
        p.v.shape[-1],
        p.dtype,
    )
    if tuple(out.shape[:-1]) != tuple(p.q.shape[:-1]):
        return out  # q broadcasts: the leading chunks are those of the arrays that span them
    return backend.rechunk_like(out, p.q)  # the features in q's chunks, as the dense path's


def _pair_kept(offset: int | None, rows: tuple[int, int], cols: tuple[int, int]) -> bool:
    """A chunk pair has keys that some query may see: all, but under a contiguous causal
    mask (``offset = Lk - Lq``) the pairs whose first key is after the last query's."""
    return offset is None or cols[0] <= rows[1] - 1 + offset


def _pair_state(
    blank: Problem,
    block_size: tuple[int, int],
    lead_start: tuple[int, ...],
    lead_shape: tuple[int, ...],
    rows: tuple[int, int],
    cols: tuple[int, int],
    *blocks: Any,
) -> BlockState:
    """The state of the query chunk ``rows = (i0, i1)`` over the key chunk ``cols = (j0,
    j1)``: the eager fold on the chunks' arrays ``blocks`` (in :data:`ARRAYS` order, of
    a leading chunk of shape ``lead_shape``), a query block and a key block at a time, at
    their global offsets (the tables are whole). ``lead_start``, where the leading chunk
    lies, changes nothing here: each term is the same for every batch row and head."""
    xp = namespace(q=blocks[0])
    p = dataclasses.replace(
        blank.with_arrays(blocks), xp=xp, dtype=blocks[0].dtype, lead=lead_shape
    )
    (i0, i1), (j0, j1) = rows, cols
    query_block, key_block = block_size
    states = []
    for s in range(0, i1 - i0, query_block):
        block = query_rows(p, s, min(s + query_block, i1 - i0))
        states.append(_query_block_state(p, block, i0 + s, j0, j1, key_block))
    if len(states) == 1:
        return states[0]
    return BlockState(*(xp.concat(parts, axis=-2) for parts in zip(*states, strict=True)))


def _merge_states(states: list[BlockState]) -> BlockState:
    """One state of a query chunk from those of disjoint key chunks."""
    xp = namespace(q=states[0].accumulator)
    return functools.reduce(lambda a, b: block_merge(a, b, xp), states)


def _finish_state(dtype: Any, state: BlockState) -> Any:
    """A query chunk's output from its merged state."""
    return block_finish(state, dtype, namespace(q=state.accumulator))


def _pad(x: Any, axis: int, size: int, xp: Any, value: Any = 0) -> Any:
    """``x`` padded with ``value`` to ``size`` along ``axis``, unless that axis broadcasts."""
    if x is None or x.ndim < -axis or x.shape[axis] in (1, size):
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return xpx.pad(x, widths, constant_values=value, xp=xp)


def _traced_blocks(p: Problem, block_size: tuple[int, int]) -> Any:
    """The traced driver: the backend's ``map`` over query blocks (each checkpointed) and
    ``fori_loop`` over key blocks, with traced offsets. Queries and keys are padded to
    whole blocks; padded keys are masked and padded queries dropped."""
    xp, backend = p.xp, backend_for(p.xp)
    slice_at, map_blocks = backend.dynamic_slice, backend.map
    if slice_at is None or map_blocks is None:
        raise TypeError(f"backend {backend.name}: fori_loop needs dynamic_slice and map too")
    bq, bk = min(block_size[0], p.lq), min(block_size[1], p.lk)
    nq, nk = -(-p.lq // bq), -(-p.lk // bk)
    rows, cols = nq * bq, nk * bk
    bias = _pad(_pad(p.bias, -1, cols, xp), -2, rows, xp)
    padded = dataclasses.replace(
        p,
        q=_pad(p.q, -2, rows, xp), qp=_pad(p.qp, -2, rows, xp), k=_pad(p.k, -2, cols, xp),
        v=_pad(p.v, -2, cols, xp), ks=_pad(p.ks, -2, cols, xp), bias=bias,
        mask=_pad(_pad(p.mask, -1, cols, xp, False), -2, rows, xp, False),
        query_positions=_pad(p.query_positions, -1, rows, xp),
        key_positions=_pad(p.key_positions, -1, cols, xp),
        query_segments=_pad(p.query_segments, -1, rows, xp),
        key_segments=_pad(p.key_segments, -1, cols, xp),
        grid_rows=_pad(p.grid_rows, -2, rows, xp), grid_cols=_pad(p.grid_cols, -2, rows, xp),
    )  # fmt: skip
    key_limit = p.lk if cols != p.lk else None

    def query_block(iq: Any) -> Any:
        i0 = iq * bq
        q_rows = dataclasses.replace(
            padded,
            q=slice_at(padded.q, i0, bq, -2), qp=slice_at(padded.qp, i0, bq, -2),
            bias=slice_at(padded.bias, i0, bq, -2), mask=slice_at(padded.mask, i0, bq, -2),
            query_positions=slice_at(padded.query_positions, i0, bq, -1),
            query_segments=slice_at(padded.query_segments, i0, bq, -1),
            grid_rows=slice_at(padded.grid_rows, i0, bq, -2),
            grid_cols=slice_at(padded.grid_cols, i0, bq, -2),
        )  # fmt: skip

        def key_block_at(step: Any, source: None) -> tuple[KeyBlock, None]:
            j0 = step * bk
            return key_slice(padded, q_rows, j0, j0, bk, slice_at), source

        state = fold_keys(
            padded, q_rows, i0, nk, key_block_at, None, loop=backend.fori_loop,
            cond=backend.cond, key_limit=key_limit,
        )  # fmt: skip
        return block_finish(state, p.dtype, xp)

    def recomputed(iq: Any) -> Any:
        return backend.checkpoint(query_block, iq)

    outputs = map_blocks(recomputed, nq)  # (nq, *lead, bq, d_v)
    d_v = p.v.shape[-1]
    out = xp.reshape(xp.moveaxis(outputs, 0, -3), (*p.lead, rows, d_v))
    return out[..., : p.lq, :]
