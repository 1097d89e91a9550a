"""The block fold in public: one block pair of a larger problem, and the online softmax's
merge and finish.

:func:`attention_block` folds one key block into the statistics of one query
block (:class:`BlockState`); :func:`merge_block_states` combines the statistics
of the same queries over disjoint keys, :func:`finish_block_state` turns them
into the output. They are the steps that :func:`relattn.relative_attention`'s
``block_size=`` and :func:`relattn.ring_attention` run (:mod:`relattn.fold`),
for callers who schedule blocks themselves.
"""

from __future__ import annotations

from typing import Any

from . import _checks, problem
from ._namespace import device_of
from ._typing import Array
from .backends import backend_for
from .fold import (
    BlockState,
    KeyBlock,
    accumulator_dtype,
    block_finish,
    block_merge,
    block_start,
    fold_keys,
    key_slice,
    query_rows,
    rows_of,
    static_slice,
)
from .problem import Problem

__all__ = ["BlockState", "attention_block", "finish_block_state", "merge_block_states"]


def attention_block(
    q: Array,
    k: Array,
    v: Array,
    position_table: Array = None,
    *,
    query_start: Any,
    key_start: Any,
    query_length: int,
    key_length: int,
    content_bias: Array = None,
    position_bias: Array = None,
    query_position_table: Array = None,
    value_table: Array = None,
    mask: Array = None,
    bias: Array = None,
    relative_bias: Array = None,
    causal: bool = False,
    scale: Any = None,
    block_size: Any = None,
    positions: Array = None,
    segment_ids: Array = None,
    score_mod: Any = None,
    mask_mod: Any = None,
    state: BlockState | None = None,
) -> BlockState:
    """One query block against one key block of a larger problem: the online softmax's step.

    Parameters
    ----------
    q : array of shape (..., bq, d), real floating
        The queries ``[query_start, query_start + bq)`` of a problem with
        ``query_length`` queries.
    k : array of shape (..., bk, d), real floating
        The keys ``[key_start, key_start + bk)`` of ``key_length`` keys.
    v : array of shape (..., bk, d_v), real floating
        Their values.
    position_table : array of shape (..., W, d), real floating, optional
        The **whole** problem's content-to-position table ``Kʳ``
        (Transformer-XL's projected ``R``) in its relative layout,
        ``W = key_length`` (causal) or ``query_length + key_length - 1``
        (full); the block reads its ``bq + bk - 1`` columns.
    query_start, key_start : int or 0-d integer array
        The block's first query and key; traced integers are allowed (a ring
        step under ``jax.jit``: the table columns are then gathered).
    query_length, key_length : int
        ``Lq`` and ``Lk`` of the whole problem (query ``i`` sits at key
        position ``i + Lk - Lq``).
    content_bias, position_bias : array, real floating, optional
        ``u`` and ``v`` of Transformer-XL, broadcastable to ``q``.
    query_position_table : array of shape (..., W, d), real floating, optional
        The whole problem's position-to-content table ``Qʳ`` (DeBERTa).
    value_table : array of shape (..., W, d_v), real floating, optional
        The whole problem's value table ``Vʳ`` (Shaw et al.).
    mask : array, bool, optional
        ``True`` = may attend, broadcastable to the **block's** scores
        ``(..., bq, bk)``.
    bias : array, real floating, optional
        Added to the scaled scores; broadcastable to the block's scores.
    relative_bias : array of shape (..., W), real floating, optional
        The whole problem's per-distance bias (T5, ALiBi).
    causal : bool, optional
        Mask ``δ > 0`` (implied by a causal-layout table).
    scale : float or 0-d array, optional
        Score scale, ``1/√d`` by default.
    block_size : int or (int, int), optional
        Fold the block in sub-blocks of these sizes (query rows, keys), for
        memory ``O(block_size²)`` instead of ``O(bq·bk)``; default: at once.
    positions, segment_ids, score_mod, mask_mod : optional
        Positions as data, document ids and the caller's score and mask
        functions; see :func:`scaled_dot_product_attention`.
    state : BlockState, optional
        The statistics of the key blocks seen so far for these queries
        (default: none yet).

    Returns
    -------
    BlockState
        ``state`` with this key block folded in: the unnormalised
        ``accumulator (..., bq, d_v)``, the running ``peak (..., bq, 1)`` and
        ``total (..., bq, 1)``, float32 for half-precision inputs.
        :func:`finish_block_state` turns it into the output.

    Raises
    ------
    ValueError
        If shapes do not match (feature sizes, table widths for the whole
        problem, a block outside it, a mask that does not broadcast to the
        block), or ``d = 0`` with the default scale.
    TypeError
        If an input is not a real floating array, ``mask`` is not boolean, or
        the arrays come from different libraries.

    See Also
    --------
    merge_block_states : Combine states of the same queries over other keys.
    finish_block_state : The attention output of a state.
    ring_attention : These blocks on a ring of devices.
    relative_attention : The whole problem at once (its ``block_size=`` runs these steps).

    Notes
    -----
    The online softmax of Milakov & Gimelshein 2018, as blocked by Dao et al.
    2022 (FlashAttention), over relattn's relative terms: the block's position
    scores are the shift of Dai et al. 2019, appendix B, on the table columns
    ``m0 … m0 + bq + bk - 2``, ``m0 = key_start - query_start - (bq - 1) +
    Lq - 1``. A row whose keys are all masked keeps peak ``-inf`` and a zero
    total, and finishes as a zero row.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import attention_block, finish_block_state, merge_block_states
    >>> q = xp.ones((2, 4)); k = xp.ones((4, 4)); v = xp.reshape(xp.arange(8.0), (4, 2))
    >>> first = attention_block(q, k[:2, :], v[:2, :], query_start=2, key_start=0,
    ...                         query_length=4, key_length=4)
    >>> second = attention_block(q, k[2:, :], v[2:, :], query_start=2, key_start=2,
    ...                          query_length=4, key_length=4)
    >>> finish_block_state(merge_block_states(first, second))      # the mean of v's rows
    array([[3., 4.],
           [3., 4.]])
    """
    for name, start in (("query_start", query_start), ("key_start", key_start)):
        if isinstance(start, bool) or not (isinstance(start, int) or hasattr(start, "ndim")):
            raise TypeError(f"{name} must be an integer, got {type(start).__name__}")
    lq = _checks.length("query_length", query_length, minimum=0)
    lk = _checks.length("key_length", key_length, minimum=0)
    p = problem.check(
        q, k, v, position_table=position_table, query_position_table=query_position_table,
        value_table=value_table, content_bias=content_bias, position_bias=position_bias,
        relative_bias=relative_bias, bias=bias, mask=mask, causal=causal, scale=scale,
        block_size=block_size, lengths=(lq, lk), block_scores=True,
        positions=positions, segment_ids=segment_ids, score_mod=score_mod,
        mask_mod=mask_mod,
    )  # fmt: skip
    xp = p.xp
    bq, bk = q.shape[-2], k.shape[-2]
    for name, start, size, total in (
        ("query_start", query_start, bq, lq),
        ("key_start", key_start, bk, lk),
    ):
        if isinstance(start, int) and not 0 <= start <= total - size:
            raise ValueError(
                f"{name} must place the block inside the problem, 0 <= {name} <= {total - size}, "
                f"got {start}"
            )
    shape = (*p.lead, bq, p.v.shape[-1])
    if state is None:
        state = block_start(shape, accumulator_dtype(p.dtype, xp), device_of(p.q), xp)
    else:
        _check_state(state, shape)
    sub_q, sub_k = p.block_size or (max(bq, 1), max(bk, 1))
    cond = backend_for(xp).cond
    states = []
    for r0 in range(0, bq, sub_q):
        r1 = min(r0 + sub_q, bq)
        rows = query_rows(p, r0, r1)

        def key_block_at(step: int, source: None, rows: Problem = rows) -> tuple[KeyBlock, None]:
            a = step * sub_k
            return key_slice(p, rows, key_start + a, a, min(sub_k, bk - a), static_slice), source

        start = BlockState(*(rows_of(x, r0, r1, -2) for x in state))
        states.append(
            fold_keys(
                p, rows, query_start + r0, -(-bk // sub_k), key_block_at, None, cond=cond,
                state=start,
            )
        )  # fmt: skip
    if len(states) == 1:
        return states[0]
    return BlockState(*(xp.concat(parts, axis=-2) for parts in zip(*states, strict=True)))


def _check_state(state: Any, shape: tuple[int, ...]) -> None:
    if not isinstance(state, BlockState):
        raise TypeError(f"state must be a BlockState, got {type(state).__name__}")
    if tuple(state.accumulator.shape) != shape:
        raise ValueError(
            f"state must hold these queries' statistics, accumulator of shape {shape}, "
            f"got {tuple(state.accumulator.shape)}"
        )


def merge_block_states(a: BlockState, b: BlockState) -> BlockState:
    """Combine the statistics of the same queries over two disjoint sets of keys.

    Parameters
    ----------
    a, b : BlockState
        States of :func:`attention_block` for the same queries (equal shapes).

    Returns
    -------
    BlockState
        The state over both key sets: ``peak = max(peak_a, peak_b)``, the
        accumulators and totals rescaled to it and added. Rows that no key of
        either set reaches stay at zero.

    Raises
    ------
    TypeError
        If an argument is not a BlockState, or the states come from different
        libraries.
    ValueError
        If the shapes differ.

    See Also
    --------
    attention_block : The state of one block pair.
    finish_block_state : The output of a state.

    Notes
    -----
    Milakov & Gimelshein 2018, the merge of two partial softmax
    normalisations; Liu et al. 2023 combine ring steps with it.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import attention_block, finish_block_state, merge_block_states
    >>> q = k = xp.ones((1, 2)); v1, v2 = xp.asarray([[0.0]]), xp.asarray([[2.0]])
    >>> a = attention_block(q, k, v1, query_start=0, key_start=0, query_length=1, key_length=2)
    >>> b = attention_block(q, k, v2, query_start=0, key_start=1, query_length=1, key_length=2)
    >>> finish_block_state(merge_block_states(a, b))
    array([[1.]])
    """
    for name, s in (("a", a), ("b", b)):
        if not isinstance(s, BlockState):
            raise TypeError(f"{name} must be a BlockState, got {type(s).__name__}")
    xp = _checks.namespace(a=a.accumulator, b=b.accumulator)
    if tuple(a.accumulator.shape) != tuple(b.accumulator.shape):
        raise ValueError(
            "a and b must hold the same queries' statistics, got accumulators of shapes "
            f"{tuple(a.accumulator.shape)} and {tuple(b.accumulator.shape)}"
        )
    return block_merge(a, b, xp)


def finish_block_state(state: BlockState, *, dtype: Any = None) -> Array:
    """The attention output ``accumulator / total`` of a state; rows with no key are 0.

    Parameters
    ----------
    state : BlockState
        The statistics of every key block for these queries.
    dtype : dtype, optional
        Real floating dtype of the result (default: the accumulator's; pass the
        inputs' half-precision dtype to cast back).

    Returns
    -------
    array of shape (..., bq, d_v)
        ``softmax(scores) (v + Vʳ)`` over every key folded into ``state``;
        exactly 0 for rows whose keys were all masked, never NaN.

    Raises
    ------
    TypeError
        If ``state`` is not a BlockState or ``dtype`` not a real floating
        dtype of its library.

    See Also
    --------
    attention_block : The state of one block pair.
    merge_block_states : The state over two key sets.

    Notes
    -----
    Dao et al. 2022, algorithm 1, line 12.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import attention_block, finish_block_state
    >>> q = k = xp.ones((1, 2)); v = xp.asarray([[5.0]])
    >>> state = attention_block(q, k, v, query_start=0, key_start=0, query_length=1,
    ...                         key_length=1, mask=xp.asarray([[False]]))
    >>> finish_block_state(state)                     # a fully masked row
    array([[0.]])
    """
    if not isinstance(state, BlockState):
        raise TypeError(f"state must be a BlockState, got {type(state).__name__}")
    xp = _checks.namespace(accumulator=state.accumulator)
    dtype = state.accumulator.dtype if dtype is None else _checks.dtype("dtype", dtype, xp)
    return block_finish(state, dtype, xp)
