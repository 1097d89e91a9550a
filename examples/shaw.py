"""Recipe: Shaw et al. 2018 relative self-attention, clipped at K.

A multi-head self-attention layer whose keys and values get a learned vector
per relative distance ``j - i``, clipped to ``[-K, K]``; the two ``(2K+1, d_head)``
tables are shared by all heads (Shaw et al. 2018, section 3). Projections are
plain matmuls; relattn splits and merges the heads and does the attention
without ever building an ``(L, L, d_head)`` tensor.

Run on NumPy with ``python examples/shaw.py``; ``run(xp)`` takes any array
library (``numpy``, ``torch``, ``jax.numpy``, ``array_api_strict`` …).
"""

from __future__ import annotations

from typing import Any

import array_api_compat
import numpy as np

import relattn

BATCH, LENGTH, D_MODEL, HEADS, RADIUS = 2, 6, 8, 2, 2
LENGTHS = (6, 4)  # real tokens per sequence: the second has two padding positions


def inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """Random NumPy float64 parameters and input sequence of the recipe."""
    rng = np.random.default_rng(seed)
    d_head = D_MODEL // HEADS
    scale = 1 / np.sqrt(D_MODEL)

    def dense(n_in: int, n_out: int) -> np.ndarray:
        return rng.normal(scale=scale * np.sqrt(D_MODEL / n_in), size=(n_in, n_out))

    return {
        "x": rng.normal(size=(BATCH, LENGTH, D_MODEL)),
        "w_q": dense(D_MODEL, D_MODEL),
        "w_k": dense(D_MODEL, D_MODEL),
        "w_v": dense(D_MODEL, D_MODEL),
        "w_o": dense(D_MODEL, D_MODEL),
        # w^K_{-K} … w^K_K and w^V_{-K} … w^V_K, one row per clipped distance.
        "key_embeddings": rng.normal(scale=0.5, size=(2 * RADIUS + 1, d_head)),
        "value_embeddings": rng.normal(scale=0.5, size=(2 * RADIUS + 1, d_head)),
    }


def shaw_self_attention(x: Any, p: dict[str, Any], mask: Any = None) -> Any:
    """``MultiHead(x) = Concat(z_1 … z_H) Wᴼ`` with Shaw relative attention per head."""
    q = relattn.split_heads(x @ p["w_q"], HEADS)  # (B, H, L, d_head)
    k = relattn.split_heads(x @ p["w_k"], HEADS)
    v = relattn.split_heads(x @ p["w_v"], HEADS)
    z = relattn.shaw_attention(q, k, v, p["key_embeddings"], p["value_embeddings"], mask=mask)
    return relattn.merge_heads(z) @ p["w_o"]  # (B, L, d_model)


def _to_numpy(a: Any) -> np.ndarray:
    return np.asarray(np.from_dlpack(a), dtype=np.float64)


def run(xp: Any, *, seed: int = 0) -> dict[str, np.ndarray]:
    """The layer as an encoder (padding mask) and as a decoder (causal mask)."""
    p = {name: xp.asarray(a) for name, a in inputs(seed).items()}
    x = p.pop("x")
    device = array_api_compat.device(x)
    lengths = xp.asarray(np.asarray(LENGTHS), device=device)
    padding = relattn.padding_mask(lengths, LENGTH)[:, None, None, :]  # (B, 1, 1, L): keys
    causal = relattn.causal_mask(LENGTH, LENGTH, xp=xp, device=device)  # (L, L)
    return {
        "encoder": _to_numpy(shaw_self_attention(x, p, mask=padding)),
        "decoder": _to_numpy(shaw_self_attention(x, p, mask=causal)),
    }


if __name__ == "__main__":
    results = run(np)
    for name, out in results.items():
        print(f"{name}: shape {out.shape}, first row {np.round(out[0, 0, :4], 4)}")
