"""relattn.shaw_attention: Shaw et al. 2018 relative representations on keys and values.

Speed on every backend and host memory through ``asv_bench/shaw_memory.py``
(NumPy, ``tracemalloc``). tensor2tensor's algorithm (``(Lq, Lk, d)`` tensors
per pair), written in each library, is in ``baselines.py``.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from . import common

#: The arrays of a Shaw call, in the order relattn's and tensor2tensor's take them.
NAMES = ("q", "k", "v", "key_table", "value_table")
#: ``L`` of the host memory benchmarks.
MEMORY_LENGTHS = (512,) if common.QUICK else (512, 2048)


def shaw_memory():
    """``asv_bench/shaw_memory.py``, which sits beside the benchmark package."""
    path = Path(__file__).resolve().parents[1] / "shaw_memory.py"
    spec = importlib.util.spec_from_file_location("shaw_memory", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Shaw(common._Topic):
    """relattn's Shaw attention (the baseline adds tensor2tensor's) on the same arrays."""

    def inputs(self, backend, query_length):
        return common.on(backend, common.shaw_inputs(query_length))

    def call(self, backend, arrays, query_length):
        args = tuple(arrays[name] for name in NAMES)
        return functools.partial(common.relattn_function("shaw_attention", backend), *args)


class ShawAttention(_Shaw, common._Speed):
    """Speed and host peak memory of relattn on every backend (K = 16, tables shared by heads)."""


class ShawHostMemory:
    """Traced peak (MiB) of one self-attention, ``B = 1``, ``L = Lq = Lk``, NumPy.

    ``shaw``: relattn; ``plain``: relattn's scaled dot-product attention with
    an ``(L, L)`` bias (the floor). tensor2tensor's materialised tensors are
    ``baselines.ShawMaterialisedHostMemory``. SPEC §5: shaw / plain <= 1.25,
    materialised / shaw >= 10 at L = 2048.
    """

    params = [("shaw", "plain"), MEMORY_LENGTHS]
    param_names = ["case", "length"]
    timeout = 300

    def setup(self, case, length):
        self.shaw_memory = shaw_memory()

    def track_traced_peak(self, case, length):
        sizes = (length, common.HEADS, common.D_HEAD, common.RADIUS)
        return self.shaw_memory.measure(case, *sizes)["traced_mib"]

    track_traced_peak.unit = "MiB"


class ShawHostMemoryRatio:
    """relattn's traced peak over plain attention's (target <= 1.25), NumPy, one process."""

    params = [MEMORY_LENGTHS]
    param_names = ["length"]
    timeout = 300

    def setup(self, length):
        self.shaw_memory = shaw_memory()

    def track_shaw_over_plain(self, length):
        sizes = (length, common.HEADS, common.D_HEAD, common.RADIUS)
        shaw = self.shaw_memory.measure("shaw", *sizes)["traced_mib"]
        plain = self.shaw_memory.measure("plain", *sizes)["traced_mib"]
        return shaw / plain

    track_shaw_over_plain.unit = "shaw/plain"
