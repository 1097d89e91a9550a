"""relattn.sinusoidal_position_encoding over the distances of a relative layout.

Transformer-XL's position table before projection: one row per distance
``i - j`` of the full layout (``W = Lq + Lk - 1`` rows, ``Lk = 2·Lq``),
``d_model = H·d_head = 512``, concatenated ``[sin | cos]`` layout, float32.
The positions are an array (JAX traces them under ``jax.jit``: with an integer
count the whole table would be a compile-time constant).
"""

from __future__ import annotations

import functools

import numpy as np

from . import common

D_MODEL = common.HEADS * common.D_HEAD


def _encode(positions):
    from relattn import sinusoidal_position_encoding

    return sinusoidal_position_encoding(positions, D_MODEL, layout="concatenated")


class SinusoidalPositionEncoding(common._Speed):
    """Speed and host peak memory of relattn on every backend (no native baseline)."""

    timeout = 120

    def inputs(self, backend, query_length):
        lk = common.key_length(query_length)
        distances = np.arange(lk - 1, -query_length, -1, dtype=np.float32)  # i - j, W of them
        return {"positions": backend.asarray(distances)}

    def call(self, backend, arrays, query_length):
        return functools.partial(backend.default_jit(_encode), arrays["positions"])
