"""relattn.rel_shift and rel_unshift: relative layout to key columns and back.

``x (B, H, Lq, W)`` float32 scores with ``Lk = 2·Lq``; ``W = Lk`` (causal
layout) or ``W = Lq + Lk - 1`` (full layout). Where a library returns views
(NumPy, PyTorch) the full-layout shift of a contiguous array copies nothing, so
its time is the dispatch alone; the native baseline (Transformer-XL's
pad-and-reshape) always copies.
"""

from __future__ import annotations

import functools

import numpy as np

from . import common, native

LAYOUTS = ("causal", "full")


def _scores(query_length: int, layout: str) -> np.ndarray:
    lk = common.key_length(query_length)
    width = {"causal": lk, "full": query_length + lk - 1}[layout]
    rng = np.random.default_rng(4)
    return common.normal(rng, common.BATCH, common.HEADS, query_length, width)


class _RelShift(common._Topic):
    """relattn's ``rel_shift`` and Transformer-XL's ``_rel_shift`` on the same scores."""

    param_names = ["backend", "query_length", "layout"]

    def calls(self, backend, query_length, layout, with_native):
        x = backend.asarray(_scores(query_length, layout), batched=True)
        lk = common.key_length(query_length)
        ours = functools.partial(native.relattn_function("rel_shift", backend), x, key_length=lk)
        if not with_native:
            return ours, None
        return ours, functools.partial(native.native("rel_shift", backend), x, key_length=lk)


class RelShift(_RelShift, common._Speed):
    """Speed and host peak memory of ``rel_shift``, and speed of ``rel_unshift``.

    ``time_relattn`` and ``peakmem_relattn`` call ``rel_shift``;
    ``time_rel_unshift`` calls ``rel_unshift`` on a contiguous copy of the
    shifted scores.
    """

    params = [common.BACKENDS, common.QUERY_LENGTHS, LAYOUTS]

    def setup(self, backend, query_length, layout):
        super().setup(backend, query_length, layout)
        shifted = self.backend.to_numpy(self.ours())
        shifted = self.backend.asarray(np.ascontiguousarray(shifted), batched=True)
        self.unshift = functools.partial(
            native.relattn_function("rel_unshift", self.backend), shifted
        )
        self.backend.ready(self.unshift())

    def time_rel_unshift(self, backend, query_length, layout):
        self.backend.ready(self.unshift())


class RelShiftVsNative(_RelShift, common._VsNative):
    """relattn's flat-stride shift against Transformer-XL's pad-and-reshape ``_rel_shift``."""

    params = [common.BACKENDS, common.RATIO_LENGTHS, LAYOUTS]
