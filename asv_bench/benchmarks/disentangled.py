"""relattn.disentangled_attention: DeBERTa's c2c + c2p + p2c scores (He et al. 2021).

``q (B, H, Lq, d)``, ``k, v (B, H, 2·Lq, d)``, per-head position tables
``Kʳ``, ``Qʳ (H, W, d)`` in the full layout (``W = Lq + Lk - 1``), the default
scale ``1/√(3d)``, float32. There is no native baseline here.
"""

from __future__ import annotations

import functools

import numpy as np

from . import common


def disentangled_inputs(query_length: int) -> dict:
    """:func:`common.attention_inputs` plus ``Kʳ`` and ``Qʳ`` of the full layout."""
    arrays = common.attention_inputs(query_length)
    width = query_length + common.key_length(query_length) - 1
    rng = np.random.default_rng(8)
    arrays["position_table"] = common.normal(rng, common.HEADS, width, common.D_HEAD)
    arrays["query_position_table"] = common.normal(rng, common.HEADS, width, common.D_HEAD)
    return arrays


class DisentangledAttention(common._Speed):
    """Speed and host peak memory of relattn on every backend."""

    def inputs(self, backend, query_length):
        common.require("disentangled_attention")
        return common.on(backend, disentangled_inputs(query_length))

    def call(self, backend, arrays, query_length):
        fn = common.relattn_function("disentangled_attention", backend)
        names = ("q", "k", "v", "position_table", "query_position_table")
        return functools.partial(fn, *(arrays[n] for n in names))
