"""Self-attention with relative position representations (Shaw et al. 2018).

Shaw et al. add a learned vector per clipped distance to every key and every
value: ``a^K_ij = w^K_{clip(j - i, K)}``, ``a^V_ij = w^V_{clip(j - i, K)}``.
tensor2tensor gathers them into ``(Lq, Lk, d)`` tensors. relattn never does:
it expands each ``(2K+1, d)`` table once to the relative layout ``(W, d)``,
``W = Lq + Lk - 1``, scores the queries against it, ``(..., Lq, W)``, and moves
those scores to key columns with the shift of Transformer-XL appendix B. The
value term runs the other way: the attention weights are moved to the relative
layout (``rel_unshift``) and multiplied by the expanded value table.
"""

from __future__ import annotations

import math
from typing import Any

from . import _checks
from .attention import check_mask, check_qkv, softmax
from .positions import OUT_OF_RANGE, relative_table
from .shift import shift, unshift

__all__ = ["shaw_attention"]


def _check_clipped_table(name: str, table: Any, features: int, feature_name: str) -> None:
    """``table`` is ``(..., 2K+1, features)``: an odd number of rows, one per distance."""
    layout = "(..., 2K+1, d)" if feature_name == "d" else "(..., 2K'+1, d_v)"
    _checks.ndim(name, table, 2, layout)
    rows, table_features = table.shape[-2:]
    if rows % 2 == 0:
        raise ValueError(
            f"{name} must have an odd number 2K+1 of rows (distances -K … K), "
            f"got {rows} rows in shape {tuple(table.shape)}"
        )
    if table_features != features:
        raise ValueError(
            f"{name} must have the feature size {feature_name} = {features}, "
            f"got shape {tuple(table.shape)}"
        )


def shaw_attention(
    q: Any,
    k: Any,
    v: Any,
    key_table: Any,
    value_table: Any,
    *,
    mask: Any = None,
    scale: Any = None,
    out_of_range: str = "clip",
) -> Any:
    """Attention with Shaw et al. relative position representations on keys and values.

    Parameters
    ----------
    q : array of shape (..., Lq, d), real floating
        Queries ``x_i W^Q`` (one head per leading index).
    k : array of shape (..., Lk, d), real floating
        Keys ``x_j W^K``. With ``Lk > Lq`` the first ``Lk - Lq`` keys are
        memory and query ``i`` sits at key position ``i + Lk - Lq``.
    v : array of shape (..., Lk, d_v), real floating
        Values ``x_j W^V``.
    key_table : array of shape (..., 2K+1, d), real floating
        ``w^K_{-K} … w^K_K``: row ``δ + K`` is added to the key of every pair
        at distance ``δ = j - i`` (key minus query). Usually ``(2K+1, d)``,
        shared by all heads; leading dimensions broadcast with ``q``'s.
    value_table : array of shape (..., 2K'+1, d_v), real floating
        ``w^V_{-K'} … w^V_{K'}``, added to the values the same way. ``K'``
        may differ from ``K``.
    mask : array, bool, optional
        ``True`` = may attend; broadcastable to the scores ``(..., Lq, Lk)``.
    scale : float, optional
        Score scale, ``1/√d`` by default.
    out_of_range : {"clip", "zero"}, optional
        Distances beyond ``±K``: ``"clip"`` shares the edge row (Shaw et al.);
        ``"zero"`` adds nothing (Music Transformer, Huang et al. 2018).

    Returns
    -------
    array of shape (..., Lq, d_v)
        ``z_i = Σ_j α_ij (v_j + a^V_ij)`` in the promoted input dtype. Queries
        with no allowed key give zero rows.

    Raises
    ------
    ValueError
        If shapes do not match (``q``/``k`` feature size, ``k``/``v`` length,
        a table with an even number of rows or a feature size other than
        ``d`` / ``d_v``, leading dimensions, ``mask`` shape), or
        ``out_of_range`` is unknown.
    TypeError
        If an input is not real floating, ``mask`` is not boolean, or the
        arrays come from different libraries.

    Notes
    -----
    Shaw et al. 2018, eq. (2)–(5):

    .. math::

        e_{ij} = \\frac{q_i (k_j + a^K_{ij})^\\top}{\\sqrt{d}}, \\quad
        \\alpha_{ij} = \\operatorname{softmax}_j e_{ij}, \\quad
        z_i = \\sum_j \\alpha_{ij} (v_j + a^V_{ij}),

    with ``a^K_ij = w^K_{clip(j - i, -K, K)}`` (eq. (3)–(4)). relattn
    computes, with ``T = relative_table(w, Lq, Lk)`` of shape ``(W, d)``,
    ``W = Lq + Lk - 1`` (one row per distance, seed note 001, eq. 17):

    ``logits = (q kᵀ + rel_shift(q T_Kᵀ)) · scale`` and
    ``z = P v + rel_unshift(P) T_V``.

    Memory ``O(B·H·Lq·Lk + W·d)``: no ``(Lq, Lk, d)`` tensor, unlike
    tensor2tensor's reference (``_relative_attention_inner``).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> from relattn import causal_mask
    >>> from relattn import shaw_attention
    >>> q = k = v = xp.zeros((3, 2))                    # uniform weights
    >>> key_table = xp.zeros((3, 2))                     # K = 1
    >>> value_table = xp.asarray([[-3.0], [0.0], [3.0]]) # w^V for δ = -1, 0, 1
    >>> shaw_attention(q, k, v[:, :1], key_table, value_table)
    Array([[ 2.],
           [ 0.],
           [-2.]], dtype=array_api_strict.float64)
    >>> shaw_attention(q, k, v[:, :1], key_table, value_table, mask=causal_mask(3, 3, xp=xp))
    Array([[ 0. ],
           [-1.5],
           [-2. ]], dtype=array_api_strict.float64)
    """
    xp = _checks.namespace(q=q, k=k, v=v, key_table=key_table, value_table=value_table, mask=mask)
    dtype = _checks.floating(xp, q=q, k=k, v=v, key_table=key_table, value_table=value_table)
    _checks.choice("out_of_range", out_of_range, OUT_OF_RANGE)
    lq, lk, d = check_qkv(q, k, v)
    _check_clipped_table("key_table", key_table, d, "d")
    _check_clipped_table("value_table", value_table, v.shape[-1], "d_v")
    lead = _checks.broadcast(
        q=q.shape[:-2],
        k=k.shape[:-2],
        v=v.shape[:-2],
        key_table=key_table.shape[:-2],
        value_table=value_table.shape[:-2],
    )
    check_mask(mask, (*lead, lq, lk), xp)

    q, k, v, key_table, value_table = (
        _checks.cast(xp, a, dtype) for a in (q, k, v, key_table, value_table)
    )
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    # One row per distance of the relative layout, O(W·d): never one per (i, j) pair.
    t_k = relative_table(key_table, lq, lk, out_of_range=out_of_range)
    t_v = relative_table(value_table, lq, lk, out_of_range=out_of_range)
    # Eq. (4): q_i·a^K_ij is q_i·T_K[δ(i, j)], computed per distance and shifted to key columns.
    # One expression, position term first: the (Lq, W) product is freed before q kᵀ exists,
    # and libraries that reuse temporaries (NumPy) add and scale in q kᵀ's buffer.
    weights = softmax(
        (shift(q @ xp.matrix_transpose(t_k), lk, xp) + q @ xp.matrix_transpose(k)) * scale,
        mask,
        -1,
        xp,
    )
    # Eq. (3): Σ_j α_ij a^V_ij = Σ_δ (Σ_{j: δ(i,j)=δ} α_ij) T_V[δ] = rel_unshift(α) T_V.
    return weights @ v + unshift(weights, xp) @ t_v
