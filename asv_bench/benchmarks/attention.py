"""relattn.scaled_dot_product_attention with a precomputed additive bias.

The floor any attention with a position term pays: ``softmax(q kᵀ/√d + B) v``
with ``B (Lq, Lk)`` given (a T5- or ALiBi-style bias, or Transformer-XL's
position term computed beforehand). The native baselines are the libraries'
fused kernels, ``torch.nn.functional.scaled_dot_product_attention`` and
``jax.nn.dot_product_attention``.
"""

from __future__ import annotations

from . import common, native


def _calls(backend: common.Backend, query_length: int, with_native: bool):
    arrays = common.on(backend, common.bias_inputs(query_length))
    q, k, v, bias = (arrays[name] for name in ("q", "k", "v", "bias"))
    fn = native.relattn_function("scaled_dot_product_attention", backend)

    def ours():
        return fn(q, k, v, bias=bias)

    theirs = None
    if with_native:
        baseline = native.native("scaled_dot_product_attention", backend)

        def theirs():
            return baseline(q, k, v, bias)

    return ours, theirs


class ScaledDotProductAttention:
    """Speed and host peak memory of relattn on every backend."""

    params = [common.BACKENDS, common.QUERY_LENGTHS]
    param_names = ["backend", "query_length"]
    timeout = 300

    def setup(self, backend, query_length):
        self.backend = common.get_backend(backend)
        self.ours, _ = _calls(self.backend, query_length, with_native=False)
        self.backend.ready(self.ours())

    def time_scaled_dot_product_attention(self, backend, query_length):
        self.backend.ready(self.ours())

    def peakmem_scaled_dot_product_attention(self, backend, query_length):
        self.backend.ready(self.ours())


class ScaledDotProductAttentionVsNative:
    """relattn against the library's fused attention with the same bias."""

    params = [common.BACKENDS, common.RATIO_LENGTHS]
    param_names = ["backend", "query_length"]
    timeout = 300

    def setup(self, backend, query_length):
        self.backend = common.get_backend(backend)
        native.check(backend)
        self.ours, self.theirs = _calls(self.backend, query_length, with_native=True)
        self.backend.ready(self.theirs())

    def time_native(self, backend, query_length):
        self.backend.ready(self.theirs())

    def track_ratio_to_native(self, backend, query_length):
        return common.median_ratio(self.ours, self.theirs, self.backend)[0]

    track_ratio_to_native.unit = "relattn/native"


class ScaledDotProductAttentionGPUMemory:
    """Peak device memory of one call, relattn and the fused kernel (GPU backends only)."""

    params = [common.GPU_BACKENDS, common.QUERY_LENGTHS]
    param_names = ["backend", "query_length"]
    timeout = 300

    def setup(self, backend, query_length):
        self.backend = common.get_backend(backend)
        self.ours, self.theirs = _calls(self.backend, query_length, with_native=True)
        self.backend.ready(self.ours())
        self.backend.ready(self.theirs())

    def track_gpu_peak_bytes(self, backend, query_length):
        return self.backend.gpu_peak_bytes(self.ours)

    track_gpu_peak_bytes.unit = "bytes"

    def track_native_gpu_peak_bytes(self, backend, query_length):
        return self.backend.gpu_peak_bytes(self.theirs)

    track_native_gpu_peak_bytes.unit = "bytes"
