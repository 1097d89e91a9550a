"""relattn.relative_attention: Transformer-XL scores, causal layout with memory and full layout.

``q (B, H, Lq, d)``, ``k, v (B, H, 2·Lq, d)`` (a memory as long as the
segment), a per-head table ``(H, W, d)`` and per-head biases ``u``, ``v``.
``layout="causal"``: ``W = Lk``, keys with ``δ > 0`` masked (Transformer-XL);
``"full"``: ``W = Lq + Lk - 1``, no mask (XLNet, Conformer).
"""

from __future__ import annotations

import functools

from . import common, native

LAYOUTS = ("causal", "full")


class _RelativeAttention(common._Topic):
    """relattn's and Transformer-XL's relative attention on the same arrays."""

    param_names = ["backend", "query_length", "layout"]

    def calls(self, backend, query_length, layout, with_native):
        arrays = common.on(backend, common.relative_inputs(query_length, layout))
        q, k, v, table, u, pos = (arrays[name] for name in native.RELATIVE_NAMES)
        fn = native.relattn_function("relative_attention", backend)
        ours = functools.partial(fn, q, k, v, table, content_bias=u, position_bias=pos)
        if not with_native:
            return ours, None
        baseline = native.native("relative_attention", backend)
        return ours, functools.partial(baseline, q, k, v, table, u, pos)


class RelativeAttention(_RelativeAttention, common._Speed):
    """Speed and host peak memory of relattn on every backend."""

    params = [common.BACKENDS, common.QUERY_LENGTHS, LAYOUTS]


class RelativeAttentionVsNative(_RelativeAttention, common._VsNative):
    """relattn against Transformer-XL's code in the library itself (pad-and-reshape shift)."""

    params = [common.BACKENDS, common.RATIO_LENGTHS, LAYOUTS]


class RelativeAttentionGPUMemory(_RelativeAttention, common._GPUMemory):
    """Peak device memory of one call, relattn and native (GPU backends only)."""

    params = [common.GPU_BACKENDS, common.QUERY_LENGTHS, LAYOUTS]
