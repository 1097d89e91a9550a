"""relattn inside a Hugging Face ``transformers`` model: an ``AttentionInterface`` function.

:func:`register` adds :func:`attention_forward` to ``transformers``'
``AttentionInterface`` (and, for its masks, the boolean masks of its ``sdpa``
implementation to ``AttentionMaskInterface``) under the name ``"relattn"``;
a model built or loaded with ``attn_implementation="relattn"`` then runs every
attention layer through :func:`relattn.scaled_dot_product_attention`. It handles
grouped-query heads, boolean and additive masks, T5's ``position_bias``,
Gemma 2's ``softcap`` (a ``score_mod``) and the static cache's empty slots at
prefill. ``transformers`` and ``torch`` are imported when :func:`register` is
called, not with relattn.

Examples
--------
>>> import relattn.huggingface
>>> relattn.huggingface.NAME
'relattn'
"""

from __future__ import annotations

from typing import Any

from ..attention import scaled_dot_product_attention

__all__ = ["NAME", "attention_forward", "patch", "register"]

#: The ``attn_implementation`` name :func:`register` uses.
NAME = "relattn"


def attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    position_bias: Any = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """One attention layer of a ``transformers`` model, computed by relattn.

    Parameters
    ----------
    module : torch.nn.Module
        The calling attention layer (read for ``is_causal`` when the call does
        not say).
    query : torch.Tensor of shape (B, H, Lq, d)
        Queries, heads first (``transformers``' layout).
    key, value : torch.Tensor of shape (B, H_kv, Lk, d)
        Keys and values; ``H`` a multiple of ``H_kv`` (grouped-query heads
        are repeated).
    attention_mask : torch.Tensor or None
        Boolean (``True`` = may attend) or additive float mask broadcastable
        to ``(B, H, Lq, Lk)``, or ``None``.
    dropout : float, optional
        Must be 0: relattn has no attention dropout (evaluate, or set
        ``attention_dropout=0``).
    scaling : float, optional
        The score scale; ``None``: ``1/√d``.
    is_causal : bool, optional
        Causal attention when no mask is given (``None``: the module's
        ``is_causal``, default True), lower-right aligned as relattn's
        ``causal``; at a static cache's prefill, the empty slots after the
        prompt are dropped first, as ``transformers``' ``sdpa`` does.
    position_bias : torch.Tensor, optional
        T5's bias ``(B|1, H, Lq, Lk)``, added to the scores.
    softcap : float, optional
        Gemma 2's logit soft-capping, ``softcap · tanh(score / softcap)``.
    **kwargs
        Other keywords ``transformers`` passes (``sliding_window``, which
        its masks already carry); ignored.

    Returns
    -------
    tuple of (torch.Tensor of shape (B, Lq, H, d), None)
        The output in ``transformers``' layout, and no attention weights.

    Raises
    ------
    ValueError
        If ``dropout`` is not 0, or ``H`` is not a multiple of ``H_kv``.

    See Also
    --------
    register : Make ``attn_implementation="relattn"`` available.
    relattn.scaled_dot_product_attention : What each layer calls.

    Examples
    --------
    >>> import torch  # doctest: +SKIP
    >>> from relattn.huggingface import attention_forward
    >>> q = k = v = torch.ones(1, 2, 3, 4)  # doctest: +SKIP
    >>> out, weights = attention_forward(None, q, k, v, None, is_causal=True)  # doctest: +SKIP
    >>> tuple(out.shape), weights  # doctest: +SKIP
    ((1, 3, 2, 4), None)
    """
    import torch

    if dropout:
        raise ValueError(
            "dropout must be 0: relattn has no attention dropout (put the model in eval mode "
            f"or set attention_dropout=0), got {dropout}"
        )
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % kv_heads:
        raise ValueError(f"query heads must be a multiple of key heads, got {heads} and {kv_heads}")
    if heads != kv_heads:
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    q_len, kv_len = query.shape[2], key.shape[2]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    causal = bool(is_causal) and attention_mask is None and q_len > 1
    if causal and kv_len > q_len:
        # A static cache at prefill: the slots after the prompt are empty.
        key, value = key[:, :, :q_len], value[:, :, :q_len]
        if position_bias is not None:
            position_bias = position_bias[..., :q_len]
    mask = bias = None
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            mask = attention_mask
        else:
            bias = attention_mask.to(query.dtype)
    if position_bias is not None:
        position_bias = position_bias.to(query.dtype)
        bias = position_bias if bias is None else bias + position_bias
    score_mod = None
    if softcap is not None:

        def score_mod(score: Any, batch: Any, head: Any, q_pos: Any, kv_pos: Any) -> Any:
            return softcap * torch.tanh(score / softcap)

    out = scaled_dot_product_attention(
        query, key, value, mask=mask, bias=bias, causal=causal, scale=scaling,
        score_mod=score_mod,
    )  # fmt: skip
    return out.transpose(1, 2).contiguous(), None


def register(name: str = NAME) -> str:
    """Register :func:`attention_forward` with ``transformers`` as ``name``.

    Parameters
    ----------
    name : str, optional
        The ``attn_implementation`` to register (default ``"relattn"``).

    Returns
    -------
    str
        ``name``, to pass as ``attn_implementation=``.

    Raises
    ------
    ImportError
        If ``transformers`` (or ``torch``) is not installed.

    See Also
    --------
    attention_forward : The function registered.

    Examples
    --------
    >>> import relattn.huggingface
    >>> relattn.huggingface.register()  # doctest: +SKIP
    'relattn'
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


#: The modules of this package that patch models outside ``AttentionInterface``: each
#: defines ``PATCHES``, a dict from a ``transformers`` module class name (an attention
#: module's, or a model's where the attention modules lack its configuration) to a function
#: that replaces that module's attention computation in place, or returns False where the
#: module needs no patch.
_PATCH_MODULES = ("_alibi", "_deberta", "_sam")


def patch(model: Any) -> Any:
    """Compute with relattn the attention of models ``AttentionInterface`` does not reach.

    BLOOM, MPT, Falcon with ALiBi, DeBERTa-v2 (and v3) and SAM's image encoder
    compute their position terms inside their own attention modules, so
    ``attn_implementation="relattn"`` never reaches them. :func:`patch`
    replaces the ``forward`` of each such module of ``model`` (in place) with
    one that reads the module's own parameters and configuration and calls
    relattn: ALiBi as a per-distance ``relative_bias`` over positions as data
    (BLOOM: the count of real tokens before each token), DeBERTa's
    disentangled c2p/p2c terms over its log buckets, SAM's decomposed 2-D
    relative positions.

    Parameters
    ----------
    model : torch.nn.Module
        A ``transformers`` model holding at least one of those attention
        modules (the bare model or one with a head).

    Returns
    -------
    torch.nn.Module
        ``model`` itself, patched.

    Raises
    ------
    TypeError
        If ``model`` holds no attention module :func:`patch` knows; a model
        whose attention goes through ``AttentionInterface`` takes
        :func:`register` instead.
    ImportError
        If ``transformers`` (or ``torch``) is not installed.

    See Also
    --------
    register : Relattn as an ``attn_implementation`` (LLaMA, T5, Gemma …).

    Examples
    --------
    >>> import relattn.huggingface
    >>> relattn.huggingface.patch(object())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: model: expected a transformers model with BLOOM, MPT, ... got object
    """
    import importlib

    patches: dict[str, Any] = {}
    for name in _PATCH_MODULES:
        patches.update(importlib.import_module(f"{__name__}.{name}").PATCHES)
    modules = getattr(model, "modules", None)
    found = 0
    for module in modules() if callable(modules) else ():
        replace = patches.get(type(module).__name__)
        if replace is not None and replace(module) is not False:
            found += 1
    if not found:
        raise TypeError(
            "model: expected a transformers model with BLOOM, MPT, Falcon (ALiBi), DeBERTa-v2 "
            f"or SAM attention modules, got {type(model).__name__}"
        )
    return model
