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

from typing import Any

from . import _checks, core, problem
from ._typing import Array
from .positions import OUT_OF_RANGE, clip_radius, relative_table

__all__ = ["shaw_attention"]


def _check_clipped_table(
    name: str, table: Any, features: int, feature_name: str, radius: Any
) -> None:
    """``table`` is ``(..., K_past + K_future + 1, features)``: one row per clipped distance."""
    _checks.ndim(name, table, 2, f"(..., 2K+1, {feature_name})")
    clip_radius(name, radius, table.shape[-2])
    if table.shape[-1] != features:
        raise ValueError(
            f"{name} must have the feature size {feature_name} = {features}, "
            f"got shape {tuple(table.shape)}"
        )


def shaw_attention(
    q: Array,
    k: Array,
    v: Array,
    key_embeddings: Array,
    value_embeddings: Array = None,
    *,
    mask: Array = None,
    bias: Array = None,
    relative_bias: Array = None,
    causal: bool = False,
    scale: Any = None,
    out_of_range: str = "clip",
    radius: Any = None,
    block_size: Any = None,
    positions: Array = None,
    segment_ids: Array = None,
    score_mod: Any = None,
    mask_mod: Any = None,
) -> Array:
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
    key_embeddings : array of shape (..., 2K+1, d), real floating, or None
        ``w^K_{-K} … w^K_K``: row ``δ + K`` is added to the key of every pair
        at distance ``δ = j - i`` (key minus query). Usually ``(2K+1, d)``,
        shared by all heads; leading dimensions broadcast with ``q``'s.
        ``None``: no key term.
    value_embeddings : array of shape (..., 2K'+1, d_v), real floating, optional
        ``w^V_{-K'} … w^V_{K'}``, added to the values the same way. ``K'``
        may differ from ``K``. Default: no value term (the keys-only variant).
    mask : array, bool, optional
        ``True`` = may attend; broadcastable to the scores ``(..., Lq, Lk)``.
    bias : array, real floating, optional
        Added to the scaled scores; broadcastable to ``(..., Lq, Lk)``.
    relative_bias : array of shape (..., W), real floating, optional
        One value per distance, added to the scaled scores; see
        :func:`scaled_dot_product_attention`.
    causal : bool, optional
        Mask the keys after each query (``δ > 0``).
    scale : float or 0-d array, optional
        Score scale, ``1/√d`` by default.
    out_of_range : {"clip", "zero"}, optional
        Distances beyond the radius: ``"clip"`` shares the edge row (Shaw et
        al.); ``"zero"`` adds nothing (Music Transformer, Huang et al. 2018).
    radius : int or (int, int), optional
        ``K``, or ``(K_past, K_future)`` for asymmetric tables of
        ``K_past + K_future + 1`` rows (WeNet clips at ``(64, 8)``), for both
        tables. Default: each table symmetric, ``K`` from its rows.
    block_size : int or (int, int), optional
        Blockwise with these block sizes; see :func:`scaled_dot_product_attention`.
    positions, segment_ids, score_mod, mask_mod : optional
        Positions as data, document ids and the caller's score and mask
        functions; see :func:`scaled_dot_product_attention`.

    Returns
    -------
    array of shape (..., Lq, d_v)
        ``z_i = Σ_j α_ij (v_j + a^V_ij)`` in the promoted input dtype. Queries
        with no allowed key give zero rows.

    Raises
    ------
    ValueError
        If shapes do not match (``q``/``k`` feature size, ``k``/``v`` length,
        a table whose rows do not fit ``radius`` (an even number without it)
        or with a feature size other than ``d`` / ``d_v``, leading dimensions,
        ``mask`` or ``bias`` shape), ``out_of_range`` is unknown, or ``d = 0``
        with the default scale.
    TypeError
        If an input is not a real floating array, ``mask`` is not boolean, or
        the arrays come from different libraries.

    See Also
    --------
    relative_table : The expansion of a clipped table to the relative layout.
    relative_attention : The same core with a table per distance (``value_table=``).
    relative_table : Expands ``key_embeddings`` to the relative layout.

    Notes
    -----
    Shaw et al. 2018, eq. (2)–(5):

    .. math::

        e_{ij} = \\frac{q_i (k_j + a^K_{ij})^\\top}{\\sqrt{d}}, \\quad
        \\alpha_{ij} = \\operatorname{softmax}_j e_{ij}, \\quad
        z_i = \\sum_j \\alpha_{ij} (v_j + a^V_{ij}),

    with ``a^K_ij = w^K_{clip(j - i, -K, K)}`` (eq. (3)–(4)). relattn
    computes, with ``T = relative_table(w, Lq, Lk)`` of shape ``(W, d)``,
    ``W = Lq + Lk - 1`` (one row per distance):

    ``logits = (q kᵀ + rel_shift(q T_Kᵀ)) · scale`` and
    ``z = P v + rel_unshift(P) T_V``.

    Memory ``O(B·H·Lq·Lk + W·d)``: no ``(Lq, Lk, d)`` tensor, unlike
    tensor2tensor's reference (``_relative_attention_inner``).

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import causal_mask
    >>> from relattn import shaw_attention
    >>> q = k = v = xp.zeros((3, 2))                    # uniform weights
    >>> key_embeddings = xp.zeros((3, 2))                     # K = 1
    >>> value_embeddings = xp.asarray([[-3.0], [0.0], [3.0]]) # w^V for δ = -1, 0, 1
    >>> shaw_attention(q, k, v[:, :1], key_embeddings, value_embeddings)
    array([[ 2.],
           [ 0.],
           [-2.]])
    >>> shaw_attention(q, k, v[:, :1], key_embeddings, value_embeddings, causal=True)
    array([[ 0. ],
           [-1.5],
           [-2. ]])
    """
    _checks.choice("out_of_range", out_of_range, OUT_OF_RANGE)

    def expand(xp: Any, dtype: Any, causal: bool, lq: int, lk: int) -> dict[str, Any]:
        # One row per distance of the relative layout, O(W·d): never one per (i, j) pair.
        # With causal=True only δ <= 0 are needed: the causal layout.
        tables = {}
        for name, given, features, what in (
            ("position_table", key_embeddings, q.shape[-1], "d"),
            ("value_table", value_embeddings, v.shape[-1], "d_v"),
        ):
            if given is not None:
                shown = NAMES[name]
                _check_clipped_table(shown, given, features, what, radius)
                table = _checks.cast(xp, given, dtype)
                tables[name] = relative_table(
                    table, lq, lk, causal=causal, out_of_range=out_of_range, radius=radius
                )
        return tables

    return core.attention(
        problem.check(
            q, k, v, mask=mask, bias=bias, relative_bias=relative_bias, causal=causal,
            scale=scale, block_size=block_size,
            positions=positions, segment_ids=segment_ids, score_mod=score_mod,
            mask_mod=mask_mod,
            others={"key_embeddings": key_embeddings, "value_embeddings": value_embeddings},
            expand=expand, names=NAMES,
        )
    )  # fmt: skip


#: Shaw's clipped embeddings, by the core's name of the tables they expand to.
NAMES = {"position_table": "key_embeddings", "value_table": "value_embeddings"}
