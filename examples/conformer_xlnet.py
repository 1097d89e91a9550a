"""Relative scores over the full layout: Conformer (ESPnet "latest") and XLNet.

Both score every distance, past and future: ``A_ij = (q_i + u)·k_j + (q_i + v)·r_{i-j}``
with no causal mask. The table is the sinusoid of ``i - j = -δ`` over the full
relative layout (``δ = -(Lk-1) … Lq-1``), projected per head.

- Conformer (Gulati et al. 2020; ESPnet ``RelPositionMultiHeadedAttention``):
  self-attention over a padded batch, interleaved sinusoid, padding mask.
- XLNet (Yang et al. 2019): queries of the current segment attend to
  ``[memory ∘ segment]`` in both directions, concatenated sinusoid. XLNet's own
  table starts one row earlier (``i - j = Lk``, never used); relattn's full
  layout leaves it out.
"""

from __future__ import annotations

import math

import numpy as np

import relattn


def full_layout_table(lq, lk, d_model, *, layout, xp, dtype):
    """Sinusoid of ``i - j`` for every distance a (Lq, Lk) pair has, ascending δ."""
    distance = -relattn.relative_distances(lq, lk, xp=xp)
    return relattn.sinusoidal_position_encoding(distance, d_model, layout=layout, dtype=dtype)


def relative_self_attention(x, context, p, *, heads, layout, mask, xp):
    """Multi-head attention from ``x`` (B, Lq, d) over ``context`` (B, Lk, d), full layout."""
    lq, lk, d_model = x.shape[-2], context.shape[-2], x.shape[-1]
    table = full_layout_table(lq, lk, d_model, layout=layout, xp=xp, dtype=x.dtype)
    q = relattn.split_heads(x @ p["w_q"], heads)
    k = relattn.split_heads(context @ p["w_k"], heads)
    v = relattn.split_heads(context @ p["w_v"], heads)
    r = relattn.split_heads(table @ p["w_pos"], heads)  # ESPnet's linear_pos: no bias
    attended = relattn.relative_attention(
        q, k, v, r, content_bias=p["u"][:, None, :], position_bias=p["v"][:, None, :], mask=mask
    )
    return relattn.merge_heads(attended) @ p["w_o"]


def init_params(rng, d_model, heads):
    def dense():
        return rng.normal(scale=1 / math.sqrt(d_model), size=(d_model, d_model))

    return {
        **{name: dense() for name in ("w_q", "w_k", "w_v", "w_pos", "w_o")},
        "u": rng.normal(scale=0.5, size=(heads, d_model // heads)),
        "v": rng.normal(scale=0.5, size=(heads, d_model // heads)),
    }


def run(xp, *, seed=0, d_model=8, heads=2):
    rng = np.random.default_rng(seed)
    params = init_params(rng, d_model, heads)
    p = {name: xp.asarray(value) for name, value in params.items()}

    # Conformer: a padded batch of two utterances, lengths 5 and 3.
    x = rng.normal(size=(2, 5, d_model))
    lengths = np.array([5, 3])
    key_mask = relattn.padding_mask(xp.asarray(lengths), 5)[:, None, None, :]  # (B, 1, 1, T)
    conformer = relative_self_attention(
        xp.asarray(x), xp.asarray(x), p, heads=heads, layout="interleaved", mask=key_mask, xp=xp
    )

    # XLNet: a segment of 3 attending to 4 memory positions and itself, both directions.
    memory = rng.normal(size=(1, 4, d_model))
    segment = rng.normal(size=(1, 3, d_model))
    context = xp.concat((xp.asarray(memory), xp.asarray(segment)), axis=1)
    xlnet = relative_self_attention(
        xp.asarray(segment), context, p, heads=heads, layout="concatenated", mask=None, xp=xp
    )
    return {
        "params": params,
        "x": x,
        "lengths": lengths,
        "memory": memory,
        "segment": segment,
        "conformer": np.from_dlpack(conformer),
        "xlnet": np.from_dlpack(xlnet),
    }


if __name__ == "__main__":
    result = run(np)
    print("Conformer output", result["conformer"].shape, "XLNet output", result["xlnet"].shape)
