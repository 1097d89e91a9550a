"""relattn.shaw_attention: Shaw et al. 2018 relative representations on keys and values.

Speed on every backend, against tensor2tensor's algorithm (``(Lq, Lk, d)``
tensors per pair) written in each library, and host memory through
``asv_bench/shaw_memory.py`` (NumPy, ``tracemalloc``).
"""

from __future__ import annotations

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


def _calls(backend: common.Backend, query_length: int, with_native: bool):
    arrays = common.on(backend, common.shaw_inputs(query_length))
    args = tuple(arrays[name] for name in _NAMES)
    fn = native.relattn_function("shaw_attention", backend)

    def ours():
        return fn(*args)

    theirs = None
    if with_native:
        baseline = native.native("shaw_attention", backend)

        def theirs():
            return baseline(*args)

    return ours, theirs


class ShawAttention:
    """Speed and host peak memory of relattn on every backend (K = 16, tables shared by heads)."""

    params = [common.BACKENDS, common.QUERY_LENGTHS]
    param_names = ["backend", "query_length"]
    timeout = 300

    def setup(self, backend, query_length):
        self.backend = common.get_backend(backend)
        self.ours, _ = _calls(self.backend, query_length, with_native=False)
        self.backend.ready(self.ours())

    def time_shaw_attention(self, backend, query_length):
        self.backend.ready(self.ours())

    def peakmem_shaw_attention(self, backend, query_length):
        self.backend.ready(self.ours())


class ShawVsMaterialised:
    """relattn (shifted, O(W·d) tables) against tensor2tensor's (Lq, Lk, d) tensors."""

    params = [common.BACKENDS, common.RATIO_LENGTHS]
    param_names = ["backend", "query_length"]
    timeout = 300

    def setup(self, backend, query_length):
        self.backend = common.get_backend(backend)
        native.check(backend)
        self.ours, self.theirs = _calls(self.backend, query_length, with_native=True)
        self.backend.ready(self.theirs())

    def time_materialised(self, backend, query_length):
        self.backend.ready(self.theirs())

    def track_ratio_to_materialised(self, backend, query_length):
        return common.median_ratio(self.ours, self.theirs, self.backend)[0]

    track_ratio_to_materialised.unit = "relattn/tensor2tensor"


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
