"""relattn.rel_shift and rel_unshift: relative layout to key columns and back.

``x (B, H, Lq, W)`` float32 scores with ``Lk = 2·Lq``; ``W = Lk`` (causal
layout) or ``W = Lq + Lk - 1`` (full layout). Where a library returns views
(NumPy, PyTorch) the full-layout shift of a contiguous array copies nothing, so
its time is the dispatch alone; the native baseline (Transformer-XL's
pad-and-reshape) always copies.
"""

from __future__ import annotations

import numpy as np

from . import common, native

LAYOUTS = ("causal", "full")


def _scores(query_length: int, layout: str) -> np.ndarray:
    lk = common.key_length(query_length)
    width = {"causal": lk, "full": query_length + lk - 1}[layout]
    rng = np.random.default_rng(4)
    return common.normal(rng, common.BATCH, common.HEADS, query_length, width)


class RelShift:
    params = [common.BACKENDS, common.QUERY_LENGTHS, LAYOUTS]
    param_names = ["backend", "query_length", "layout"]
    timeout = 300

    def setup(self, backend, query_length, layout):
        self.backend = common.get_backend(backend)
        x = self.backend.asarray(_scores(query_length, layout), batched=True)
        lk = common.key_length(query_length)
        shift = native.relattn_function("rel_shift", self.backend)
        unshift = native.relattn_function("rel_unshift", self.backend)
        self.shift = lambda: shift(x, key_length=lk)
        shifted = self.backend.asarray(
            np.ascontiguousarray(self.backend.to_numpy(self.shift())), batched=True
        )
        self.unshift = lambda: unshift(shifted)
        self.backend.ready(self.shift())
        self.backend.ready(self.unshift())

    def time_rel_shift(self, backend, query_length, layout):
        self.backend.ready(self.shift())

    def time_rel_unshift(self, backend, query_length, layout):
        self.backend.ready(self.unshift())

    def peakmem_rel_shift(self, backend, query_length, layout):
        self.backend.ready(self.shift())


class RelShiftVsNative:
    """relattn's flat-stride shift against Transformer-XL's pad-and-reshape ``_rel_shift``."""

    params = [common.BACKENDS, common.RATIO_LENGTHS, LAYOUTS]
    param_names = ["backend", "query_length", "layout"]
    timeout = 300

    def setup(self, backend, query_length, layout):
        self.backend = common.get_backend(backend)
        native.check(backend)
        x = self.backend.asarray(_scores(query_length, layout), batched=True)
        lk = common.key_length(query_length)
        shift = native.relattn_function("rel_shift", self.backend)
        baseline = native.native("rel_shift", self.backend)
        self.ours = lambda: shift(x, key_length=lk)
        self.theirs = lambda: baseline(x, key_length=lk)
        self.backend.ready(self.theirs())

    def time_native(self, backend, query_length, layout):
        self.backend.ready(self.theirs())

    def track_ratio_to_native(self, backend, query_length, layout):
        return common.median_ratio(self.ours, self.theirs, self.backend)[0]

    track_ratio_to_native.unit = "relattn/native"
