"""ALiBi (Press et al. 2022): a causal language model's attention with linear biases.

ALiBi adds no position to the tokens. Head ``h`` adds ``m_h · δ`` to the logit
of query ``i`` and key ``j``, ``δ = j - i <= 0`` (key minus query): a penalty
growing linearly with the distance to the past, with the head's slope ``m_h``
(``2^(-8h/H)`` for ``H`` a power of two; ``alibi_slopes`` also gives the
authors' slopes for other ``H``). BLOOM and MPT add ``m_h · j`` instead, which
differs by a constant per row and gives the same weights.

In relattn the bias is a vector per distance over the **causal layout**
(``W = Lk`` columns, ``δ = -(Lk - 1) … 0``): ``values (H, Lk) = m[:, None] · δ``,
passed unexpanded as ``relative_bias=``. The causal layout also says that the
keys with ``δ > 0`` are masked: no mask array is needed. With a cache of ``n``
tokens the ``Lq`` new queries sit at the last positions (``δ = j - (i + n)``).

Run ``python examples/alibi.py``: it checks itself against a per-pair loop.
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat
import numpy as np

import relattn

BATCH, LENGTH, CACHE, D_MODEL, HEADS = 2, 6, 3, 12, 3  # 3 heads: not a power of two


def inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """NumPy float64 projections and two sequences: a prompt and a continuation."""
    rng = np.random.default_rng(seed)

    def dense() -> np.ndarray:
        return rng.normal(scale=1 / math.sqrt(D_MODEL), size=(D_MODEL, D_MODEL))

    return {
        "prompt": rng.normal(size=(BATCH, CACHE, D_MODEL)),
        "x": rng.normal(size=(BATCH, LENGTH, D_MODEL)),
        "w_q": dense(),
        "w_k": dense(),
        "w_v": dense(),
        "w_o": dense(),
    }


def alibi_bias(num_heads: int, key_length: int, *, like: Any) -> Any:
    """``values (H, Lk) = m_h · δ`` over the causal layout, in the dtype and device of ``like``."""
    xp = array_api_compat.array_namespace(like)
    device = array_api_compat.device(like)
    slopes = relattn.alibi_slopes(num_heads, dtype=like.dtype, device=device, xp=xp)
    delta = relattn.relative_distances(key_length, key_length, causal=True, xp=xp, device=device)
    return slopes[:, None] * xp.astype(delta, like.dtype)[None, :]


def alibi_self_attention(x: Any, p: dict[str, Any], *, cache: Any = None, heads: int = HEADS):
    """Causal multi-head self-attention of ``x`` after ``cache`` (the keys' inputs, or None)."""
    xp = array_api_compat.array_namespace(x)
    context = x if cache is None else xp.concat((cache, x), axis=-2)
    q = relattn.split_heads(x @ p["w_q"], heads)  # (B, H, Lq, d_head)
    k = relattn.split_heads(context @ p["w_k"], heads)  # (B, H, Lk, d_head)
    v = relattn.split_heads(context @ p["w_v"], heads)
    values = alibi_bias(heads, context.shape[-2], like=q)  # (H, Lk): causal layout
    out = relattn.scaled_dot_product_attention(q, k, v, relative_bias=values)
    return relattn.merge_heads(out) @ p["w_o"]


# -- the per-pair check ------------------------------------------------------------------------


def slopes(num_heads: int) -> list[float]:
    """The authors' ``get_slopes`` (github.com/ofirpress/attention_with_linear_biases)."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_2(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_2(closest) + slopes(2 * closest)[0::2][: num_heads - closest]


def loop_reference(x, p, *, cache=None, heads=HEADS):
    """Every logit ``q_i·k_j/√d + m_h (j - i)`` written out; keys after the query masked."""
    context = x if cache is None else np.concatenate((cache, x), axis=1)
    lq, lk, d_head = x.shape[1], context.shape[1], D_MODEL // heads
    q, k, v = x @ p["w_q"], context @ p["w_k"], context @ p["w_v"]
    m = slopes(heads)
    out = np.zeros(x.shape)
    for b in range(x.shape[0]):
        for h in range(heads):
            cols = slice(h * d_head, (h + 1) * d_head)
            for i in range(lq):
                position = i + lk - lq
                logits = [
                    q[b, i, cols] @ k[b, j, cols] / math.sqrt(d_head) + m[h] * (j - position)
                    for j in range(position + 1)
                ]
                weights = np.exp(np.asarray(logits) - max(logits))
                out[b, i, cols] = weights / weights.sum() @ v[b, : position + 1, cols]
    return out @ p["w_o"]


def main() -> float:
    p = inputs()
    diffs = {
        "prompt": np.abs(
            alibi_self_attention(p["prompt"], p) - loop_reference(p["prompt"], p)
        ).max(),
        "continuation after the prompt": np.abs(
            alibi_self_attention(p["x"], p, cache=p["prompt"])
            - loop_reference(p["x"], p, cache=p["prompt"])
        ).max(),
    }
    for name, diff in diffs.items():
        print(f"ALiBi {name}: max |relattn - per-pair loop| = {diff:.2e}")
    worst = max(diffs.values())
    assert worst < 1e-10, worst
    return worst


if __name__ == "__main__":
    main()
