"""DeBERTa-v2 and v3: their disentangled self-attention computed by relattn.

``DisentangledSelfAttention`` (``transformers.models.deberta_v2``) adds its
content-to-position (c2p) and position-to-content (p2c) terms inside its own
``forward``, outside ``transformers``' ``AttentionInterface``. :data:`PATCHES`
maps that class name to :func:`patch_deberta_v2`, which replaces the module's
``forward`` (in place) with one that keeps the module's projections and sends
the three terms, the padding mask, the softmax and the values through one
:func:`relattn.disentangled_attention` call.

The position tables are given per column of relattn's relative layout
(``δ = j - i``, ``W = 2L - 1`` rows), never per pair: the shared relative
embeddings the encoder passes in (already through its ``LayerNorm`` when
``norm_rel_ebd`` says so) are projected by the layer's key and query
projections (or ``pos_key_proj`` and ``pos_query_proj`` without
``share_att_key``) and gathered at DeBERTa's index
``φ = clip(r + k, 0, 2k - 1)``, with ``r`` the bucket of query minus key
(``-δ``: :func:`relattn.log_bucket_position` with ``position_buckets > 0``,
``-δ`` itself otherwise) and ``k`` the number of rows on each side
(``position_buckets``, else ``max_relative_positions``). ``r`` is read from
the ``relative_pos`` the encoder passes in (one value per distance, checked
to depend on ``j - i`` only), so that the layer uses the very positions
``transformers`` builds.

Attention dropout must be off: a patched module in training mode with a
nonzero ``attention_probs_dropout_prob`` raises a ``ValueError``, since
relattn has no attention dropout (the dropout of the relative embeddings,
``pos_dropout``, is applied as ``transformers`` does). The patched modules
return no attention weights.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from ..biases import log_bucket_position
from ..disentangled import disentangled_attention
from ..heads import merge_heads, split_heads
from ..positions import relative_distances
from ._checks import dropout_off, no_weights

__all__ = ["PATCHES", "patch_deberta_v2"]


def patch_deberta_v2(module: Any) -> bool:
    """Compute a DeBERTa-v2 ``DisentangledSelfAttention``'s attention with relattn (in place).

    Parameters
    ----------
    module : transformers.models.deberta_v2.modeling_deberta_v2.DisentangledSelfAttention
        Read at each call: ``query_proj``, ``key_proj``, ``value_proj``,
        ``num_attention_heads``, ``attention_head_size``, ``pos_att_type``
        (``"c2p"``, ``"p2c"``, both or neither), ``relative_attention``,
        ``share_att_key`` (else ``pos_key_proj``, ``pos_query_proj``),
        ``position_buckets``, ``max_relative_positions``, ``pos_ebd_size``
        (``k``), ``pos_dropout`` and ``dropout``.

    Returns
    -------
    bool
        True: the module is patched; False: it is not DeBERTa-v2's (DeBERTa
        v1 and SEW-D have classes of the same name and other parameters), and
        is left alone.

    See Also
    --------
    relattn.huggingface.patch : Patches every such module of a model.
    relattn.disentangled_attention : What the patched module calls.

    Notes
    -----
    The replaced ``forward`` keeps the module's signature ``(hidden_states,
    attention_mask, output_attentions=False, query_states=None,
    relative_pos=None, rel_embeddings=None)`` and returns
    ``(context, None)``. ``transformers`` divides the scores by
    ``√(d·(1 + len(pos_att_type)))`` rounded to float32 (then to the model's
    dtype); the patched module passes the inverse of that same number as
    ``scale``, so that float64 models agree to rounding. A padding query (a
    row the mask allows no key) gets a zero row, where ``transformers``
    averages every value uniformly; real tokens never read those rows.

    The positions are read from the ``relative_pos`` the encoder passes (one
    value per distance ``j - i``, its row ``L - 1`` and row 0; the whole
    matrix is compared with them, an ``O(L²)`` integer comparison and, on a
    GPU, one synchronisation per layer call). A layer called alone, with
    ``relative_pos=None``, builds them with :func:`relattn.log_bucket_position`.

    The patched ``forward`` raises a ``ValueError`` if ``output_attentions``
    is true, if the module is in training mode with a nonzero attention
    dropout, if ``query_states`` has another length than ``hidden_states``,
    if ``rel_embeddings`` is missing while ``relative_attention`` is on, or if
    ``relative_pos`` does not have one value per distance ``j - i``.

    Examples
    --------
    >>> import transformers  # doctest: +SKIP
    >>> import relattn.huggingface
    >>> model = transformers.AutoModelForMaskedLM.from_pretrained(
    ...     "microsoft/deberta-v3-base"
    ... ).eval()  # doctest: +SKIP
    >>> relattn.huggingface.patch(model) is model  # doctest: +SKIP
    True
    """
    if not type(module).__module__.endswith(".deberta_v2.modeling_deberta_v2"):
        return False
    module.forward = types.MethodType(_forward, module)
    return True


def _forward(
    self: Any,
    hidden_states: Any,
    attention_mask: Any,
    output_attentions: bool = False,
    query_states: Any = None,
    relative_pos: Any = None,
    rel_embeddings: Any = None,
) -> tuple[Any, None]:
    """The patched ``DisentangledSelfAttention.forward``: ``(B, L, H·d)`` and no weights."""
    no_weights(output_attentions)
    dropout_off(self, self.dropout.p, "attention_probs_dropout_prob")
    if query_states is None:
        query_states = hidden_states
    heads = self.num_attention_heads
    q = split_heads(self.query_proj(query_states), heads)  # (B, H, L, d)
    k = split_heads(self.key_proj(hidden_states), heads)
    v = split_heads(self.value_proj(hidden_states), heads)
    length = k.shape[-2]
    if q.shape[-2] != length:
        raise ValueError(
            f"query_states must have the length of hidden_states, got {q.shape[-2]} and {length}"
        )
    terms = [t for t in ("c2p", "p2c") if t in self.pos_att_type]
    key_table = query_table = None
    if self.relative_attention:
        if rel_embeddings is None:
            raise ValueError(
                "rel_embeddings is required with relative_attention=True (the encoder's "
                "get_rel_embedding())"
            )
        # pos_dropout even without a position term: transformers draws its mask then too
        rows = self.pos_dropout(rel_embeddings)[: 2 * self.pos_ebd_size]
        phi = _position_index(self, relative_pos, length, k.device) if terms else None
        if "c2p" in terms:
            key_table = _table(self.key_proj if self.share_att_key else self.pos_key_proj,
                               rows, phi, heads)  # fmt: skip
        if "p2c" in terms:
            query_table = _table(self.query_proj if self.share_att_key else self.pos_query_proj,
                                 rows, phi, heads)  # fmt: skip
    mask = None
    if attention_mask is not None:
        mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask.bool()
    out = disentangled_attention(
        q, k, v, key_table, query_table, mask=mask,
        scale=1 / _denominator(q.shape[-1], 1 + len(terms), q.dtype),
    )  # fmt: skip
    return merge_heads(out), None


def _denominator(d: int, factor: int, dtype: Any) -> float:
    """``√(d·factor)`` as ``transformers`` forms it: in float32, then in the model's dtype."""
    root = torch.sqrt(torch.tensor(float(d * factor), dtype=torch.float32))
    return float(root.to(dtype))


def _table(projection: Any, rows: Any, phi: Any, heads: int) -> Any:
    """The projected rows gathered per column of the relative layout: ``(H, W, d)``."""
    return split_heads(projection(rows)[phi], heads)


def _position_index(module: Any, relative_pos: Any, length: int, device: Any) -> Any:
    """``φ`` of each column of the full relative layout (``δ = m - (L - 1)``): ``(W,)``."""
    span = module.pos_ebd_size
    if relative_pos is None:
        query_minus_key = -relative_distances(length, length, xp=torch, device=device)
        if module.position_buckets > 0:
            query_minus_key = log_bucket_position(
                query_minus_key, bucket_size=module.position_buckets,
                max_position=module.max_relative_positions,
            )  # fmt: skip
    else:
        query_minus_key = _per_distance(relative_pos, length).to(device)
    return torch.clamp(query_minus_key + span, 0, 2 * span - 1)


def _per_distance(relative_pos: Any, length: int) -> Any:
    """The value of each distance ``j - i`` in an ``(L, L)`` ``relative_pos``, ascending.

    Column ``m`` of the relative layout (``δ = m - (L - 1)``) is the pair
    ``(L - 1, m)`` for ``δ <= 0`` and ``(0, δ)`` for ``δ > 0``; every other pair
    must repeat its distance's value.
    """
    if relative_pos.numel() != length * length or relative_pos.shape[-2:] != (length, length):
        raise ValueError(
            f"relative_pos must hold one ({length}, {length}) matrix (query, key): shape "
            f"({length}, {length}), (1, {length}, {length}) or (1, 1, {length}, {length}), "
            f"got {tuple(relative_pos.shape)}"
        )
    grid = relative_pos.reshape(length, length).long()
    values = torch.cat([grid[length - 1], grid[0, 1:]])
    index = torch.arange(length, device=grid.device)
    if not torch.equal(grid, values[index[None, :] - index[:, None] + length - 1]):
        raise ValueError(
            "relative_pos must depend on the distance j - i only (as DeBERTa's own "
            "build_relative_position does): relattn gives one position per distance"
        )
    return values


#: ``transformers`` attention class name -> the function that patches such a module.
PATCHES: dict[str, Callable[[Any], bool | None]] = {
    "DisentangledSelfAttention": patch_deberta_v2,
}
