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
check their arguments, turn their paper's parameters into these terms and call
:func:`attention`. It runs them densely (the whole ``(Lq, Lk)`` scores, the
backend's fused kernel where one fits) or blockwise (:mod:`relattn.blocks`).

Each relative input is in the full layout (width ``Lq + Lk - 1``) or the causal
layout (width ``Lk``, ``δ <= 0`` only, the prefix of the full one). A causal
layout or ``causal=True`` masks ``δ > 0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import array_api_compat
import array_api_extra as xpx

from . import _checks
from .backends import backend_for
from .shift import shift

__all__ = ["Relative", "attend", "attend_generic", "attention", "relative_term", "softmax"]

NEGATIVE_INFINITY = -math.inf


# -------------------------------------------------------------------------------------------
# Softmax and plain attention
# -------------------------------------------------------------------------------------------
def softmax(scores: Any, mask: Any, axis: int, xp: Any) -> Any:
    """Masked softmax over ``axis`` without argument checks; fully masked rows are 0."""
    if math.prod(scores.shape) == 0:
        return scores  # nothing to normalise (Dask cannot reduce empty chunks either)
    device = array_api_compat.device(scores)
    if mask is not None:
        # -inf, not the dtype's lowest value: exp gives exactly 0 for masked keys,
        # with no overflow in ``scores - peak`` even in float16.
        scores = xp.where(mask, scores, xp.full((), -math.inf, dtype=scores.dtype, device=device))
    peak = xp.max(scores, axis=axis, keepdims=True)
    # A row with no finite score (fully masked, or a -inf bias) would give
    # inf - inf; shift it by 0 instead, so its weights are exp(-inf) = 0.
    peak = xp.where(xp.isfinite(peak), peak, xp.zeros((), dtype=scores.dtype, device=device))
    weights = xp.exp(scores - peak)
    total = xp.sum(weights, axis=axis, keepdims=True)
    # A fully masked row sums to 0: divide by 1 so it stays 0, never 0/0.
    return weights / xp.where(total > 0, total, xp.ones_like(total))


def attend(q: Any, k: Any, v: Any, bias: Any, mask: Any, scale: Any, xp: Any) -> Any:
    """``softmax(q kᵀ · scale + bias, mask) v`` on inputs already checked and cast.

    The backend's fused kernel runs it where there is one and the inputs fit
    (:attr:`relattn.backends.Backend.fused_attention`); :func:`attend_generic`
    is the reference it is tested against. Empty axes always take the generic
    path, which gives the empty or zero result of SPEC §1 on every backend.
    """
    fused = backend_for(xp).fused_attention
    if fused is not None and all(n > 0 for n in (*q.shape, *k.shape, *v.shape)):
        out = fused(q, k, v, bias=bias, mask=mask, scale=scale)
        if out is not None:
            return out
    return attend_generic(q, k, v, bias, mask, scale, xp)


def attend_generic(q: Any, k: Any, v: Any, bias: Any, mask: Any, scale: Any, xp: Any) -> Any:
    """:func:`attend` in array-API calls only."""
    return softmax(scores(q, k, bias, scale, xp), mask, -1, xp) @ v


def scores(q: Any, k: Any, bias: Any, scale: Any, xp: Any) -> Any:
    """``q kᵀ · scale + bias``; scaling ``q``, not the scores, saves a pass over ``(Lq, Lk)``."""
    out = (q * scale) @ xp.matrix_transpose(k)
    return out if bias is None else out + bias


# -------------------------------------------------------------------------------------------
# Argument checks shared by the attention functions
# -------------------------------------------------------------------------------------------
def check_qkv(q: Any, k: Any, v: Any) -> tuple[int, int, int]:
    """``q (..., Lq, d)``, ``k (..., Lk, d)``, ``v (..., Lk, d_v)``; return ``Lq, Lk, d``."""
    _checks.query_key(q, k)
    _checks.ndim("v", v, 2, "(..., Lk, d_v)")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v must have one row per key, Lk = {k.shape[-2]}, got v of shape {tuple(v.shape)}"
        )
    return q.shape[-2], k.shape[-2], q.shape[-1]


def check_mask(mask: Any, scores_shape: tuple[int, ...], xp: Any) -> None:
    """``mask`` is boolean and broadcasts to the scores ``(..., Lq, Lk)``."""
    if mask is not None:
        _checks.boolean("mask", mask, xp)
        _checks.broadcastable("mask", mask.shape, scores_shape, "the scores (..., Lq, Lk)")


def check_bias(bias: Any, scores_shape: tuple[int, ...]) -> None:
    if bias is not None:
        _checks.broadcastable("bias", bias.shape, scores_shape, "the scores (..., Lq, Lk)")


def relative_width(name: str, width: int, lq: int, lk: int) -> int:
    """``width`` is ``Lk`` (causal layout) or ``Lq + Lk - 1`` (full layout)."""
    if width not in (lk, lq + lk - 1):
        raise ValueError(
            f"{name} must have W = Lk = {lk} rows (causal layout) or W = Lq + Lk - 1 = "
            f"{lq + lk - 1} rows (full layout), got W = {width}"
        )
    return width


def check_table(name: str, table: Any, lq: int, lk: int, d: int, feature: str = "d") -> int:
    """``table`` is ``(..., W, d)`` in the causal or full layout; return ``W``."""
    _checks.ndim(name, table, 2, f"(..., W, {feature})")
    width, table_d = table.shape[-2:]
    relative_width(name, width, lq, lk)
    if table_d != d:
        what = "the feature size of q" if feature == "d" else "the feature size of v"
        raise ValueError(
            f"{name} must have {what}, {feature} = {d}, got shape {tuple(table.shape)}"
        )
    return width


def check_relative_bias(
    relative_bias: Any, lq: int, lk: int, scores_shape: tuple[int, ...]
) -> None:
    """``relative_bias (..., W)``: one value per distance; leading dims broadcast to the scores'."""
    if relative_bias is None:
        return
    _checks.ndim("relative_bias", relative_bias, 1, "(..., W)")
    relative_width("relative_bias", relative_bias.shape[-1], lq, lk)
    lead = tuple(relative_bias.shape[:-1])
    _checks.broadcastable(
        "relative_bias", (*lead, 1, 1), (*scores_shape[:-2], 1, 1), "(..., W) with leading dims"
    )


def check_options(
    xp: Any,
    scores_shape: tuple[int, ...],
    d: int,
    *,
    mask: Any,
    bias: Any,
    relative_bias: Any,
    causal: Any,
    scale: Any,
    block_size: Any,
) -> tuple[Any, bool, int | None]:
    """The keywords every attention function shares; return ``(scale, causal, block_size)``."""
    lq, lk = scores_shape[-2:]
    check_mask(mask, scores_shape, xp)
    check_bias(bias, scores_shape)
    check_relative_bias(relative_bias, lq, lk, scores_shape)
    causal = _checks.flag("causal", causal)
    scale = _checks.scale(scale, d, xp)
    if block_size is not None:
        block_size = _checks.length("block_size", block_size)
    return scale, causal, block_size


# -------------------------------------------------------------------------------------------
# The relative terms of one block
# -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Relative:
    """The per-distance terms of one problem, checked and cast.

    ``key_table`` ``Kʳ (..., W, d)``, ``query_table`` ``Qʳ (..., W, d)``,
    ``relative_bias`` ``b (..., W)``; each in the full or causal layout, or
    ``None``. ``lq``, ``lk``: the whole problem's lengths. ``causal``: ``δ > 0``
    is masked (the flag, or a table in the causal layout).
    """

    lq: int
    lk: int
    causal: bool
    key_table: Any = None
    query_table: Any = None
    relative_bias: Any = None

    @property
    def empty(self) -> bool:
        return self.key_table is None and self.query_table is None and self.relative_bias is None

    @property
    def masks_itself(self) -> bool:
        """A causal term whose absent cells are filled with ``-inf`` carries the causal mask."""
        return self.causal and (self.key_table is not None or self.relative_bias is not None)


def relative_term(
    rel: Relative,
    qp: Any,
    ks: Any,
    block: tuple[int, int, int, int],
    xp: Any,
    *,
    fill: float = NEGATIVE_INFINITY,
) -> Any:
    """The relative scores of the query block ``[i0, i0 + bq)`` and key block ``[j0, j0 + bk)``.

    ``block = (i0, bq, j0, bk)``. ``qp (..., bq, d)`` are the block's position
    queries ``(q + v) · scale`` (read when there is a ``key_table``) and
    ``ks (..., bk, d)`` its keys times ``scale`` (read when there is a
    ``query_table``). The block's distances are the ``bq + bk - 1`` columns of
    the relative layout from ``m0 = j0 - i0 - (bq - 1) + Lq - 1``: each term is
    the shift of Transformer-XL's appendix B on that slice. In a causal problem
    the slice stops at column ``Lk - 1`` (``δ = 0``) and the shift fills the
    absent ``δ > 0`` cells with ``fill`` (``-inf``: the term is then the causal
    mask too). ``None`` when the problem has no relative term.
    """
    if rel.empty:
        return None
    i0, bq, j0, bk = block
    width = bq + bk - 1
    m0 = j0 - i0 - (bq - 1) + rel.lq - 1
    stop = min(m0 + width, rel.lk if rel.causal else rel.lq + rel.lk - 1)
    terms = []
    if rel.key_table is not None:
        table = rel.key_table[..., m0:stop, :]
        terms.append(shift(qp @ xp.matrix_transpose(table), bk, xp, fill=fill))
    if rel.relative_bias is not None:
        values = rel.relative_bias[..., m0:stop]
        values = xp.broadcast_to(values[..., None, :], (*values.shape[:-1], bq, values.shape[-1]))
        terms.append(shift(values, bk, xp, fill=fill))
    if rel.query_table is not None:
        # p2c[i, j] = k_j · Qʳ[m(i, j)]: the keys play the queries' part in a problem of
        # bk "queries" and bq "keys", over the flipped slice (SPEC §2.12).
        table = rel.query_table[..., m0 : min(m0 + width, rel.query_table.shape[-2]), :]
        if table.shape[-2] < width:
            # Causal layout: the δ > 0 rows are absent and their cells masked; zeros stand in.
            rows = [(0, 0)] * (table.ndim - 2) + [(0, width - table.shape[-2]), (0, 0)]
            table = xpx.pad(table, rows, xp=xp)
        flipped = xp.flip(table, axis=-2)
        terms.append(xp.matrix_transpose(shift(ks @ xp.matrix_transpose(flipped), bq, xp)))
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


# -------------------------------------------------------------------------------------------
# The core
# -------------------------------------------------------------------------------------------
def attention(
    q: Any,
    k: Any,
    v: Any,
    xp: Any,
    *,
    scale: Any,
    content_bias: Any = None,
    position_bias: Any = None,
    key_table: Any = None,
    query_table: Any = None,
    value_table: Any = None,
    relative_bias: Any = None,
    bias: Any = None,
    mask: Any = None,
    causal: bool = False,
    block_size: int | None = None,
) -> Any:
    """Relative attention with every term of the module docstring, on checked, cast inputs.

    ``key_table`` is paired with ``position_bias``, ``content_bias`` with the
    content term. Tables and ``relative_bias`` are in the full or causal layout
    (a causal layout implies ``causal``); ``value_table (..., W, d_v)`` likewise.
    """
    lq, lk = q.shape[-2], k.shape[-2]
    full = lq + lk - 1
    layouts = [t.shape[-2] for t in (key_table, query_table, value_table) if t is not None]
    if relative_bias is not None:
        layouts.append(relative_bias.shape[-1])
    causal = causal or any(w != full for w in layouts)
    rel = Relative(lq, lk, causal, key_table, query_table, relative_bias)

    if content_bias is not None:
        q_content = q + content_bias
    else:
        q_content = q
    qp = None
    if key_table is not None:
        qp = (q if position_bias is None else q + position_bias) * scale
    ks = k * scale if query_table is not None else k

    if block_size is not None and lq > 0 and lk > 0:
        from .blocks import blockwise

        return blockwise(
            q_content, k, v, rel, qp, ks, xp, scale=scale, value_table=value_table,
            bias=bias, mask=mask, block_size=block_size,
        )  # fmt: skip

    if causal and (not rel.masks_itself or lq > lk):
        # Without a -inf-filled term the causal mask is a boolean one; with Lq > Lk the
        # first Lq - Lk queries have no key at all, and the mask keeps their rows zero
        # whatever a fused kernel makes of a row of -inf.
        from .masks import causal_mask

        blocked = causal_mask(lq, lk, xp=xp, device=array_api_compat.device(q))
        mask = blocked if mask is None else mask & blocked
    position = relative_term(rel, qp, ks, (0, lq, 0, lk), xp)
    if bias is not None:
        position = bias if position is None else position + bias
    if value_table is None:
        return attend(q_content, k, v, position, mask, scale, xp)
    weights = softmax(scores(q_content, k, position, scale, xp), mask, -1, xp)
    return weights @ v + value_term(weights, value_table, xp)


def value_term(weights: Any, value_table: Any, xp: Any) -> Any:
    """``Σ_j α_ij Vʳ[m(i, j)] = rel_unshift(α) Vʳ`` (Shaw et al. 2018, eq. (3)).

    A causal-layout table (width ``Lk``) meets the first ``Lk`` columns of
    ``rel_unshift(α)``: the others belong to ``δ > 0``, whose weights are 0.
    """
    from .shift import unshift

    spread = unshift(weights, xp)
    width = value_table.shape[-2]
    if width != spread.shape[-1]:
        spread = spread[..., :width]
    return spread @ value_table
