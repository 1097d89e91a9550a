"""relattn.multi_dimensional_attention: DiSAN's feature-wise token2token attention.

``h (B, L, d)`` with ``B = 2``, ``d = 64`` (:data:`common.DISAN_FEATURES`),
``L = Lq``, the forward mask, no fusion gate. The logits are ``O(B·L²·d)``,
computed in query chunks; L = 2048 is skipped on CPU backends (see
:data:`common.DISAN_FEATURES`). There is no native baseline: no library ships
this attention.
"""

from __future__ import annotations

import functools

import numpy as np

from . import common


def _inputs(query_length: int) -> dict:
    d = common.DISAN_FEATURES
    rng = np.random.default_rng(5)
    return {
        "h": common.normal(rng, common.BATCH, query_length, d),
        "query_weight": common.normal(rng, d, d) / np.float32(np.sqrt(d)),
        "key_weight": common.normal(rng, d, d) / np.float32(np.sqrt(d)),
        "bias": np.zeros(d, dtype=np.float32),
    }


def _forward(h, query_weight, key_weight, bias):
    from relattn import multi_dimensional_attention

    return multi_dimensional_attention(h, query_weight, key_weight, bias, direction="forward")


class MultiDimensionalAttention(common._Speed):
    """Speed and host peak memory of relattn on every backend (no native baseline)."""

    def inputs(self, backend, query_length):
        common.skip_on_cpu_from(backend.name, query_length, 2048)
        return common.on(backend, _inputs(query_length))

    def call(self, backend, arrays, query_length):
        return functools.partial(backend.default_jit(_forward), **arrays)
