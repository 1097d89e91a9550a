"""Naive NumPy float64 references, written straight from the papers' formulas.

Each loops over every (i, j) pair or gathers per pair, the way the equations
read; none shares code with relattn. Leading (batch, head) dimensions are
broadcast and looped over.
"""

from __future__ import annotations

import math

import numpy as np


def sinusoid(positions, d_model, base=10000.0, layout="interleaved"):
    """Vaswani et al. 2017, sec. 3.5: PE(p, 2k) = sin(p / base^(2k/d)), PE(p, 2k+1) = cos(...)."""
    positions = np.asarray(positions, dtype=np.float64)
    out = np.zeros((positions.shape[0], d_model))
    half = d_model // 2
    for row, p in enumerate(positions):
        for k in range(half):
            angle = float(p) / base ** (2 * k / d_model)
            if layout == "interleaved":
                out[row, 2 * k] = math.sin(angle)
                out[row, 2 * k + 1] = math.cos(angle)
            else:
                out[row, k] = math.sin(angle)
                out[row, half + k] = math.cos(angle)
    return out


def delta(i, j, lq, lk):
    """Relative distance, key minus query, with the queries aligned to the last keys."""
    return j - (i + lk - lq)


def rel_shift(x, lk):
    """out[..., i, j] = x[..., i, j - i + Lq - 1], 0 where that column does not exist."""
    x = np.asarray(x)
    lq, width = x.shape[-2:]
    out = np.zeros((*x.shape[:-2], lq, lk), dtype=x.dtype)
    for i in range(lq):
        for j in range(lk):
            col = delta(i, j, lq, lk) + lk - 1
            if 0 <= col < width:
                out[..., i, j] = x[..., i, col]
    return out


def rel_unshift(x):
    """out[..., i, j - i + Lq - 1] = x[..., i, j], zeros elsewhere."""
    x = np.asarray(x)
    lq, lk = x.shape[-2:]
    out = np.zeros((*x.shape[:-2], lq, lq + lk - 1), dtype=x.dtype)
    for i in range(lq):
        for j in range(lk):
            out[..., i, delta(i, j, lq, lk) + lk - 1] = x[..., i, j]
    return out


def _broadcast_lead(*arrays):
    lead = np.broadcast_shapes(*(a.shape[:-2] for a in arrays if a is not None))
    return lead, [None if a is None else np.broadcast_to(a, (*lead, *a.shape[-2:])) for a in arrays]


def softmax_row(scores, allowed):
    """Softmax of one row over the allowed entries; all zeros when none is allowed."""
    out = np.zeros_like(scores, dtype=np.float64)
    if not np.any(allowed):
        return out
    kept = scores[allowed]
    e = np.exp(kept - kept.max())
    out[allowed] = e / e.sum()
    return out


def masked_softmax(scores, mask=None):
    scores = np.asarray(scores, dtype=np.float64)
    allowed = np.ones(scores.shape, bool) if mask is None else np.broadcast_to(mask, scores.shape)
    out = np.zeros_like(scores)
    for idx in np.ndindex(scores.shape[:-1]):
        out[idx] = softmax_row(scores[idx], allowed[idx])
    return out


def attention(q, k, v, mask=None, bias=None, scale=None):
    """Vaswani et al. 2017 eq. (1), one query at a time: e_ij = q_i·k_j·scale + b_ij."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    lead, (q, k, v) = _broadcast_lead(q, k, v)
    mask = np.ones((lq, lk), bool) if mask is None else np.asarray(mask)
    mask = np.broadcast_to(mask, (*lead, lq, lk))
    bias = np.zeros((lq, lk)) if bias is None else np.asarray(bias, dtype=np.float64)
    bias = np.broadcast_to(bias, (*lead, lq, lk))
    out = np.zeros((*lead, lq, v.shape[-1]))
    for b in np.ndindex(lead):
        for i in range(lq):
            e = np.array([q[b][i] @ k[b][j] * scale + bias[b][i, j] for j in range(lk)])
            w = softmax_row(e, mask[b][i])
            out[b][i] = sum(w[j] * v[b][j] for j in range(lk))
    return out


def relative_attention(q, k, v, table, u=None, vb=None, mask=None, scale=None):
    """Dai et al. 2019 sec. 3.3: A_ij = (q_i + u)·k_j + (q_i + v)·r(δ_ij), per pair.

    ``table`` row m encodes δ = m - (Lk - 1); with W = Lk (causal layout) pairs
    with δ > 0 have no row and are masked.
    """
    q, k, v, table = (np.asarray(a, dtype=np.float64) for a in (q, k, v, table))
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    width = table.shape[-2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    u = np.zeros(d) if u is None else np.asarray(u, dtype=np.float64)
    vb = np.zeros(d) if vb is None else np.asarray(vb, dtype=np.float64)
    lead, (q, k, v, table) = _broadcast_lead(q, k, v, table)
    u = np.broadcast_to(u, (*lead, lq, d))
    vb = np.broadcast_to(vb, (*lead, lq, d))
    mask = np.ones((lq, lk), bool) if mask is None else np.asarray(mask)
    mask = np.broadcast_to(mask, (*lead, lq, lk))
    out = np.zeros((*lead, lq, v.shape[-1]))
    for b in np.ndindex(lead):
        for i in range(lq):
            e = np.zeros(lk)
            allowed = mask[b][i].copy()
            for j in range(lk):
                m = delta(i, j, lq, lk) + lk - 1
                if m >= width:
                    allowed[j] = False
                    continue
                e[j] = ((q[b][i] + u[b][i]) @ k[b][j] + (q[b][i] + vb[b][i]) @ table[b][m]) * scale
            w = softmax_row(e, allowed)
            out[b][i] = sum(w[j] * v[b][j] for j in range(lk))
    return out


def layer_norm(x, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


def transformer_xl(params, tokens, *, heads, clamp_len):
    """Transformer-XL layers over the whole sequence at once, attention per pair.

    ``params``: ``embedding`` and per layer ``w_q, w_k, w_v, w_r, w_o`` (d, d),
    ``u, v`` (H, d_head), feed-forward ``w_1, b_1, w_2, b_2``; post-norm layers.
    """
    h = params["embedding"][tokens]
    n, d = h.shape
    dh = d // heads
    # Causal layout: row m encodes i - j = (n - 1) - m, clamped.
    r_table = sinusoid(np.minimum(np.arange(n - 1, -1, -1), clamp_len), d, layout="concatenated")
    for p in params["layers"]:
        per_head = []
        for head in range(heads):
            cols = slice(head * dh, (head + 1) * dh)
            q, k, v = ((h @ p[w])[:, cols] for w in ("w_q", "w_k", "w_v"))
            r = (r_table @ p["w_r"])[:, cols]
            per_head.append(relative_attention(q, k, v, r, p["u"][head], p["v"][head]))
        h = layer_norm(h + np.concatenate(per_head, axis=-1) @ p["w_o"])
        h = layer_norm(h + np.maximum(h @ p["w_1"] + p["b_1"], 0) @ p["w_2"] + p["b_2"])
    return h


def relative_kernel_attention(q, k, v, *, qp=None, key_table=None, ks=None, query_table=None,
                              relative_bias=None, grid_rows=None, grid_cols=None,
                              grid_width=None, query_segments=None, key_segments=None,
                              key_mask=None, query_positions=None, key_positions=None,
                              causal=False):  # fmt: skip
    """The relative kernels' attention, pair by pair (Dai et al. 2019, eq. (3); He et al.
    2021, eq. (2)–(4); MViTv2 §3.1), in float64 on ``(B, H, L, ·)`` inputs:

    ``softmax_j(q_i·k_j + qp_i·Kʳ[m] + ks_j·Qʳ[m] + b[m] + grid_rows[i, j // kw] +
    grid_cols[i, j % kw]) v``, ``m = δ + Lk - 1`` clipped to the table's rows ``[0, W)``
    with ``δ = key_positions[j] - query_positions[i]`` (by default ``j - i - (Lk - Lq)``:
    ``m = j - i + Lq - 1``) (each term where given; ``kw`` the width of ``grid_cols``). A
    key is left out where ``causal`` and ``δ > 0``, where its segment differs from the
    query's, or where ``key_mask`` is False (its values never read); a query with no key
    gives zeros. Tables, biases, the grid terms, segments, positions and the mask have up
    to two leading dims, broadcast to ``(B, H)``.
    """
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    batch, heads, lq, _ = q.shape
    lk = k.shape[2]

    def full(x, trailing, dtype=np.float64):
        if x is None:
            return None
        x = np.asarray(x, dtype)
        x = x.reshape((1,) * (trailing + 2 - x.ndim) + x.shape)
        return np.broadcast_to(x, (batch, heads, *x.shape[2:]))

    kt, qt, bias = full(key_table, 2), full(query_table, 2), full(relative_bias, 1)
    qp, ks = full(qp, 2), full(ks, 2)
    rows, cols = full(grid_rows, 2), full(grid_cols, 2)
    kw = None if cols is None else cols.shape[-1]
    assert grid_width in (None, kw), "grid_width is the width of grid_cols"
    q_seg, k_seg = full(query_segments, 1, np.int64), full(key_segments, 1, np.int64)
    keep = full(key_mask, 1, bool)
    q_pos = full(np.arange(lq) + lk - lq if query_positions is None else query_positions, 1,
                 np.int64)  # fmt: skip
    k_pos = full(np.arange(lk) if key_positions is None else key_positions, 1, np.int64)
    width = next((t.shape[2] for t in (kt, qt, bias) if t is not None), lq + lk - 1)
    out = np.zeros((batch, heads, lq, v.shape[-1]))
    for b, h, i in np.ndindex(batch, heads, lq):
        scores, keys = [], []
        for j in range(lk):
            delta = k_pos[b, h, j] - q_pos[b, h, i]
            if causal and delta > 0:
                continue
            if q_seg is not None and q_seg[b, h, i] != k_seg[b, h, j]:
                continue
            if keep is not None and not keep[b, h, j]:
                continue
            m = min(max(delta + lk - 1, 0), width - 1)
            s = q[b, h, i] @ k[b, h, j]
            if kt is not None:
                s += qp[b, h, i] @ kt[b, h, m]
            if qt is not None:
                s += ks[b, h, j] @ qt[b, h, m]
            if bias is not None:
                s += bias[b, h, m]
            if rows is not None:
                s += rows[b, h, i, j // kw] + cols[b, h, i, j % kw]
            scores.append(s)
            keys.append(j)
        if scores:
            w = np.exp(np.array(scores) - max(scores))
            out[b, h, i] = (w / w.sum()) @ v[b, h, keys]
    return out
