"""Per-distance biases: T5 and ALiBi attention, ``relative_bias_matrix``, buckets.

- ``T5Attention``: ``Lq = Lk = L`` self-attention (``B = 2``, ``H = 8``,
  ``d = 64``, float32) with T5's bias, ``common.t5_attention``: the
  ``(32, H)`` table gathered at the bucket of each distance (``W = 2L - 1``
  values per head, buckets computed once), then
  ``scaled_dot_product_attention(q, k, v, relative_bias=values, scale=1)``.
  The native baseline (``baselines.py``) gathers a bucket per pair into an
  ``(H, L, L)`` bias for the library's fused attention.
- ``AlibiAttention``: ``Lk = 2·Lq`` (a memory), ALiBi's ``m_h·δ`` over the
  causal layout (``W = Lk``, keys with ``δ > 0`` masked) as ``relative_bias``.
- ``RelativeBiasMatrix``: ``relative_bias_matrix`` expanding ``(H, W)`` values to
  ``(H, Lq, Lk)``, full layout, ``Lk = 2·Lq``.
- ``RelativePositionBucket``: T5's buckets of every pair's distance,
  ``(Lq, Lk)`` integers (relattn's attention needs only the ``W`` distances;
  this measures the function on the size HF computes it for).
- ``AlibiSlopes``: ``alibi_slopes(8)``, the call's cost (see ``common._Constant``).
"""

from __future__ import annotations

import functools

import numpy as np

from . import common


class _T5(common._Topic):
    """relattn's T5 attention (the baseline adds the ``(H, L, L)`` bias) on the same arrays."""

    def inputs(self, backend, query_length):
        common.require("relative_position_bucket")
        return common.on(backend, common.t5_inputs(query_length))

    def call(self, backend, arrays, query_length):
        fn = backend.default_jit(common.t5_attention)
        return functools.partial(fn, *(arrays[n] for n in ("q", "k", "v", "table", "buckets")))


class T5Attention(_T5, common._Speed):
    """Speed and host peak memory of relattn on every backend (``Lq = Lk``)."""


class AlibiAttention(common._Speed):
    """Speed and host peak memory of relattn with ALiBi's bias (causal layout, a memory)."""

    def inputs(self, backend, query_length):
        common.require("alibi_slopes")
        from relattn import alibi_slopes, relative_distances

        lk = common.key_length(query_length)
        distances = relative_distances(query_length, lk, causal=True)  # (Lk,), δ <= 0
        values = alibi_slopes(common.HEADS)[:, None] * distances[None, :]
        arrays = common.attention_inputs(query_length)
        arrays["values"] = values.astype(np.float32)
        return common.on(backend, arrays)

    def call(self, backend, arrays, query_length):
        fn = common.relattn_function("scaled_dot_product_attention", backend)
        q, k, v, values = (arrays[n] for n in ("q", "k", "v", "values"))
        return functools.partial(fn, q, k, v, relative_bias=values)


class RelativeBiasMatrix(common._Speed):
    """``relative_bias_matrix``: ``(H, W)`` values to the ``(H, Lq, Lk)`` matrix, full layout."""

    timeout = 120

    def inputs(self, backend, query_length):
        common.require("relative_bias_matrix")
        lk = common.key_length(query_length)
        rng = np.random.default_rng(9)
        values = common.normal(rng, common.HEADS, query_length + lk - 1)
        return {"values": backend.asarray(values)}

    def call(self, backend, arrays, query_length):
        lk = common.key_length(query_length)
        fn = common.relattn_function(
            "relative_bias_matrix", backend, query_length=query_length, key_length=lk
        )
        return functools.partial(fn, arrays["values"])


class RelativePositionBucket(common._Speed):
    """``relative_position_bucket`` (32 buckets, max distance 128) of ``(Lq, Lk)`` distances."""

    timeout = 120

    def inputs(self, backend, query_length):
        common.require("relative_position_bucket")
        lk = common.key_length(query_length)
        distances = np.arange(lk)[None, :] - np.arange(lk - query_length, lk)[:, None]
        return {"distances": backend.asarray(distances.astype(np.int32))}

    def call(self, backend, arrays, query_length):
        fn = common.relattn_function(
            "relative_position_bucket",
            backend,
            num_buckets=common.T5_BUCKETS,
            max_distance=common.T5_MAX_DISTANCE,
        )
        return functools.partial(fn, arrays["distances"])


class AlibiSlopes(common._Constant):
    """``alibi_slopes(8)``, ALiBi's slope per head: a per-model constant."""

    function = "alibi_slopes"
    count = common.HEADS
