"""Native baselines: the algorithms relattn implements, written directly in each library.

These are what a user would write without relattn, in the library's own API
(no relattn, no array-api-compat), the way the reference implementations do:

- Transformer-XL relative attention with the pad-and-reshape shift of Dai et
  al. 2019, appendix B (``_rel_shift`` in ``mem_transformer.py``; ESPnet's
  ``RelPositionMultiHeadedAttention.rel_shift`` for the full layout), in
  PyTorch, NumPy (and CuPy, whose API is NumPy's) and ``jax.numpy``;
- attention with a precomputed additive bias, or none (plain attention), through
  the libraries' fused kernels, ``torch.nn.functional.scaled_dot_product_attention``
  and ``jax.nn.dot_product_attention`` (its ``implementation="xla"`` or ``"cudnn"``,
  ``is_causal``), and plain NumPy;
- Shaw et al. 2018 as tensor2tensor computes it
  (``dot_product_attention_relative``): the clipped tables gathered into
  ``(Lq, Lk, d)`` tensors per pair;
- RoPE as Hugging Face's LLaMA applies it (``apply_rotary_pos_emb`` with
  ``rotate_half``, the concatenated layout) on ``q`` and ``k``, given the
  ``cos`` and ``sin`` tables that ``LlamaRotaryEmbedding`` computes once per
  forward pass (in float32) and every layer shares;
- causal Transformer-XL attention through PyTorch's FlexAttention (a
  ``score_mod`` and a causal block mask, :func:`torch_flex_transformer_xl`),
  checked against relattn where it runs (``baselines.FlexAttentionVsBlockwise``);
- FlexAttention written directly for the ``score_mod``-expressible schemes (ALiBi,
  a per-distance bias such as T5's, a document mask over packed sequences,
  :func:`torch_flex_attention`), the GPU rows of ``compare.py``;
- T5's relative attention bias as Hugging Face's ``T5Attention.compute_bias``
  forms it: a bucket index per query–key pair (:func:`t5_pair_buckets`), the
  ``(num_buckets, H)`` table gathered into an ``(H, Lq, Lk)`` bias, then the
  fused kernels above (NumPy: softmax) with ``scale=1``.

Each computes exactly what its relattn counterpart computes (same layouts,
same distance convention ``δ = j - (i + Lk - Lq)``, same masking; relattn's
RoPE and T5 calls are ``common.rotary_qk`` and ``common.t5_attention``);
:func:`check` asserts it on small inputs and the benchmarks call it once in
``setup``. Run ``python asv_bench/benchmarks/native.py`` to check every
installed backend.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import relattn

try:
    from . import common
except ImportError:  # run as a script: python asv_bench/benchmarks/native.py
    import common

# -- NumPy (and CuPy: pass ``lib=cupy``) --------------------------------


def numpy_rel_shift(x: Any, key_length: int, lib: Any = np) -> Any:
    """Transformer-XL ``_rel_shift``: prepend a zero column, read rows with stride ``W``.

    ``x (..., Lq, W)`` in relattn's relative layout; returns ``(..., Lq, Lk)``
    with ``out[i, j] = x[i, j - i + Lq - 1]``. In the causal layout (``W =
    Lk``) the entries with ``δ > 0`` hold other rows' values: callers mask them.
    """
    *batch, lq, width = x.shape
    padded = lib.concatenate([lib.zeros((*batch, lq, 1), dtype=x.dtype), x], axis=-1)
    padded = padded.reshape(*batch, width + 1, lq)[..., 1:, :]
    return padded.reshape(*batch, lq, width)[..., :key_length]


def numpy_softmax(scores: Any, mask: Any = None, lib: Any = np) -> Any:
    """Softmax over the last axis, ``mask`` (True = may attend) filled with ``-inf`` first."""
    if mask is not None:
        scores = lib.where(mask, scores, -lib.inf)
    weights = lib.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


def numpy_causal_mask(query_length: int, key_length: int, lib: Any = np) -> Any:
    """``True`` where ``j <= i + Lk - Lq`` (Transformer-XL's ``dec_attn_mask``, negated)."""
    return lib.tri(query_length, key_length, key_length - query_length, dtype=bool)


def numpy_relative_attention(
    q, k, v, position_table, content_bias, position_bias, scale=None, lib: Any = np
):
    """Transformer-XL relative attention; causal layout (``W = Lk``) or full layout."""
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    ac = (q + content_bias) @ lib.swapaxes(k, -1, -2)
    bd = numpy_rel_shift((q + position_bias) @ lib.swapaxes(position_table, -1, -2), lk, lib)
    scores = (ac + bd) * scale
    mask = numpy_causal_mask(lq, lk, lib) if position_table.shape[-2] == lk else None
    return numpy_softmax(scores, mask, lib) @ v


def numpy_relative_attention_einsum(
    q, k, v, position_table, content_bias, position_bias, scale=None, lib: Any = np
):
    """:func:`numpy_relative_attention` with its products as ``einsum`` contractions (no
    transposed ``k`` or table), the other way to write it by hand."""
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    ac = lib.einsum("...qd,...kd->...qk", q + content_bias, k)
    bd = lib.einsum("...qd,...wd->...qw", q + position_bias, position_table)
    scores = (ac + numpy_rel_shift(bd, lk, lib)) * scale
    mask = numpy_causal_mask(lq, lk, lib) if position_table.shape[-2] == lk else None
    return lib.einsum("...qk,...kd->...qd", numpy_softmax(scores, mask, lib), v)


def numpy_cached_decode(q, k, v, position_table, content_bias, position_bias, filled,
                        scale=None, lib: Any = np):  # fmt: skip
    """One Transformer-XL decode step against a static cache of ``Lmax`` slots, row ``b``
    filled up to ``filled[b]`` (the step's own key included): the query at position
    ``filled - 1``, slot ``j`` at ``j``; the table in the causal layout of ``Lmax`` rows
    (``δ = -(Lmax - 1) … 0``), read at row ``j - filled + Lmax`` (clipped) per slot; the
    unfilled slots masked. ``q (B, H, 1, d)``, ``filled (B,)`` integers."""
    lmax, d = k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    slots = lib.arange(lmax)
    ac = (q + content_bias) @ lib.swapaxes(k, -1, -2)
    rows = lib.clip(slots[None, :] - filled[:, None] + lmax, 0, lmax - 1)  # (B, Lmax)
    bd = (q + position_bias) @ lib.swapaxes(position_table, -1, -2)  # (B, H, 1, Lmax)
    bd = lib.take_along_axis(bd, rows[:, None, None, :], axis=-1)
    mask = (slots[None, :] < filled[:, None])[:, None, None, :]
    return numpy_softmax((ac + bd) * scale, mask, lib) @ v


def numpy_attention(q, k, v, bias=None, scale=None, lib: Any = np):
    """``softmax(q kᵀ · scale + bias) v``; ``bias=None``: plain attention."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ lib.swapaxes(k, -1, -2)) * scale
    return numpy_softmax(scores if bias is None else scores + bias, None, lib) @ v


def numpy_relative_embeddings(table, query_length, key_length, lib: Any = np):
    """tensor2tensor ``_generate_relative_positions_embeddings``: ``(Lq, Lk, d)``."""
    radius = (table.shape[0] - 1) // 2
    keys = lib.arange(key_length)
    queries = keys[-query_length:]  # the last Lq keys are the current segment
    distance = keys[None, :] - queries[:, None]
    return table[lib.clip(distance, -radius, radius) + radius]


def _numpy_relative_inner(x, y, z, transpose, lib):
    """tensor2tensor ``_relative_attention_inner``: ``x y(ᵀ) + x z(ᵀ)``, ``z`` per pair."""
    batch, heads, length = x.shape[:3]
    xy = x @ (lib.swapaxes(y, -1, -2) if transpose else y)
    x_t = lib.transpose(x, (2, 0, 1, 3)).reshape(length, batch * heads, -1)
    xz = x_t @ (lib.swapaxes(z, -1, -2) if transpose else z)
    return xy + lib.transpose(xz.reshape(length, batch, heads, -1), (1, 2, 0, 3))


def numpy_shaw_materialised(q, k, v, key_table, value_table, scale=None, lib: Any = np):
    """tensor2tensor ``dot_product_attention_relative`` (Shaw et al. 2018, eq. (2)–(5))."""
    lq, lk = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    relations_keys = numpy_relative_embeddings(key_table, lq, lk, lib)
    relations_values = numpy_relative_embeddings(value_table, lq, lk, lib)
    logits = _numpy_relative_inner(q * scale, k, relations_keys, True, lib)
    return _numpy_relative_inner(numpy_softmax(logits, None, lib), v, relations_values, False, lib)


def numpy_rotary_cos_sin(positions, dim: int, base: float = 10000.0, lib: Any = np):
    """HF ``LlamaRotaryEmbedding``: ``cos``, ``sin`` of ``(L, dim)``, float32, ``[θ | θ]``."""
    inv_freq = 1.0 / (base ** (lib.arange(0, dim, 2).astype(lib.float32) / dim))
    freqs = positions.astype(lib.float32)[:, None] * inv_freq.astype(lib.float32)[None, :]
    emb = lib.concatenate((freqs, freqs), axis=-1)
    return lib.cos(emb), lib.sin(emb)


def numpy_rotate_half(x, lib: Any = np):
    """HF ``rotate_half``: ``[-x2 | x1]`` for ``x = [x1 | x2]``."""
    half = x.shape[-1] // 2
    return lib.concatenate((-x[..., half:], x[..., :half]), axis=-1)


def numpy_rotary(q, k, cos, sin, lib: Any = np):
    """HF ``apply_rotary_pos_emb``: ``x·cos + rotate_half(x)·sin`` for ``q`` and ``k``."""
    return (
        q * cos + numpy_rotate_half(q, lib) * sin,
        k * cos + numpy_rotate_half(k, lib) * sin,
    )


def t5_pair_buckets(
    query_length: int, key_length: int, num_buckets: int = 32, max_distance: int = 128
) -> np.ndarray:
    """HF ``T5Attention._relative_position_bucket`` of every pair (bidirectional), ``(Lq, Lk)``.

    ``memory_position - context_position`` with the last ``Lq`` keys as the
    queries (relattn's alignment; HF's with ``past_seen_tokens = Lk - Lq``).
    Computed on the host in float64 (HF: float32 on the device): the indices
    depend on the lengths alone, and every call reuses them.
    """
    context = np.arange(key_length - query_length, key_length)[:, None]
    relative_position = np.arange(key_length)[None, :] - context
    n = num_buckets // 2
    buckets = (relative_position > 0).astype(np.int64) * n
    relative_position = np.abs(relative_position)
    max_exact = n // 2
    is_small = relative_position < max_exact
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0): small, discarded entries
        large = max_exact + (
            np.log(relative_position / max_exact)
            / math.log(max_distance / max_exact)
            * (n - max_exact)
        ).astype(np.int64, casting="unsafe")
    large = np.minimum(large, n - 1)
    return buckets + np.where(is_small, relative_position, large)


def numpy_t5_attention(q, k, v, table, pair_buckets, lib: Any = np):
    """T5's bias gathered per pair, ``table[buckets] (Lq, Lk, H) → (H, Lq, Lk)``, then attention."""
    bias = lib.transpose(table[pair_buckets], (2, 0, 1))
    return numpy_attention(q, k, v, bias, scale=1.0, lib=lib)


def sam_rel_pos(table, q_size: int, k_size: int, lib: Any = np):
    """SAM ``get_rel_pos`` for a table of ``2·max(q, k) - 1`` rows (no resizing): ``(q, k, d)``.

    ``relative_coords = (q_coords - k_coords) + (k_size - 1)`` with the ratios
    ``max(k/q, 1)``, ``max(q/k, 1)`` of the authors' code (1 on a square grid).
    """
    q_ratio, k_ratio = max(k_size / q_size, 1.0), max(q_size / k_size, 1.0)
    q_coords = lib.arange(q_size)[:, None] * q_ratio
    k_coords = lib.arange(k_size)[None, :] * k_ratio
    relative_coords = (q_coords - k_coords) + (k_size - 1) * k_ratio
    return table[relative_coords.astype(int)]


def numpy_sam_attention(q, k, v, rel_pos_h, rel_pos_w, grid, scale=None, lib: Any = np):
    """Segment Anything's ``Attention.forward`` with ``add_decomposed_rel_pos`` (same grid
    for queries and keys), on ``(B, H, L, d)`` arrays, ``L = h·w`` row-major.

    As the authors write it: ``q``, ``k``, ``v`` viewed as ``(B·H, L, d)``, ``attn = (q ·
    scale) @ kᵀ``; ``rel_h = einsum("bhwc,hkc->bhwk", q, Rʰ)`` with the unscaled ``q``
    viewed as ``(B·H, h, w, d)`` and ``Rʰ = rel_pos_h[qy - ky + h - 1]`` ``(h, h, d)``,
    ``rel_w`` likewise; ``attn.view(B·H, h, w, h, w) + rel_h[..., None] + rel_w[..., None,
    :]``, softmax, ``@ v``. ``rel_pos_h (2h - 1, d)``, ``rel_pos_w (2w - 1, d)`` (shared
    by the heads).
    """
    b, heads, length, d = q.shape
    h, w = grid
    scale = d**-0.5 if scale is None else scale
    q, k, v = (x.reshape(b * heads, length, x.shape[-1]) for x in (q, k, v))
    attn = (q * scale) @ lib.swapaxes(k, -1, -2)
    rh, rw = sam_rel_pos(rel_pos_h, h, h, lib), sam_rel_pos(rel_pos_w, w, w, lib)
    r_q = q.reshape(b * heads, h, w, d)
    rel_h = lib.einsum("bhwc,hkc->bhwk", r_q, rh)
    rel_w = lib.einsum("bhwc,wkc->bhwk", r_q, rw)
    attn = attn.reshape(b * heads, h, w, h, w) + rel_h[..., :, None] + rel_w[..., None, :]
    out = numpy_softmax(attn.reshape(b * heads, length, length), None, lib) @ v
    return out.reshape(b, heads, length, v.shape[-1])


def swin_relative_index(window: int) -> np.ndarray:
    """Swin's ``relative_position_index`` buffer of a ``window × window`` window, ``(N, N)``.

    ``coords`` of the window's patches, ``relative = coords[:, :, None] - coords[:, None,
    :]`` (query minus key), shifted by ``window - 1``, then ``Δrow·(2·window - 1) + Δcol``:
    computed once, when the model is built (``WindowAttention.__init__``).
    """
    coords = np.stack(np.meshgrid(np.arange(window), np.arange(window), indexing="ij"))
    flat = coords.reshape(2, -1)
    relative = (flat[:, :, None] - flat[:, None, :]).transpose(1, 2, 0) + (window - 1)
    return relative[:, :, 0] * (2 * window - 1) + relative[:, :, 1]


def swin_attn_mask(height: int, width: int, window: int, shift: int) -> np.ndarray:
    """Swin's ``attn_mask`` buffer of the shifted windows: ``(nW, N, N)`` float32, 0 or -100.

    ``SwinTransformerBlock.__init__``: the image's regions numbered by the three slices
    ``[0, -window)``, ``[-window, -shift)``, ``[-shift, None)`` per axis, cut into
    windows; pairs of different regions get ``-100.0``.
    """
    img_mask = np.zeros((height, width), dtype=np.float32)
    cnt = 0
    slices = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
    for hs in slices:
        for ws in slices:
            img_mask[hs, ws] = cnt
            cnt += 1
    windows = img_mask.reshape(height // window, window, width // window, window)
    windows = windows.transpose(0, 2, 1, 3).reshape(-1, window * window)
    mask = windows[:, None, :] - windows[:, :, None]
    return np.where(mask != 0, np.float32(-100.0), np.float32(0.0))


def numpy_swin_window_attention(q, k, v, table, index, attn_mask, scale=None, lib: Any = np):
    """Swin's ``WindowAttention.forward`` on ``(B·nW, H, N, d)`` windows.

    ``attn = (q · scale) @ kᵀ``; ``+ table[index.reshape(-1)].reshape(N, N, H)`` permuted
    to ``(H, N, N)`` (``table (T, H)`` as Swin stores it, ``index`` of
    :func:`swin_relative_index`); viewed as ``(B, nW, H, N, N)`` ``+ attn_mask[:, None]``
    (:func:`swin_attn_mask`, ``(nW, N, N)`` of 0 and -100), softmax, ``@ v``.
    """
    windows, heads, n, d = q.shape
    nw = attn_mask.shape[0]
    scale = d**-0.5 if scale is None else scale
    attn = (q * scale) @ lib.swapaxes(k, -1, -2)
    bias = table[index.reshape(-1)].reshape(n, n, -1)
    attn = attn + lib.transpose(bias, (2, 0, 1))[None]
    attn = attn.reshape(windows // nw, nw, heads, n, n) + attn_mask[:, None][None]
    return numpy_softmax(attn.reshape(-1, heads, n, n), None, lib) @ v


def deberta_index(query_length: int, key_length: int, lib: Any = np) -> Any:
    """HF DeBERTa's ``c2p_pos`` without buckets: the full layout's column of each pair,
    ``m(i, j) = j - i + Lq - 1`` (``(Lq, Lk)``, int64)."""
    i = lib.arange(query_length)[:, None]
    j = lib.arange(key_length)[None, :]
    return j - i + (query_length - 1)


def numpy_deberta_attention(q, k, v, key_table, query_table, scale, lib: Any = np):
    """DeBERTa's disentangled attention as HF's eager ``DisentangledSelfAttention``
    computes it, one table row per distance (full layout ``W = Lq + Lk - 1``): ``q kᵀ``,
    the content-to-position scores ``q Kʳᵀ`` gathered at ``m(i, j)``, the
    position-to-content scores ``k Qʳᵀ`` gathered at ``m(i, j)`` per key and transposed,
    all times ``scale``; softmax; ``@ v``."""
    lq, lk = q.shape[-2], k.shape[-2]
    index = deberta_index(lq, lk, lib)
    scores = q @ lib.swapaxes(k, -1, -2)
    c2p = q @ lib.swapaxes(key_table, -1, -2)
    scores = scores + lib.take_along_axis(c2p, lib.broadcast_to(index, (*c2p.shape[:-1], lk)),
                                          axis=-1)  # fmt: skip
    p2c = k @ lib.swapaxes(query_table, -1, -2)
    p2c = lib.take_along_axis(p2c, lib.broadcast_to(index.T, (*p2c.shape[:-1], lq)), axis=-1)
    scores = (scores + lib.swapaxes(p2c, -1, -2)) * scale
    return numpy_softmax(scores, None, lib) @ v


# -- PyTorch -------------------------------------------------------------


def torch_rel_shift(x, key_length: int):
    """Transformer-XL ``_rel_shift`` (batch first): ``cat`` a zero column, ``view``, drop a row."""
    import torch

    *batch, lq, width = x.shape
    zero_pad = x.new_zeros((*batch, lq, 1))
    padded = torch.cat([zero_pad, x], dim=-1).view(*batch, width + 1, lq)
    return padded[..., 1:, :].view(*batch, lq, width)[..., :key_length]


def torch_relative_attention(q, k, v, position_table, content_bias, position_bias, scale=None):
    """Transformer-XL ``RelPartialLearnableMultiHeadAttn`` scores, batch first."""
    import torch

    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    ac = torch.matmul(q + content_bias, k.transpose(-1, -2))
    bd = torch_rel_shift(torch.matmul(q + position_bias, position_table.transpose(-1, -2)), lk)
    scores = (ac + bd) * scale
    if position_table.shape[-2] == lk:
        blocked = torch.triu(
            torch.ones(lq, lk, dtype=torch.bool, device=q.device), diagonal=1 + lk - lq
        )
        scores = scores.masked_fill(blocked, -math.inf)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def torch_relative_attention_einsum(
    q, k, v, position_table, content_bias, position_bias, scale=None
):
    """:func:`torch_relative_attention` with ``torch.einsum`` products."""
    import torch

    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    ac = torch.einsum("...qd,...kd->...qk", q + content_bias, k)
    bd = torch.einsum("...qd,...wd->...qw", q + position_bias, position_table)
    scores = (ac + torch_rel_shift(bd, lk)) * scale
    if position_table.shape[-2] == lk:
        blocked = torch.triu(
            torch.ones(lq, lk, dtype=torch.bool, device=q.device), diagonal=1 + lk - lq
        )
        scores = scores.masked_fill(blocked, -math.inf)
    return torch.einsum("...qk,...kd->...qd", torch.softmax(scores, dim=-1), v)


def torch_cached_decode(q, k, v, position_table, content_bias, position_bias, filled,
                        scale=None):  # fmt: skip
    """:func:`numpy_cached_decode` in PyTorch (``take_along_dim``, ``masked_fill``)."""
    import torch

    lmax, d = k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    slots = torch.arange(lmax, device=q.device)
    ac = torch.matmul(q + content_bias, k.transpose(-1, -2))
    rows = (slots[None, :] - filled[:, None] + lmax).clamp(0, lmax - 1)
    bd = torch.matmul(q + position_bias, position_table.transpose(-1, -2))
    bd = torch.take_along_dim(bd, rows[:, None, None, :], dim=-1)
    unfilled = (slots[None, :] >= filled[:, None])[:, None, None, :]
    scores = ((ac + bd) * scale).masked_fill(unfilled, -math.inf)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def torch_attention(q, k, v, bias=None, scale=None):
    """``torch.nn.functional.scaled_dot_product_attention`` with a float ``attn_mask`` (a bias;
    ``None``: plain attention)."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)


def torch_shaw_materialised(q, k, v, key_table, value_table, scale=None):
    """tensor2tensor ``dot_product_attention_relative`` in PyTorch."""
    import torch

    lq, lk = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    radius = (key_table.shape[0] - 1) // 2
    keys = torch.arange(lk, device=q.device)
    distance = keys[None, :] - keys[-lq:, None]
    index = torch.clamp(distance, -radius, radius) + radius
    relations_keys, relations_values = key_table[index], value_table[index]  # (Lq, Lk, d)

    def inner(x, y, z, transpose):
        batch, heads, length = x.shape[:3]
        xy = torch.matmul(x, y.transpose(-1, -2) if transpose else y)
        x_t = x.permute(2, 0, 1, 3).reshape(length, batch * heads, -1)
        xz = torch.matmul(x_t, z.transpose(-1, -2) if transpose else z)
        return xy + xz.reshape(length, batch, heads, -1).permute(1, 2, 0, 3)

    weights = torch.softmax(inner(q * scale, k, relations_keys, True), dim=-1)
    return inner(weights, v, relations_values, False)


def torch_rotary_cos_sin(positions, dim: int, base: float = 10000.0):
    """HF ``LlamaRotaryEmbedding.forward``: ``cos``, ``sin`` of ``(L, dim)`` in float32."""
    import torch

    arange = torch.arange(0, dim, 2, dtype=torch.int64, device=positions.device)
    inv_freq = 1.0 / (base ** (arange.float() / dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def torch_rotate_half(x):
    """HF ``rotate_half`` (``modeling_llama.py``)."""
    import torch

    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def torch_rotary(q, k, cos, sin):
    """HF ``apply_rotary_pos_emb``; ``cos``, ``sin (L, d)`` broadcast as HF's ``(B, 1, L, d)``."""
    q_embed = (q * cos) + (torch_rotate_half(q) * sin)
    k_embed = (k * cos) + (torch_rotate_half(k) * sin)
    return q_embed, k_embed


def torch_t5_attention(q, k, v, table, pair_buckets):
    """HF ``T5Attention.compute_bias`` (``values.permute([2, 0, 1]).unsqueeze(0)``), then SDPA."""
    import torch.nn.functional as F

    bias = table[pair_buckets].permute(2, 0, 1).unsqueeze(0)  # (1, H, Lq, Lk)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)


def torch_flex_transformer_xl(q, k, v, table, content_bias, position_bias, scale=None):
    """A no-argument call of FlexAttention computing causal Transformer-XL attention.

    ``asv_bench/long_sequences.py``'s ``flex_one``: ``torch.compile(flex_attention,
    dynamic=False)`` on ``q + u``, ``k``, ``v`` with a ``score_mod`` adding the
    position term ``(q + v) Rᵀ`` (``(B, H, L, W)``, formed in each call) at column
    ``kv_idx - q_idx + L - 1`` and a causal block mask (made once). The column is
    clamped to ``L - 1`` (``δ <= 0``): ``flex_one`` reads past the table for the
    masked pairs of partly masked blocks, which PyTorch 2.13's CPU kernel rejects
    (``index out of bounds``). Self-attention,
    causal layout (``W = Lk = Lq``). The first call compiles (minutes on a CPU);
    ``ImportError`` where this PyTorch has no FlexAttention.
    """
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    length = q.shape[-2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    compiled = torch.compile(flex_attention, dynamic=False)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    mask = create_block_mask(causal, None, None, length, length, device=q.device.type)

    def call():
        position = ((q + position_bias) @ table.transpose(-1, -2)) * scale

        def score_mod(score, b, h, q_idx, kv_idx):
            # Clamped: the mask drops kv_idx > q_idx, whose columns the causal layout lacks,
            # but score_mod also runs on them in partly masked blocks (out of bounds).
            column = torch.clamp(kv_idx - q_idx, max=0) + length - 1
            return score + position[b, h, q_idx, column]

        return compiled(q + content_bias, k, v, score_mod=score_mod, block_mask=mask, scale=scale)

    return call


def torch_flex_attention(q, k, v, *, slopes=None, values=None, segments=None, causal=False,
                         scale=None):  # fmt: skip
    """FlexAttention written directly (He et al. 2024; the attention-gym examples): a
    no-argument-or-``(q, k, v)`` call of ``torch.compile(flex_attention, dynamic=False)``.

    - ``slopes (H,)``: ALiBi, ``score + slopes[h]·δ`` (Press et al. 2022);
    - ``values (H, Lq + Lk - 1)``: a per-distance bias in the full layout (T5's bucket
      values gathered per distance), ``score + values[h, δ + Lq - 1]``;
    - ``segments (B, Lk)`` (self-attention): a document mask, keys of the query's document
      only;
    - ``causal``: keys after the query's position (``δ > 0``) masked.

    ``δ = kv_idx - (q_idx + Lk - Lq)``, relattn's distance. The block mask is made once,
    here, as a model reuses it across its layers; every call compiles nothing after the
    first. Returns ``call(q=q, k=k, v=v)``: pass tensors that require a gradient to time
    the backward pass. ``ImportError`` where this PyTorch has no FlexAttention.
    """
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    batch, lq = q.shape[0], q.shape[-2]
    lk = k.shape[-2]
    offset = lk - lq
    compiled = torch.compile(flex_attention, dynamic=False)
    score_mod = None
    if slopes is not None:

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - q_idx - offset)

    elif values is not None:

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + values[h, kv_idx - q_idx - offset + lq - 1]

    def visible(b, h, q_idx, kv_idx):
        return q_idx + offset >= kv_idx

    if segments is not None:

        def mask_mod(b, h, q_idx, kv_idx):
            same = segments[b, q_idx + offset] == segments[b, kv_idx]
            return (same & visible(b, h, q_idx, kv_idx)) if causal else same

        block_mask = create_block_mask(mask_mod, batch, None, lq, lk, device=q.device)
    elif causal:
        block_mask = create_block_mask(visible, None, None, lq, lk, device=q.device)
    else:
        block_mask = None

    def call(q=q, k=k, v=v):
        return compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)

    return call


def torch_sam_attention(q, k, v, rel_pos_h, rel_pos_w, grid, scale=None):
    """:func:`numpy_sam_attention` as segment-anything writes it in PyTorch (``view``,
    ``torch.einsum``, ``softmax(dim=-1)``; ``get_rel_pos``'s ``torch.arange`` coordinates
    and ``.long()`` index per call)."""
    import torch

    b, heads, length, d = q.shape
    h, w = grid
    scale = d**-0.5 if scale is None else scale
    q, k, v = (x.reshape(b * heads, length, x.shape[-1]) for x in (q, k, v))
    attn = (q * scale) @ k.transpose(-2, -1)

    def get_rel_pos(q_size, k_size, rel_pos):
        q_coords = torch.arange(q_size, device=q.device)[:, None] * max(k_size / q_size, 1.0)
        k_coords = torch.arange(k_size, device=q.device)[None, :] * max(q_size / k_size, 1.0)
        relative_coords = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)
        return rel_pos[relative_coords.long()]

    rh, rw = get_rel_pos(h, h, rel_pos_h), get_rel_pos(w, w, rel_pos_w)
    r_q = q.reshape(b * heads, h, w, d)
    rel_h = torch.einsum("bhwc,hkc->bhwk", r_q, rh)
    rel_w = torch.einsum("bhwc,wkc->bhwk", r_q, rw)
    attn = (attn.view(b * heads, h, w, h, w) + rel_h[:, :, :, :, None]
            + rel_w[:, :, :, None, :]).view(b * heads, length, length)  # fmt: skip
    attn = attn.softmax(dim=-1)
    return (attn @ v).view(b, heads, length, v.shape[-1])


def torch_swin_window_attention(q, k, v, table, index, attn_mask, scale=None):
    """Swin's ``WindowAttention.forward`` (the authors' PyTorch):
    :func:`numpy_swin_window_attention` with ``view``, ``permute(2, 0, 1).contiguous()``,
    ``unsqueeze`` and ``softmax(dim=-1)``."""
    windows, heads, n, d = q.shape
    nw = attn_mask.shape[0]
    scale = d**-0.5 if scale is None else scale
    attn = (q * scale) @ k.transpose(-2, -1)
    bias = table[index.view(-1)].view(n, n, -1).permute(2, 0, 1).contiguous()
    attn = attn + bias.unsqueeze(0)
    attn = attn.view(windows // nw, nw, heads, n, n) + attn_mask.unsqueeze(1).unsqueeze(0)
    attn = attn.view(-1, heads, n, n).softmax(dim=-1)
    return attn @ v


def torch_deberta_attention(q, k, v, key_table, query_table, scale):
    """:func:`numpy_deberta_attention` as HF writes it: ``torch.gather`` of the two
    products with the index expanded, ``transpose(-1, -2)``, ``softmax(dim=-1)``."""
    import torch

    lq, lk = q.shape[-2], k.shape[-2]
    index = deberta_index(lq, lk, torch).to(q.device)
    scores = q @ k.transpose(-1, -2)
    c2p = q @ key_table.transpose(-1, -2)
    scores = scores + torch.gather(c2p, -1, index.expand(*c2p.shape[:-1], lk))
    p2c = k @ query_table.transpose(-1, -2)
    p2c = torch.gather(p2c, -1, index.T.expand(*p2c.shape[:-1], lq)).transpose(-1, -2)
    return ((scores + p2c) * scale).softmax(dim=-1) @ v


# -- JAX (call through ``jax.jit``) -------------------------------------


def jax_rel_shift(x, key_length: int):
    """Transformer-XL ``_rel_shift`` in ``jax.numpy``."""
    import jax.numpy as jnp

    *batch, lq, width = x.shape
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(1, 0)])
    padded = padded.reshape(*batch, width + 1, lq)[..., 1:, :]
    return padded.reshape(*batch, lq, width)[..., :key_length]


def jax_relative_attention(q, k, v, position_table, content_bias, position_bias, scale=None):
    """Transformer-XL relative attention in ``jax.numpy`` (as in Flax/Haiku ports)."""
    import jax
    import jax.numpy as jnp

    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    ac = jnp.matmul(q + content_bias, jnp.swapaxes(k, -1, -2))
    bd = jax_rel_shift(jnp.matmul(q + position_bias, jnp.swapaxes(position_table, -1, -2)), lk)
    scores = (ac + bd) * scale
    if position_table.shape[-2] == lk:
        scores = jnp.where(jnp.tri(lq, lk, lk - lq, dtype=bool), scores, -jnp.inf)
    return jnp.matmul(jax.nn.softmax(scores, axis=-1), v)


def jax_relative_attention_einsum(q, k, v, position_table, content_bias, position_bias, scale=None):
    """:func:`jax_relative_attention` with ``jnp.einsum`` products: under ``jax.jit`` on
    the CPU, 2–3 times faster than ``matmul`` of a transposed ``k`` for a decode step."""
    import jax
    import jax.numpy as jnp

    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    ac = jnp.einsum("...qd,...kd->...qk", q + content_bias, k)
    bd = jnp.einsum("...qd,...wd->...qw", q + position_bias, position_table)
    scores = (ac + jax_rel_shift(bd, lk)) * scale
    if position_table.shape[-2] == lk:
        scores = jnp.where(jnp.tri(lq, lk, lk - lq, dtype=bool), scores, -jnp.inf)
    return jnp.einsum("...qk,...kd->...qd", jax.nn.softmax(scores, axis=-1), v)


def jax_cached_decode(q, k, v, position_table, content_bias, position_bias, filled,
                      scale=None):  # fmt: skip
    """:func:`numpy_cached_decode` in ``jax.numpy``, its products as ``einsum`` (the faster
    way under ``jax.jit`` on the CPU)."""
    import jax
    import jax.numpy as jnp

    lmax, d = k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    slots = jnp.arange(lmax)
    ac = jnp.einsum("...qd,...kd->...qk", q + content_bias, k)
    rows = jnp.clip(slots[None, :] - filled[:, None] + lmax, 0, lmax - 1)
    bd = jnp.einsum("...qd,...wd->...qw", q + position_bias, position_table)
    bd = jnp.take_along_axis(bd, rows[:, None, None, :], axis=-1)
    mask = (slots[None, :] < filled[:, None])[:, None, None, :]
    scores = jnp.where(mask, (ac + bd) * scale, -jnp.inf)
    return jnp.einsum("...qk,...kd->...qd", jax.nn.softmax(scores, axis=-1), v)


def jax_attention(q, k, v, bias=None, scale=None, *, causal=False, implementation=None):
    """``jax.nn.dot_product_attention`` on ``(B, H, L, d)`` arrays.

    The fused function wants ``(B, L, H, d)``; the transposes are part of what
    a caller holding relattn's layout pays, and XLA folds them into the
    products. ``bias=None``: plain attention; ``causal``: its ``is_causal``;
    ``implementation``: ``"xla"``, ``"cudnn"`` (GPUs, 16-bit floats) or ``None``
    (JAX chooses).
    """
    import jax
    import jax.numpy as jnp

    if bias is not None and bias.ndim == 2:
        bias = jnp.broadcast_to(bias, (1, 1, *bias.shape[-2:]))
    out = jax.nn.dot_product_attention(
        jnp.swapaxes(q, 1, 2),
        jnp.swapaxes(k, 1, 2),
        jnp.swapaxes(v, 1, 2),
        bias=bias,
        scale=scale,
        is_causal=causal,
        implementation=implementation,
    )
    return jnp.swapaxes(out, 1, 2)


def jax_shaw_materialised(q, k, v, key_table, value_table, scale=None):
    """tensor2tensor ``dot_product_attention_relative`` in ``jax.numpy``."""
    import jax
    import jax.numpy as jnp

    lq, lk = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    radius = (key_table.shape[0] - 1) // 2
    keys = jnp.arange(lk)
    index = jnp.clip(keys[None, :] - keys[-lq:, None], -radius, radius) + radius
    relations_keys, relations_values = key_table[index], value_table[index]
    logits = (q * scale) @ jnp.swapaxes(k, -1, -2)
    logits = logits + jnp.einsum("bhid,ijd->bhij", q * scale, relations_keys)
    weights = jax.nn.softmax(logits, axis=-1)
    return weights @ v + jnp.einsum("bhij,ijd->bhid", weights, relations_values)


def jax_rotary_cos_sin(positions, dim: int, base: float = 10000.0):
    """HF's ``cos``, ``sin`` tables in ``jax.numpy`` (as Flax's LLaMA), float32."""
    import jax.numpy as jnp

    inv_freq = 1.0 / (base ** (jnp.arange(0, dim, 2).astype(jnp.float32) / dim))
    freqs = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    emb = jnp.concatenate((freqs, freqs), axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def jax_rotate_half(x):
    """HF ``rotate_half`` in ``jax.numpy`` (``modeling_flax_llama.py``)."""
    import jax.numpy as jnp

    half = x.shape[-1] // 2
    return jnp.concatenate((-x[..., half:], x[..., :half]), axis=-1)


def jax_rotary(q, k, cos, sin):
    """HF ``apply_rotary_pos_emb`` in ``jax.numpy``."""
    return q * cos + jax_rotate_half(q) * sin, k * cos + jax_rotate_half(k) * sin


def jax_t5_attention(q, k, v, table, pair_buckets):
    """T5's ``(1, H, Lq, Lk)`` bias gathered per pair, then ``jax.nn.dot_product_attention``."""
    import jax.numpy as jnp

    bias = jnp.transpose(table[pair_buckets], (2, 0, 1))[None]
    return jax_attention(q, k, v, bias, scale=1.0)


def jax_sam_attention(q, k, v, rel_pos_h, rel_pos_w, grid, scale=None):
    """:func:`numpy_sam_attention` in ``jax.numpy`` (as JAX ports of SAM/ViTDet write it)."""
    import jax
    import jax.numpy as jnp

    b, heads, length, d = q.shape
    h, w = grid
    scale = d**-0.5 if scale is None else scale
    q, k, v = (x.reshape(b * heads, length, x.shape[-1]) for x in (q, k, v))
    attn = (q * scale) @ jnp.swapaxes(k, -1, -2)
    rh, rw = sam_rel_pos(rel_pos_h, h, h, jnp), sam_rel_pos(rel_pos_w, w, w, jnp)
    r_q = q.reshape(b * heads, h, w, d)
    rel_h = jnp.einsum("bhwc,hkc->bhwk", r_q, rh)
    rel_w = jnp.einsum("bhwc,wkc->bhwk", r_q, rw)
    attn = attn.reshape(b * heads, h, w, h, w) + rel_h[..., :, None] + rel_w[..., None, :]
    attn = jax.nn.softmax(attn.reshape(b * heads, length, length), axis=-1)
    return (attn @ v).reshape(b, heads, length, v.shape[-1])


def jax_swin_window_attention(q, k, v, table, index, attn_mask, scale=None):
    """Swin's ``WindowAttention.forward`` in ``jax.numpy``."""
    import jax
    import jax.numpy as jnp

    windows, heads, n, d = q.shape
    nw = attn_mask.shape[0]
    scale = d**-0.5 if scale is None else scale
    attn = (q * scale) @ jnp.swapaxes(k, -1, -2)
    bias = jnp.transpose(table[index.reshape(-1)].reshape(n, n, -1), (2, 0, 1))
    attn = attn + bias[None]
    attn = attn.reshape(windows // nw, nw, heads, n, n) + attn_mask[:, None][None]
    return jax.nn.softmax(attn.reshape(-1, heads, n, n), axis=-1) @ v


def jax_deberta_attention(q, k, v, key_table, query_table, scale):
    """:func:`numpy_deberta_attention` in ``jax.numpy``."""
    import jax
    import jax.numpy as jnp

    lq, lk = q.shape[-2], k.shape[-2]
    index = deberta_index(lq, lk, jnp)
    scores = q @ jnp.swapaxes(k, -1, -2)
    c2p = q @ jnp.swapaxes(key_table, -1, -2)
    scores = scores + jnp.take_along_axis(c2p, jnp.broadcast_to(index, (*c2p.shape[:-1], lk)),
                                          axis=-1)  # fmt: skip
    p2c = k @ jnp.swapaxes(query_table, -1, -2)
    p2c = jnp.take_along_axis(p2c, jnp.broadcast_to(index.T, (*p2c.shape[:-1], lq)), axis=-1)
    return jax.nn.softmax((scores + jnp.swapaxes(p2c, -1, -2)) * scale, axis=-1) @ v


# -- the table the benchmarks use ----------------------------------------

#: ``{function: {backend family: native implementation}}``; "numpy" serves
#: CuPy as well (through ``lib=cupy``).
NATIVE = {
    "relative_attention": {
        "numpy": numpy_relative_attention,
        "torch": torch_relative_attention,
        "jax": jax_relative_attention,
    },
    "relative_attention_einsum": {
        "numpy": numpy_relative_attention_einsum,
        "torch": torch_relative_attention_einsum,
        "jax": jax_relative_attention_einsum,
    },
    "cached_decode": {
        "numpy": numpy_cached_decode,
        "torch": torch_cached_decode,
        "jax": jax_cached_decode,
    },
    "scaled_dot_product_attention": {
        "numpy": numpy_attention,
        "torch": torch_attention,
        "jax": jax_attention,
    },
    "shaw_attention": {
        "numpy": numpy_shaw_materialised,
        "torch": torch_shaw_materialised,
        "jax": jax_shaw_materialised,
    },
    "rel_shift": {"numpy": numpy_rel_shift, "torch": torch_rel_shift, "jax": jax_rel_shift},
    "rotary_position_embedding": {
        "numpy": numpy_rotary,
        "torch": torch_rotary,
        "jax": jax_rotary,
    },
    #: Not timed: the ``cos``, ``sin`` tables ``rotary_position_embedding``'s baseline takes.
    "rotary_cos_sin": {
        "numpy": numpy_rotary_cos_sin,
        "torch": torch_rotary_cos_sin,
        "jax": jax_rotary_cos_sin,
    },
    "t5_attention": {
        "numpy": numpy_t5_attention,
        "torch": torch_t5_attention,
        "jax": jax_t5_attention,
    },
    #: SAM's attention with decomposed relative positions (``benchmarks/vision.py``).
    "decomposed_relative_attention": {
        "numpy": numpy_sam_attention,
        "torch": torch_sam_attention,
        "jax": jax_sam_attention,
    },
    #: DeBERTa's c2p and p2c terms as HF's eager attention gathers them.
    "deberta_attention": {
        "numpy": numpy_deberta_attention,
        "torch": torch_deberta_attention,
        "jax": jax_deberta_attention,
    },
    #: Swin's (shifted) window attention with its relative position bias.
    "swin_window_attention": {
        "numpy": numpy_swin_window_attention,
        "torch": torch_swin_window_attention,
        "jax": jax_swin_window_attention,
    },
}


def rotary_tables(backend: Any, length: int) -> tuple[Any, Any]:
    """The native ``cos``, ``sin (L, d)`` of positions ``0 … L-1`` on ``backend``.

    Computed once, natively, as HF's model does before its layers: the timed
    baseline is ``apply_rotary_pos_emb`` alone.
    """
    positions = backend.asarray(np.arange(length, dtype=np.int64))
    return native("rotary_cos_sin", backend, dim=common.D_HEAD)(positions)


def t5_pairs(backend: Any, length: int) -> Any:
    """The native ``(L, L)`` bucket indices (:func:`t5_pair_buckets`) on ``backend``."""
    pairs = t5_pair_buckets(length, length, common.T5_BUCKETS, common.T5_MAX_DISTANCE)
    return backend.asarray(pairs)


def family(backend: Any) -> str | None:
    """The key of :data:`NATIVE` for a :class:`relattn.testing.Target`; ``None`` for Dask (none)."""
    library = backend.library
    if library == "cupy":
        return "numpy"  # CuPy's API is NumPy's
    return library if library in ("numpy", "torch", "jax") else None


def native(function: str, backend: Any, **static: Any) -> Any:
    """The native implementation of relattn's ``function`` for target ``backend``.

    ``static`` keywords are bound, and JAX's is compiled with ``jax.jit``
    (``backend.default_jit``); CuPy's is NumPy's code on ``cupy``.
    ``NotImplementedError`` where there is none (Dask).
    """
    fam = family(backend)
    if fam is None:
        raise NotImplementedError(f"no native {function} for {backend.name}")
    if backend.library == "cupy":
        static = {**static, "lib": backend.lib}
    fn = NATIVE[function][fam]
    return backend.default_jit(functools.partial(fn, **static) if static else fn)


# -- equality with relattn -----------------------------------------------


@functools.cache
def check(backend_name: str) -> None:
    """Assert every native baseline of ``backend_name`` equals relattn on small float32 inputs.

    ``NotImplementedError`` where the backend is absent or has no native code
    (Dask). Cached: one check per process, however many benchmarks call it.
    """
    backend = common.get_backend(backend_name)
    if family(backend) is None:
        raise NotImplementedError(f"no native baselines for {backend_name}")
    tol = {"rtol": 2e-4, "atol": 2e-5}

    def same(function: str, args: tuple, kwargs: dict, native_args: tuple | None = None, *,
             native_function: str | None = None,
             native_static: dict | None = None) -> None:  # fmt: skip
        ours = getattr(relattn, function)(*args, **kwargs)
        theirs = native(native_function or function, backend, **(native_static or {}))(
            *(args if native_args is None else native_args)
        )
        np.testing.assert_allclose(
            backend.to_host(theirs),
            backend.to_host(ours),
            **tol,
            err_msg=f"native {function} on {backend_name} differs from relattn",
        )

    for lq, lk in ((5, 9), (6, 6)):
        for layout in ("causal", "full"):
            arrays = common.on(backend, common.relative_inputs(lq, layout, key_len=lk))
            q, k, v, table, u, pos = (arrays[n] for n in common.RELATIVE_NAMES)
            same(
                "relative_attention",
                (q, k, v, table),
                {"content_bias": u, "position_bias": pos},
                (q, k, v, table, u, pos),
            )
            einsum = native("relative_attention_einsum", backend)(q, k, v, table, u, pos)
            np.testing.assert_allclose(
                backend.to_host(einsum),
                backend.to_host(native("relative_attention", backend)(q, k, v, table, u, pos)),
                **tol,
                err_msg=f"native relative_attention (einsum) on {backend_name} differs",
            )
            scores = (q + pos) @ backend.lib.swapaxes(table, -1, -2)
            ours = common.relattn_function("rel_shift", backend, key_length=lk)(scores)
            theirs = native("rel_shift", backend, key_length=lk)(scores)
            ours, theirs = backend.to_host(ours), backend.to_host(theirs)
            # The causal layout has no column for δ > 0: relattn writes 0 there, the
            # native shift leaves other rows' values, which attention masks.
            keep = np.tri(lq, lk, lk - lq, dtype=bool) if layout == "causal" else True
            np.testing.assert_allclose(np.where(keep, theirs, 0), np.where(keep, ours, 0), **tol)
        # A decode step against a cache of lk slots, rows filled to lk and 3.
        arrays = common.on(backend, common.relative_inputs(1, "causal", key_len=lk))
        q, k, v, table, u, pos = (arrays[n] for n in common.RELATIVE_NAMES)
        filled = np.array([lk, 3])  # B = 2 rows
        positions = (backend.asarray((filled - 1).reshape(2, 1, 1)),
                     backend.asarray(np.arange(lk)[None, None, :]))  # fmt: skip
        same(
            "relative_attention",
            (q, k, v, table),
            {"content_bias": u, "position_bias": pos, "causal": True, "positions": positions},
            (q, k, v, table, u, pos, backend.asarray(filled)),
            native_function="cached_decode",
        )
        arrays = common.on(backend, common.bias_inputs(lq, key_len=lk))
        same(
            "scaled_dot_product_attention",
            (arrays["q"], arrays["k"], arrays["v"]),
            {"bias": arrays["bias"]},
            (arrays["q"], arrays["k"], arrays["v"], arrays["bias"]),
        )
        same("scaled_dot_product_attention", (arrays["q"], arrays["k"], arrays["v"]), {})
        arrays = common.on(backend, common.shaw_inputs(lq, key_len=lk))
        args = tuple(arrays[n] for n in ("q", "k", "v", "key_table", "value_table"))
        same("shaw_attention", args, {})
        arrays = common.on(backend, common.plan_inputs("deberta", lq, heads=2))
        tables = (arrays["position_table"], arrays["query_position_table"])
        qkv = (arrays["q"], arrays["k"], arrays["v"])
        same("relative_attention", (*qkv, tables[0]),
             {"query_position_table": tables[1], "scale": 0.125}, (*qkv, *tables),
             native_function="deberta_attention", native_static={"scale": 0.125})  # fmt: skip
    if not all(
        hasattr(relattn, f) for f in ("rotary_position_embedding", "relative_position_bucket")
    ):
        return  # an older commit: the benchmarks that need these skip
    for length in (5, 6, 9):
        arrays = common.on(backend, common.rotary_inputs(length))
        q, k = arrays["q"], arrays["k"]
        cos, sin = rotary_tables(backend, length)
        ours = backend.default_jit(common.rotary_qk)(q, k)
        theirs = native("rotary_position_embedding", backend)(q, k, cos, sin)
        for a, b, name in zip(theirs, ours, "qk", strict=True):
            np.testing.assert_allclose(
                backend.to_host(a), backend.to_host(b), **tol,
                err_msg=f"native rotate_half ({name}) on {backend_name} differs from relattn",
            )  # fmt: skip
        arrays, pairs = common.on(backend, common.t5_inputs(length)), t5_pairs(backend, length)
        qkv = (arrays["q"], arrays["k"], arrays["v"])
        ours = backend.default_jit(common.t5_attention)(*qkv, arrays["table"], arrays["buckets"])
        theirs = native("t5_attention", backend)(*qkv, arrays["table"], pairs)
        np.testing.assert_allclose(
            backend.to_host(theirs), backend.to_host(ours), **tol,
            err_msg=f"native T5 attention on {backend_name} differs from relattn",
        )  # fmt: skip
    _check_t5_buckets()


@functools.cache
def _check_t5_buckets(length: int = 300) -> None:
    """HF's bucket of every pair equals relattn's bucket of the pair's distance (every bucket)."""
    buckets = common.t5_inputs(length)["buckets"]  # relattn's, one per column of the full layout
    i, j = np.indices((length, length))
    np.testing.assert_array_equal(
        t5_pair_buckets(length, length, common.T5_BUCKETS, common.T5_MAX_DISTANCE),
        buckets[j - i + length - 1],
        err_msg="T5 bucket indices per pair differ from relattn's relative_position_bucket",
    )


if __name__ == "__main__":
    for name in common.BACKENDS:
        try:
            check(name)
        except NotImplementedError as e:
            print(f"{name:<11} skipped: {e}")
        else:
            print(f"{name:<11} native baselines equal relattn")
