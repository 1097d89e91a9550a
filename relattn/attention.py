"""Masked softmax, scaled dot-product attention and relative attention."""

from __future__ import annotations

from typing import Any

from . import _checks, core, problem
from ._typing import Array
from .problem import check_mask

__all__ = ["masked_softmax", "relative_attention", "scaled_dot_product_attention"]


def masked_softmax(scores: Array, mask: Array = None, *, axis: int = -1) -> Array:
    """Softmax over the keys that may be attended; fully masked rows give zeros.

    Parameters
    ----------
    scores : array of shape (..., Lq, Lk), real floating
        Attention logits ``e_ij``.
    mask : array, bool, optional
        ``True`` = may attend; broadcastable to ``scores``.
    axis : int, optional
        Axis to normalise over (the key axis, last by default).

    Returns
    -------
    array, shape and dtype of ``scores``
        ``α_ij = exp(e_ij) / Σ_{j' allowed} exp(e_ij')`` for allowed ``j`` and
        ``0`` for masked ones. A row with no allowed key (or only ``-inf``
        scores) is all zeros, never NaN, in every dtype. An empty ``axis``
        gives the empty result.

    Raises
    ------
    TypeError
        If ``scores`` is not a real floating array, ``mask`` is not boolean,
        ``axis`` is not an integer, or the arrays come from different
        libraries.
    ValueError
        If ``mask`` does not broadcast to ``scores``, or ``axis`` is out of
        range.

    See Also
    --------
    scaled_dot_product_attention : The softmax applied to ``q kᵀ · scale``.
    mask_to_bias : An additive bias instead of a boolean mask.

    Notes
    -----
    Vaswani et al. 2017, eq. (1), with the masking of section 3.2.3 done by
    selection rather than by adding ``-inf``, so that the gradient of a fully
    masked row is zero as well.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import masked_softmax
    >>> scores = xp.zeros((2, 2))
    >>> masked_softmax(scores, xp.asarray([[True, True], [False, False]]))
    array([[0.5, 0.5],
           [0. , 0. ]])
    """
    xp = _checks.namespace(scores=scores, optional={"mask": mask})
    _checks.floating(xp, scores=scores)
    if scores.ndim == 0:
        raise ValueError("scores must have at least one dimension, got a 0-d array")
    axis = _checks.axis("axis", axis, scores.ndim)
    check_mask(mask, tuple(scores.shape), xp)
    return core.softmax(_checks.cast(xp, scores, scores.dtype), mask, axis, xp)


def scaled_dot_product_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
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
) -> Array:
    """Scaled dot-product attention with optional masks and additive biases.

    Parameters
    ----------
    q : array of shape (..., Lq, d), real floating
        Queries.
    k : array of shape (..., Lk, d), real floating
        Keys.
    v : array of shape (..., Lk, d_v), real floating
        Values. Leading dimensions of ``q``, ``k`` and ``v`` broadcast.
    mask : array, bool, optional
        ``True`` = may attend; broadcastable to the scores ``(..., Lq, Lk)``.
    bias : array, real floating, optional
        Added to the scaled scores; broadcastable to ``(..., Lq, Lk)``.
    relative_bias : array of shape (..., W), real floating, optional
        One value per relative distance (T5's bucketed bias, ALiBi's
        ``m_h·δ``), added to the scaled scores of every pair at that distance:
        column ``m`` holds ``δ = m - (Lk - 1)``. ``W = Lq + Lk - 1`` (full
        layout) or ``W = Lk`` (causal layout: keys with ``δ > 0`` are masked).
        Leading dimensions broadcast with the scores' (one row per head:
        ``(H, W)``). No ``(Lq, Lk)`` bias is formed from it blockwise.
    causal : bool, optional
        Mask the keys after each query (``δ > 0``), without a mask array.
    scale : float or 0-d array, optional
        Score scale, ``1/√d`` by default.
    block_size : int or (int, int), optional
        Run blockwise with query and key blocks of this size, or of sizes
        ``(query_block, key_block)`` (online softmax, memory
        ``O(Lq·d + query_block·key_block)`` per head instead of
        ``O(Lq·Lk)``). Default: the call's plan chooses
        (:func:`relattn.explain`): a library kernel where one computes the
        call, dense while the dense path's peak fits
        ``relattn.config.max_score_bytes``, blockwise with the device's blocks
        beyond it.
    positions : array of shape (..., L), integer dtype, or a pair of them, optional
        Positions as data (SPEC §2.15): one array for self-attention
        (``Lq = Lk``) or ``(query_positions (..., Lq), key_positions (...,
        Lk))``; leading dims broadcast against the scores' (per batch row of
        ``(B, H, L, d)`` inputs: shape ``(B, 1, L)``). Every relative term and
        ``causal`` then read ``δ = key_position - query_position``, clipped to
        the edge columns of each relative input. ``None``: query ``i`` at key
        position ``i + Lk - Lq`` (contiguous, the shift-based fast path).
    segment_ids : array of shape (..., L), integer dtype, or a pair of them, optional
        Document ids of queries and keys (packed sequences): a query attends
        only to keys with its own id. Blocks whose documents do not meet are
        skipped.
    score_mod : callable, optional
        ``score_mod(score, batch, head, q_pos, kv_pos)`` returns the modified
        scores, after every built-in term (FlexAttention's signature). The
        arguments are arrays that broadcast against one block's scores
        ``(B, H, bq, bk)``: ``batch (B, 1, 1, 1)``, ``head (1, H, 1, 1)``,
        ``q_pos (..., bq, 1)``, ``kv_pos (..., 1, bk)`` (the positions).
    mask_mod : callable, optional
        ``mask_mod(batch, head, q_pos, kv_pos)`` returns a boolean array, True
        where a query may attend; blocks where it is all False are skipped.

    Returns
    -------
    array of shape (..., Lq, d_v)
        ``softmax(q kᵀ · scale + bias + b[m(i, j)], mask) v`` in the promoted
        input dtype. Queries with no allowed key (every key masked, or
        ``Lk = 0``) give zero rows.

    Raises
    ------
    ValueError
        If shapes do not match (``q``/``k`` feature size, ``k``/``v`` length,
        leading dimensions, ``mask``, ``bias`` or ``relative_bias`` shape),
        ``d = 0`` with the default scale, or a block size below 1.
    TypeError
        If an input is not a real floating array (``None``, a list), ``mask``
        is not boolean, ``causal`` is not a bool, ``scale`` is not a real
        number, or the arrays come from different libraries.

    See Also
    --------
    relative_attention : With Transformer-XL's per-distance position term.
    relative_bias_matrix : The ``(..., Lq, Lk)`` matrix a ``relative_bias`` stands for.
    masked_softmax : The softmax alone.
    explain : The path a call takes (kernel, FlexAttention, dense or blockwise), and why.

    Notes
    -----
    Vaswani et al. 2017, eq. (1): ``Attention(Q, K, V) = softmax(QKᵀ/√d_k) V``.
    The per-distance bias is that of T5 (Raffel et al. 2020, §2.1) and ALiBi
    (Press et al. 2022, §3).

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import scaled_dot_product_attention
    >>> q = k = xp.ones((3, 4))
    >>> v = xp.reshape(xp.arange(6.0), (3, 2))
    >>> scaled_dot_product_attention(q, k, v, causal=True)
    array([[0., 1.],
           [1., 2.],
           [2., 3.]])
    """
    return core.attention(
        problem.check(
            q, k, v, mask=mask, bias=bias, relative_bias=relative_bias, causal=causal,
            scale=scale, block_size=block_size,
            positions=positions, segment_ids=segment_ids, score_mod=score_mod,
            mask_mod=mask_mod,
        )
    )  # fmt: skip


def relative_attention(
    q: Array,
    k: Array,
    v: Array,
    position_table: Array,
    *,
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
) -> Array:
    """Attention with Transformer-XL relative position scores.

    Parameters
    ----------
    q : array of shape (..., Lq, d), real floating
        Queries ``q_i = W_q h_i`` of the current segment.
    k : array of shape (..., Lk, d), real floating
        Keys ``k_j = W_{k,E} h̃_j`` over memory and segment, ``Lk >= Lq``
        (memory first) or any ``Lk`` with the full layout.
    v : array of shape (..., Lk, d_v), real floating
        Values.
    position_table : array of shape (..., W, d), real floating, or None
        Projected position encodings in the relative layout: row ``m`` encodes
        distance ``δ = m - (Lk - 1)`` (key minus query). ``W = Lk``: the
        causal layout (``δ <= 0``; Transformer-XL's ``r_{i-j}`` for
        ``i - j = -δ = Lk-1 … 0``); keys with ``δ > 0`` are then masked.
        ``W = Lq + Lk - 1``: the full layout (XLNet, Conformer), no implied
        mask. Leading dimensions broadcast with those of ``q`` (one table, or
        one per head ``(H, W, d)``). ``None``: no content-to-position term
        (T5 or ALiBi through ``relative_bias``, Shaw through ``value_table``).
    content_bias : array, real floating, optional
        ``u``, the global content bias, broadcastable to ``q`` (per head:
        ``u[:, None, :]`` for ``u`` of shape ``(H, d)``).
    position_bias : array, real floating, optional
        ``v``, the global position bias, broadcastable to ``q``.
    query_position_table : array of shape (..., W, d), real floating, optional
        The position-to-content table ``Qʳ`` in the relative layout: adds
        ``k_j · Qʳ[m(i, j)]`` to the scores (DeBERTa's p2c, TENER as
        released). See :func:`disentangled_attention`.
    value_table : array of shape (..., W, d_v), real floating, optional
        Shaw et al.'s value representations per distance, in either layout:
        ``out_i = Σ_j α_ij (v_j + value_table[m(i, j)])``.
    mask : array, bool, optional
        ``True`` = may attend; broadcastable to the scores ``(..., Lq, Lk)``;
        combined with the causal-layout mask.
    bias : array, real floating, optional
        Added to the scaled scores; broadcastable to ``(..., Lq, Lk)``.
    relative_bias : array of shape (..., W), real floating, optional
        One value per distance, added to the scaled scores (T5, ALiBi), in
        either layout; see :func:`scaled_dot_product_attention`.
    causal : bool, optional
        Mask ``δ > 0`` with full-layout inputs too.
    scale : float or 0-d array, optional
        Score scale, ``1/√d`` by default; TENER uses ``1``.
    block_size : int or (int, int), optional
        Blockwise with these block sizes; see :func:`scaled_dot_product_attention`.
    positions, segment_ids, score_mod, mask_mod : optional
        Positions as data, document ids and the caller's score and mask
        functions; see :func:`scaled_dot_product_attention`.

    Returns
    -------
    array of shape (..., Lq, d_v)
        ``softmax(A · scale + bias + b[m], mask) (v + Vʳ)`` in the promoted
        input dtype; queries with no allowed key give zero rows.

    Raises
    ------
    ValueError
        If shapes do not match, including a table or ``relative_bias`` width
        ``W`` that fits neither layout, a bias that does not broadcast to
        ``q``, ``d = 0`` with the default scale, or a block size below 1.
    TypeError
        If an input is not a real floating array, ``mask`` is not boolean,
        ``causal`` is not a bool, ``scale`` is not a real number, or the
        arrays come from different libraries.

    See Also
    --------
    relative_scores : The position term ``(q + v) Rᵀ`` moved to key columns.
    sinusoidal_position_encoding : The table ``R`` of Transformer-XL and TENER.
    update_memory : The segment memory that makes ``Lk > Lq``.
    shaw_attention, disentangled_attention : The other schemes of the same core.

    Notes
    -----
    Dai et al. 2019, section 3.3:

    .. math::

        A_{ij} = \\underbrace{(q_i + u)^\\top k_j}_{(a) + (c)}
               + \\underbrace{(q_i + v)^\\top r_{i-j}}_{(b) + (d)}

    Term (b)+(d) is computed once per distance, ``(q + v) Rᵀ`` of shape
    ``(..., Lq, W)``, and moved to key columns by :func:`relattn.rel_shift`
    (appendix B): ``O(Lq·W·d)`` work, no ``(Lq, Lk, d)`` tensor. TENER (Yan et
    al. 2019, eq. (15)–(17)) is this function with the unprojected signed
    sinusoid as table and ``scale=1``; Shaw et al. 2018's value term (eq. (3))
    is ``value_table`` moved back by :func:`relattn.rel_unshift`.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import relative_attention, relative_distances, sinusoidal_position_encoding
    >>> q = xp.ones((2, 4)); kv = xp.ones((3, 4))       # 2 queries, 1 memory slot
    >>> dist = -relative_distances(2, 3, causal=True, xp=xp)   # i - j = 2, 1, 0
    >>> r = sinusoidal_position_encoding(dist, 4, layout="concatenated")
    >>> relative_attention(q, kv, kv, r).shape
    (2, 4)
    """
    return core.attention(
        problem.check(
            q, k, v, position_table=position_table, query_position_table=query_position_table,
            value_table=value_table, content_bias=content_bias, position_bias=position_bias,
            relative_bias=relative_bias, bias=bias, mask=mask, causal=causal, scale=scale,
            block_size=block_size,
            positions=positions, segment_ids=segment_ids, score_mod=score_mod,
            mask_mod=mask_mod,
        )
    )  # fmt: skip
