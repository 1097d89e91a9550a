"""TENER (Yan et al. 2019): direction- and distance-aware relative attention.

TENER keeps the key unprojected (``K = H``), scores with the **unprojected**
sinusoid of the signed distance ``t - j`` and drops the ``1/√d`` scaling:

    A_tj = Q_t·K_j + Q_t·R_{t-j} + u·K_j + v·R_{t-j}      (eq. (15)–(17))

In relattn that is ``relative_attention`` with the full-layout table
``R = PE(t - j)`` (``t - j = -δ``) and ``scale=1``. Because sine is odd,
``R_{-k} ≠ R_k``: a key ``k`` tokens to the left scores differently from one
``k`` tokens to the right, which the absolute encoding's ``PE_t·PE_{t+k}``
cannot tell apart.
"""

from __future__ import annotations

import math

import numpy as np

import relattn


def tener_attention(h, p, *, heads, mask, xp):
    """TENER multi-head self-attention over ``h`` (B, L, d)."""
    length, d_model = h.shape[-2], h.shape[-1]
    d_head = d_model // heads
    # One table of d_head dimensions, shared by all heads: R_{t-j} over the full layout.
    distance = -relattn.relative_distances(length, length, xp=xp)
    table = relattn.sinusoidal_position_encoding(
        distance, d_head, layout="concatenated", dtype=h.dtype
    )
    q = relattn.split_heads(h @ p["w_q"], heads)
    k = relattn.split_heads(h, heads)  # TENER: the key is not projected
    v = relattn.split_heads(h @ p["w_v"], heads)
    attended = relattn.relative_attention(
        q,
        k,
        v,
        table,
        content_bias=p["u"][:, None, :],
        position_bias=p["v"][:, None, :],
        mask=mask,
        scale=1.0,
    )
    return relattn.merge_heads(attended)


def mirrored_position_scores(d_head, distance, *, xp):
    """``q·R(+k)`` and ``q·R(-k)`` for a query ``q`` of ones: TENER's tables differ."""
    pair = xp.asarray([float(distance), -float(distance)], dtype=xp.float64)
    table = relattn.sinusoidal_position_encoding(pair, d_head, layout="concatenated")
    return xp.sum(table, axis=-1)


def run(xp, *, seed=0, d_model=8, heads=2):
    rng = np.random.default_rng(seed)
    params = {
        "w_q": rng.normal(scale=1 / math.sqrt(d_model), size=(d_model, d_model)),
        "w_v": rng.normal(scale=1 / math.sqrt(d_model), size=(d_model, d_model)),
        "u": rng.normal(scale=0.5, size=(heads, d_model // heads)),
        "v": rng.normal(scale=0.5, size=(heads, d_model // heads)),
    }
    h = rng.normal(size=(2, 5, d_model))
    lengths = np.array([5, 4])
    mask = relattn.padding_mask(xp.asarray(lengths), 5)[:, None, None, :]
    p = {name: xp.asarray(value) for name, value in params.items()}
    out = tener_attention(xp.asarray(h), p, heads=heads, mask=mask, xp=xp)
    return {
        "params": params,
        "h": h,
        "lengths": lengths,
        "out": np.from_dlpack(out),
        "mirrored": np.from_dlpack(mirrored_position_scores(d_model // heads, 2, xp=xp)),
    }


if __name__ == "__main__":
    result = run(np)
    left, right = result["mirrored"]
    print(f"TENER output {result['out'].shape}; q·R(+2) = {left:.3f}, q·R(-2) = {right:.3f}")
