"""relattn.rel_shift and rel_unshift: relative layout to key columns and back.

``x (B, H, Lq, W)`` float32 scores with ``Lk = 2·Lq``; ``W = Lk`` (causal
layout) or ``W = Lq + Lk - 1`` (full layout). Where a library returns views
(NumPy, PyTorch) the full-layout shift of a contiguous array copies nothing, so
its time is the dispatch alone; the native baseline (Transformer-XL's
pad-and-reshape, in ``baselines.py``) always copies.
"""

from __future__ import annotations

import functools

import numpy as np

from . import common

LAYOUTS = ("causal", "full")


def _scores(query_length: int, layout: str) -> np.ndarray:
    lk = common.key_length(query_length)
    width = {"causal": lk, "full": query_length + lk - 1}[layout]
    rng = np.random.default_rng(4)
    return common.normal(rng, common.BATCH, common.HEADS, query_length, width)


class _RelShift(common._Topic):
    """relattn's ``rel_shift`` (the baseline adds Transformer-XL's ``_rel_shift``) on scores."""

    param_names = ["backend", "query_length", "layout"]

    def inputs(self, backend, query_length, layout):
        return {"x": common.asarray(backend, _scores(query_length, layout), batched=True)}

    def call(self, backend, arrays, query_length, layout):
        lk = common.key_length(query_length)
        return functools.partial(
            common.relattn_function("rel_shift", backend, key_length=lk), arrays["x"]
        )


class RelShift(_RelShift, common._Speed):
    """Speed and host peak memory of ``rel_shift``, and speed of ``rel_unshift``.

    ``time_relattn`` and ``peakmem_relattn`` call ``rel_shift``;
    ``time_rel_unshift`` calls ``rel_unshift`` on a contiguous copy of the
    shifted scores.
    """

    params = [common.BACKENDS, common.QUERY_LENGTHS, LAYOUTS]

    def setup(self, backend, query_length, layout):
        super().setup(backend, query_length, layout)
        shifted = self.backend.to_host(self.ours())
        shifted = common.asarray(self.backend, np.ascontiguousarray(shifted), batched=True)
        self.unshift = functools.partial(
            common.relattn_function("rel_unshift", self.backend), shifted
        )
        self.backend.ready(self.unshift())

    def time_rel_unshift(self, backend, query_length, layout):
        self.backend.ready(self.unshift())
