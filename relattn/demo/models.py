"""The demo's encoders, one per position scheme, built from relattn calls.

Each encoder holds seeded random weights on one backend and encodes byte
tokens segment by segment: ``step(h, memories, naive)`` returns the segment's
output and the memories for the next segment (only Transformer-XL keeps any).
``naive=True`` swaps relattn's algorithm for the formula computed directly
(per-pair gathers, materialised relative tensors, unchunked logits), so the
demo can show that the two agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .._activations import elu
from ..attention import relative_attention, scaled_dot_product_attention
from ..complex_order import complex_attention, complex_linear, complex_order_embedding
from ..core import softmax
from ..disan import multi_dimensional_attention
from ..encodings import sinusoidal_position_encoding
from ..heads import merge_heads, split_heads
from ..masks import causal_mask
from ..memory import update_memory
from ..positions import relative_distances, relative_positions, relative_table
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


def transformer_weights(config: Config, extra: Any = None) -> dict[str, Any]:
    """Seeded float64 NumPy weights of a post-norm Transformer encoder.

    ``extra(rng)`` adds scheme-specific arrays to each layer.
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
    return {"embedding": rng.normal(size=(256, d)), "layers": layers}


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


class Encoder:
    """A post-norm Transformer encoder; subclasses supply ``attend``."""

    name: ClassVar[str]
    description: ClassVar[str]

    def __init__(self, config: Config, xp: Any, dtype: Any, device: Any = None):
        self.config, self.xp, self.dtype, self.device = config, xp, dtype, device
        weights = self.init_weights(config)
        self.embedding = self.array(weights["embedding"])
        self.layers = [{n: self.array(w) for n, w in p.items()} for p in weights["layers"]]

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

    def attend(self, h: Any, memory: Any, p: dict, naive: bool) -> Any:
        raise NotImplementedError

    def remember(self, memory: Any, h: Any) -> Any:
        """The memory this layer hands to the next segment (none by default)."""
        return memory

    def layer(self, h: Any, memory: Any, p: dict, naive: bool) -> Any:
        """Attention, residual and norm; feed-forward, residual and norm."""
        xp = self.xp
        h = layer_norm(h + merge_heads(self.attend(h, memory, p, naive)) @ p["w_o"], xp)
        hidden = xp.maximum(h @ p["w_1"] + p["b_1"], xp.zeros((), dtype=h.dtype))
        return layer_norm(h + hidden @ p["w_2"] + p["b_2"], xp)

    def step(self, h: Any, memories: list, naive: bool = False) -> tuple[Any, list]:
        """One segment through every layer; returns the output and the next memories."""
        new = []
        for p, memory in zip(self.layers, memories, strict=True):
            new.append(self.remember(memory, h))
            h = self.layer(h, memory, p, naive)
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

    def attend(self, h, memory, p, naive):
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
                "key_table": rng.normal(scale=0.5, size=(rows, d_head)),
                "value_table": rng.normal(scale=0.5, size=(rows, d_head)),
            }

        return transformer_weights(config, tables)

    def attend(self, h, memory, p, naive):
        xp = self.xp
        q, k, v = (self.heads(h @ p[w]) for w in ("w_q", "w_k", "w_v"))
        if not naive:
            return shaw_attention(q, k, v, p["key_table"], p["value_table"])
        # tensor2tensor's way: a^K_ij and a^V_ij materialised, (Lq, Lk, d_head).
        lq = lk = h.shape[-2]
        a_k, a_v = (
            gather_pairs(relative_table(p[t], lq, lk), lq, lk, xp, self.device)
            for t in ("key_table", "value_table")
        )
        scores = xp.sum(q[..., :, None, :] * (k[..., None, :, :] + a_k), axis=-1)
        weights = softmax(scores / math.sqrt(q.shape[-1]), None, -1, xp)
        return weights @ v + xp.sum(weights[..., None] * a_v, axis=-2)


class TransformerXLEncoder(Encoder):
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

    def attend(self, h, memory, p, naive):
        context = h if memory is None else self.xp.concat((memory, h), axis=-2)
        q = self.heads(h @ p["w_q"])
        k, v = self.heads(context @ p["w_k"]), self.heads(context @ p["w_v"])
        r = self.heads(self.position_table(q.shape[-2], k.shape[-2]) @ p["w_r"])
        u, vb = p["u"][:, None, :], p["v"][:, None, :]
        if naive:
            scale = 1 / math.sqrt(q.shape[-1])
            return naive_relative_attention(
                q, k, v, r, u, vb, scale=scale, causal=True, xp=self.xp, device=self.device
            )
        return relative_attention(q, k, v, r, content_bias=u, position_bias=vb)

    def remember(self, memory: Any, h: Any) -> Any:
        return update_memory(memory, h, self.config.memory)


class TenerEncoder(Encoder):
    """Yan et al. 2019: unprojected keys, unprojected signed sinusoid, no scaling."""

    name = "tener"
    description = "TENER: unprojected signed sinusoid, full layout, scale 1"

    def attend(self, h, memory, p, naive):
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

    def layer(self, h, memory, p, naive):
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

    def step(self, h, memories, naive=False):
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


SCHEMES = {
    cls.name: cls
    for cls in (
        AbsoluteEncoder,
        ShawEncoder,
        TransformerXLEncoder,
        TenerEncoder,
        ComplexOrderEncoder,
        DisanEncoder,
    )
}
