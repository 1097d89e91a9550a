"""The demo's encoders, one per position scheme, built from relattn calls.

Each encoder holds seeded random weights on one backend and encodes byte
tokens segment by segment: ``step(h, memories, naive, start)`` returns the
segment's output and the memories for the next segment (Transformer-XL, ALiBi
and RoPE keep some); ``start`` is the position of the segment's first token
(RoPE's cache offset). ``naive=True`` swaps relattn's algorithm for the
formula computed directly (per-pair gathers, materialised relative tensors
and biases, per-pair rotations, unchunked logits), so the demo can show that
the two agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .._activations import elu
from ..attention import relative_attention, scaled_dot_product_attention
from ..biases import alibi_slopes, log_bucket_position, relative_position_bucket
from ..complex_order import complex_attention, complex_linear, complex_order_embedding
from ..core import softmax
from ..decomposed import decomposed_relative_attention, resize_relative_table
from ..disan import multi_dimensional_attention
from ..disentangled import disentangled_attention
from ..encodings import sinusoidal_position_encoding
from ..grid import grid_bias_mod
from ..heads import merge_heads, split_heads
from ..masks import causal_mask
from ..memory import update_memory
from ..positions import relative_distances, relative_positions, relative_table
from ..rotary import rotary_position_embedding
from ..shaw import shaw_attention


@dataclass(frozen=True)
class Config:
    segment: int = 64
    memory: int = 64
    d_model: int = 64
    heads: int = 4
    layers: int = 2
    clamp_len: int = 1000
    radius: int = 16
    seed: int = 0


def dense(rng: np.random.Generator, n_in: int, n_out: int) -> np.ndarray:
    """A weight that keeps unit-scale activations at unit scale."""
    return rng.normal(scale=1 / math.sqrt(n_in), size=(n_in, n_out))


def transformer_weights(config: Config, extra: Any = None, shared: Any = None) -> dict[str, Any]:
    """Seeded float64 NumPy weights of a post-norm Transformer encoder.

    ``extra(rng)`` adds scheme-specific arrays to each layer, ``shared(rng)``
    arrays that every layer uses (under ``"shared"``).
    """
    rng = np.random.default_rng(config.seed)
    d, h = config.d_model, config.heads
    layers = []
    for _ in range(config.layers):
        layer = {name: dense(rng, d, d) for name in ("w_q", "w_k", "w_v", "w_r", "w_o")}
        layer.update(
            u=rng.normal(scale=0.5, size=(h, d // h)),
            v=rng.normal(scale=0.5, size=(h, d // h)),
            w_1=dense(rng, d, 4 * d),
            b_1=np.zeros(4 * d),
            w_2=dense(rng, 4 * d, d),
            b_2=np.zeros(d),
        )
        if extra is not None:
            layer.update(extra(rng))
        layers.append(layer)
    weights = {"embedding": rng.normal(size=(256, d)), "layers": layers}
    if shared is not None:
        weights["shared"] = shared(rng)
    return weights


def layer_norm(x: Any, xp: Any, eps: float = 1e-5) -> Any:
    mean = xp.mean(x, axis=-1, keepdims=True)
    var = xp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / xp.sqrt(var + eps)


def pair_index(lq: int, lk: int, width: int, xp: Any, device: Any) -> Any:
    """Flat ``(Lq·Lk,)`` relative-layout column of each pair, clipped into the table."""
    delta = relative_positions(lq, lk, xp=xp, device=device)
    return xp.reshape(xp.clip(delta + (lk - 1), 0, width - 1), (lq * lk,))


def gather_pairs(table: Any, lq: int, lk: int, xp: Any, device: Any) -> Any:
    """``table (..., W, d)`` gathered per pair: ``(..., Lq, Lk, d)``, the naive way."""
    index = pair_index(lq, lk, table.shape[-2], xp, device)
    rows = xp.take(table, index, axis=table.ndim - 2)
    return xp.reshape(rows, (*table.shape[:-2], lq, lk, table.shape[-1]))


def naive_relative_attention(q, k, v, r, u, vb, *, scale, causal, xp, device):
    """``(q+u)·k_j + (q+v)·r[δ_ij]`` with ``r`` gathered for every pair."""
    lq, lk = q.shape[-2], k.shape[-2]
    position = xp.sum((q + vb)[..., :, None, :] * gather_pairs(r, lq, lk, xp, device), axis=-1)
    scores = ((q + u) @ xp.matrix_transpose(k) + position) * scale
    mask = causal_mask(lq, lk, xp=xp, device=device) if causal else None
    return softmax(scores, mask, -1, xp) @ v


def pair_distances(lq: int, lk: int) -> np.ndarray:
    """``δ(i, j) = j - (i + Lk - Lq)`` of every pair, on the host: ``(Lq, Lk)`` ints."""
    return np.arange(lk)[None, :] - (np.arange(lq)[:, None] + (lk - lq))


def t5_bucket(delta: np.ndarray, num_buckets: int, max_distance: int) -> np.ndarray:
    """T5's bidirectional bucket of each ``δ``, written on the host.

    A transcription of Mesh TensorFlow's ``_relative_position_bucket``, whose
    ``n`` is ``-δ``; the twin of :func:`relattn.relative_position_bucket`.
    """
    n = -delta
    num_buckets //= 2
    ret = (n < 0) * num_buckets
    n = np.abs(n)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    # max(n, 1): log(0) is never used (n = 0 is small) but would warn.
    val_if_large = max_exact + (
        np.log(np.maximum(n, 1) / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).astype(np.int64)
    val_if_large = np.minimum(val_if_large, num_buckets - 1)
    return ret + np.where(is_small, n, val_if_large)


def deberta_bucket(relative_pos: np.ndarray, bucket_size: int, max_position: int) -> np.ndarray:
    """DeBERTa-v2's bucket of each relative position, written on the host.

    A transcription of HF transformers' ``make_log_bucket_position``; the twin
    of :func:`relattn.log_bucket_position`.
    """
    sign = np.sign(relative_pos)
    mid = bucket_size // 2
    small = (relative_pos < mid) & (relative_pos > -mid)
    abs_pos = np.where(small, mid - 1, np.abs(relative_pos))
    log_pos = np.ceil(np.log(abs_pos / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid
    return np.where(abs_pos <= mid, relative_pos, log_pos * sign).astype(np.int64)


def press_slopes(n: int) -> list[float]:
    """ALiBi's slopes as the authors' ``get_slopes`` computes them; the twin of
    :func:`relattn.alibi_slopes`."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + press_slopes(2 * closest)[0::2][: n - closest]


class Encoder:
    """A post-norm Transformer encoder; subclasses supply ``attend``."""

    name: ClassVar[str]
    description: ClassVar[str]

    def __init__(self, config: Config, xp: Any, dtype: Any, device: Any = None):
        self.config, self.xp, self.dtype, self.device = config, xp, dtype, device
        weights = self.init_weights(config)
        self.embedding = self.array(weights["embedding"])
        self.layers = [
            {n: self.array(w) if isinstance(w, np.ndarray) else w for n, w in p.items()}
            for p in weights["layers"]
        ]
        self.shared = {n: self.array(w) for n, w in weights.get("shared", {}).items()}

    @staticmethod
    def init_weights(config: Config) -> dict[str, Any]:
        return transformer_weights(config)

    def array(self, a: np.ndarray) -> Any:
        xp = self.xp
        dtype = self.dtype
        if np.iscomplexobj(a):
            dtype = xp.complex64 if self.dtype == xp.float32 else xp.complex128
        return xp.asarray(a, dtype=dtype, device=self.device)

    def embed(self, tokens: np.ndarray) -> Any:
        index = self.xp.asarray(tokens, device=self.device)
        return self.xp.take(self.embedding, index, axis=0)

    def heads(self, x: Any) -> Any:
        return split_heads(x, self.config.heads)

    def attend(self, h: Any, memory: Any, p: dict, naive: bool, start: Any = 0) -> Any:
        """Multi-head attention of segment ``h`` (first position ``start``): ``(H, L, d_head)``."""
        raise NotImplementedError

    def remember(self, memory: Any, h: Any) -> Any:
        """The memory this layer hands to the next segment (none by default)."""
        return memory

    def layer(self, h: Any, memory: Any, p: dict, naive: bool, start: Any = 0) -> Any:
        """Attention, residual and norm; feed-forward, residual and norm."""
        xp = self.xp
        h = layer_norm(h + merge_heads(self.attend(h, memory, p, naive, start)) @ p["w_o"], xp)
        hidden = xp.maximum(h @ p["w_1"] + p["b_1"], xp.zeros((), dtype=h.dtype))
        return layer_norm(h + hidden @ p["w_2"] + p["b_2"], xp)

    def step(self, h: Any, memories: list, naive: bool = False, start: Any = 0) -> tuple[Any, list]:
        """One segment through every layer; returns the output and the next memories.

        ``start`` (an int, traced under a jit) is the position of the segment's
        first token in the text.
        """
        new = []
        for p, memory in zip(self.layers, memories, strict=True):
            new.append(self.remember(memory, h))
            h = self.layer(h, memory, p, naive, start)
        return h, new


class AbsoluteEncoder(Encoder):
    """Vaswani et al. 2017: sinusoidal positions added to the embeddings."""

    name = "absolute"
    description = "Vaswani: sinusoid added to embeddings, scaled dot-product attention"

    def embed(self, tokens: np.ndarray) -> Any:
        pe = sinusoidal_position_encoding(
            len(tokens), self.config.d_model, dtype=self.dtype, xp=self.xp, device=self.device
        )
        return super().embed(tokens) + pe

    def attend(self, h, memory, p, naive, start=0):
        xp = self.xp
        q, k, v = (self.heads(h @ p[w]) for w in ("w_q", "w_k", "w_v"))
        if not naive:
            return scaled_dot_product_attention(q, k, v)
        scores = xp.sum(q[..., :, None, :] * k[..., None, :, :], axis=-1) / math.sqrt(q.shape[-1])
        weights = xp.exp(scores - xp.max(scores, axis=-1, keepdims=True))
        return (weights / xp.sum(weights, axis=-1, keepdims=True)) @ v


class ShawEncoder(Encoder):
    """Shaw et al. 2018: clipped relative key and value tables, shared by the heads."""

    name = "shaw"
    description = "Shaw: relative keys and values clipped at K, shift/unshift"

    @staticmethod
    def init_weights(config: Config) -> dict[str, Any]:
        rows, d_head = 2 * config.radius + 1, config.d_model // config.heads

        def tables(rng: np.random.Generator) -> dict[str, np.ndarray]:
            return {
                "key_embeddings": rng.normal(scale=0.5, size=(rows, d_head)),
                "value_embeddings": rng.normal(scale=0.5, size=(rows, d_head)),
            }

        return transformer_weights(config, tables)

    def attend(self, h, memory, p, naive, start=0):
        xp = self.xp
        q, k, v = (self.heads(h @ p[w]) for w in ("w_q", "w_k", "w_v"))
        if not naive:
            return shaw_attention(q, k, v, p["key_embeddings"], p["value_embeddings"])
        # tensor2tensor's way: a^K_ij and a^V_ij materialised, (Lq, Lk, d_head).
        lq = lk = h.shape[-2]
        a_k, a_v = (
            gather_pairs(relative_table(p[t], lq, lk), lq, lk, xp, self.device)
            for t in ("key_embeddings", "value_embeddings")
        )
        scores = xp.sum(q[..., :, None, :] * (k[..., None, :, :] + a_k), axis=-1)
        weights = softmax(scores / math.sqrt(q.shape[-1]), None, -1, xp)
        return weights @ v + xp.sum(weights[..., None] * a_v, axis=-2)


class MemoryEncoder(Encoder):
    """Each layer also attends to its last ``memory`` inputs of past segments (Transformer-XL)."""

    def context(self, h: Any, memory: Any) -> Any:
        """The keys' inputs: the layer's memory, then the segment."""
        return h if memory is None else self.xp.concat((memory, h), axis=-2)

    def projections(self, h: Any, memory: Any, p: dict) -> tuple[Any, Any, Any]:
        """Queries of the segment, keys and values of the memory and the segment, per head."""
        context = self.context(h, memory)
        q = self.heads(h @ p["w_q"])
        return q, self.heads(context @ p["w_k"]), self.heads(context @ p["w_v"])

    def remember(self, memory: Any, h: Any) -> Any:
        return update_memory(memory, h, self.config.memory)


class TransformerXLEncoder(MemoryEncoder):
    """Dai et al. 2019: relative scores with u, v and segment memory."""

    name = "xl"
    description = "Transformer-XL: u, v biases, causal layout, segment memory"

    def position_table(self, lq: int, lk: int) -> Any:
        """``R``: sinusoid of ``i - j = -δ`` over the causal layout, clamped at ``clamp_len``."""
        xp = self.xp
        distance = -relative_distances(lq, lk, causal=True, xp=xp, device=self.device)
        distance = xp.clip(distance, 0, self.config.clamp_len)
        return sinusoidal_position_encoding(
            distance, self.config.d_model, layout="concatenated", dtype=self.dtype
        )

    def attend(self, h, memory, p, naive, start=0):
        q, k, v = self.projections(h, memory, p)
        r = self.heads(self.position_table(q.shape[-2], k.shape[-2]) @ p["w_r"])
        u, vb = p["u"][:, None, :], p["v"][:, None, :]
        if naive:
            scale = 1 / math.sqrt(q.shape[-1])
            return naive_relative_attention(
                q, k, v, r, u, vb, scale=scale, causal=True, xp=self.xp, device=self.device
            )
        return relative_attention(q, k, v, r, content_bias=u, position_bias=vb)


class TenerEncoder(Encoder):
    """Yan et al. 2019: unprojected keys, unprojected signed sinusoid, no scaling."""

    name = "tener"
    description = "TENER: unprojected signed sinusoid, full layout, scale 1"

    def attend(self, h, memory, p, naive, start=0):
        xp, length = self.xp, h.shape[-2]
        q, k, v = self.heads(h @ p["w_q"]), self.heads(h), self.heads(h @ p["w_v"])
        distance = -relative_distances(length, length, xp=xp, device=self.device)
        table = sinusoidal_position_encoding(
            distance, q.shape[-1], layout="concatenated", dtype=self.dtype
        )
        u, vb = p["u"][:, None, :], p["v"][:, None, :]
        if naive:
            return naive_relative_attention(
                q, k, v, table, u, vb, scale=1.0, causal=False, xp=xp, device=self.device
            )
        return relative_attention(q, k, v, table, content_bias=u, position_bias=vb, scale=1.0)


class ComplexOrderEncoder(Encoder):
    """Wang et al. 2020: complex-order embeddings and complex attention, one layer.

    The output is complex; the demo compares it as such.
    """

    name = "complex"
    description = "complex order: r·exp(i(ωp+θ)) embeddings, Re(q·k̄) attention"

    @staticmethod
    def init_weights(config: Config) -> dict[str, Any]:
        rng = np.random.default_rng(config.seed)
        d = config.d_model

        def complex_dense() -> np.ndarray:
            parts = rng.normal(scale=1 / math.sqrt(2 * d), size=(2, d, d))
            return parts[0] + 1j * parts[1]

        return {
            "embedding": np.stack(
                [
                    rng.uniform(0.5, 1.5, size=(256, d)),  # amplitude r
                    rng.normal(scale=0.5, size=(256, d)),  # frequency ω
                    rng.uniform(-np.pi, np.pi, size=(256, d)),  # initial phase θ
                ]
            ),
            "layers": [{w: complex_dense() for w in ("w_q", "w_k", "w_v")}],
        }

    def embed(self, tokens: np.ndarray) -> Any:
        xp = self.xp
        index = xp.asarray(tokens, device=self.device)
        r, w, theta = (xp.take(self.embedding[n, ...], index, axis=0) for n in range(3))
        positions = xp.arange(len(tokens), dtype=self.dtype, device=self.device)
        return complex_order_embedding(r, w, theta, positions)

    def layer(self, h, memory, p, naive, start=0):
        xp = self.xp
        q, k, v = (self.heads(complex_linear(h, p[w])) for w in ("w_q", "w_k", "w_v"))
        if not naive:
            return merge_heads(complex_attention(q, k, v, conjugate=True, reduction="real"))
        # Re(q·k̄) = q_r·k_r + q_i·k_i, four real products spelled out.
        qr, qi, kr, ki = xp.real(q), xp.imag(q), xp.real(k), xp.imag(k)
        scores = (qr @ xp.matrix_transpose(kr) + qi @ xp.matrix_transpose(ki)) / math.sqrt(
            q.shape[-1]
        )
        weights = xp.astype(softmax(scores, None, -1, xp), v.dtype)
        return merge_heads(weights @ v)


class DisanEncoder(Encoder):
    """Shen et al. 2018: a DiSA block, forward and backward directions concatenated."""

    name = "disan"
    description = "DiSAN: directional multi-dimensional attention, fusion gate"

    @staticmethod
    def init_weights(config: Config) -> dict[str, Any]:
        rng = np.random.default_rng(config.seed)
        d = config.d_model

        def block() -> dict[str, np.ndarray]:
            return {
                "w_h": dense(rng, d, d),
                "b_h": np.zeros(d),
                "w_1": dense(rng, d, d),
                "w_2": dense(rng, d, d),
                "b_1": np.zeros(d),
                "w_f1": dense(rng, d, d),
                "w_f2": dense(rng, d, d),
                "b_f": np.zeros(d),
            }

        return {"embedding": rng.normal(size=(256, d)), "layers": [block(), block()]}

    def step(self, h, memories, naive=False, start=0):
        """Forward and backward DiSA blocks, concatenated: ``(L, 2·d)``."""
        xp = self.xp
        outputs = []
        for direction, p in zip(("forward", "backward"), self.layers, strict=True):
            x = elu(h @ p["w_h"] + p["b_h"], xp)
            outputs.append(
                multi_dimensional_attention(
                    x,
                    p["w_1"],
                    p["w_2"],
                    p["b_1"],
                    direction=direction,
                    fusion=(p["w_f1"], p["w_f2"], p["b_f"]),
                    # the fast path computes the O(L²·d) logits 16 queries at a time
                    chunk_size=x.shape[-2] if naive else 16,
                )
            )
        return xp.concat(outputs, axis=-1), memories


class T5Encoder(Encoder):
    """Raffel et al. 2020: a learned scalar per distance bucket and head, shared by the layers."""

    name = "t5"
    description = "T5: learned bias per distance bucket and head, shared by layers, scale 1"
    num_buckets, max_distance = 32, 128

    @classmethod
    def init_weights(cls, config: Config) -> dict[str, Any]:
        def table(rng: np.random.Generator) -> dict[str, np.ndarray]:
            return {"bias_table": rng.normal(size=(cls.num_buckets, config.heads))}

        return transformer_weights(config, shared=table)

    def attend(self, h, memory, p, naive, start=0):
        xp, length = self.xp, h.shape[-2]
        q, k, v = (self.heads(h @ p[w]) for w in ("w_q", "w_k", "w_v"))
        table = self.shared["bias_table"]  # (num_buckets, H)
        if not naive:
            # one bucket, and one value per head, for each column of the relative layout
            distances = relative_distances(length, length, xp=xp, device=self.device)
            buckets = relative_position_bucket(
                distances, num_buckets=self.num_buckets, max_distance=self.max_distance
            )
            values = xp.matrix_transpose(xp.take(table, buckets, axis=0))  # (H, W)
            return scaled_dot_product_attention(q, k, v, relative_bias=values, scale=1.0)
        # HF's way: a bucket per (i, j) pair, the (H, Lq, Lk) bias materialised.
        buckets = t5_bucket(pair_distances(length, length), self.num_buckets, self.max_distance)
        index = xp.asarray(np.reshape(buckets, (-1,)), device=self.device)
        bias = xp.reshape(
            xp.matrix_transpose(xp.take(table, index, axis=0)), (table.shape[1], length, length)
        )
        return softmax(q @ xp.matrix_transpose(k) + bias, None, -1, xp) @ v


class AlibiEncoder(MemoryEncoder):
    """Press et al. 2022: causal attention biased by a slope per head times the distance."""

    name = "alibi"
    description = "ALiBi: slope per head times distance, causal layout, segment memory"

    def attend(self, h, memory, p, naive, start=0):
        xp = self.xp
        q, k, v = self.projections(h, memory, p)
        lq, lk = q.shape[-2], k.shape[-2]
        if not naive:
            # m_h·δ over the causal layout (δ <= 0, width Lk), which masks δ > 0
            slopes = alibi_slopes(self.config.heads, dtype=self.dtype, device=self.device, xp=xp)
            distances = relative_distances(lq, lk, causal=True, xp=xp, device=self.device)
            values = slopes[:, None] * xp.astype(distances, self.dtype)  # (H, Lk)
            return scaled_dot_product_attention(q, k, v, relative_bias=values)
        # m_h·(j - i) materialised for every pair, with a causal mask.
        delta = pair_distances(lq, lk)
        slopes = xp.asarray(press_slopes(self.config.heads), dtype=self.dtype, device=self.device)
        bias = slopes[:, None, None] * xp.asarray(delta, dtype=self.dtype, device=self.device)
        scores = q @ xp.matrix_transpose(k) / math.sqrt(q.shape[-1]) + bias
        return softmax(scores, xp.asarray(delta <= 0, device=self.device), -1, xp) @ v


class RotaryEncoder(MemoryEncoder):
    """Su et al. 2021: queries and keys rotated at their positions in the text, causal.

    The positions count from the start of the text (a cache offset: the
    segment's first token is at ``start``), memory keys at their own
    positions. Even layers pair features as LLaMA does (``"concatenated"``),
    odd layers as the paper and GPT-J do (``"interleaved"``).
    """

    name = "rope"
    description = (
        "RoPE: q, k rotated at their positions in the text, LLaMA pairs (interleaved in "
        "odd layers), causal, segment memory"
    )

    @staticmethod
    def init_weights(config: Config) -> dict[str, Any]:
        weights = transformer_weights(config)
        for n, layer in enumerate(weights["layers"]):
            layer["layout"] = ("concatenated", "interleaved")[n % 2]
        return weights

    def attend(self, h, memory, p, naive, start=0):
        xp = self.xp
        q, k, v = self.projections(h, memory, p)
        lq, lk = q.shape[-2], k.shape[-2]
        if not naive:
            # keys at start - M … start + Lq - 1 (memory first); the queries are the last Lq
            positions = xp.arange(lk, device=self.device) + (start - (lk - lq))
            q = rotary_position_embedding(q, positions[lk - lq :], layout=p["layout"])
            k = rotary_position_embedding(k, positions, layout=p["layout"])
            return scaled_dot_product_attention(q, k, v, causal=True)
        # q_i · R(δθ) k_j for every pair: each feature pair (a, b) of k_j rotated by
        # δ(i, j)·θ_k, θ_k = 10000^(-2k/d); no position but the pair's distance.
        d = q.shape[-1]
        half = d // 2
        delta = pair_distances(lq, lk)
        angle = delta[:, :, None] * 10000.0 ** (-2 * np.arange(half) / d)  # (Lq, Lk, d/2)
        cos, sin = (
            xp.asarray(f(angle), dtype=self.dtype, device=self.device) for f in (np.cos, np.sin)
        )
        if p["layout"] == "concatenated":  # pairs (x_k, x_{k+d/2})
            a, b = slice(0, half), slice(half, d)
        else:  # pairs (x_2k, x_2k+1)
            a, b = slice(0, d, 2), slice(1, d, 2)
        qa, qb = q[..., :, None, a], q[..., :, None, b]
        ka, kb = k[..., None, :, a], k[..., None, :, b]
        scores = xp.sum(qa * (ka * cos - kb * sin) + qb * (ka * sin + kb * cos), axis=-1)
        mask = xp.asarray(delta <= 0, device=self.device)
        return softmax(scores / math.sqrt(d), mask, -1, xp) @ v


class DebertaEncoder(Encoder):
    """He et al. 2021, DeBERTa-v2/v3: disentangled attention over log-bucketed distances.

    One relative embedding table of ``2k`` rows (``k`` DeBERTa's
    ``position_buckets``, its attention span) is shared by the layers; each
    layer projects it with its own ``W_q`` and ``W_k`` (``share_att_key``) into
    position queries and keys. The pair ``(i, j)`` reads row
    ``φ = clip(bucket(i - j) + k, 0, 2k - 1)`` of both: DeBERTa indexes by
    query minus key, ``-δ``.
    """

    name = "deberta"
    description = "DeBERTa-v2: c2c + c2p + p2c, log-bucketed table of 2k rows, scale 1/√(3d)"
    span, max_position = 16, 32  # k = position_buckets, max_relative_positions

    @classmethod
    def init_weights(cls, config: Config) -> dict[str, Any]:
        def table(rng: np.random.Generator) -> dict[str, np.ndarray]:
            return {"relative_embeddings": rng.normal(size=(2 * cls.span, config.d_model))}

        return transformer_weights(config, shared=table)

    def attend(self, h, memory, p, naive, start=0):
        xp, length, span = self.xp, h.shape[-2], self.span
        q, k, v = (self.heads(h @ p[w]) for w in ("w_q", "w_k", "w_v"))
        table = self.shared["relative_embeddings"]
        pos_key, pos_query = (self.heads(table @ p[w]) for w in ("w_k", "w_q"))  # (H, 2k, d_head)
        if not naive:
            # one row of each table per column of the full relative layout
            delta = relative_distances(length, length, xp=xp, device=self.device)
            bucket = log_bucket_position(-delta, bucket_size=span, max_position=self.max_position)
            phi = xp.clip(bucket + span, 0, 2 * span - 1)
            position_table, query_position_table = (
                xp.take(t, phi, axis=1) for t in (pos_key, pos_query)
            )
            return disentangled_attention(q, k, v, position_table, query_position_table)
        # HF's way: φ for every (i, j) pair, the three scores written out.
        bucket = deberta_bucket(-pair_distances(length, length), span, self.max_position)
        phi = xp.asarray(
            np.reshape(np.clip(bucket + span, 0, 2 * span - 1), (-1,)), device=self.device
        )
        shape = (*pos_key.shape[:-2], length, length, pos_key.shape[-1])
        key_pairs, query_pairs = (
            xp.reshape(xp.take(t, phi, axis=1), shape) for t in (pos_key, pos_query)
        )
        c2c = q @ xp.matrix_transpose(k)
        c2p = xp.sum(q[..., :, None, :] * key_pairs, axis=-1)  # q_i · Kʳ[φ(i, j)]
        p2c = xp.sum(k[..., None, :, :] * query_pairs, axis=-1)  # k_j · Qʳ[φ(i, j)]
        return softmax((c2c + c2p + p2c) / math.sqrt(3 * q.shape[-1]), None, -1, xp) @ v


#: The demo's image-like grid: a segment's tokens row-major, this many to a row.
GRID_WIDTH = 8


def grid_shape(length: int) -> tuple[int, int]:
    """``(rows, GRID_WIDTH)`` covering ``length`` tokens (the last row may be short)."""
    return -(-length // GRID_WIDTH), GRID_WIDTH


def grid_pair_index(length: int, table_rows: int) -> np.ndarray:
    """Swin's table entry of every ``(i, j)`` pair, on the host: ``(L, L)`` ints.

    Token ``t`` sits at ``divmod(t, GRID_WIDTH)``; the table has ``table_rows`` rows of
    ``2·GRID_WIDTH − 1`` column distances, row distance 0 in its middle row.
    """
    rows, cols = np.divmod(np.arange(length), GRID_WIDTH)
    centre = (table_rows - 1) // 2
    index = np.empty((length, length), dtype=np.int64)
    for i in range(length):
        for j in range(length):
            index[i, j] = (rows[i] - rows[j] + centre) * (2 * GRID_WIDTH - 1) + (
                cols[i] - cols[j] + GRID_WIDTH - 1
            )
    return index


class SwinEncoder(Encoder):
    """Liu et al. 2021 (Swin), Bao et al. 2022 (BEiT): a learned bias per head over the
    2-D relative positions ``(Δrow, Δcol)`` of the segment laid out as an image."""

    name = "swin"
    description = "Swin/BEiT: learned bias per head and 2-D distance, segment as an 8-wide grid"

    @staticmethod
    def init_weights(config: Config) -> dict[str, Any]:
        rows = 2 * grid_shape(config.segment)[0] - 1

        def table(rng: np.random.Generator) -> dict[str, np.ndarray]:
            return {"bias_table": rng.normal(size=(config.heads, rows * (2 * GRID_WIDTH - 1)))}

        return transformer_weights(config, extra=table)

    def attend(self, h, memory, p, naive, start=0):
        xp, length = self.xp, h.shape[-2]
        q, k, v = (self.heads(h @ p[w]) for w in ("w_q", "w_k", "w_v"))
        table = p["bias_table"]  # (H, (2·rows − 1)(2·width − 1)), row distances ascending
        stored = 2 * grid_shape(self.config.segment)[0] - 1
        height = grid_shape(length)[0]
        if not naive:
            # a shorter segment's grid has fewer row distances: the table's middle rows
            first = (stored - (2 * height - 1)) // 2 * (2 * GRID_WIDTH - 1)
            rows = table[:, first : first + (2 * height - 1) * (2 * GRID_WIDTH - 1)]
            mod = grid_bias_mod(rows, height, GRID_WIDTH)
            return scaled_dot_product_attention(q, k, v, score_mod=mod)
        # The (H, L, L) bias gathered pair by pair from the whole table.
        index = xp.asarray(np.reshape(grid_pair_index(length, stored), (-1,)), device=self.device)
        bias = xp.reshape(xp.take(table, index, axis=1), (table.shape[0], length, length))
        scores = q @ xp.matrix_transpose(k) / math.sqrt(q.shape[-1]) + bias
        return softmax(scores, None, -1, xp) @ v


def full_grid(length: int) -> tuple[int, int]:
    """``(rows, cols)`` with ``rows·cols = length``: ``GRID_WIDTH`` columns where they
    divide the segment, else the widest that does."""
    cols = max(c for c in range(1, GRID_WIDTH + 1) if length % c == 0)
    return length // cols, cols


class DecomposedEncoder(Encoder):
    """Li et al. 2022 (MViTv2), Kirillov et al. 2023 (SAM): ``q_i·Rʰ[Δrow] + q_i·Rʷ[Δcol]``,
    one learned table per axis, the segment laid out as an image."""

    name = "sam"
    description = "SAM/MViTv2: decomposed 2-D relative positions, a table per axis"

    @staticmethod
    def init_weights(config: Config) -> dict[str, Any]:
        rows, cols = full_grid(config.segment)
        head = config.d_model // config.heads

        def tables(rng: np.random.Generator) -> dict[str, np.ndarray]:
            return {
                "rel_h": rng.normal(scale=0.5, size=(2 * rows - 1, head)),
                "rel_w": rng.normal(scale=0.5, size=(2 * cols - 1, head)),
            }

        return transformer_weights(config, extra=tables)

    def attend(self, h, memory, p, naive, start=0):
        xp, length = self.xp, h.shape[-2]
        q, k, v = (self.heads(h @ p[w]) for w in ("w_q", "w_k", "w_v"))
        grid = full_grid(length)
        if not naive:
            return decomposed_relative_attention(q, k, v, p["rel_h"], p["rel_w"], query_grid=grid)
        # The (H, L, L) bias: each pair's rows of the tables gathered, one product per pair.
        rows, cols = np.divmod(np.arange(length), grid[1])
        bias = 0.0
        for table, coords, size in ((p["rel_h"], rows, grid[0]), (p["rel_w"], cols, grid[1])):
            table = resize_relative_table(table, 2 * size - 1)  # SAM's, for a shorter segment
            index = np.reshape(coords[:, None] - coords[None, :] + size - 1, (-1,))
            pairs = xp.take(table, xp.asarray(index, device=self.device), axis=0)
            pairs = xp.reshape(pairs, (length, length, table.shape[-1]))
            bias = bias + xp.sum(q[..., :, None, :] * pairs, axis=-1)
        scores = q @ xp.matrix_transpose(k) / math.sqrt(q.shape[-1]) + bias
        return softmax(scores, None, -1, xp) @ v


SCHEMES = {
    cls.name: cls
    for cls in (
        AbsoluteEncoder,
        ShawEncoder,
        TransformerXLEncoder,
        TenerEncoder,
        ComplexOrderEncoder,
        DisanEncoder,
        T5Encoder,
        AlibiEncoder,
        RotaryEncoder,
        DebertaEncoder,
        SwinEncoder,
        DecomposedEncoder,
    )
}
