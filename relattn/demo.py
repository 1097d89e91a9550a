"""The demo: a 2-layer Transformer-XL encoder over real text, on every backend.

Byte tokens of a text (the Zen of Python by default) run through a
Transformer-XL encoder with seeded random weights, segment by segment with
memory. Each backend runs the same relattn code; the demo checks it against a
NumPy float64 run and against a naive model whose position scores are
gathered per ``(i, j)`` pair instead of shifted, and times each segment.
"""

from __future__ import annotations

import codecs
import contextlib
import importlib
import io
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import array_api_compat
import numpy as np

from .attention import relative_attention, softmax
from .backends import backend_for, namespace_of_module
from .encodings import sinusoidal_position_encoding
from .heads import merge_heads, split_heads
from .masks import causal_mask
from .memory import update_memory
from .positions import relative_distances, relative_positions

#: Backends the demo knows, by the module a user passes as ``xp``.
BACKENDS = {
    "numpy": "numpy",
    "array_api_strict": "array_api_strict",
    "torch": "torch",
    "jax": "jax.numpy",
    "cupy": "cupy",
    "dask": "dask.array",
}

#: SPEC §5 tolerances, per dtype, on unit-scale data.
TOLERANCES = {"float64": (1e-10, 1e-12), "float32": (1e-4, 1e-5)}


@dataclass(frozen=True)
class Config:
    segment: int = 64
    memory: int = 64
    d_model: int = 64
    heads: int = 4
    layers: int = 2
    clamp_len: int = 1000
    seed: int = 0


def zen_of_python() -> str:
    """The Zen of Python, from CPython's ``this`` module (which prints it on import)."""
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return codecs.decode(this.s, "rot13")


def byte_tokens(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def init_weights(config: Config) -> dict[str, Any]:
    """Seeded float64 NumPy weights, scaled so activations stay near unit scale."""
    rng = np.random.default_rng(config.seed)
    d, h = config.d_model, config.heads

    def dense(n_in: int, n_out: int) -> np.ndarray:
        return rng.normal(scale=1 / math.sqrt(n_in), size=(n_in, n_out))

    layers = [
        {
            "w_q": dense(d, d),
            "w_k": dense(d, d),
            "w_v": dense(d, d),
            "w_r": dense(d, d),
            "w_o": dense(d, d),
            "u": rng.normal(scale=0.5, size=(h, d // h)),
            "v": rng.normal(scale=0.5, size=(h, d // h)),
            "w_1": dense(d, 4 * d),
            "b_1": np.zeros(4 * d),
            "w_2": dense(4 * d, d),
            "b_2": np.zeros(d),
        }
        for _ in range(config.layers)
    ]
    return {"embedding": rng.normal(size=(256, d)), "layers": layers}


def layer_norm(x: Any, xp: Any, eps: float = 1e-5) -> Any:
    mean = xp.mean(x, axis=-1, keepdims=True)
    var = xp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / xp.sqrt(var + eps)


def naive_relative_attention(q: Any, k: Any, v: Any, r: Any, u: Any, vb: Any, xp: Any) -> Any:
    """Transformer-XL attention with ``r_{i-j}`` gathered per pair: ``(H, Lq, Lk, d)``."""
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    delta = relative_positions(lq, lk, xp=xp)
    index = xp.reshape(xp.clip(delta + (lk - 1), 0, lk - 1), (lq * lk,))
    r_pairs = xp.reshape(xp.take(r, index, axis=r.ndim - 2), (*r.shape[:-2], lq, lk, d))
    position = xp.sum((q + vb)[..., :, None, :] * r_pairs, axis=-1)
    scores = ((q + u) @ xp.matrix_transpose(k) + position) / math.sqrt(d)
    return softmax(scores, causal_mask(lq, lk, xp=xp), -1, xp) @ v


class TransformerXLEncoder:
    """Transformer-XL encoder layers (Dai et al. 2019) built from relattn calls.

    ``weights`` are NumPy arrays; they are moved to ``xp`` in ``dtype`` once.
    ``naive=True`` swaps the shifted position scores for a per-pair gather.
    """

    def __init__(self, weights: dict, config: Config, xp: Any, dtype: Any, device: Any = None):
        self.config, self.xp, self.dtype, self.device = config, xp, dtype, device
        self.embedding = self._array(weights["embedding"])
        self.layers = [{n: self._array(w) for n, w in layer.items()} for layer in weights["layers"]]

    def _array(self, a: np.ndarray) -> Any:
        return self.xp.asarray(a, dtype=self.dtype, device=self.device)

    def embed(self, tokens: np.ndarray) -> Any:
        index = self.xp.asarray(tokens, device=self.device)
        return self.xp.take(self.embedding, index, axis=0)

    def position_table(self, lq: int, lk: int) -> Any:
        """``R``: sinusoid of ``i - j = -δ`` over the causal layout, clamped at ``clamp_len``."""
        xp = self.xp
        distance = -relative_distances(lq, lk, causal=True, xp=xp, device=self.device)
        distance = xp.clip(distance, 0, self.config.clamp_len)
        return sinusoidal_position_encoding(
            distance, self.config.d_model, layout="concatenated", dtype=self.dtype
        )

    def layer(self, h: Any, memory: Any, p: dict, naive: bool = False) -> Any:
        xp, heads = self.xp, self.config.heads
        context = h if memory is None else xp.concat((memory, h), axis=-2)
        lq, lk = h.shape[-2], context.shape[-2]
        q = split_heads(h @ p["w_q"], heads)
        k = split_heads(context @ p["w_k"], heads)
        v = split_heads(context @ p["w_v"], heads)
        r = split_heads(self.position_table(lq, lk) @ p["w_r"], heads)
        u, vb = p["u"][:, None, :], p["v"][:, None, :]
        if naive:
            attended = naive_relative_attention(q, k, v, r, u, vb, xp)
        else:
            attended = relative_attention(q, k, v, r, content_bias=u, position_bias=vb)
        h = layer_norm(h + merge_heads(attended) @ p["w_o"], xp)
        hidden = xp.maximum(h @ p["w_1"] + p["b_1"], xp.zeros((), dtype=h.dtype))
        return layer_norm(h + hidden @ p["w_2"] + p["b_2"], xp)

    def step(self, h: Any, memories: list, naive: bool = False) -> tuple[Any, list]:
        """One segment through every layer; returns the output and the new memories."""
        new = []
        for p, memory in zip(self.layers, memories, strict=True):
            new.append(update_memory(memory, h, self.config.memory))
            h = self.layer(h, memory, p, naive)
        return h, new


def run(encoder: TransformerXLEncoder, tokens: np.ndarray, naive: bool = False):
    """Encode ``tokens`` segment by segment; returns the host output and seconds per segment."""
    backend = backend_for(encoder.xp)
    step = backend.jit(lambda h, mems: encoder.step(h, mems, naive))
    memories: list = [None] * encoder.config.layers
    outputs, times = [], []
    for start in range(0, len(tokens), encoder.config.segment):
        h = encoder.embed(tokens[start : start + encoder.config.segment])
        tic = time.perf_counter()
        out, memories = step(h, memories)
        memories = [backend.materialize(m) for m in memories]
        outputs.append(backend.to_host(out))
        times.append(time.perf_counter() - tic)
    return np.concatenate(outputs), times


def default_device(name: str, lib: Any) -> Any:
    """The accelerator where the library has one, else its CPU."""
    if name == "torch":
        return lib.device("cuda" if lib.cuda.is_available() else "cpu")
    return None


def available(names: list[str]) -> list[str]:
    found = []
    for name in names:
        try:
            importlib.import_module(BACKENDS[name])
        except ImportError:
            continue
        found.append(name)
    return found


def exceeds(got: np.ndarray, want: np.ndarray, dtype: str) -> float:
    """Largest violation of ``|got - want| <= atol + rtol·|want|`` (> 0 means failure)."""
    rtol, atol = TOLERANCES[dtype]
    return float(np.max(np.abs(got - want) - (atol + rtol * np.abs(want))))


def demo(
    backends: list[str],
    text: str,
    text_name: str,
    config: Config = Config(),
    dtype: str = "float32",
    out: Any = print,
) -> bool:
    """Run the demo on ``backends``; print the table; return whether every check passed."""
    tokens = byte_tokens(text)
    weights = init_weights(config)
    numpy_xp = namespace_of_module(None)
    reference, _ = run(TransformerXLEncoder(weights, config, numpy_xp, numpy_xp.float64), tokens)
    segments = math.ceil(len(tokens) / config.segment)
    out(
        f"relattn demo: Transformer-XL encoder, {config.layers} layers, d_model {config.d_model}, "
        f"{config.heads} heads, segment {config.segment}, memory {config.memory}"
    )
    out(f"text: {text_name}, {len(tokens)} byte tokens, {segments} segments")
    out("")
    header = f"{'backend':<17}{'device':<12}{'dtype':<9}{'max|Δ| vs numpy f64':>21}"
    out(header + f"{'max|shift - gather|':>21}{'ms/segment':>12}  check")
    ok = True
    for name in backends:
        lib = importlib.import_module(BACKENDS[name])
        xp = namespace_of_module(lib)
        device = default_device(name, lib)
        encoder = TransformerXLEncoder(weights, config, xp, getattr(xp, dtype), device)
        run(encoder, tokens[: config.segment])  # warm up: imports, jit compilation
        result, times = run(encoder, tokens)
        naive, _ = run(encoder, tokens, naive=True)
        vs_reference = float(np.max(np.abs(result - reference)))
        vs_naive = float(np.max(np.abs(result - naive)))
        passed = exceeds(result, reference, dtype) <= 0 and exceeds(result, naive, dtype) <= 0
        ok &= passed
        # "Device('CPU_DEVICE')" -> "CPU_DEVICE"
        where = re.sub(r"^.*\('(.*)'\)$", r"\1", str(array_api_compat.device(encoder.embedding)))
        out(
            f"{name:<17}{where:<12}{dtype:<9}{vs_reference:>21.2e}{vs_naive:>21.2e}"
            f"{1e3 * float(np.median(times)):>12.2f}  {'ok' if passed else 'FAIL'}"
        )
    return ok


def read_text(path: str | None) -> tuple[str, str]:
    if path is None:
        return zen_of_python(), "the Zen of Python (CPython's `this`)"
    return Path(path).read_text(encoding="utf-8"), path
