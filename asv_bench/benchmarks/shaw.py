"""relattn.shaw_attention: Shaw et al. 2018 relative representations on keys and values.

Speed on every backend, against tensor2tensor's algorithm (``(Lq, Lk, d)``
tensors per pair) written in each library, and host memory through
``asv_bench/shaw_memory.py`` (NumPy, ``tracemalloc``).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from . import common, native

_NAMES = ("q", "k", "v", "key_table", "value_table")


def _shaw_memory():
    """``asv_bench/shaw_memory.py``, which sits beside the benchmark package."""
    path = Path(__file__).resolve().parents[1] / "shaw_memory.py"
    spec = importlib.util.spec_from_file_location("shaw_memory", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Shaw(common._Topic):
    """relattn's Shaw attention and tensor2tensor's on the same arrays."""

    def calls(self, backend, query_length, with_native):
        arrays = common.on(backend, common.shaw_inputs(query_length))
        args = tuple(arrays[name] for name in _NAMES)
        ours = functools.partial(native.relattn_function("shaw_attention", backend), *args)
        if not with_native:
            return ours, None
        return ours, functools.partial(native.native("shaw_attention", backend), *args)


class ShawAttention(_Shaw, common._Speed):
    """Speed and host peak memory of relattn on every backend (K = 16, tables shared by heads)."""


class ShawVsMaterialised(_Shaw, common._VsNative):
    """relattn (shifted, O(W·d) tables) against tensor2tensor's (Lq, Lk, d) tensors.

    The native code is tensor2tensor's ``dot_product_attention_relative``:
    ``time_native`` and ``track_ratio_to_native`` time the materialised
    algorithm.
    """

    unit = "relattn/tensor2tensor"


class ShawHostMemory:
    """Traced peak (MiB) of one self-attention, ``B = 1``, ``L = Lq = Lk``, NumPy.

    ``shaw``: relattn; ``plain``: scaled dot-product attention with an
    ``(L, L)`` bias (the floor); ``materialised``: tensor2tensor. SPEC §5:
    shaw / plain <= 1.25, materialised / shaw >= 10 at L = 2048.
    """

    params = [("shaw", "plain", "materialised"), (512,) if common.QUICK else (512, 2048)]
    param_names = ["case", "length"]
    timeout = 300

    def setup(self, case, length):
        self.shaw_memory = _shaw_memory()

    def track_traced_peak(self, case, length):
        sizes = (length, common.HEADS, common.D_HEAD, common.RADIUS)
        return self.shaw_memory.measure(case, *sizes)["traced_mib"]

    track_traced_peak.unit = "MiB"


class ShawHostMemoryRatio:
    """relattn's traced peak over plain attention's (target <= 1.25), NumPy, one process."""

    params = [(512,) if common.QUICK else (512, 2048)]
    param_names = ["length"]
    timeout = 300

    def setup(self, length):
        self.shaw_memory = _shaw_memory()

    def track_shaw_over_plain(self, length):
        sizes = (length, common.HEADS, common.D_HEAD, common.RADIUS)
        shaw = self.shaw_memory.measure("shaw", *sizes)["traced_mib"]
        plain = self.shaw_memory.measure("plain", *sizes)["traced_mib"]
        return shaw / plain

    track_shaw_over_plain.unit = "shaw/plain"
