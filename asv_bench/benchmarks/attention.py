"""relattn.scaled_dot_product_attention with a precomputed additive bias.

The floor any attention with a position term pays: ``softmax(q kᵀ/√d + B) v``
with ``B (Lq, Lk)`` given (a T5- or ALiBi-style bias, or Transformer-XL's
position term computed beforehand). The native baselines are the libraries'
fused kernels, ``torch.nn.functional.scaled_dot_product_attention`` and
``jax.nn.dot_product_attention`` (in ``baselines.py``).
"""

from __future__ import annotations

import functools

from . import common


class _BiasedAttention(common._Topic):
    """relattn's attention with a precomputed bias (the baseline adds the fused kernel)."""

    def inputs(self, backend, query_length):
        return common.on(backend, common.bias_inputs(query_length))

    def call(self, backend, arrays, query_length):
        q, k, v, bias = (arrays[name] for name in ("q", "k", "v", "bias"))
        fn = common.relattn_function("scaled_dot_product_attention", backend)
        return functools.partial(fn, q, k, v, bias=bias)


class ScaledDotProductAttention(_BiasedAttention, common._Speed):
    """Speed and host peak memory of relattn on every backend."""


class ScaledDotProductAttentionGPUMemory(_BiasedAttention, common._GPUMemory):
    """Peak device memory of relattn's call (GPU backends only)."""
