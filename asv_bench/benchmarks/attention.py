"""relattn.scaled_dot_product_attention with a precomputed additive bias.

The floor any attention with a position term pays: ``softmax(q kᵀ/√d + B) v``
with ``B (Lq, Lk)`` given (a T5- or ALiBi-style bias, or Transformer-XL's
position term computed beforehand). The native baselines are the libraries'
fused kernels, ``torch.nn.functional.scaled_dot_product_attention`` and
``jax.nn.dot_product_attention``.
"""

from __future__ import annotations

import functools

from . import common, native


class _BiasedAttention(common._Topic):
    """relattn's attention and the library's fused kernel with the same bias."""

    def calls(self, backend, query_length, with_native):
        arrays = common.on(backend, common.bias_inputs(query_length))
        q, k, v, bias = (arrays[name] for name in ("q", "k", "v", "bias"))
        fn = native.relattn_function("scaled_dot_product_attention", backend)
        ours = functools.partial(fn, q, k, v, bias=bias)
        if not with_native:
            return ours, None
        baseline = native.native("scaled_dot_product_attention", backend)
        return ours, functools.partial(baseline, q, k, v, bias)


class ScaledDotProductAttention(_BiasedAttention, common._Speed):
    """Speed and host peak memory of relattn on every backend."""


class ScaledDotProductAttentionVsNative(_BiasedAttention, common._VsNative):
    """relattn against the library's fused attention with the same bias."""


class ScaledDotProductAttentionGPUMemory(_BiasedAttention, common._GPUMemory):
    """Peak device memory of one call, relattn and the fused kernel (GPU backends only)."""
