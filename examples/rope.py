"""Rotary position embedding (Su et al. 2021, RoFormer eq. (34)) in a decoder with a cache.

RoPE rotates each feature pair of the queries and keys of position ``p`` by
``p·θ_k``; the logit ``⟨RoPE(q, m), RoPE(k, n)⟩`` then depends on ``n - m``
only. Two layouts pair the features differently:

- ``"concatenated"`` pairs ``(x_k, x_{k + d/2})``: GPT-NeoX, LLaMA, HF's
  ``rotate_half``;
- ``"interleaved"`` pairs ``(x_2k, x_2k+1)``: the paper, GPT-J, RoFormer; here
  with GPT-J's partial rotary (``rotary_dim`` of the ``d_head`` features, the
  rest unchanged).

A decoder rotates the new tokens at their absolute positions
``offset + arange(Lq)`` (``offset``: the tokens in the cache), keeps the rotated
keys in the cache and attends causally with ``Lk = offset + Lq`` keys; relattn
aligns the last query with the last key. Decoding in two steps equals running
the whole sequence at once.

Run ``python examples/rope.py``: it checks itself against a per-pair loop.
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat
import numpy as np

import relattn

BATCH, PROMPT, STEP, D_MODEL, HEADS = 2, 5, 3, 16, 2
GPTJ_ROTARY_DIM = 4  # of d_head = 8


def inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """NumPy float64 projections and a sequence of PROMPT + STEP tokens."""
    rng = np.random.default_rng(seed)

    def dense() -> np.ndarray:
        return rng.normal(scale=1 / math.sqrt(D_MODEL), size=(D_MODEL, D_MODEL))

    return {
        "x": rng.normal(size=(BATCH, PROMPT + STEP, D_MODEL)),
        "w_q": dense(),
        "w_k": dense(),
        "w_v": dense(),
        "w_o": dense(),
    }


def rope_self_attention(
    x: Any,
    p: dict[str, Any],
    *,
    cache: tuple[Any, Any] | None = None,
    layout: str = "concatenated",
    rotary_dim: int | None = None,
    heads: int = HEADS,
) -> tuple[Any, tuple[Any, Any]]:
    """Causal self-attention of the new tokens ``x`` after ``cache``; returns the new cache too.

    ``cache``: the rotated keys and the values of the earlier tokens,
    ``(B, H, n, d_head)`` each, or None.
    """
    xp = array_api_compat.array_namespace(x)
    offset = 0 if cache is None else cache[0].shape[-2]
    positions = offset + xp.arange(x.shape[-2], device=array_api_compat.device(x))
    q = relattn.split_heads(x @ p["w_q"], heads)  # (B, H, Lq, d_head)
    k = relattn.split_heads(x @ p["w_k"], heads)
    v = relattn.split_heads(x @ p["w_v"], heads)
    q = relattn.rotary_position_embedding(q, positions, layout=layout, rotary_dim=rotary_dim)
    k = relattn.rotary_position_embedding(k, positions, layout=layout, rotary_dim=rotary_dim)
    if cache is not None:
        k = xp.concat((cache[0], k), axis=-2)
        v = xp.concat((cache[1], v), axis=-2)
    out = relattn.scaled_dot_product_attention(q, k, v, causal=True)
    return relattn.merge_heads(out) @ p["w_o"], (k, v)


def decode_in_two_steps(x: Any, p: dict[str, Any], **options: Any) -> Any:
    """The prompt, then the following tokens with the prompt's cache; outputs concatenated."""
    xp = array_api_compat.array_namespace(x)
    first, cache = rope_self_attention(x[:, :PROMPT, :], p, **options)
    second, _ = rope_self_attention(x[:, PROMPT:, :], p, cache=cache, **options)
    return xp.concat((first, second), axis=-2)


# -- the per-pair check ------------------------------------------------------------------------


def rotate(vector, position, *, layout, rotary_dim):
    """Eq. (34) one feature pair at a time, ``θ_k = 10000^(-2k/r)``."""
    out = np.array(vector, dtype=np.float64)
    half = rotary_dim // 2
    for pair in range(half):
        a, b = (2 * pair, 2 * pair + 1) if layout == "interleaved" else (pair, pair + half)
        angle = position * 10000.0 ** (-2 * pair / rotary_dim)
        out[a] = vector[a] * math.cos(angle) - vector[b] * math.sin(angle)
        out[b] = vector[a] * math.sin(angle) + vector[b] * math.cos(angle)
    return out


def loop_reference(x, p, *, layout="concatenated", rotary_dim=None, heads=HEADS):
    """The whole sequence at once: every logit ``⟨R_i q_i, R_j k_j⟩/√d`` for ``j <= i``."""
    length, d_head = x.shape[1], D_MODEL // heads
    rotary_dim = d_head if rotary_dim is None else rotary_dim
    q, k, v = x @ p["w_q"], x @ p["w_k"], x @ p["w_v"]
    out = np.zeros(x.shape)
    for b in range(x.shape[0]):
        for h in range(heads):
            cols = slice(h * d_head, (h + 1) * d_head)
            keys = [rotate(k[b, j, cols], j, layout=layout, rotary_dim=rotary_dim)
                    for j in range(length)]  # fmt: skip
            for i in range(length):
                query = rotate(q[b, i, cols], i, layout=layout, rotary_dim=rotary_dim)
                logits = np.asarray([query @ keys[j] for j in range(i + 1)]) / math.sqrt(d_head)
                weights = np.exp(logits - logits.max())
                out[b, i, cols] = weights / weights.sum() @ v[b, : i + 1, cols]
    return out @ p["w_o"]


def main() -> float:
    p = inputs()
    x = p["x"]
    diffs = {
        "LLaMA layout, prompt then cache": np.abs(
            decode_in_two_steps(x, p, layout="concatenated") - loop_reference(x, p)
        ).max(),
        "GPT-J interleaved partial rotary": np.abs(
            decode_in_two_steps(x, p, layout="interleaved", rotary_dim=GPTJ_ROTARY_DIM)
            - loop_reference(x, p, layout="interleaved", rotary_dim=GPTJ_ROTARY_DIM)
        ).max(),
    }
    for name, diff in diffs.items():
        print(f"RoPE {name}: max |relattn - per-pair loop| = {diff:.2e}")
    worst = max(diffs.values())
    assert worst < 1e-10, worst
    return worst


if __name__ == "__main__":
    main()
