"""T5's relative attention bias (Raffel et al. 2020, §2.1), encoder and decoder.

T5 adds no position to the tokens: every head adds to the logit of query ``i``
and key ``j`` a learned scalar ``b_h[bucket(δ)]``, ``δ = j - i`` (key minus
query), from a ``(num_buckets, H)`` table shared by the layers. The buckets
(Mesh TensorFlow's ``_relative_position_bucket``) are exact for small
distances and logarithmic up to ``max_distance``; the encoder's are
bidirectional, the decoder's self-attention is causal with unidirectional
buckets. T5 does not scale the logits (``scale=1``).

In relattn the bias is a vector per distance, never an ``(Lq, Lk)`` matrix:

1. ``relative_distances(Lq, Lk)``: the ``W = Lq + Lk - 1`` distances of the
   relative layout;
2. ``relative_position_bucket``: their buckets;
3. a gather from the table: ``values (H, W)``;
4. ``scaled_dot_product_attention(q, k, v, relative_bias=values, scale=1)``.

A decoder with a cache of ``n`` tokens has ``Lk = n + Lq`` keys; relattn
aligns the last query with the last key (``δ = j - (i + n)``), which is HF's
``compute_bias`` with ``cache_position = n + arange(Lq)``.

Run ``python examples/t5.py``: it checks itself against a per-pair loop.
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat
import numpy as np

import relattn

BATCH, LENGTH, CACHE, D_MODEL, HEADS = 2, 6, 4, 8, 2
NUM_BUCKETS, MAX_DISTANCE = 8, 12
LENGTHS = (6, 4)  # real tokens per encoder sequence


def inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """NumPy float64 parameters and inputs: projections, the bias table, sequences."""
    rng = np.random.default_rng(seed)

    def dense() -> np.ndarray:
        return rng.normal(scale=1 / math.sqrt(D_MODEL), size=(D_MODEL, D_MODEL))

    return {
        "x": rng.normal(size=(BATCH, LENGTH, D_MODEL)),
        "cache": rng.normal(size=(BATCH, CACHE, D_MODEL)),
        "w_q": dense(),
        "w_k": dense(),
        "w_v": dense(),
        "w_o": dense(),
        # One learned scalar per bucket and head: HF's relative_attention_bias.weight.
        "relative_table": rng.normal(size=(NUM_BUCKETS, HEADS)),
    }


def t5_relative_bias(
    table: Any, query_length: int, key_length: int, *, bidirectional: bool, max_distance: int
) -> Any:
    """``values (H, W)``: the table row of each distance's bucket, over the full layout."""
    xp = array_api_compat.array_namespace(table)
    device = array_api_compat.device(table)
    distances = relattn.relative_distances(query_length, key_length, xp=xp, device=device)
    buckets = relattn.relative_position_bucket(
        distances,
        num_buckets=table.shape[0],
        max_distance=max_distance,
        bidirectional=bidirectional,
    )
    return xp.matrix_transpose(xp.take(table, buckets, axis=0))


def t5_attention(
    x: Any,
    context: Any,
    p: dict[str, Any],
    *,
    bidirectional: bool,
    causal: bool = False,
    mask: Any = None,
    heads: int = HEADS,
    max_distance: int = MAX_DISTANCE,
) -> Any:
    """T5 multi-head attention of the queries of ``x`` over the keys of ``context``."""
    q = relattn.split_heads(x @ p["w_q"], heads)  # (B, H, Lq, d_head)
    k = relattn.split_heads(context @ p["w_k"], heads)  # (B, H, Lk, d_head)
    v = relattn.split_heads(context @ p["w_v"], heads)
    values = t5_relative_bias(
        p["relative_table"],
        x.shape[-2],
        context.shape[-2],
        bidirectional=bidirectional,
        max_distance=max_distance,
    )
    out = relattn.scaled_dot_product_attention(
        q, k, v, relative_bias=values, mask=mask, causal=causal, scale=1.0
    )
    return relattn.merge_heads(out) @ p["w_o"]


def encoder_self_attention(x: Any, p: dict[str, Any], lengths: Any) -> Any:
    """Bidirectional buckets, padding keys masked."""
    mask = relattn.padding_mask(lengths, x.shape[-2])[:, None, None, :]  # (B, 1, 1, L)
    return t5_attention(x, x, p, bidirectional=True, mask=mask)


def decoder_self_attention(x: Any, cache: Any, p: dict[str, Any]) -> Any:
    """Causal, unidirectional buckets, the new tokens after a cache (``Lk > Lq``)."""
    xp = array_api_compat.array_namespace(x, cache)
    context = xp.concat((cache, x), axis=-2)
    return t5_attention(x, context, p, bidirectional=False, causal=True)


# -- the per-pair check ------------------------------------------------------------------------


def bucket(delta: int, *, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """T5's bucket of one distance ``δ = key - query``, as Mesh TensorFlow computes it."""
    n = num_buckets // 2 if bidirectional else num_buckets
    offset = n if bidirectional and delta > 0 else 0
    a = abs(delta) if bidirectional else max(-delta, 0)
    exact = n // 2
    if a < exact:
        return offset + a
    large = exact + int(math.log(a / exact) / math.log(max_distance / exact) * (n - exact))
    return offset + min(large, n - 1)


def loop_reference(x, context, p, *, bidirectional, causal=False, key_mask=None, heads=HEADS):
    """The same layer with every logit written out per head, query and key."""
    lq, lk, d_head = x.shape[-2], context.shape[-2], D_MODEL // heads
    q, k, v = x @ p["w_q"], context @ p["w_k"], context @ p["w_v"]
    out = np.zeros(x.shape)
    for b in range(x.shape[0]):
        for h in range(heads):
            cols = slice(h * d_head, (h + 1) * d_head)
            for i in range(lq):
                logits, allowed = np.zeros(lk), np.ones(lk, bool)
                for j in range(lk):
                    delta = j - (i + lk - lq)
                    row = bucket(
                        delta,
                        bidirectional=bidirectional,
                        num_buckets=NUM_BUCKETS,
                        max_distance=MAX_DISTANCE,
                    )
                    logits[j] = q[b, i, cols] @ k[b, j, cols] + p["relative_table"][row, h]
                    allowed[j] = not (causal and delta > 0)
                    if key_mask is not None:
                        allowed[j] &= bool(key_mask[b, j])
                weights = np.where(allowed, np.exp(logits - logits[allowed].max()), 0.0)
                out[b, i, cols] = weights / weights.sum() @ v[b, :, cols]
    return out @ p["w_o"]


def main() -> float:
    p = inputs()
    lengths = np.asarray(LENGTHS)
    encoder = encoder_self_attention(p["x"], p, lengths)
    decoder = decoder_self_attention(p["x"], p["cache"], p)
    key_mask = np.arange(LENGTH)[None, :] < lengths[:, None]
    context = np.concatenate((p["cache"], p["x"]), axis=1)
    diffs = {
        "encoder": np.abs(encoder - loop_reference(p["x"], p["x"], p, bidirectional=True,
                                                   key_mask=key_mask)).max(),
        "decoder": np.abs(decoder - loop_reference(p["x"], context, p, bidirectional=False,
                                                   causal=True)).max(),
    }  # fmt: skip
    for name, diff in diffs.items():
        print(f"T5 {name}: max |relattn - per-pair loop| = {diff:.2e}")
    worst = max(diffs.values())
    assert worst < 1e-10, worst
    return worst


if __name__ == "__main__":
    main()
