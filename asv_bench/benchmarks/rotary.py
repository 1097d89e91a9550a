"""relattn.rotary_position_embedding: RoPE of queries and keys (LLaMA's concatenated layout).

``q``, ``k (B, H, L, d)`` with ``B = 2``, ``H = 8``, ``d = 64``, float32,
``L = query_length``, positions ``0 … L-1``, ``base = 10000``: one call rotates
both, as a layer does before its attention. relattn forms its angles in every
call (in float64, then casts); the native baseline (Hugging Face's
``apply_rotary_pos_emb`` with ``rotate_half``, in ``baselines.py``) is given
the ``cos``/``sin`` tables that HF's model computes once per forward pass.
"""

from __future__ import annotations

import functools

from . import common


class _Rotary(common._Topic):
    """relattn's RoPE of ``q`` and ``k`` (the baseline adds HF's ``rotate_half``)."""

    def inputs(self, backend, query_length):
        common.require("rotary_position_embedding")
        return common.on(backend, common.rotary_inputs(query_length))

    def call(self, backend, arrays, query_length):
        fn = backend.default_jit(common.rotary_qk)
        return functools.partial(fn, arrays["q"], arrays["k"])


class RotaryPositionEmbedding(_Rotary, common._Speed):
    """Speed and host peak memory of relattn on every backend."""

    timeout = 120


class InverseFrequencies(common._Constant):
    """``inverse_frequencies(32)``, RoPE's ``θ_k`` for ``d = 64``: a per-model constant."""

    function = "inverse_frequencies"
    count = common.D_HEAD // 2
