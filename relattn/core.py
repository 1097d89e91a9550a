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
from typing import Any

import array_api_compat

from . import _checks
from .backends import backend_for
from .blocks import Blocks, Relative, blockwise, dense_in_query_blocks, problem, relative_term
from .shift import unshift

__all__ = ["attend", "attend_generic", "attention", "softmax"]


# -------------------------------------------------------------------------------------------
# Softmax and plain attention
# -------------------------------------------------------------------------------------------
def softmax(scores: Any, mask: Any, axis: int, xp: Any) -> Any:
    """Masked softmax over ``axis`` without argument checks; fully masked rows are 0.

    ``scores`` is released as soon as it has been read: a caller that passes a
    temporary holds at most two score-sized arrays at once here.
    """
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
    shifted = scores - peak
    del scores
    weights = xp.exp(shifted)
    del shifted
    total = xp.sum(weights, axis=axis, keepdims=True)
    # A fully masked row sums to 0: divide by 1 so it stays 0, never 0/0.
    return weights / xp.where(total > 0, total, xp.ones_like(total))


def fused_kernel(q: Any, k: Any, v: Any, xp: Any) -> Any:
    """The backend's attention kernel for these inputs, or ``None`` (generic path).

    Empty axes always take the generic path, which gives the empty or zero
    result (relattn's conventions: no key gives a zero row) on every backend.
    """
    offer = backend_for(xp).fused_attention
    if offer is None or not all(n > 0 for n in (*q.shape, *k.shape, *v.shape)):
        return None
    return offer(q, k, v)


def attend(q: Any, k: Any, v: Any, bias: Any, mask: Any, scale: Any, xp: Any) -> Any:
    """``softmax(q kᵀ · scale + bias, mask) v`` on inputs already checked and cast.

    The backend's fused kernel runs it where there is one and the inputs fit
    (:attr:`relattn.backends.Backend.fused_attention`); :func:`attend_generic`
    is the reference it is tested against.
    """
    kernel = fused_kernel(q, k, v, xp)
    if kernel is not None:
        return kernel(bias=bias, mask=mask, scale=scale)
    return attend_generic(q, k, v, bias, mask, scale, xp)


def attend_generic(q: Any, k: Any, v: Any, bias: Any, mask: Any, scale: Any, xp: Any) -> Any:
    """:func:`attend` in array-API calls only."""
    return softmax(scores(q, k, bias, scale, xp), mask, -1, xp) @ v


def scores(q: Any, k: Any, bias: Any, scale: Any, xp: Any) -> Any:
    """``q kᵀ · scale + bias``; scaling ``q``, not the scores, saves a pass over ``(Lq, Lk)``.

    One expression, so that libraries that reuse temporaries (NumPy) add the
    bias in the product's buffer.
    """
    if not (isinstance(scale, float) and scale == 1.0):
        q = q * scale
    if bias is None:
        return q @ xp.matrix_transpose(k)
    return q @ xp.matrix_transpose(k) + bias


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
) -> tuple[Any, bool, tuple[int, int] | None]:
    """The keywords every attention function shares; return ``(scale, causal, block_size)``."""
    lq, lk = scores_shape[-2:]
    check_mask(mask, scores_shape, xp)
    check_bias(bias, scores_shape)
    check_relative_bias(relative_bias, lq, lk, scores_shape)
    causal = _checks.flag("causal", causal)
    scale = _checks.scale(scale, d, xp)
    return scale, causal, check_block_size(block_size)


def check_block_size(block_size: Any) -> tuple[int, int] | None:
    """``None``, or ``(query_block, key_block)`` from an integer or a pair of integers."""
    if block_size is None:
        return None
    if isinstance(block_size, (tuple, list)):
        if len(block_size) != 2:
            raise ValueError(
                "block_size must be an integer or a pair (query block, key block),"
                f" got a {type(block_size).__name__} of {len(block_size)}"
            )
        return (
            _checks.length("block_size[0]", block_size[0]),
            _checks.length("block_size[1]", block_size[1]),
        )
    size = _checks.length("block_size", block_size)
    return size, size


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
    block_size: tuple[int, int] | None = None,
) -> Any:
    """Relative attention with every term of the module docstring, on checked, cast inputs.

    ``key_table`` is paired with ``position_bias``, ``content_bias`` with the
    content term. Tables and ``relative_bias`` are in the full or causal layout
    (a causal layout implies ``causal``); ``value_table (..., W, d_v)`` likewise.
    """
    lq, lk = q.shape[-2], k.shape[-2]
    blocks = problem(
        q, k, v, xp, scale=scale, lq=lq, lk=lk, content_bias=content_bias,
        position_bias=position_bias, key_table=key_table, query_table=query_table,
        value_table=value_table, relative_bias=relative_bias, bias=bias, mask=mask,
        causal=causal,
    )  # fmt: skip
    dtype = xp.result_type(q, v)
    # ``blocks.q`` is already scaled: the kernel and the scores below scale by 1.
    kernel = fused_kernel(blocks.q, k, v, xp) if value_table is None else None
    terms = (key_table, query_table, value_table, relative_bias)
    backend = backend_for(xp)
    blockable = backend.takes_blockwise(q)
    if block_size is not None and not blockable:
        raise TypeError(
            f"block_size: the blockwise path does not run on {type(q).__name__} arrays;"
            f" pass block_size=None, got {block_size}"
        )
    if block_size is None and blockable and (any(t is not None for t in terms) or kernel is None):
        # A fused kernel computes the scores in tiles of its own, faster than relattn's
        # loop: without a relative term it keeps the call whatever the length.
        block_size = automatic_block_size(q, k, v, xp)
    # Empty axes take the whole-array path: an empty result, or zero rows where no key is.
    nonempty = all(n > 0 for n in (*q.shape, *k.shape, *v.shape))
    if block_size is not None and nonempty:
        return blockwise(blocks, xp, block_size=block_size, dtype=dtype)
    if kernel is not None:
        # Built where it is consumed: no local holds the (Lq, W) buffer of the term.
        mask = _causal(blocks.rel, mask, q, xp)
        return kernel(bias=_position(blocks, xp), mask=mask, scale=1.0)
    if backend.query_chunks and nonempty:
        return dense_in_query_blocks(blocks, xp, dtype=dtype)
    mask = _causal(blocks.rel, mask, q, xp)
    weights = softmax(scores(blocks.q, k, _position(blocks, xp), 1.0, xp), mask, -1, xp)
    if value_table is None:
        return weights @ v
    return weights @ v + value_term(weights, value_table, xp)


def _causal(rel: Relative, mask: Any, q: Any, xp: Any) -> Any:
    """``mask`` with the causal mask where the position term does not carry it.

    Without a ``-inf``-filled term the causal mask is a boolean one; with
    ``Lq > Lk`` the first ``Lq - Lk`` queries have no key at all, and the mask
    keeps their rows zero whatever a fused kernel makes of a row of ``-inf``.
    """
    if not rel.causal or (rel.masks_itself and rel.lq <= rel.lk):
        return mask
    from .masks import causal_mask

    blocked = causal_mask(rel.lq, rel.lk, xp=xp, device=array_api_compat.device(q))
    return blocked if mask is None else mask & blocked


def _position(blocks: Blocks, xp: Any) -> Any:
    """The whole problem's relative term plus its ``bias`` (either may be absent: ``None``)."""
    rel = blocks.rel
    position = relative_term(rel, blocks.qp, blocks.ks, (0, rel.lq, 0, rel.lk), xp)
    if blocks.bias is None:
        return position
    return blocks.bias if position is None else position + blocks.bias


#: Default budget of one ``(..., Lq, Lk)`` score array: beyond it, blockwise. Measured
#: on a 2-core CPU (causal Transformer-XL attention, H = 8, float32), the blockwise path
#: is the faster from L = 1024 (32 MiB of scores) on NumPy, PyTorch and JAX, and the
#: slower at L = 512 (8 MiB) on PyTorch and JAX: ``asv_bench/long_sequences.py speed``.
MAX_SCORE_BYTES = 1 << 24
#: Query and key block sizes of the automatic blockwise path. Query blocks half as long
#: as key blocks: a block pair's position term has ``bq + bk - 1`` columns, so it costs
#: ``(bq + bk - 1) / bk`` times the content term (about 1.5 here, 2 with square blocks).
AUTOMATIC_BLOCK_SIZE = (256, 512)


def automatic_block_size(q: Any, k: Any, v: Any, xp: Any) -> tuple[int, int] | None:
    """``None`` (dense) while one score array fits the budget, else :data:`AUTOMATIC_BLOCK_SIZE`.

    The budget is ``RELATTN_MAX_SCORE_BYTES`` (bytes) when set, else
    :data:`MAX_SCORE_BYTES`. The dense path holds about three such arrays.
    """
    import os

    budget = os.environ.get("RELATTN_MAX_SCORE_BYTES")
    limit = MAX_SCORE_BYTES if budget is None else int(budget)
    lead = [max(a, b, c) for a, b, c in zip(*_padded_leads(q, k, v), strict=True)]
    count = math.prod(lead) * q.shape[-2] * k.shape[-2]
    return None if count * xp.finfo(q.dtype).bits // 8 <= limit else AUTOMATIC_BLOCK_SIZE


def _padded_leads(*arrays: Any) -> list[tuple[int, ...]]:
    ndim = max(a.ndim for a in arrays) - 2
    return [(1,) * (ndim - (a.ndim - 2)) + tuple(a.shape[:-2]) for a in arrays]


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
