"""BLOOM, MPT and Falcon with ALiBi: their attention computed by relattn.

These models add ALiBi inside their own attention modules, outside
``transformers``' ``AttentionInterface``. :data:`PATCHES` maps each attention
class name (MPT: its model's, as its attention modules do not keep the
configuration) to a function that replaces the ``forward`` of the attention
modules (in place) with one that keeps the module's projections, its cache update and its output
projection, and sends the scores, the ALiBi term, the softmax and the values
through one :func:`relattn.scaled_dot_product_attention` call: ALiBi as a
``relative_bias`` row ``slope_h · δ`` per head over the causal layout, the
module's mask as ``mask=``, and ``positions=`` as data.

Positions are read from the boolean mask each module receives, so that no model
``forward`` needs to be replaced and caches (dynamic or static) need no
bookkeeping:

- a key's position: for BLOOM and Falcon, whose ALiBi counts real tokens
  (``cumsum(attention_mask) - 1``, 0 on padding), the number of real keys
  before it, read from the last query's row of the mask (the key padding, as
  every filled slot of the cache precedes the last query); for MPT, whose
  ALiBi counts slots, padding included, its index;
- a query's position is that of the last key it may attend: itself, for a real
  token. A padding query's row is shifted by a constant, which the softmax
  ignores; a row with no allowed key gives zeros.

So ``δ = key_position - query_position <= 0`` on every allowed pair. BLOOM
and Falcon differ from the index only when padding sits inside a row; MPT's
positions are the index, given as data so that a static cache's slots need no
alignment. ``transformers`` adds ``slope_h · key_position`` instead of
``slope_h · δ``: the same weights, as the two differ by a constant per row.

Attention dropout must be off: a patched module in training mode with a
nonzero attention dropout raises a ``ValueError`` naming the configuration
field, since relattn has no attention dropout. The patched modules return no
attention weights.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from ..attention import scaled_dot_product_attention
from ..biases import alibi_slopes
from ..positions import relative_distances
from ._checks import dropout_off, no_weights

__all__ = ["PATCHES", "mpt_alibi_slopes", "patch_bloom", "patch_falcon", "patch_mpt"]


def mpt_alibi_slopes(num_heads: int, alibi_bias_max: float = 8) -> list[float]:
    """MPT's ALiBi slopes, which ``attn_config.alibi_bias_max`` sets.

    Parameters
    ----------
    num_heads : int
        ``H >= 1``.
    alibi_bias_max : float, optional
        ``b > 0``, the exponent of the smallest slope ``2^-b`` (default 8).

    Returns
    -------
    list of float
        With ``n`` the smallest power of 2 at least ``H``: ``2^(-b·i/n)``,
        ``i = 1 … n``. When ``n > H``, the slopes of even ``i``, then those
        of odd ``i``, the first ``H`` of them.

    Raises
    ------
    ValueError
        If ``num_heads < 1`` or ``alibi_bias_max <= 0``.
    TypeError
        If ``num_heads`` is not an integer.

    See Also
    --------
    relattn.alibi_slopes : The slopes of ``b = 8``, those of BLOOM and Falcon.

    Notes
    -----
    MosaicML's llm-foundry, ``gen_slopes(n_heads, alibi_bias_max)``. For
    ``b = 8`` these are Press et al. 2022's slopes. ``transformers``
    (5.24.0) always uses ``b = 8``, whatever the configuration says.

    Examples
    --------
    >>> from relattn.huggingface._alibi import mpt_alibi_slopes
    >>> [s * 2**16 for s in mpt_alibi_slopes(4, alibi_bias_max=16)]
    [4096.0, 256.0, 16.0, 1.0]
    >>> [s * 2**8 for s in mpt_alibi_slopes(3)]
    [16.0, 1.0, 64.0]
    """
    if not isinstance(num_heads, int) or isinstance(num_heads, bool):
        raise TypeError(f"num_heads must be an integer, got {type(num_heads).__name__}")
    if num_heads < 1:
        raise ValueError(f"num_heads must be at least 1, got {num_heads}")
    if not alibi_bias_max > 0:
        raise ValueError(f"alibi_bias_max must be positive, got {alibi_bias_max}")
    n = 1 << (num_heads - 1).bit_length()
    slopes = [2.0 ** (-alibi_bias_max * i / n) for i in range(1, n + 1)]
    if n != num_heads:
        slopes = (slopes[1::2] + slopes[::2])[:num_heads]
    return slopes


def _attend(
    query: Any,
    key: Any,
    value: Any,
    allowed: Any,
    slopes: Any,
    scale: float,
    count_real_tokens: bool,
) -> Any:
    """ALiBi attention by relattn, positions read from ``allowed``; ``(B, Lq, H·d)``.

    ``query (B, H, Lq, d)``; ``key``, ``value (B, H or 1, Lk, d)``; ``allowed``: a
    boolean mask broadcastable to ``(B, H, Lq, Lk)`` (``True`` = may attend) or
    ``None`` (causal); ``slopes (H,)`` float64, already multiplied by any factor
    the model puts on its ALiBi term.
    """
    batch, heads, q_len, _ = query.shape
    k_len = key.shape[-2]
    # The causal layout: one column per distance δ = 1 - Lk … 0.
    distances = relative_distances(q_len, k_len, causal=True, xp=torch, device=query.device)
    relative_bias = slopes.to(device=query.device, dtype=query.dtype)[:, None] * distances
    if allowed is None:
        out = scaled_dot_product_attention(
            query, key, value, relative_bias=relative_bias, causal=True, scale=scale
        )
    else:
        if count_real_tokens:
            last_row = allowed[:, :1, -1:, :].long()  # (B, 1, 1, Lk): the key padding
            key_pos = (last_row.cumsum(-1) - 1) * last_row
        else:
            key_pos = torch.arange(k_len, device=query.device).expand(batch, 1, 1, k_len)
        query_pos = torch.where(allowed[:, :1], key_pos, 0).amax(-1)  # (B, 1, Lq)
        out = scaled_dot_product_attention(
            query, key, value, relative_bias=relative_bias, mask=allowed, scale=scale,
            positions=(query_pos, key_pos[:, :, 0]),
        )  # fmt: skip
    return out.transpose(1, 2).reshape(batch, q_len, heads * out.shape[-1])


def _additive_to_allowed(attention_mask: Any) -> Any:
    """``True`` where an additive mask (``0``/ALiBi or ``finfo.min``) lets a query attend."""
    if attention_mask is None:
        return None
    return attention_mask > torch.finfo(attention_mask.dtype).min / 2


def _as_tensor(slopes: Any) -> Any:
    return torch.as_tensor(slopes, dtype=torch.float64)


def patch_bloom(module: Any) -> None:
    """Compute a ``BloomAttention``'s attention with relattn (in place).

    Parameters
    ----------
    module : transformers.models.bloom.modeling_bloom.BloomAttention
        Read: ``num_heads`` (slopes :func:`relattn.alibi_slopes`),
        ``inv_norm_factor`` (``scale``), ``beta`` (the ALiBi factor),
        ``query_key_value`` and ``_reshape`` (the fused projection),
        ``dense``, ``hidden_dropout``, ``attention_dropout`` and ``layer_idx``.

    Notes
    -----
    The replaced ``forward`` takes the model's ALiBi tensor and ignores it: its
    positions come from the mask (the module docstring). ``transformers``
    computes the slopes in float32 (exact for up to 8 heads) and the softmax in
    float32 whatever the model's dtype; relattn in the model's dtype.
    ``pretraining_tp`` with ``slow_but_exact`` (the output projection summed
    in slices) is not reproduced: it changes only the rounding.
    """
    slopes = _as_tensor(alibi_slopes(module.num_heads)) * module.beta
    module.forward = types.MethodType(_bloom_forward(slopes), module)


def _bloom_forward(slopes: Any) -> Callable[..., tuple[Any, None]]:
    def forward(
        self: Any,
        hidden_states: Any,
        residual: Any,
        alibi: Any,
        attention_mask: Any,
        layer_past: Any = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        **kwargs: Any,
    ) -> tuple[Any, None]:
        dropout_off(self, self.attention_dropout.p, "attention_dropout")
        no_weights(output_attentions)
        query, key, value = self._reshape(self.query_key_value(hidden_states))
        if layer_past is not None:
            key, value = layer_past.update(key, value, self.layer_idx)
        allowed = _additive_to_allowed(attention_mask)
        context = _attend(query, key, value, allowed, slopes, self.inv_norm_factor, True)
        out = torch.nn.functional.dropout(
            self.dense(context), p=self.hidden_dropout, training=self.training
        )
        return residual + out, None

    return forward


def patch_mpt(model: Any) -> None:
    """Compute the attention of every ``MptAttention`` of an ``MptModel`` with relattn (in place).

    Parameters
    ----------
    model : transformers.models.mpt.modeling_mpt.MptModel
        Read: ``config.attn_config.alibi_bias_max`` (the slopes,
        :func:`mpt_alibi_slopes`; an ``MptAttention`` does not keep its
        configuration, hence the model), and in each block's ``attn``:
        ``n_heads``, ``head_dim``, ``softmax_scale`` (``scale``),
        ``clip_qkv``, ``Wqkv``, ``out_proj``, ``attn_dropout_p`` and
        ``layer_idx``.

    Raises
    ------
    ValueError
        If ``attn_config.alibi`` is False (MPT then uses learned position
        embeddings, which ``transformers``' MPT does not have) or
        ``attn_config.qk_ln`` is True (``transformers``' ``MptAttention`` has
        no LayerNorm weights for queries and keys).

    Notes
    -----
    The replaced ``forward`` takes the model's ALiBi tensor (built with
    ``alibi_bias_max = 8`` whatever the configuration) and ignores it. The
    mask it receives is ``True`` where a key is masked. ``transformers``
    computes the softmax in float32 whatever the model's dtype; relattn in the
    model's dtype.
    """
    attn_config = model.config.attn_config
    if not attn_config.alibi:
        raise ValueError(
            "attn_config.alibi must be True: without ALiBi MPT uses learned position embeddings, "
            "which transformers' MPT does not have"
        )
    if attn_config.qk_ln:
        raise ValueError(
            "attn_config.qk_ln must be False: transformers' MptAttention has no LayerNorm weights "
            "for queries and keys"
        )
    slopes = _as_tensor(mpt_alibi_slopes(model.config.n_heads, attn_config.alibi_bias_max))
    for block in model.blocks:
        block.attn.forward = types.MethodType(_mpt_forward(slopes), block.attn)


def _mpt_forward(slopes: Any) -> Callable[..., tuple[Any, None]]:
    def forward(
        self: Any,
        hidden_states: Any,
        position_bias: Any,
        cache: Any = None,
        attention_mask: Any = None,
        **kwargs: Any,
    ) -> tuple[Any, None]:
        dropout_off(self, self.attn_dropout_p, "attn_config.attn_pdrop")
        batch, length = hidden_states.shape[:2]
        qkv = self.Wqkv(hidden_states)
        if self.clip_qkv:
            qkv = qkv.clamp(min=-self.clip_qkv, max=self.clip_qkv)
        query, key, value = (
            x.reshape(batch, length, self.n_heads, self.head_dim).transpose(1, 2)
            for x in qkv.chunk(3, dim=2)
        )
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        allowed = None if attention_mask is None else ~attention_mask
        context = _attend(query, key, value, allowed, slopes, self.softmax_scale, False)
        return self.out_proj(context), None

    return forward


def patch_falcon(module: Any) -> bool | None:
    """Compute a ``FalconAttention``'s attention with relattn (in place), with ALiBi.

    Parameters
    ----------
    module : transformers.models.falcon.modeling_falcon.FalconAttention
        Read: ``config.alibi``, ``num_heads`` (slopes
        :func:`relattn.alibi_slopes` rounded to bfloat16, as Falcon's own code
        rounds them), ``inv_norm_factor`` (``scale``, which also multiplies
        the ALiBi term), ``query_key_value`` and ``_split_heads`` (the fused
        projection, multi-query or grouped heads), ``dense``,
        ``attention_dropout`` and ``layer_idx``.

    Returns
    -------
    bool or None
        False, leaving the module as it is, when the model has no ALiBi (its
        rotary attention then goes through ``transformers``' own paths).

    Notes
    -----
    ALiBi is added once, as in Falcon's original code and ``transformers``'
    ``sdpa`` path; ``transformers``' ``eager`` path adds it twice (once in
    the mask it builds, once to the scores). The mask's ALiBi values are
    ignored; only where it is ``finfo.min`` counts. ``transformers`` also
    rounds ``slope · position`` to bfloat16, exact for positions below 256 with
    a power-of-2 head count; relattn multiplies the rounded slope by the exact
    distance.
    """
    if not module.config.alibi:
        return False
    rounded = _as_tensor(alibi_slopes(module.num_heads)).to(torch.bfloat16).double()
    slopes = rounded * module.inv_norm_factor
    module.forward = types.MethodType(_falcon_forward(slopes), module)
    return None


def _falcon_forward(slopes: Any) -> Callable[..., tuple[Any, None]]:
    def forward(
        self: Any,
        hidden_states: Any,
        alibi: Any,
        attention_mask: Any,
        position_ids: Any = None,
        layer_past: Any = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        position_embeddings: Any = None,
        **kwargs: Any,
    ) -> tuple[Any, None]:
        dropout_off(self, self.attention_dropout.p, "attention_dropout")
        no_weights(output_attentions)
        query, key, value = (
            x.transpose(1, 2) for x in self._split_heads(self.query_key_value(hidden_states))
        )
        if layer_past is not None:
            key, value = layer_past.update(key, value, self.layer_idx)
        allowed = _additive_to_allowed(attention_mask)
        context = _attend(query, key, value, allowed, slopes, self.inv_norm_factor, True)
        return self.dense(context), None

    return forward


#: ``transformers`` class name → the function that patches one such module: the
#: attention module, or for MPT the model, which holds the configuration.
PATCHES: dict[str, Callable[[Any], bool | None]] = {
    "BloomAttention": patch_bloom,
    "MptModel": patch_mpt,
    "FalconAttention": patch_falcon,
}
