"""Inference with NumPy alone: a Transformer-XL language model over segments, with memory.

The model stands for a pretrained network: its float32 weights live in an
``.npz`` file with flat names (``embedding``, ``layer0.w_q`` …), as weights
exported from a training framework would. Inference needs NumPy and relattn
only (no PyTorch, no JAX). The text is read segment by segment; each layer keeps
the last ``memory_length`` inputs it saw (:func:`relattn.update_memory`) and the
next segment attends over ``[memory ∘ segment]`` with Transformer-XL relative
scores (content bias ``u``, position bias ``v``, sinusoid of ``i - j``).

Every function takes the array namespace ``xp``, so the same code runs on
CuPy (``examples/cupy_inference.py``), array-api-strict or any other array-API
library. With a memory that covers all earlier tokens, segment-by-segment
inference gives the same logits as one pass over the whole text.

Run with ``python examples/numpy_inference.py``.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import array_api_compat
import numpy as np

import relattn

VOCAB, D_MODEL, HEADS, LAYERS = 32, 16, 2, 2


# -- weights ------------------------------------------------------------------------------


def init_weights(
    seed: int = 0, *, vocab: int = VOCAB, d_model: int = D_MODEL, heads: int = HEADS, layers=LAYERS
) -> dict[str, np.ndarray]:
    """Random float32 weights with the names and shapes of the pretrained file."""
    rng = np.random.default_rng(seed)
    d_head = d_model // heads

    def dense(n_in: int, n_out: int) -> np.ndarray:
        return rng.normal(scale=1 / math.sqrt(n_in), size=(n_in, n_out))

    weights = {"embedding": rng.normal(size=(vocab, d_model))}
    for n in range(layers):
        for name in ("w_q", "w_k", "w_v", "w_r", "w_o"):
            weights[f"layer{n}.{name}"] = dense(d_model, d_model)
        weights[f"layer{n}.u"] = rng.normal(scale=0.5, size=(heads, d_head))
        weights[f"layer{n}.v"] = rng.normal(scale=0.5, size=(heads, d_head))
        weights[f"layer{n}.w_1"] = dense(d_model, 4 * d_model)
        weights[f"layer{n}.b_1"] = np.zeros(4 * d_model)
        weights[f"layer{n}.w_2"] = dense(4 * d_model, d_model)
        weights[f"layer{n}.b_2"] = np.zeros(d_model)
    return {name: a.astype(np.float32) for name, a in weights.items()}


def save_weights(path: str | Path, weights: dict[str, np.ndarray]) -> None:
    """Write the weights to an ``.npz`` file."""
    np.savez(path, **weights)


def load_weights(path: str | Path) -> dict[str, np.ndarray]:
    """Read the weights of an ``.npz`` file written by :func:`save_weights`."""
    with np.load(path) as archive:
        return {name: archive[name] for name in archive.files}


def to_namespace(weights: dict[str, np.ndarray], xp: Any) -> dict[str, Any]:
    """The weights as arrays of ``xp`` (``numpy``, ``cupy``, ``array_api_strict`` …)."""
    return {name: xp.asarray(a) for name, a in weights.items()}


def num_layers(weights: dict[str, Any]) -> int:
    return sum(name.endswith(".w_q") for name in weights)


# -- the model ----------------------------------------------------------------------------


def layer_norm(x: Any, xp: Any, eps: float = 1e-5) -> Any:
    mean = xp.mean(x, axis=-1, keepdims=True)
    centred = x - mean
    return centred / xp.sqrt(xp.mean(centred * centred, axis=-1, keepdims=True) + eps)


def embed(tokens: Any, weights: dict[str, Any], xp: Any) -> Any:
    """``(B, L)`` token ids -> ``(B, L, d)`` embeddings."""
    table = weights["embedding"]
    rows = xp.take(table, xp.reshape(tokens, (-1,)), axis=0)
    return xp.reshape(rows, (*tokens.shape, table.shape[-1]))


def layer_weights(weights: dict[str, Any], n: int) -> dict[str, Any]:
    """Layer ``n``'s weights, without the ``layer{n}.`` prefix."""
    prefix = f"layer{n}."
    return {name[len(prefix) :]: a for name, a in weights.items() if name.startswith(prefix)}


def xl_layer(h: Any, memory: Any, p: dict[str, Any], *, heads: int, xp: Any) -> Any:
    """One layer: the segment ``h`` (B, L, d) attends over ``[memory ∘ h]`` (B, M + L, d)."""
    context = h if memory is None else xp.concat((memory, h), axis=-2)
    lq, lk, d_model = h.shape[-2], context.shape[-2], h.shape[-1]
    # Causal layout: row m encodes i - j = -δ = Lk - 1 - m, the sinusoid Transformer-XL uses.
    device = array_api_compat.device(h)
    distance = -relattn.relative_distances(lq, lk, causal=True, xp=xp, device=device)
    table = relattn.sinusoidal_position_encoding(
        distance, d_model, layout="concatenated", dtype=h.dtype
    )
    q = relattn.split_heads(h @ p["w_q"], heads)  # (B, H, Lq, d_head)
    k = relattn.split_heads(context @ p["w_k"], heads)  # (B, H, Lk, d_head)
    v = relattn.split_heads(context @ p["w_v"], heads)
    r = relattn.split_heads(table @ p["w_r"], heads)  # (H, Lk, d_head), shared by the batch
    attended = relattn.relative_attention(
        q, k, v, r, content_bias=p["u"][:, None, :], position_bias=p["v"][:, None, :]
    )
    h = layer_norm(h + relattn.merge_heads(attended) @ p["w_o"], xp)
    hidden = xp.maximum(h @ p["w_1"] + p["b_1"], xp.zeros((), dtype=h.dtype, device=device))
    return layer_norm(h + hidden @ p["w_2"] + p["b_2"], xp)


def segment_forward(
    tokens: Any,
    weights: dict[str, Any],
    memories: list[Any],
    *,
    memory_length: int,
    heads: int = HEADS,
    xp: Any,
) -> tuple[Any, list[Any]]:
    """One segment ``(B, L)`` -> logits ``(B, L, vocab)`` and every layer's new memory.

    ``memories[n]`` is layer ``n``'s memory ``(B, M, d)``, or ``None`` before the
    first segment.
    """
    h = embed(tokens, weights, xp)
    new_memories = []
    for n, memory in enumerate(memories):
        # A layer's memory is its own input, cached before the layer runs.
        new_memories.append(relattn.update_memory(memory, h, memory_length))
        h = xl_layer(h, memory, layer_weights(weights, n), heads=heads, xp=xp)
    logits = h @ xp.matrix_transpose(weights["embedding"])  # tied output embedding
    return logits, new_memories


def infer(
    tokens: Any,
    weights: dict[str, Any],
    *,
    segment: int,
    memory_length: int,
    heads: int = HEADS,
    xp: Any,
) -> Any:
    """Logits ``(B, T, vocab)`` for the tokens ``(B, T)``, read ``segment`` at a time."""
    memories = [None] * num_layers(weights)
    logits = []
    for start in range(0, tokens.shape[-1], segment):
        out, memories = segment_forward(
            tokens[:, start : start + segment],
            weights,
            memories,
            memory_length=memory_length,
            heads=heads,
            xp=xp,
        )
        logits.append(out)
    return xp.concat(logits, axis=-2)


def sample_tokens(seed: int = 1, *, batch: int = 2, length: int = 12, vocab: int = VOCAB):
    """A NumPy ``(batch, length)`` array of token ids to run the model on."""
    return np.random.default_rng(seed).integers(0, vocab, size=(batch, length))


def run(lib: Any = np, *, seed: int = 0, segment: int = 4, memory_length: int = 8) -> dict:
    """Segment-by-segment logits and one-pass logits, as arrays of ``lib``.

    ``lib`` is the array library (``numpy``, ``cupy``, ``array_api_strict`` …);
    its arrays are created on its current device.
    """
    tokens = lib.asarray(sample_tokens(seed + 1))
    xp = array_api_compat.array_namespace(tokens)  # the array-API view of ``lib``
    weights = to_namespace(init_weights(seed), xp)
    options = {"heads": HEADS, "xp": xp}
    return {
        "segmented": infer(
            tokens, weights, segment=segment, memory_length=memory_length, **options
        ),
        "whole": infer(tokens, weights, segment=tokens.shape[-1], memory_length=0, **options),
    }


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "relattn_xl_lm.npz"
        save_weights(path, init_weights(0))
        weights = load_weights(path)
    tokens = sample_tokens(1)
    print(f"weights: {len(weights)} float32 arrays, {sum(a.size for a in weights.values())} values")
    memories = [None] * num_layers(weights)
    for start in range(0, tokens.shape[-1], 4):
        logits, memories = segment_forward(
            tokens[:, start : start + 4], weights, memories, memory_length=8, xp=np
        )
        print(
            f"segment at {start:2d}: logits {logits.dtype} {logits.shape}, "
            f"memory {memories[0].shape}, next token after each row: {np.argmax(logits[:, -1], -1)}"
        )
    result = run(np)
    gap = np.max(np.abs(result["segmented"] - result["whole"]))
    print(f"three segments with memory 8 vs one pass over 12 tokens: max |Δ logits| = {gap:.1e}")
