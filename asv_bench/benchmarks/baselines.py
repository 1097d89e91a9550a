"""Native baselines: the code of :mod:`native` timed beside relattn's calls.

Every benchmark here is named ``baselines.*``: the native code does not depend
on relattn, so comparing it across commits (``asv continuous``) measures the
machine, not relattn; ``asv continuous --bench '^(?!baselines\\.)'`` leaves
these out (see ``asv_bench/README.md``). They are for ``asv run`` on one
commit: ``time_native`` (the native call), ``track_ratio_to_native`` (relattn's
median time over the native code's, the two alternating in one process) and
``track_native_gpu_peak_bytes``, plus tensor2tensor's host memory.

Each class subclasses a topic's class (its inputs and relattn's call) and adds
:meth:`_Native.native_call`; ``setup`` first asserts that the two agree on
small inputs (:func:`native.check`). Dask has no native code and is skipped.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from . import attention, biases, blockwise, common, native, relative_attention, rotary, shaw, shift


class _Native(common._Topic):
    """A topic's relattn call and the same algorithm in the library's own API."""

    def native_call(self, backend: Any, arrays: dict, *params: Any) -> Any:
        """The native call on ``arrays`` (from ``inputs``), without arguments."""
        # TypeError, not NotImplementedError: asv would report the latter as a skip.
        raise TypeError(f"{type(self).__name__} does not define native_call()")

    def setup(self, backend: str, *params: Any) -> None:
        """:meth:`common._Topic.setup`, then ``self.theirs`` (the native call), run once."""
        native.check(backend)
        super().setup(backend, *params)
        self.theirs = self.native_call(self.backend, self.arrays, *params)
        common.ready(self.backend, self.theirs())


class _VsNative(_Native):
    """Time of the native call and relattn's time over it."""

    params = [common.BACKENDS, common.RATIO_LENGTHS]
    #: The unit of ``track_ratio_to_native``: asv looks for ``unit`` on the
    #: method and then on the class, so a topic can name its baseline here
    #: (``time_*`` benchmarks are in seconds whatever this says).
    unit = "relattn/native"

    def time_native(self, *params: Any) -> None:
        common.ready(self.backend, self.theirs())

    def track_ratio_to_native(self, *params: Any) -> float:
        """Median time of relattn over median time of the native code, side by side."""
        return common.median_ratio(self.ours, self.theirs, self.backend)[0]


class _NativeGPUMemory(_Native):
    """Peak device memory of the native call (GPU backends only)."""

    params = [common.GPU_BACKENDS, common.QUERY_LENGTHS]

    def track_native_gpu_peak_bytes(self, *params: Any) -> int:
        """Bytes the native call allocates on the device at its peak."""
        return common.peak_device_bytes(self.backend, self.theirs)

    track_native_gpu_peak_bytes.unit = "bytes"


# -- scaled_dot_product_attention: the libraries' fused kernels ------------


class _FusedAttention(attention._BiasedAttention, _Native):
    def native_call(self, backend, arrays, query_length):
        q, k, v, bias = (arrays[name] for name in ("q", "k", "v", "bias"))
        fn = native.native("scaled_dot_product_attention", backend)
        return functools.partial(fn, q, k, v, bias)


class ScaledDotProductAttentionVsNative(_FusedAttention, _VsNative):
    """relattn against the library's fused attention with the same bias."""


class ScaledDotProductAttentionNativeGPUMemory(_FusedAttention, _NativeGPUMemory):
    """Peak device memory of the fused kernel (GPU backends only)."""


# -- relative_attention: Transformer-XL's pad-and-reshape shift ------------


class _TransformerXL(relative_attention._RelativeAttention, _Native):
    def native_call(self, backend, arrays, query_length, layout):
        q, k, v, table, u, pos = (arrays[name] for name in common.RELATIVE_NAMES)
        fn = native.native("relative_attention", backend)
        return functools.partial(fn, q, k, v, table, u, pos)


class RelativeAttentionVsNative(_TransformerXL, _VsNative):
    """relattn against Transformer-XL's code in the library itself (pad-and-reshape shift)."""

    params = [common.BACKENDS, common.RATIO_LENGTHS, relative_attention.LAYOUTS]


class DecodeVsNative(relative_attention._Decode, _VsNative):
    """A decode step and chunked prefill against the same math written by hand: ``einsum``
    on JAX (under ``jax.jit``, ``matmul`` of a transposed ``k`` copies the whole cache),
    ``matmul`` elsewhere (the faster of the two there, ``asv_bench/compare.py``)."""

    params = relative_attention._Decode.params

    def native_call(self, backend, arrays, query_length, key_length):
        q, k, v, table, u, pos = (arrays[name] for name in common.RELATIVE_NAMES)
        way = "relative_attention_einsum" if backend.is_jax else "relative_attention"
        return functools.partial(native.native(way, backend), q, k, v, table, u, pos)


class RelativeAttentionNativeGPUMemory(_TransformerXL, _NativeGPUMemory):
    """Peak device memory of Transformer-XL's code (GPU backends only)."""

    params = [common.GPU_BACKENDS, common.QUERY_LENGTHS, relative_attention.LAYOUTS]


# -- rel_shift: Transformer-XL's _rel_shift ---------------------------------


class RelShiftVsNative(shift._RelShift, _VsNative):
    """relattn's flat-stride shift against Transformer-XL's pad-and-reshape ``_rel_shift``."""

    params = [common.BACKENDS, common.RATIO_LENGTHS, shift.LAYOUTS]

    def native_call(self, backend, arrays, query_length, layout):
        lk = common.key_length(query_length)
        return functools.partial(native.native("rel_shift", backend, key_length=lk), arrays["x"])


# -- shaw_attention: tensor2tensor's (Lq, Lk, d) tensors --------------------


class ShawVsMaterialised(shaw._Shaw, _VsNative):
    """relattn (shifted, O(W·d) tables) against tensor2tensor's (Lq, Lk, d) tensors.

    The native code is tensor2tensor's ``dot_product_attention_relative``:
    ``time_native`` and ``track_ratio_to_native`` time the materialised
    algorithm.
    """

    unit = "relattn/tensor2tensor"

    def native_call(self, backend, arrays, query_length):
        args = tuple(arrays[name] for name in shaw.NAMES)
        return functools.partial(native.native("shaw_attention", backend), *args)


class ShawMaterialisedHostMemory(shaw.ShawHostMemory):
    """Traced peak (MiB) of tensor2tensor's Shaw attention, as ``shaw.ShawHostMemory``."""

    params = [("materialised",), shaw.MEMORY_LENGTHS]


# -- rotary_position_embedding: HF's rotate_half ------------------------------


class RotaryVsNative(rotary._Rotary, _VsNative):
    """relattn's RoPE of ``q`` and ``k`` against HF's ``apply_rotary_pos_emb`` (``rotate_half``).

    The native call is given the ``cos``/``sin (L, d)`` tables, computed once
    in ``setup`` as HF's model computes them once per forward pass; relattn
    forms its angles in every call.
    """

    unit = "relattn/rotate_half"

    def native_call(self, backend, arrays, query_length):
        cos, sin = native.rotary_tables(backend, query_length)
        fn = native.native("rotary_position_embedding", backend)
        return functools.partial(fn, arrays["q"], arrays["k"], cos, sin)


# -- T5's bias: materialised (H, L, L), then the fused kernels ----------------


class T5AttentionVsNative(biases._T5, _VsNative):
    """relattn (``W·H`` values, ``relative_bias=``) against HF T5's ``(H, L, L)`` bias + SDPA.

    Both calls gather the ``(32, H)`` table at precomputed bucket indices: relattn
    at the ``2L - 1`` distances, the native code at the ``L²`` pairs
    (``native.t5_pair_buckets``), then ``F.scaled_dot_product_attention`` with
    ``attn_mask=bias``, ``jax.nn.dot_product_attention`` with ``bias``, or NumPy.
    """

    unit = "relattn/materialised"

    def native_call(self, backend, arrays, query_length):
        pairs = native.t5_pairs(backend, query_length)
        args = (arrays["q"], arrays["k"], arrays["v"], arrays["table"], pairs)
        return functools.partial(native.native("t5_attention", backend), *args)


# -- FlexAttention: torch.compile'd score_mod and block mask ------------------

#: ``L`` of the FlexAttention comparison (compiling takes a minute or more on a CPU).
FLEX_LENGTHS = (1024,) if common.QUICK else (1024, 4096)


class FlexAttentionVsBlockwise:
    """PyTorch's FlexAttention against relattn's blockwise path (``block_size=512``), CPU.

    Causal Transformer-XL, ``B = 1``, ``H = 8``, ``d = 64``, float32
    (``blockwise.Blockwise``'s inputs): ``native.torch_flex_transformer_xl``,
    compiled in ``setup`` (``torch.compile(flex_attention, dynamic=False)``) and
    checked against relattn there. ``time_native``: FlexAttention's call;
    ``track_ratio_to_native``: relattn's median time over FlexAttention's.
    Skipped where PyTorch has no FlexAttention or compiling it fails.
    """

    params = [FLEX_LENGTHS]
    param_names = ["length"]
    timeout = 1800
    unit = "relattn/flex"

    def setup(self, length):
        blockwise.require_block_size()
        self.backend = common.get_backend("torch")
        arrays = common.on(self.backend, blockwise.long_sequences().inputs(length))
        self.ours = blockwise.long_call(self.backend, arrays, blockwise.BLOCK_SIZE)
        names = ("q", "k", "v", "table", "u", "w")
        try:
            self.theirs = native.torch_flex_transformer_xl(*(arrays[n] for n in names))
            theirs = self.theirs()
        except ImportError as e:
            raise NotImplementedError(f"no FlexAttention in this PyTorch: {e}") from None
        except Exception as e:  # torch.compile's errors have no common base class
            raise NotImplementedError(
                f"torch.compile(flex_attention) failed: {type(e).__name__}: {e}"[:500]
            ) from None
        np.testing.assert_allclose(
            self.backend.to_host(theirs),
            self.backend.to_host(self.ours()),
            rtol=1e-3,
            atol=1e-4,
            err_msg="FlexAttention differs from relattn's blockwise path",
        )

    def time_native(self, length):
        self.theirs()

    def track_ratio_to_native(self, length):
        return common.median_ratio(self.ours, self.theirs, self.backend)[0]
