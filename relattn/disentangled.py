"""DeBERTa's disentangled attention (He et al. 2021)."""

from __future__ import annotations

from typing import Any

from . import core, problem
from ._typing import Array

__all__ = ["disentangled_attention"]


def disentangled_attention(
    q: Array,
    k: Array,
    v: Array,
    position_table: Array,
    query_position_table: Array,
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
    r"""Attention with content-to-content, content-to-position and position-to-content scores.

    Parameters
    ----------
    q : array of shape (..., Lq, d), real floating
        Content queries ``Q_c``.
    k : array of shape (..., Lk, d), real floating
        Content keys ``K_c``.
    v : array of shape (..., Lk, d_v), real floating
        Values.
    position_table : array of shape (..., W, d), real floating, or None
        ``Kʳ``, the projected relative position keys per column of the
        relative layout (``δ = m - (Lk - 1)``): DeBERTa's ``pos_key_layer``
        gathered at ``φ(δ)`` for each column. ``W = Lq + Lk - 1`` (full), or
        ``Lk`` (causal layout, implies ``causal``). ``None``: no c2p term.
    query_position_table : array of shape (..., W, d), real floating, or None
        ``Qʳ``, the projected relative position queries, gathered the same way
        (the same ``φ`` as the keys, as HF's code does). ``None``: no p2c term.
    mask : array, bool, optional
        ``True`` = may attend; broadcastable to the scores ``(..., Lq, Lk)``.
    bias : array, real floating, optional
        Added to the scaled scores; broadcastable to ``(..., Lq, Lk)``.
    relative_bias : array of shape (..., W), real floating, optional
        One value per distance, added to the scaled scores.
    causal : bool, optional
        Mask the keys after each query (``δ > 0``).
    scale : float or 0-d array, optional
        Score scale; by default ``1/√(3d)`` with both tables, ``1/√(2d)``
        with one (DeBERTa's ``scale_factor = 1 + len(pos_att_type)``).
    block_size : int or (int, int), optional
        Blockwise with these block sizes; see :func:`scaled_dot_product_attention`.
    positions, segment_ids, score_mod, mask_mod : optional
        Positions as data, document ids and the caller's score and mask
        functions; see :func:`scaled_dot_product_attention`.

    Returns
    -------
    array of shape (..., Lq, d_v)
        ``softmax(A · scale + bias, mask) v`` in the promoted input dtype;
        queries with no allowed key give zero rows.

    Raises
    ------
    ValueError
        If shapes do not match (feature sizes, table widths that fit neither
        layout, leading dimensions, ``mask``, ``bias``, ``relative_bias``),
        ``d = 0`` with the default scale, or a block size below 1.
    TypeError
        If an input is not a real floating array, ``mask`` is not boolean,
        ``causal`` not a bool, ``scale`` not a real number, or the arrays come
        from different libraries.

    See Also
    --------
    log_bucket_position : DeBERTa-v2's bucket ``φ`` of each distance.
    relative_attention : Transformer-XL's scores, the c2p term with a bias ``v``.

    Notes
    -----
    He et al. 2021, eq. (2)–(4):

    .. math::

        A_{ij} = Q^c_i {K^c_j}^\top + Q^c_i {K^r_{φ(i,j)}}^\top
               + K^c_j {Q^r_{φ(i,j)}}^\top,
        \qquad H_o = \operatorname{softmax}\Big(\frac{A}{\sqrt{3d}}\Big) V_c,

    with ``φ(i, j) = clip(bucket(i - j) + k, 0, 2k - 1)`` indexing tables of
    ``2k`` rows: i.e. ``Kʳ[m] = K_r[φ(-δ_m)]`` over the relative layout. The
    c2p term is ``rel_shift(q Kʳᵀ)``; the p2c term is the transpose of
    ``rel_shift(k flip(Qʳ)ᵀ, Lq)``, no ``(Lq, Lk, d)`` gather.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import disentangled_attention
    >>> q = k = v = xp.ones((2, 4))
    >>> table = xp.zeros((3, 4))                       # W = Lq + Lk - 1
    >>> disentangled_attention(q, k, v, table, table)
    array([[1., 1., 1., 1.],
           [1., 1., 1., 1.]])
    """
    terms = 1 + (position_table is not None) + (query_position_table is not None)
    return core.attention(
        problem.check(
            q, k, v, position_table=position_table, query_position_table=query_position_table,
            relative_bias=relative_bias, bias=bias, mask=mask, causal=causal, scale=scale,
            block_size=block_size, default_scale=lambda d: (terms * d) ** -0.5,
            positions=positions, segment_ids=segment_ids, score_mod=score_mod,
            mask_mod=mask_mod,
        )
    )  # fmt: skip
