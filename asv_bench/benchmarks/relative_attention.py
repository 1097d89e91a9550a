"""relattn.relative_attention: Transformer-XL scores, causal layout with memory and full layout.

``q (B, H, Lq, d)``, ``k, v (B, H, 2·Lq, d)`` (a memory as long as the
segment), a per-head table ``(H, W, d)`` and per-head biases ``u``, ``v``.
``layout="causal"``: ``W = Lk``, keys with ``δ > 0`` masked (Transformer-XL);
``"full"``: ``W = Lq + Lk - 1``, no mask (XLNet, Conformer).
"""

from __future__ import annotations

import functools

import numpy as np

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


#: Cached keys of a decode step (``Lq = 1``) and of a chunk of prefill (``Lq = 256``).
CACHE_LENGTHS = (8192,) if common.QUICK else (8192, 65536)
STEP_LENGTHS = (1, 256)


class _Decode(common._Topic):
    """A decode step or a chunk of prefill against a cache: Transformer-XL terms (causal
    layout, per-head table, ``u``, ``v``), B = 1, H = 8, d = 64, float32."""

    param_names = ["backend", "query_length", "key_length"]
    params = [common.BACKENDS, STEP_LENGTHS, CACHE_LENGTHS]

    def inputs(self, backend, query_length, key_length):
        rng = np.random.default_rng(3)
        shapes = {"q": (1, 8, query_length, 64), "k": (1, 8, key_length, 64),
                  "v": (1, 8, key_length, 64), "position_table": (8, key_length, 64),
                  "content_bias": (8, 1, 64), "position_bias": (8, 1, 64)}  # fmt: skip
        arrays = {name: common.normal(rng, *shape) for name, shape in shapes.items()}
        return {name: common.asarray(backend, a) for name, a in arrays.items()}

    def call(self, backend, arrays, query_length, key_length):
        q, k, v, table, u, pos = (arrays[name] for name in common.RELATIVE_NAMES)
        fn = common.relattn_function("relative_attention", backend)
        return functools.partial(fn, q, k, v, table, content_bias=u, position_bias=pos)


class Decode(_Decode, common._Speed):
    """Speed and host peak memory of a decode step and of chunked prefill."""
