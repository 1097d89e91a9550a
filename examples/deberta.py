"""DeBERTa-v2 disentangled self-attention (He et al. 2021, eq. (2)–(4); the v2 log buckets).

DeBERTa scores each query–key pair with three terms, content-to-content,
content-to-position and position-to-content:

    A_ij = q_i·k_j + q_i·Kʳ_φ(i,j) + k_j·Qʳ_φ(i,j),      scaled by 1/√(3·d_head)

``Kʳ`` and ``Qʳ`` are a shared table of ``2k`` relative embeddings projected by
the layer's key and query projections (``share_att_key``, the v2/v3 models),
indexed by ``φ(i, j) = clip(bucket(i - j) + k, 0, 2k - 1)``: DeBERTa counts
query minus key, ``-δ``, in the log buckets of ``log_bucket_position``
(``k = position_buckets``). Both position terms use the same ``φ(i, j)``, as
HF's ``disentangled_attention_bias`` does.

In relattn the tables are gathered once per distance of the full relative
layout (``W = 2L - 1`` rows, never ``L²``) and passed to
``disentangled_attention``, which applies the shift of Transformer-XL's
appendix B to both position terms.

Run ``python examples/deberta.py``: it checks itself against a per-pair loop.
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat
import numpy as np

import relattn

BATCH, LENGTH, D_MODEL, HEADS = 2, 7, 8, 2
POSITION_BUCKETS, MAX_RELATIVE_POSITIONS = 4, 16  # DeBERTa-v3: 256, 512
LENGTHS = (7, 5)


def inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """NumPy float64 projections (with biases), the relative embeddings and a sequence."""
    rng = np.random.default_rng(seed)
    p = {"h": rng.normal(size=(BATCH, LENGTH, D_MODEL))}
    for name in ("q", "k", "v"):
        p[f"w_{name}"] = rng.normal(scale=1 / math.sqrt(D_MODEL), size=(D_MODEL, D_MODEL))
        p[f"b_{name}"] = rng.normal(scale=0.1, size=(D_MODEL,))
    p["rel_embeddings"] = rng.normal(size=(2 * POSITION_BUCKETS, D_MODEL))
    return p


def position_index(length: int, *, like: Any, position_buckets: int, max_position: int) -> Any:
    """``φ`` of each column of the full relative layout: ``clip(bucket(-δ) + k, 0, 2k - 1)``."""
    xp = array_api_compat.array_namespace(like)
    delta = relattn.relative_distances(length, length, xp=xp, device=array_api_compat.device(like))
    bucket = relattn.log_bucket_position(
        -delta, bucket_size=position_buckets, max_position=max_position
    )
    return xp.clip(bucket + position_buckets, 0, 2 * position_buckets - 1)


def deberta_v2_self_attention(
    h: Any,
    p: dict[str, Any],
    *,
    mask: Any = None,
    heads: int = HEADS,
    position_buckets: int = POSITION_BUCKETS,
    max_position: int = MAX_RELATIVE_POSITIONS,
) -> Any:
    """DeBERTa-v2's ``DisentangledSelfAttention`` (c2p and p2c, shared keys): ``(B, L, d)``."""
    xp = array_api_compat.array_namespace(h)
    q = relattn.split_heads(h @ p["w_q"] + p["b_q"], heads)  # (B, H, L, d_head)
    k = relattn.split_heads(h @ p["w_k"] + p["b_k"], heads)
    v = relattn.split_heads(h @ p["w_v"] + p["b_v"], heads)
    rows = p["rel_embeddings"][: 2 * position_buckets, :]
    phi = position_index(
        h.shape[-2], like=h, position_buckets=position_buckets, max_position=max_position
    )
    # The projected tables, one row per distance of the full layout: (H, 2L - 1, d_head).
    position_table = relattn.split_heads(xp.take(rows @ p["w_k"] + p["b_k"], phi, axis=0), heads)
    query_position_table = relattn.split_heads(
        xp.take(rows @ p["w_q"] + p["b_q"], phi, axis=0), heads
    )
    out = relattn.disentangled_attention(q, k, v, position_table, query_position_table, mask=mask)
    return relattn.merge_heads(out)


# -- the per-pair check ------------------------------------------------------------------------


def log_bucket(r: int, bucket_size: int, max_position: int) -> int:
    """DeBERTa-v2's ``make_log_bucket_position`` for one relative position ``r``."""
    mid = bucket_size // 2
    if abs(r) <= mid:
        return r
    magnitude = mid + math.ceil(math.log(abs(r) / mid) / math.log((max_position - 1) / mid)
                                * (mid - 1))  # fmt: skip
    return magnitude if r > 0 else -magnitude


def loop_reference(h, p, *, key_mask=None, heads=HEADS):
    """Every ``A_ij`` written out per head and pair, ``φ`` from ``i - j``."""
    length, d_head = h.shape[1], D_MODEL // heads
    q, k, v = (h @ p[f"w_{n}"] + p[f"b_{n}"] for n in ("q", "k", "v"))
    rows = p["rel_embeddings"][: 2 * POSITION_BUCKETS]
    pos_key, pos_query = rows @ p["w_k"] + p["b_k"], rows @ p["w_q"] + p["b_q"]
    out = np.zeros(h.shape)
    for b in range(h.shape[0]):
        for hd in range(heads):
            c = slice(hd * d_head, (hd + 1) * d_head)
            for i in range(length):
                logits, allowed = np.zeros(length), np.ones(length, bool)
                for j in range(length):
                    bucket = log_bucket(i - j, POSITION_BUCKETS, MAX_RELATIVE_POSITIONS)
                    phi = min(max(bucket + POSITION_BUCKETS, 0), 2 * POSITION_BUCKETS - 1)
                    logits[j] = (
                        q[b, i, c] @ k[b, j, c]
                        + q[b, i, c] @ pos_key[phi, c]
                        + k[b, j, c] @ pos_query[phi, c]
                    ) / math.sqrt(3 * d_head)
                    allowed[j] = key_mask is None or bool(key_mask[b, j])
                weights = np.where(allowed, np.exp(logits - logits[allowed].max()), 0.0)
                out[b, i, c] = weights / weights.sum() @ v[b, :, c]
    return out


def main() -> float:
    p = inputs()
    lengths = np.asarray(LENGTHS)
    key_mask = np.arange(LENGTH)[None, :] < lengths[:, None]
    out = deberta_v2_self_attention(p["h"], p, mask=key_mask[:, None, None, :])
    diff = np.abs(out - loop_reference(p["h"], p, key_mask=key_mask)).max()
    print(f"DeBERTa-v2 attention: max |relattn - per-pair loop| = {diff:.2e}")
    assert diff < 1e-10, diff
    return diff


if __name__ == "__main__":
    main()
