"""Attention score functions ``e_ij``: relative, dot-product, bilinear, additive, cosine, location.

Every score function maps queries ``q (..., Lq, d_q)`` and keys
``k (..., Lk, d_k)`` to scores ``e (..., Lq, Lk)``, entry ``[i, j]`` for query
``i`` and key ``j`` (Luong et al. 2015 write ``score(h_t, h̄_s)``: the target
state ``h_t`` is the query, the source state ``h̄_s`` the key). Leading
dimensions broadcast, ``Lq`` and ``Lk`` may differ (cross-attention), and
:func:`relattn.masked_softmax` turns scores into attention weights.
Weights act on row vectors: ``q @ weight``, so a weight has shape
``(d_in, d_out)``, the transpose of the papers' ``W x``.
"""

from __future__ import annotations

import math
from typing import Any

from . import _checks
from ._typing import Array
from .problem import check_table
from .shift import shift

__all__ = [
    "additive_scores",
    "bilinear_scores",
    "cosine_scores",
    "dot_product_scores",
    "location_scores",
    "relative_scores",
    "scaled_dot_product_scores",
]

#: Elements of one query chunk's ``(..., chunk, Lk, d_a)`` tensor in :func:`additive_scores`.
ADDITIVE_CHUNK_ELEMENTS = 2**22


def _check_qk(q: Any, k: Any, *, same_features: bool) -> tuple[int, ...]:
    """``q (..., Lq, d_q)`` and ``k (..., Lk, d_k)``; return the broadcast leading shape."""
    _checks.query_key(q, k, same_features=same_features)
    return _checks.broadcast(q=q.shape[:-2], k=k.shape[:-2])


def relative_scores(q: Array, table: Array, key_length: int, *, bias: Array = None) -> Array:
    """Query–position scores, one column per key: ``rel_shift((q + bias) tableᵀ, Lk)``.

    Parameters
    ----------
    q : array of shape (..., Lq, d), real floating
        Queries.
    table : array of shape (..., W, d), real floating
        Position representations in the relative layout (row ``m`` for
        ``δ = m - (Lk - 1)``), ``W = Lk`` (causal) or ``Lq + Lk - 1`` (full).
        Leading dimensions broadcast with those of ``q``.
    key_length : int
        ``Lk >= 1``.
    bias : array, real floating, optional
        Added to every query first (Transformer-XL's position bias ``v``);
        broadcastable to ``q``.

    Returns
    -------
    array of shape (..., Lq, Lk)
        ``out[..., i, j] = (q_i + bias) · table[δ(i, j) + Lk - 1]``; zero for
        ``δ > 0`` in the causal layout. Unscaled.

    Raises
    ------
    ValueError
        If ``table``'s width fits neither layout, or feature sizes or leading
        dimensions do not match.
    TypeError
        If an input is not real floating, a length is not an integer, or the
        arrays come from different libraries.

    Notes
    -----
    Terms (b) and (d) of Dai et al. 2019, section 3.3, with the shift of
    appendix B; Shaw et al. 2018's key term ``x_i W^Q (a^K_ij)ᵀ`` (eq. (5))
    with ``table = relative_table(w^K, Lq, Lk)``.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import relative_scores, relative_distances
    >>> table = xp.astype(relative_distances(2, 2, xp=xp), xp.float64)[:, None]   # δ itself
    >>> relative_scores(xp.ones((2, 1)), table, 2)
    array([[ 0.,  1.],
           [-1.,  0.]])
    """
    xp = _checks.namespace(q=q, table=table, optional={"bias": bias})
    dtype = _checks.floating(xp, q=q, table=table, bias=bias)
    _checks.ndim("q", q, 2, "(..., Lq, d)")
    lk = _checks.length("key_length", key_length, minimum=0)
    lq, d = q.shape[-2:]
    check_table("table", table, lq, lk, d)
    _checks.broadcast(q=q.shape[:-2], table=table.shape[:-2])
    if bias is not None:
        _checks.broadcastable("bias", bias.shape, tuple(q.shape), "q")
    q, table, bias = (_checks.cast(xp, a, dtype) for a in (q, table, bias))
    return shift((q if bias is None else q + bias) @ xp.matrix_transpose(table), lk, xp)


def dot_product_scores(q: Array, k: Array) -> Array:
    """Dot-product (multiplicative) scores ``e_ij = q_iᵀ k_j``.

    Parameters
    ----------
    q : array of shape (..., Lq, d), real floating
        Queries (Luong's target hidden states ``h_t``).
    k : array of shape (..., Lk, d), real floating
        Keys (Luong's source hidden states ``h̄_s``). Leading dimensions of
        ``q`` and ``k`` broadcast.

    Returns
    -------
    array of shape (..., Lq, Lk)
        ``q kᵀ`` in the promoted input dtype.

    Raises
    ------
    ValueError
        If ``q`` or ``k`` has fewer than 2 dimensions, their feature sizes
        differ, or their leading dimensions do not broadcast.
    TypeError
        If an input is not a real floating array, or the arrays come from
        different libraries.

    Notes
    -----
    Luong et al. 2015, eq. (8), "dot": ``score(h_t, h̄_s) = h_tᵀ h̄_s``.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import dot_product_scores
    >>> q = xp.asarray([[1.0, 0.0], [0.0, 2.0]])
    >>> k = xp.asarray([[1.0, 1.0], [0.0, 1.0], [2.0, 0.0]])
    >>> dot_product_scores(q, k)
    array([[1., 0., 2.],
           [2., 2., 0.]])
    """
    xp = _checks.namespace(q=q, k=k)
    dtype = _checks.floating(xp, q=q, k=k)
    _check_qk(q, k, same_features=True)
    q, k = (_checks.cast(xp, a, dtype) for a in (q, k))
    return q @ xp.matrix_transpose(k)


def scaled_dot_product_scores(q: Array, k: Array, *, scale: Any = None) -> Array:
    """Scaled dot-product scores ``e_ij = q_iᵀ k_j · scale``, ``scale = 1/√d`` by default.

    Parameters
    ----------
    q : array of shape (..., Lq, d), real floating
        Queries.
    k : array of shape (..., Lk, d), real floating
        Keys. Leading dimensions of ``q`` and ``k`` broadcast.
    scale : float, optional
        Score scale; ``1/√d`` by default.

    Returns
    -------
    array of shape (..., Lq, Lk)
        ``q kᵀ · scale`` in the promoted input dtype.

    Raises
    ------
    ValueError
        If ``q`` or ``k`` has fewer than 2 dimensions, their feature sizes
        differ, or their leading dimensions do not broadcast.
    TypeError
        If an input is not a real floating array, or the arrays come from
        different libraries.

    Notes
    -----
    Vaswani et al. 2017, eq. (1): the logits of ``softmax(QKᵀ/√d_k) V``; the
    ``1/√d_k`` keeps their variance near 1 for unit-variance ``q`` and ``k``
    (section 3.2.1).

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import scaled_dot_product_scores
    >>> scaled_dot_product_scores(xp.ones((2, 4)), xp.ones((3, 4)))
    array([[2., 2., 2.],
           [2., 2., 2.]])
    """
    xp = _checks.namespace(q=q, k=k)
    dtype = _checks.floating(xp, q=q, k=k)
    _check_qk(q, k, same_features=True)
    q, k = (_checks.cast(xp, a, dtype) for a in (q, k))
    scale = _checks.scale(scale, q.shape[-1], xp)
    return (q @ xp.matrix_transpose(k)) * scale


def bilinear_scores(q: Array, k: Array, weight: Array) -> Array:
    """Bilinear ("general") scores ``e_ij = q_iᵀ W k_j``.

    Parameters
    ----------
    q : array of shape (..., Lq, d_q), real floating
        Queries.
    k : array of shape (..., Lk, d_k), real floating
        Keys; ``d_k`` may differ from ``d_q``.
    weight : array of shape (..., d_q, d_k), real floating
        ``W`` (Luong's ``W_a``). Leading dimensions of ``q``, ``k`` and
        ``weight`` broadcast (e.g. one ``W`` per head, ``(H, d_q, d_k)``).

    Returns
    -------
    array of shape (..., Lq, Lk)
        ``q W kᵀ`` in the promoted input dtype.

    Raises
    ------
    ValueError
        If ``q`` or ``k`` has fewer than 2 dimensions, ``weight`` is not
        ``(..., d_q, d_k)``, or leading dimensions do not broadcast.
    TypeError
        If an input is not a real floating array, or the arrays come from
        different libraries.

    Notes
    -----
    Luong et al. 2015, eq. (8), "general": ``score(h_t, h̄_s) = h_tᵀ W_a h̄_s``.
    Computed as ``(q W) kᵀ``: ``O(Lq·d_q·d_k + Lq·Lk·d_k)`` work.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import bilinear_scores
    >>> q = xp.asarray([[1.0, 2.0]])
    >>> k = xp.asarray([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    >>> weight = xp.asarray([[1.0, 0.0, 3.0], [0.0, 1.0, 0.0]])   # (d_q, d_k) = (2, 3)
    >>> bilinear_scores(q, k, weight)
    array([[1., 3.]])
    """
    xp = _checks.namespace(q=q, k=k, weight=weight)
    dtype = _checks.floating(xp, q=q, k=k, weight=weight)
    _check_qk(q, k, same_features=False)
    d_q, d_k = q.shape[-1], k.shape[-1]
    _checks.ndim("weight", weight, 2, "(..., d_q, d_k)")
    rows = weight.shape[-2]
    if rows == d_q:  # the weight fits q: a mismatch is k's
        _checks.features("k", k, "weight", weight, -1, "(..., d_q, d_k)")
    if tuple(weight.shape[-2:]) != (d_q, d_k):
        raise ValueError(
            f"weight must have shape (..., d_q, d_k) = (..., {d_q}, {d_k}), "
            f"got shape {tuple(weight.shape)}"
        )
    _checks.broadcast(q=q.shape[:-2], k=k.shape[:-2], weight=weight.shape[:-2])
    q, k, weight = (_checks.cast(xp, a, dtype) for a in (q, k, weight))
    return (q @ weight) @ xp.matrix_transpose(k)


def _additive_chunk_size(lead: tuple[int, ...], lq: int, lk: int, d_a: int) -> int:
    """Largest query chunk whose ``(*lead, chunk, Lk, d_a)`` tensor fits the element budget."""
    per_query = math.prod(lead) * lk * d_a
    return max(1, min(lq, ADDITIVE_CHUNK_ELEMENTS // max(per_query, 1)))


def additive_scores(
    q: Array,
    k: Array,
    query_weight: Array,
    key_weight: Array,
    v: Array,
    *,
    bias: Array = None,
    chunk_size: int | None = None,
) -> Array:
    """Additive ("concat", Bahdanau) scores ``e_ij = vᵀ tanh(W q_i + U k_j + b)``.

    Parameters
    ----------
    q : array of shape (..., Lq, d_q), real floating
        Queries (Bahdanau's decoder state ``s_{i-1}``).
    k : array of shape (..., Lk, d_k), real floating
        Keys (Bahdanau's annotations ``h_j``). Leading dimensions of ``q`` and
        ``k`` broadcast.
    query_weight : array of shape (d_q, d_a), real floating
        ``W`` (Bahdanau's ``W_a``, transposed: it acts as ``q @ query_weight``).
    key_weight : array of shape (d_k, d_a), real floating
        ``U`` (Bahdanau's ``U_a``, transposed).
    v : array of shape (d_a,), real floating
        ``v`` (Bahdanau's ``v_a``).
    bias : array of shape (d_a,), real floating, optional
        ``b`` inside the ``tanh``; absent in both papers, common in code.
    chunk_size : int, optional
        Number of queries whose ``(..., chunk, Lk, d_a)`` activations are
        formed at once, ``>= 1``. Default: the largest chunk with at most
        ``ADDITIVE_CHUNK_ELEMENTS = 2**22`` elements (16 MiB in float32), and
        at least one query.

    Returns
    -------
    array of shape (..., Lq, Lk)
        The scores in the promoted input dtype; the same for every
        ``chunk_size`` up to rounding.

    Raises
    ------
    ValueError
        If ``q`` or ``k`` has fewer than 2 dimensions, a weight, ``v`` or
        ``bias`` has the wrong shape, leading dimensions do not broadcast, or
        ``chunk_size`` is below 1.
    TypeError
        If an input is not a real floating array, ``chunk_size`` is not an
        integer, or the arrays come from different libraries.

    Notes
    -----
    Bahdanau et al. 2015, appendix A.1.2: ``e_ij = v_aᵀ tanh(W_a s_{i-1} +
    U_a h_j)``; Luong et al. 2015, eq. (8), "concat":
    ``v_aᵀ tanh(W_a [h_t; h̄_s])``, the same with ``W_a = [W U]``.

    ``q W`` and ``k U + b`` are computed once (Bahdanau's remark that ``U_a
    h_j`` does not depend on ``i``). The ``tanh`` needs every ``(i, j)`` pair,
    ``O(Lq·Lk·d_a)`` values: they are formed a chunk of queries at a time
    (a Python loop over static chunk boundaries, so ``jax.jit`` traces it),
    holding at most ``max(ADDITIVE_CHUNK_ELEMENTS, B·Lk·d_a)`` of them at once,
    ``B`` the product of the leading dimensions, plus the ``(..., Lq, Lk)``
    result. The bound holds for the forward pass; an autograd backward pass
    (torch, ``jax.grad``) keeps every chunk's ``tanh`` for the gradient,
    ``O(Lq·Lk·d_a)`` again, unless the call is wrapped in checkpointing.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import additive_scores
    >>> q, k = xp.ones((2, 3)), xp.ones((4, 5))
    >>> w, u = xp.zeros((3, 6)), xp.zeros((5, 6))
    >>> additive_scores(q, k, w, u, xp.ones(6), bias=xp.full(6, 100.0))   # 6 · tanh(100)
    array([[6., 6., 6., 6.],
           [6., 6., 6., 6.]])
    """
    xp = _checks.namespace(
        q=q, k=k, query_weight=query_weight, key_weight=key_weight, v=v, optional={"bias": bias}
    )
    dtype = _checks.floating(
        xp, q=q, k=k, query_weight=query_weight, key_weight=key_weight, v=v, bias=bias
    )
    lead = _check_qk(q, k, same_features=False)
    d_q, d_k = q.shape[-1], k.shape[-1]
    _checks.ndim("query_weight", query_weight, 2, "(d_q, d_a)")
    _checks.ndim("key_weight", key_weight, 2, "(d_k, d_a)")
    d_a = query_weight.shape[-1]
    _checks.exact_shape("query_weight", query_weight, (d_q, d_a), "(d_q, d_a)")
    if key_weight.shape[-1] == d_a:
        _checks.features("k", k, "key_weight", key_weight, 0, "(d_k, d_a)")
    _checks.exact_shape("key_weight", key_weight, (d_k, d_a), "(d_k, d_a)")
    _checks.exact_shape("v", v, (d_a,), "(d_a,)")
    if bias is not None:
        _checks.exact_shape("bias", bias, (d_a,), "(d_a,)")
    lq, lk = q.shape[-2], k.shape[-2]
    if chunk_size is None:
        chunk = _additive_chunk_size(lead, lq, lk, d_a)
    else:
        chunk = _checks.length("chunk_size", chunk_size)

    q, k, w, u, v, bias = (
        _checks.cast(xp, a, dtype) for a in (q, k, query_weight, key_weight, v, bias)
    )
    wq = (q @ w)[..., :, None, :]  # (..., Lq, 1, d_a)
    uk = k @ u
    if bias is not None:
        uk = uk + bias
    uk = uk[..., None, :, :]  # (..., 1, Lk, d_a)
    # Static chunk boundaries; the last stop is clipped (array-API slices must stay in bounds).
    bounds = [(start, min(start + chunk, lq)) for start in range(0, lq, chunk)] or [(0, 0)]
    chunks = [xp.tanh(wq[..., start:stop, :, :] + uk) @ v for start, stop in bounds]
    return chunks[0] if len(chunks) == 1 else xp.concat(chunks, axis=-2)


def _unit_rows(x: Any, xp: Any) -> Any:
    """Rows of ``x`` divided by their Euclidean norm; zero rows stay zero."""
    if math.prod(x.shape) == 0:
        return x  # no feature (every row is the zero row), or no row at all
    # Divide by the largest |x| first: the squared norm then lies in [1, d] and
    # can neither overflow (float16: |x| > 256) nor underflow.
    peak = xp.max(xp.abs(x), axis=-1, keepdims=True)
    scaled = x / xp.where(peak > 0, peak, xp.ones_like(peak))
    squared = xp.sum(scaled * scaled, axis=-1, keepdims=True)
    # The where keeps sqrt away from 0, whose derivative is infinite: a zero row
    # has scaled = 0, so it stays 0 and its gradient stays finite.
    return scaled / xp.sqrt(xp.where(squared > 0, squared, xp.ones_like(squared)))


def cosine_scores(q: Array, k: Array) -> Array:
    """Content-based (cosine) scores ``e_ij = q_iᵀ k_j / (‖q_i‖ ‖k_j‖)``.

    Parameters
    ----------
    q : array of shape (..., Lq, d), real floating
        Queries.
    k : array of shape (..., Lk, d), real floating
        Keys. Leading dimensions of ``q`` and ``k`` broadcast.

    Returns
    -------
    array of shape (..., Lq, Lk)
        Cosines in ``[-1, 1]`` in the promoted input dtype. A zero query or
        key scores 0 against everything (never NaN), and its gradient is
        finite.

    Raises
    ------
    ValueError
        If ``q`` or ``k`` has fewer than 2 dimensions, their feature sizes
        differ, or their leading dimensions do not broadcast.
    TypeError
        If an input is not a real floating array, or the arrays come from
        different libraries.

    Notes
    -----
    Graves et al. 2014 (Neural Turing Machines), section 3.3.1, eq. (6):
    ``K[u, v] = u·v / (‖u‖ ‖v‖)``; their content weights are
    ``softmax(β K)``, i.e. ``masked_softmax(beta * cosine_scores(q, k))``.
    Each row is scaled by its largest absolute entry before its norm is
    taken, so large or tiny vectors (float16 included) neither overflow nor
    underflow.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import cosine_scores
    >>> q = xp.asarray([[3.0, 4.0], [0.0, 0.0]])
    >>> k = xp.asarray([[4.0, 3.0], [1.0, 0.0]])
    >>> cosine_scores(q, k)
    array([[0.96, 0.6 ],
           [0.  , 0.  ]])
    """
    xp = _checks.namespace(q=q, k=k)
    dtype = _checks.floating(xp, q=q, k=k)
    _check_qk(q, k, same_features=True)
    q, k = (_checks.cast(xp, a, dtype) for a in (q, k))
    return _unit_rows(q, xp) @ xp.matrix_transpose(_unit_rows(k, xp))


def location_scores(q: Array, weight: Array) -> Array:
    """Location-based logits ``W_a q_i`` over a fixed number of source positions.

    Parameters
    ----------
    q : array of shape (..., Lq, d), real floating
        Queries (Luong's target hidden states ``h_t``).
    weight : array of shape (..., d, n_positions), real floating
        ``W_a`` transposed; leading dimensions broadcast with those of ``q``.

    Returns
    -------
    array of shape (..., Lq, n_positions)
        The logits ``q @ weight`` in the promoted input dtype. They depend on
        the query alone, not on any key: :func:`relattn.masked_softmax` turns
        them into Luong's weights ``a_t`` over the ``n_positions`` fixed source
        positions (mask the positions beyond a sentence's length, e.g. with
        :func:`relattn.padding_mask`, when sentences are shorter).

    Raises
    ------
    ValueError
        If ``q`` has fewer than 2 dimensions, ``weight`` is not
        ``(..., d, n_positions)``, or leading dimensions do not broadcast.
    TypeError
        If an input is not a real floating array, or the arrays come from
        different libraries.

    Notes
    -----
    Luong et al. 2015, eq. (8), last line, "location": ``a_t = softmax(W_a h_t)``.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import masked_softmax
    >>> from relattn import location_scores
    >>> logits = location_scores(xp.ones((2, 4)), xp.zeros((4, 5)))
    >>> logits.shape
    (2, 5)
    >>> masked_softmax(logits)[0, :]
    array([0.2, 0.2, 0.2, 0.2, 0.2])
    """
    xp = _checks.namespace(q=q, weight=weight)
    dtype = _checks.floating(xp, q=q, weight=weight)
    _checks.ndim("q", q, 2, "(..., Lq, d)")
    _checks.ndim("weight", weight, 2, "(..., d, n_positions)")
    if weight.shape[-2] != q.shape[-1]:
        raise ValueError(
            f"weight must have shape (..., d, n_positions) with d = {q.shape[-1]} "
            f"(the feature size of q), got shape {tuple(weight.shape)}"
        )
    _checks.broadcast(q=q.shape[:-2], weight=weight.shape[:-2])
    q, weight = (_checks.cast(xp, a, dtype) for a in (q, weight))
    return q @ weight
