"""Transformer-XL (Dai et al. 2019): two layers, three segments, memory and clamp_len.

Each layer attends from the current segment to ``[memory ∘ segment]`` with
relative scores (content bias u, position bias v, the sinusoid of ``i - j``
clamped at ``clamp_len``); the memory of a layer is its input over the last
``M`` positions, cut from the gradient. With ``M`` covering all history the
segment-by-segment result equals one pass over the whole sequence.
"""

from __future__ import annotations

import math

import array_api_compat
import numpy as np

import relattn


def init_params(seed=0, *, d_model=16, heads=2, layers=2, vocab=50):
    rng = np.random.default_rng(seed)

    def dense(n_in, n_out):
        return rng.normal(scale=1 / math.sqrt(n_in), size=(n_in, n_out))

    d_head = d_model // heads
    return {
        "embedding": rng.normal(size=(vocab, d_model)),
        "layers": [
            {
                **{name: dense(d_model, d_model) for name in ("w_q", "w_k", "w_v", "w_r", "w_o")},
                "u": rng.normal(scale=0.5, size=(heads, d_head)),
                "v": rng.normal(scale=0.5, size=(heads, d_head)),
                "w_1": dense(d_model, 4 * d_model),
                "b_1": np.zeros(4 * d_model),
                "w_2": dense(4 * d_model, d_model),
                "b_2": np.zeros(d_model),
            }
            for _ in range(layers)
        ],
    }


def layer_norm(x, xp, eps=1e-5):
    mean = xp.mean(x, axis=-1, keepdims=True)
    return (x - mean) / xp.sqrt(xp.mean((x - mean) ** 2, axis=-1, keepdims=True) + eps)


def xl_layer(h, memory, p, *, heads, clamp_len, xp):
    """One Transformer-XL layer: h (L, d) attends over [memory ∘ h]."""
    context = h if memory is None else xp.concat((memory, h), axis=0)
    lq, lk, d_model = h.shape[0], context.shape[0], h.shape[1]
    # R: sinusoid of i - j = -δ over the causal layout (Lk - 1 … 0), clamped.
    distance = -relattn.relative_distances(lq, lk, causal=True, xp=xp)
    table = relattn.sinusoidal_position_encoding(
        xp.clip(distance, 0, clamp_len), d_model, layout="concatenated", dtype=h.dtype
    )
    q = relattn.split_heads(h @ p["w_q"], heads)
    k = relattn.split_heads(context @ p["w_k"], heads)
    v = relattn.split_heads(context @ p["w_v"], heads)
    r = relattn.split_heads(table @ p["w_r"], heads)
    attended = relattn.relative_attention(
        q, k, v, r, content_bias=p["u"][:, None, :], position_bias=p["v"][:, None, :]
    )
    h = layer_norm(h + relattn.merge_heads(attended) @ p["w_o"], xp)
    hidden = xp.maximum(h @ p["w_1"] + p["b_1"], xp.zeros((), dtype=h.dtype))
    return layer_norm(h + hidden @ p["w_2"] + p["b_2"], xp)


def encode(tokens, params, *, segment, memory_length, heads, clamp_len, xp):
    """Run the layers segment by segment, carrying each layer's memory."""
    memories = [None] * len(params["layers"])
    outputs = []
    for start in range(0, tokens.shape[0], segment):
        h = xp.take(params["embedding"], tokens[start : start + segment], axis=0)
        for n, p in enumerate(params["layers"]):
            new_memory = relattn.update_memory(memories[n], h, memory_length)
            h = xl_layer(h, memories[n], p, heads=heads, clamp_len=clamp_len, xp=xp)
            memories[n] = new_memory
        outputs.append(h)
    return xp.concat(outputs, axis=0)


def to_xp(tree, xp, dtype):
    if isinstance(tree, dict):
        return {key: to_xp(value, xp, dtype) for key, value in tree.items()}
    if isinstance(tree, list):
        return [to_xp(value, xp, dtype) for value in tree]
    return xp.asarray(tree, dtype=dtype)


def run(lib, *, seed=0, segment=4, memory_length=8, clamp_len=6, heads=2):
    """Three segments with full-history memory, and the whole sequence in one pass."""
    params = init_params(seed, heads=heads)
    tokens = np.random.default_rng(seed + 1).integers(0, 50, size=3 * segment)
    xp_tokens = lib.asarray(tokens)
    xp = array_api_compat.array_namespace(xp_tokens)  # the array-API view of ``lib``
    xp_params = to_xp(params, xp, xp.float64)
    options = {"heads": heads, "clamp_len": clamp_len, "xp": xp}
    segmented = encode(
        xp_tokens, xp_params, segment=segment, memory_length=memory_length, **options
    )
    whole = encode(xp_tokens, xp_params, segment=3 * segment, memory_length=0, **options)
    return {
        "tokens": tokens,
        "segmented": np.from_dlpack(segmented),
        "whole": np.from_dlpack(whole),
    }


if __name__ == "__main__":
    result = run(np)
    gap = np.max(np.abs(result["segmented"] - result["whole"]))
    print(f"segments with memory vs whole sequence: max |Δ| = {gap:.1e}")
