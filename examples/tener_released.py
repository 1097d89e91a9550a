"""TENER as released (fastnlp/TENER ``modules/relative_transformer.py``), from relattn calls.

The paper (Yan et al. 2019, eq. (15)–(17); ``examples/tener.py``) scores

    A_tj = Q_t·K_j + Q_t·R_{t-j} + u·K_j + v·R_{t-j}

with the unprojected sinusoid ``R`` of the signed distance. The released
``RelativeMultiHeadAttn.forward`` (the code the checkpoints were trained with;
the maintainers confirm the difference in FudanNLP/TENER#21) computes
something else:

    A_tj = (Q_t + u)·K_j + (Q_t + v)·R_{j-t} + K_j·R_{t-j}          then / scale

- the query-side table is that of ``j - t = δ`` (its ``_shift``), not ``t - j``;
- an extra key-side, position-to-content term ``K_j·R_{t-j}`` (its ``_transpose_shift``);
- keys are projected (``qkv_linear``, since the 2020-07-06 version; earlier
  versions used ``K = X`` and had no key-side term);
- ``R`` has the frequencies ``10000^(-k/(d/2 - 1))`` (``inverse_frequencies(d/2,
  endpoint=True)``, tensor2tensor's spacing) in the ``[sin | cos]`` layout, one
  table of ``d_head`` features shared by the heads;
- ``scale`` is 1, or ``√d_head`` with ``scale=True``; padding keys are masked.

TENER's names: ``r_r_bias`` (``u`` above) is added to the queries of the content
term, ``r_w_bias`` (``v``) multiplies the position embeddings.

In relattn it is DeBERTa's three-term score: ``disentangled_attention`` with
``Kʳ = R_{+δ}`` and ``Qʳ = R_{-δ}`` over the full relative layout, the
content bias ``u·K_j`` as an additive ``bias`` (the same for every query) and
``v·R_{j-t}`` as a ``relative_bias`` (one value per distance), all divided by
``scale``: ``scale=1/scale``.

Run ``python examples/tener_released.py``: it checks itself against a per-pair
loop and shows that the paper's form gives other numbers.
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat
import numpy as np

import relattn

BATCH, LENGTH, D_MODEL, HEADS = 2, 6, 16, 2
LENGTHS = (6, 4)


def inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """NumPy float64 parameters: ``qkv_linear`` as a ``(d, 3d)`` matrix, the two biases."""
    rng = np.random.default_rng(seed)
    d_head = D_MODEL // HEADS
    return {
        "x": rng.normal(size=(BATCH, LENGTH, D_MODEL)),
        "w_qkv": rng.normal(scale=1 / math.sqrt(D_MODEL), size=(D_MODEL, 3 * D_MODEL)),
        "r_r_bias": rng.normal(scale=0.5, size=(HEADS, d_head)),
        "r_w_bias": rng.normal(scale=0.5, size=(HEADS, d_head)),
    }


def released_position_tables(length: int, d_head: int, *, like: Any) -> tuple[Any, Any]:
    """``R_{+δ}`` and ``R_{-δ}``, ``(2L - 1, d_head)``, over the full relative layout."""
    xp = array_api_compat.array_namespace(like)
    device = array_api_compat.device(like)
    delta = relattn.relative_distances(length, length, xp=xp, device=device)
    frequencies = relattn.inverse_frequencies(
        d_head // 2, endpoint=True, dtype=like.dtype, device=device, xp=xp
    )

    def table(positions: Any) -> Any:
        return relattn.sinusoidal_position_encoding(
            positions, d_head, layout="concatenated", frequencies=frequencies, dtype=like.dtype
        )

    return table(delta), table(-delta)


def tener_released_attention(
    q: Any, k: Any, v: Any, r_r_bias: Any, r_w_bias: Any, *, mask: Any = None, scale: float = 1.0
) -> Any:
    """TENER's released ``RelativeMultiHeadAttn`` on projected heads.

    Parameters
    ----------
    q, k, v : arrays of shape (B, H, L, d_head)
        Projected queries, keys and values. The June 2020 versions used the
        unprojected input as keys: pass ``split_heads(x, H)`` as ``k`` for them.
    r_r_bias, r_w_bias : arrays of shape (H, d_head)
        TENER's ``r_r_bias`` (added to the queries of the content term) and
        ``r_w_bias`` (multiplies the position embeddings).
    mask : array of shape (B, L), bool, optional
        True for real tokens; padding keys are masked.
    scale : float
        TENER divides the scores by it: 1, or ``√d_head`` with ``scale=True``.
    """
    length, d_head = q.shape[-2], q.shape[-1]
    plus, minus = released_position_tables(length, d_head, like=q)
    # u·K_j, the same for every query: (B, H, 1, L).
    content = (k @ r_r_bias[:, :, None])[..., 0][..., None, :]
    # v·R_{j-t}, one value per distance: (H, 2L - 1).
    position = (plus @ r_w_bias[:, :, None])[..., 0]
    return relattn.disentangled_attention(
        q,
        k,
        v,
        plus,
        minus,
        bias=content / scale,
        relative_bias=position / scale,
        mask=None if mask is None else mask[:, None, None, :],
        scale=1.0 / scale,
    )


def tener_released_layer(
    x: Any, p: dict[str, Any], *, mask: Any = None, heads: int = HEADS, scale: bool = False
) -> Any:
    """``RelativeMultiHeadAttn(d_model, heads, dropout=0, scale=scale).forward(x, mask)``."""
    d_model = x.shape[-1]
    qkv = x @ p["w_qkv"]
    q, k, v = (relattn.split_heads(qkv[..., n * d_model : (n + 1) * d_model], heads)
               for n in range(3))  # fmt: skip
    divisor = math.sqrt(d_model // heads) if scale else 1.0
    out = tener_released_attention(q, k, v, p["r_r_bias"], p["r_w_bias"], mask=mask, scale=divisor)
    return relattn.merge_heads(out)


def paper_layer(x: Any, p: dict[str, Any], *, mask: Any = None, heads: int = HEADS) -> Any:
    """The paper's form (``examples/tener.py``) on the same projections and biases."""
    xp = array_api_compat.array_namespace(x)
    d_model = x.shape[-1]
    d_head = d_model // heads
    qkv = x @ p["w_qkv"]
    q, k, v = (relattn.split_heads(qkv[..., n * d_model : (n + 1) * d_model], heads)
               for n in range(3))  # fmt: skip
    delta = relattn.relative_distances(x.shape[-2], x.shape[-2], xp=xp,
                                       device=array_api_compat.device(x))  # fmt: skip
    table = relattn.sinusoidal_position_encoding(-delta, d_head, layout="concatenated",
                                                 dtype=x.dtype)  # fmt: skip
    out = relattn.relative_attention(
        q, k, v, table,
        content_bias=p["r_r_bias"][:, None, :], position_bias=p["r_w_bias"][:, None, :],
        mask=None if mask is None else mask[:, None, None, :], scale=1.0,
    )  # fmt: skip
    return relattn.merge_heads(out)


# -- the per-pair check ------------------------------------------------------------------------


def loop_reference(x, p, *, key_mask, heads=HEADS, scale=False):
    """``A_tj = (Q_t + u)·K_j + (Q_t + v)·R_{j-t} + K_j·R_{t-j}`` per head and pair."""
    length, d_model = x.shape[1], x.shape[2]
    d_head = d_model // heads
    half = d_head // 2
    omega = [10000.0 ** (-k / (half - 1)) for k in range(half)]

    def r(position):
        angles = [position * w for w in omega]
        return np.asarray([math.sin(a) for a in angles] + [math.cos(a) for a in angles])

    divisor = math.sqrt(d_head) if scale else 1.0
    qkv = x @ p["w_qkv"]
    q, k, v = qkv[..., :d_model], qkv[..., d_model : 2 * d_model], qkv[..., 2 * d_model :]
    out = np.zeros(x.shape)
    for b in range(x.shape[0]):
        for h in range(heads):
            c = slice(h * d_head, (h + 1) * d_head)
            u, w = p["r_r_bias"][h], p["r_w_bias"][h]
            for t in range(length):
                logits = np.asarray([
                    ((q[b, t, c] + u) @ k[b, j, c] + (q[b, t, c] + w) @ r(j - t)
                     + k[b, j, c] @ r(t - j)) / divisor
                    for j in range(length)
                ])  # fmt: skip
                allowed = key_mask[b]
                weights = np.where(allowed, np.exp(logits - logits[allowed].max()), 0.0)
                out[b, t, c] = weights / weights.sum() @ v[b, :, c]
    return out


def main() -> float:
    p = inputs()
    key_mask = np.arange(LENGTH)[None, :] < np.asarray(LENGTHS)[:, None]
    worst = 0.0
    for scale in (False, True):
        out = tener_released_layer(p["x"], p, mask=key_mask, scale=scale)
        diff = np.abs(out - loop_reference(p["x"], p, key_mask=key_mask, scale=scale)).max()
        print(f"TENER released (scale={scale}): max |relattn - per-pair loop| = {diff:.2e}")
        worst = max(worst, diff)
    paper = paper_layer(p["x"], p, mask=key_mask)
    released = tener_released_layer(p["x"], p, mask=key_mask)
    print(f"paper form vs released form: max difference {np.abs(paper - released).max():.3f}")
    assert worst < 1e-10, worst
    return worst


if __name__ == "__main__":
    main()
