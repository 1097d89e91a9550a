"""relattn.relative_attention: Transformer-XL scores, causal layout with memory and full layout.

``q (B, H, Lq, d)``, ``k, v (B, H, 2·Lq, d)`` (a memory as long as the
segment), a per-head table ``(H, W, d)`` and per-head biases ``u``, ``v``.
``layout="causal"``: ``W = Lk``, keys with ``δ > 0`` masked (Transformer-XL);
``"full"``: ``W = Lq + Lk - 1``, no mask (XLNet, Conformer).
"""

from __future__ import annotations

import functools

from . import common

LAYOUTS = ("causal", "full")


class _RelativeAttention(common._Topic):
    """relattn's relative attention (the baseline adds Transformer-XL's) on the same arrays."""

    param_names = ["backend", "query_length", "layout"]

    def inputs(self, backend, query_length, layout):
        return common.on(backend, common.relative_inputs(query_length, layout))

    def call(self, backend, arrays, query_length, layout):
        q, k, v, table, u, pos = (arrays[name] for name in common.RELATIVE_NAMES)
        fn = common.relattn_function("relative_attention", backend)
        return functools.partial(fn, q, k, v, table, content_bias=u, position_bias=pos)


class RelativeAttention(_RelativeAttention, common._Speed):
    """Speed and host peak memory of relattn on every backend."""

    params = [common.BACKENDS, common.QUERY_LENGTHS, LAYOUTS]


class RelativeAttentionGPUMemory(_RelativeAttention, common._GPUMemory):
    """Peak device memory of relattn's call (GPU backends only)."""

    params = [common.GPU_BACKENDS, common.QUERY_LENGTHS, LAYOUTS]
