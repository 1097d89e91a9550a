"""Recipe: a Vaswani et al. (2017) encoder layer and decoder layer.

The encoder layer adds the sinusoidal position encoding to the scaled token
embeddings (section 3.5) and runs multi-head self-attention under a padding
mask, then the position-wise feed-forward network, each sub-layer wrapped in
a residual connection and layer normalisation (section 3.1). The decoder layer
runs causal self-attention, then cross-attention from its ``T`` positions to
the ``S`` encoder outputs (``Lq = T ≠ Lk = S``) under the encoder padding mask,
then the feed-forward network.

relattn provides the position encoding, the masks, the head split and
merge, and the attention; the rest is plain array-API calls, so the same code
runs on NumPy, PyTorch, JAX, array-api-strict, Dask and CuPy arrays.

Run ``python examples/vaswani.py`` to see it on NumPy.
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat
import numpy as np

import relattn

D_MODEL, HEADS, D_FF, VOCAB = 8, 2, 16, 11
SOURCE_LENGTH, TARGET_LENGTH = 5, 4  # S encoder positions, T decoder positions
SOURCE_LENGTHS = (5, 3)  # real tokens per source sentence; the rest is padding


def init(seed: int = 0) -> dict[str, Any]:
    """Seeded NumPy float64 parameters and a batch of two token sequences."""
    rng = np.random.default_rng(seed)

    def dense(n_in: int, n_out: int) -> np.ndarray:
        return rng.normal(scale=1 / math.sqrt(n_in), size=(n_in, n_out))

    def attention() -> dict[str, np.ndarray]:
        return {name: dense(D_MODEL, D_MODEL) for name in ("w_q", "w_k", "w_v", "w_o")}

    def norm() -> dict[str, np.ndarray]:
        return {
            "gain": 1 + 0.1 * rng.normal(size=D_MODEL),
            "shift": 0.1 * rng.normal(size=D_MODEL),
        }

    def feed_forward() -> dict[str, np.ndarray]:
        return {
            "w_1": dense(D_MODEL, D_FF),
            "b_1": 0.1 * rng.normal(size=D_FF),
            "w_2": dense(D_FF, D_MODEL),
            "b_2": 0.1 * rng.normal(size=D_MODEL),
        }

    return {
        "source_tokens": rng.integers(0, VOCAB, size=(len(SOURCE_LENGTHS), SOURCE_LENGTH)),
        "source_lengths": np.array(SOURCE_LENGTHS),
        "target_tokens": rng.integers(0, VOCAB, size=(len(SOURCE_LENGTHS), TARGET_LENGTH)),
        "embedding": rng.normal(scale=1 / math.sqrt(D_MODEL), size=(VOCAB, D_MODEL)),
        "encoder": {
            "self_attention": attention(),
            "norm_1": norm(),
            "feed_forward": feed_forward(),
            "norm_2": norm(),
        },
        "decoder": {
            "self_attention": attention(),
            "norm_1": norm(),
            "cross_attention": attention(),
            "norm_2": norm(),
            "feed_forward": feed_forward(),
            "norm_3": norm(),
        },
    }


def embed(xp: Any, tokens: Any, embedding: Any) -> Any:
    """Token embeddings times √d_model plus the sinusoidal encoding (section 3.4, 3.5)."""
    batch, length = tokens.shape
    x = xp.take(embedding, xp.reshape(tokens, (-1,)), axis=0)
    x = xp.reshape(x, (batch, length, D_MODEL)) * math.sqrt(D_MODEL)
    pe = relattn.sinusoidal_position_encoding(
        length, D_MODEL, dtype=x.dtype, device=array_api_compat.device(x), xp=xp
    )
    return x + pe  # (L, d) broadcasts over the batch


def layer_norm(xp: Any, x: Any, p: dict[str, Any], eps: float = 1e-5) -> Any:
    mean = xp.mean(x, axis=-1, keepdims=True)
    var = xp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / xp.sqrt(var + eps) * p["gain"] + p["shift"]


def feed_forward(xp: Any, x: Any, p: dict[str, Any]) -> Any:
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (eq. (2))."""
    hidden = x @ p["w_1"] + p["b_1"]
    return xp.maximum(hidden, xp.zeros_like(hidden)) @ p["w_2"] + p["b_2"]


def multi_head_attention(queries: Any, keys_values: Any, p: dict[str, Any], mask: Any) -> Any:
    """MultiHead(Q, K, V) = Concat(head_1 … head_h) W^O (section 3.2.2)."""
    q = relattn.split_heads(queries @ p["w_q"], HEADS)  # (B, H, Lq, d_head)
    k = relattn.split_heads(keys_values @ p["w_k"], HEADS)  # (B, H, Lk, d_head)
    v = relattn.split_heads(keys_values @ p["w_v"], HEADS)
    heads = relattn.scaled_dot_product_attention(q, k, v, mask=mask)
    return relattn.merge_heads(heads) @ p["w_o"]


def encoder_layer(xp: Any, x: Any, source_mask: Any, p: dict[str, Any]) -> Any:
    """Self-attention over the real source tokens, then the feed-forward network."""
    key_mask = source_mask[:, None, None, :]  # (B, S) -> (B, 1 head, 1 query, S keys)
    h = layer_norm(xp, x + multi_head_attention(x, x, p["self_attention"], key_mask), p["norm_1"])
    return layer_norm(xp, h + feed_forward(xp, h, p["feed_forward"]), p["norm_2"])


def decoder_layer(xp: Any, y: Any, memory: Any, source_mask: Any, p: dict[str, Any]) -> Any:
    """Causal self-attention, cross-attention to the encoder output, feed-forward."""
    length = y.shape[-2]
    causal = relattn.causal_mask(length, length, xp=xp, device=array_api_compat.device(y))
    h = layer_norm(xp, y + multi_head_attention(y, y, p["self_attention"], causal), p["norm_1"])
    # Queries: the T decoder positions; keys and values: the S encoder outputs.
    cross = multi_head_attention(h, memory, p["cross_attention"], source_mask[:, None, None, :])
    h = layer_norm(xp, h + cross, p["norm_2"])
    return layer_norm(xp, h + feed_forward(xp, h, p["feed_forward"]), p["norm_3"])


def _as_arrays(xp: Any, tree: Any) -> Any:
    if isinstance(tree, dict):
        return {name: _as_arrays(xp, value) for name, value in tree.items()}
    return xp.asarray(tree)


def _to_numpy(x: Any) -> np.ndarray:
    # DLPack reaches NumPy from CPU arrays of any library; Dask arrays compute instead.
    x = np.from_dlpack(x) if hasattr(x, "__dlpack__") else np.asarray(x)
    return np.asarray(x, dtype=np.float64)


def run(xp: Any, *, seed: int = 0) -> dict[str, np.ndarray]:
    """The encoder layer and the decoder layer on ``xp`` arrays (any array library).

    Returns NumPy float64 copies of the encoder output ``(B, S, d_model)`` and
    the decoder output ``(B, T, d_model)``.
    """
    params = _as_arrays(xp, init(seed))
    xp = array_api_compat.array_namespace(params["embedding"])  # the standard's functions
    source_mask = relattn.padding_mask(params["source_lengths"], SOURCE_LENGTH)  # (B, S)

    x = embed(xp, params["source_tokens"], params["embedding"])
    memory = encoder_layer(xp, x, source_mask, params["encoder"])
    y = embed(xp, params["target_tokens"], params["embedding"])
    out = decoder_layer(xp, y, memory, source_mask, params["decoder"])
    return {"encoder": _to_numpy(memory), "decoder": _to_numpy(out)}


if __name__ == "__main__":
    results = run(np)
    for name, value in results.items():
        print(f"{name:8} shape {value.shape}, first row {np.round(value[0, 0, :4], 3)} …")
