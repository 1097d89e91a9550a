"""SAM's image encoder: its decomposed relative positions computed by relattn.

SAM's ViT image encoder (``transformers.models.sam``, and SAM-HQ's copy of it)
adds MViTv2's decomposed relative positions inside its own attention module,
outside ``transformers``' ``AttentionInterface``: for query ``(y, x)`` and key
``(ky, kx)`` of an ``h × w`` grid, ``q·Rʰ[y - ky] + q·Rʷ[x - kx]`` with the
module's learned ``rel_pos_h`` and ``rel_pos_w``, linearly resized to ``2h - 1``
and ``2w - 1`` rows when they have another length. :data:`PATCHES` maps the
attention class names to functions that replace the module's ``forward`` (in
place) with one that keeps its fused ``qkv`` and output ``proj`` projections
and sends the scores, the two per-axis terms, the softmax and the values
through one :func:`relattn.decomposed_relative_attention` call (or
:func:`relattn.scaled_dot_product_attention` with ``use_rel_pos=False``).

Windowed and global blocks need nothing of their own: the layer partitions the
image into windows (padding it to a multiple of the window) before it calls
the attention module, which sees each window as a ``(window, window)`` grid and
reads the tables of its own size.

Attention dropout must be off for the eager classes: a patched
``SamVisionAttention`` in training mode with a nonzero ``attention_dropout``
raises a ``ValueError``, since relattn has no attention dropout
(``SamVisionSdpaAttention`` applies none, and neither does its patched
version). The patched modules return no attention weights.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

from ..attention import scaled_dot_product_attention
from ..decomposed import decomposed_relative_attention
from ._checks import dropout_off, no_weights

__all__ = ["PATCHES", "patch_sam_vision"]


def patch_sam_vision(module: Any, *, applies_dropout: bool = True) -> bool:
    """Compute a SAM image-encoder attention module's attention with relattn (in place).

    Parameters
    ----------
    module : transformers.models.sam.modeling_sam.SamVisionAttention
        Or ``SamVisionSdpaAttention``, ``SamHQVisionAttention``,
        ``SamHQVisionSdpaAttention``. Read at each call: ``qkv``, ``proj``,
        ``num_attention_heads``, ``scale`` (``head_dim ** -0.5``),
        ``use_rel_pos``, ``rel_pos_h``, ``rel_pos_w``, ``dropout`` and
        ``training``.
    applies_dropout : bool, optional
        Whether the module's own ``forward`` applies its attention dropout in
        training (the eager classes, default) or ignores it (the ``Sdpa``
        classes). With True, a patched module in training mode with a nonzero
        ``dropout`` raises a ``ValueError`` when called.

    Returns
    -------
    bool
        True: the module is patched.

    See Also
    --------
    relattn.huggingface.patch : Patches every such module of a model.
    relattn.decomposed_relative_attention : What the patched module calls.

    Notes
    -----
    The replaced ``forward`` takes ``(hidden_states, output_attentions=None)``
    with ``hidden_states`` of shape ``(N, h, w, C)`` (a batch of images or of
    windows) and returns ``(output, None)``. The tables are read at each call,
    so a table loaded with another length than ``2h - 1`` is resized by
    :func:`relattn.resize_relative_table`: PyTorch's linear interpolation
    (``align_corners=False``), with its source coordinates and weights formed
    in float64, where PyTorch forms them in the table's dtype (a float32 table
    of 127 rows of N(0, 1) values resized to 63 differs by up to 2.5e-5; float64
    tables by 4e-15). The eager
    ``transformers`` module computes the softmax in float32 whatever the
    model's dtype; relattn computes it in the model's dtype.

    Examples
    --------
    >>> import transformers  # doctest: +SKIP
    >>> import relattn.huggingface
    >>> model = transformers.SamModel.from_pretrained("facebook/sam-vit-base")  # doctest: +SKIP
    >>> relattn.huggingface.patch(model) is model  # doctest: +SKIP
    True
    """
    module.forward = types.MethodType(_forward_of(applies_dropout), module)
    return True


def _forward_of(applies_dropout: bool) -> Callable[..., tuple[Any, None]]:
    def forward(self: Any, hidden_states: Any, output_attentions: Any = None) -> tuple[Any, None]:
        """The patched attention: ``(N, h, w, C)`` and no weights."""
        no_weights(output_attentions)
        if applies_dropout:
            dropout_off(self, self.dropout, "attention_dropout")
        batch, height, width, _ = hidden_states.shape
        heads = self.num_attention_heads
        # (N, h·w, 3·C) -> q, k, v of shape (N, H, h·w, d)
        qkv = self.qkv(hidden_states).reshape(batch, height * width, 3, heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        if self.use_rel_pos:
            out = decomposed_relative_attention(
                q, k, v, self.rel_pos_h, self.rel_pos_w, query_grid=(height, width),
                scale=self.scale,
            )  # fmt: skip
        else:
            out = scaled_dot_product_attention(q, k, v, scale=self.scale)
        out = out.permute(0, 2, 1, 3).reshape(batch, height, width, -1)
        return self.proj(out), None

    return forward


#: ``transformers`` attention class name -> the function that patches such a module.
PATCHES: dict[str, Callable[[Any], bool | None]] = {
    "SamVisionAttention": patch_sam_vision,
    "SamVisionSdpaAttention": functools.partial(patch_sam_vision, applies_dropout=False),
    "SamHQVisionAttention": patch_sam_vision,
    "SamHQVisionSdpaAttention": functools.partial(patch_sam_vision, applies_dropout=False),
}
