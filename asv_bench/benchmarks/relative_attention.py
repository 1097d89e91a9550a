"""relattn.relative_attention: Transformer-XL scores, causal layout with memory and full layout.

``q (B, H, Lq, d)``, ``k, v (B, H, 2·Lq, d)`` (a memory as long as the
segment), a per-head table ``(H, W, d)`` and per-head biases ``u``, ``v``.
``layout="causal"``: ``W = Lk``, keys with ``δ > 0`` masked (Transformer-XL);
``"full"``: ``W = Lq + Lk - 1``, no mask (XLNet, Conformer).
"""

from __future__ import annotations

from . import common, native

LAYOUTS = ("causal", "full")


def _calls(backend: common.Backend, query_length: int, layout: str, with_native: bool):
    """``(relattn call, native call or None)``, both without arguments."""
    arrays = common.on(backend, common.relative_inputs(query_length, layout))
    q, k, v, table, u, pos = (arrays[name] for name in native.RELATIVE_NAMES)
    fn = native.relattn_function("relative_attention", backend)

    def ours():
        return fn(q, k, v, table, content_bias=u, position_bias=pos)

    theirs = None
    if with_native:
        baseline = native.native("relative_attention", backend)

        def theirs():
            return baseline(q, k, v, table, u, pos)

    return ours, theirs


class RelativeAttention:
    """Speed and host peak memory of relattn on every backend."""

    params = [common.BACKENDS, common.QUERY_LENGTHS, LAYOUTS]
    param_names = ["backend", "query_length", "layout"]
    timeout = 300

    def setup(self, backend, query_length, layout):
        self.backend = common.get_backend(backend)
        self.ours, _ = _calls(self.backend, query_length, layout, with_native=False)
        self.backend.ready(self.ours())  # compile (jax.jit) and touch the memory once

    def time_relative_attention(self, backend, query_length, layout):
        self.backend.ready(self.ours())

    def peakmem_relative_attention(self, backend, query_length, layout):
        self.backend.ready(self.ours())


class RelativeAttentionVsNative:
    """relattn against Transformer-XL's code in the library itself (pad-and-reshape shift)."""

    params = [common.BACKENDS, common.RATIO_LENGTHS, LAYOUTS]
    param_names = ["backend", "query_length", "layout"]
    timeout = 300

    def setup(self, backend, query_length, layout):
        self.backend = common.get_backend(backend)
        native.check(backend)  # NotImplementedError for Dask: no native code
        self.ours, self.theirs = _calls(self.backend, query_length, layout, with_native=True)
        self.backend.ready(self.theirs())

    def time_native(self, backend, query_length, layout):
        self.backend.ready(self.theirs())

    def track_ratio_to_native(self, backend, query_length, layout):
        """Median time of relattn over median time of the native code, side by side."""
        return common.median_ratio(self.ours, self.theirs, self.backend)[0]

    track_ratio_to_native.unit = "relattn/native"


class RelativeAttentionGPUMemory:
    """Peak device memory of one call, relattn and native (GPU backends only)."""

    params = [common.GPU_BACKENDS, common.QUERY_LENGTHS, LAYOUTS]
    param_names = ["backend", "query_length", "layout"]
    timeout = 300

    def setup(self, backend, query_length, layout):
        self.backend = common.get_backend(backend)
        self.ours, self.theirs = _calls(self.backend, query_length, layout, with_native=True)
        self.backend.ready(self.ours())
        self.backend.ready(self.theirs())

    def track_gpu_peak_bytes(self, backend, query_length, layout):
        return self.backend.gpu_peak_bytes(self.ours)

    track_gpu_peak_bytes.unit = "bytes"

    def track_native_gpu_peak_bytes(self, backend, query_length, layout):
        return self.backend.gpu_peak_bytes(self.theirs)

    track_native_gpu_peak_bytes.unit = "bytes"
