"""One multi-head attention layer per position scheme, written once for every framework.

A layer is a :class:`LayerConfig` (the scheme and its sizes), the parameters
that config lists (:meth:`LayerConfig.parameters`: names, shapes, logical
sharding axes and the initialiser of the scheme's reference model) and one
forward, :func:`layer_attention`, written against the array API: it takes the
parameters as a mapping of arrays of any library and calls relattn's
functions. The framework modules (:mod:`relattn.nnx`, :mod:`relattn.equinox`,
:mod:`relattn.keras`) only create the parameters with their framework's
random numbers and variables and call :func:`layer_attention`; the math lives
here and in the functions it calls.

Schemes (``scheme=``) and their parameters besides the projections ``w_q``,
``w_k``, ``w_v`` ``(d_model, H·d_head)`` and ``w_o`` ``(H·d_head, d_model)``
(and their biases ``b_*`` where the reference model has them):

- ``transformer_xl`` (Dai et al. 2019): ``w_r`` (projects the sinusoid),
  ``content_bias`` u and ``position_bias`` v ``(H, d_head)``; normal, σ = 0.02.
- ``t5`` (Raffel et al. 2020): ``relative_attention_bias`` ``(num_buckets, H)``;
  the σ of Hugging Face's T5.
- ``alibi`` (Press et al. 2022): none (slopes ``2^(-8h/H)``); BLOOM's σ = 0.02.
- ``rope`` (Su et al. 2021): none (frequencies from ``rope_base`` and
  ``rope_scaling``); LLaMA's σ = 0.02.
- ``deberta`` (He et al. 2021): ``rel_embeddings`` ``(2k, d_model)``, projected by
  ``w_k`` and ``w_q`` (``share_att_key``); σ = 0.02.
- ``shaw`` (Shaw et al. 2018): ``key_embeddings`` and ``value_embeddings``
  ``(2K+1, d_head)``; Glorot uniform (tensor2tensor's default).
- ``swin`` (Liu et al. 2021): ``relative_position_bias_table``
  ``((2h-1)(2w-1), H)``; truncated normal, σ = 0.02.
- ``decomposed`` (Li et al. 2022, SAM): ``rel_pos_h`` ``(2h-1, d_head)`` and
  ``rel_pos_w`` ``(2w-1, d_head)``; zeros.

Examples
--------
>>> import numpy as np
>>> from relattn.layers import LayerConfig, init_parameters, layer_attention
>>> config = LayerConfig(d_model=8, num_heads=2, scheme="t5", causal=True)
>>> params = init_parameters(config, np.random.default_rng(0))
>>> layer_attention(config, params, np.ones((1, 5, 8))).shape
(1, 5, 8)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import array_api_compat

from ._namespace import device_of
from ._typing import Array
from .attention import relative_attention, scaled_dot_product_attention
from .biases import alibi_slopes, log_bucket_position, relative_position_bucket
from .decomposed import decomposed_relative_attention
from .disentangled import disentangled_attention
from .encodings import sinusoidal_position_encoding
from .grid import grid_relative_bias
from .heads import merge_heads, split_heads
from .memory import update_memory
from .positions import relative_distances
from .rope_scaling import rope_frequencies
from .rotary import rotary_position_embedding
from .shaw import shaw_attention

__all__ = [
    "SCHEMES",
    "LayerConfig",
    "Parameter",
    "init_parameters",
    "layer_attention",
    "layer_memory",
]

#: The position schemes a layer can take, in the order of the table above.
SCHEMES = ("transformer_xl", "t5", "alibi", "rope", "deberta", "shaw", "swin", "decomposed")
_GRID_SCHEMES = ("swin", "decomposed")
#: Schemes whose projections carry biases in their reference models (BLOOM, DeBERTa,
#: Swin's and SAM's qkv).
_BIASED = ("alibi", "deberta", "swin", "decomposed")
_INITS = ("normal", "truncated_normal", "zeros", "glorot_uniform")


@dataclass(frozen=True)
class Parameter:
    """One parameter of a layer: its name, shape, sharding axes and initialiser.

    Parameters
    ----------
    name : str
        The reference model's name where it has one (``content_bias`` is
        Transformer-XL's ``r_w_bias`` u, ``relative_attention_bias`` T5's).
    shape : tuple of int
        The parameter's shape.
    axes : tuple of str or None
        One logical axis name per dimension, for sharding annotations:
        ``"embed"`` (``d_model``), ``"heads"`` (``H`` or ``H·d_head``),
        ``"head_dim"``, ``None`` (a table's positions: replicated).
    init : {"normal", "truncated_normal", "zeros", "glorot_uniform"}
        ``"normal"``: ``N(0, std²)``; ``"truncated_normal"``: the same cut at
        ``±2 std``; ``"glorot_uniform"``: ``U(±√(6 / (fan_in + fan_out)))``
        with the first and last dimension as fans (TensorFlow's default,
        tensor2tensor's tables).
    std : float, optional
        The standard deviation of the normal initialisers.

    See Also
    --------
    LayerConfig.parameters : A layer's parameters.

    Examples
    --------
    >>> from relattn.layers import LayerConfig
    >>> u = LayerConfig(16, 2, "transformer_xl").parameters()[-2]
    >>> u.name, u.shape, u.axes, u.init, u.std
    ('content_bias', (2, 8), ('heads', 'head_dim'), 'normal', 0.02)
    """

    name: str
    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    init: str
    std: float = 0.0

    def sample(self, rng: Any, dtype: Any = "float64") -> Any:
        """A NumPy array drawn from this initialiser with ``numpy.random.Generator`` ``rng``.

        Parameters
        ----------
        rng : numpy.random.Generator
            The random numbers.
        dtype : str or numpy dtype, optional
            The array's dtype.

        Returns
        -------
        numpy.ndarray of shape ``self.shape``
            The initial value.

        Examples
        --------
        >>> import numpy as np
        >>> from relattn.layers import Parameter
        >>> table = Parameter("table", (7, 4), (None, "head_dim"), "glorot_uniform")
        >>> bool(np.abs(table.sample(np.random.default_rng(0))).max() <= (6 / 11) ** 0.5)
        True
        """
        import numpy as np

        if self.init == "zeros":
            value = np.zeros(self.shape)
        elif self.init == "normal":
            value = rng.normal(scale=self.std, size=self.shape)
        elif self.init == "truncated_normal":
            value = self.std * rng.standard_normal(self.shape)
            # Redraw the tails rather than pile them on the edges.
            tails = np.abs(value) > 2 * self.std
            while tails.any():
                value[tails] = self.std * rng.standard_normal(int(tails.sum()))
                tails = np.abs(value) > 2 * self.std
        else:
            bound = math.sqrt(6.0 / (self.shape[0] + self.shape[-1]))
            value = rng.uniform(-bound, bound, size=self.shape)
        return value.astype(dtype)


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {value}")


@dataclass(frozen=True)
class LayerConfig:
    """The sizes and position scheme of one multi-head attention layer.

    Parameters
    ----------
    d_model : int
        The width of the layer's input and output.
    num_heads : int
        ``H``, the number of heads.
    scheme : str, optional
        One of :data:`SCHEMES` (default ``"rope"``).
    head_dim : int, optional
        ``d_head``; default ``d_model // num_heads`` (which must then divide).
    causal : bool, optional
        A decoder: every query sees keys at or before its position only, and
        the position tables take the causal layout (``δ <= 0``).
    use_bias : bool, optional
        Biases on the four projections; default: as the scheme's reference
        model (``alibi``, ``deberta``, ``swin``, ``decomposed``).
    scale : float, optional
        The score scale; default the scheme's (``1/√d_head``; T5: 1;
        DeBERTa: ``1/√(3·d_head)``).
    num_buckets, max_distance : int, optional
        ``t5``: the buckets of :func:`relattn.relative_position_bucket`
        (32, 128).
    max_relative_position : int, optional
        ``shaw``: the clipping distance ``K`` (16).
    position_buckets, max_relative_positions : int, optional
        ``deberta``: the log buckets ``k`` of
        :func:`relattn.log_bucket_position` and the largest distance (256,
        512, DeBERTa-v3's); ``position_buckets=0``: no buckets, distances
        clipped at ``max_relative_positions``.
    rope_base : float, optional
        ``rope``: ``θ`` (10000).
    rotary_dim : int, optional
        ``rope``: the number of rotated features per head (default
        ``d_head``).
    rope_scaling : mapping, optional
        ``rope``: keywords of :func:`relattn.rope_frequencies` (``scaling``,
        ``factor``, ``original_max_position`` …), e.g. ``{"scaling":
        "llama3", "factor": 8.0, ...}``. ``"dynamic"`` and ``"longrope"``
        take the number of keys (cache, memory and ``x``) as the sequence
        length, not the largest position of ``positions=``. Kept as a
        sorted tuple of ``(keyword, value)`` pairs (the config is hashable:
        a static argument of ``jit``), which ``LayerConfig`` also takes;
        :attr:`rope_keywords` gives the mapping.
    grid : (int, int), optional
        ``swin``, ``decomposed``: the window (or image) in patches; the
        sequence is its ``h·w`` patches, row-major.
    memory_length : int, optional
        ``transformer_xl``: the positions :func:`layer_memory` keeps (0).
    block_size : int or (int, int), optional
        Passed to relattn's functions (blockwise attention); default: the
        plan chooses.
    initializer_range : float, optional
        ``σ`` of the normal initialisers of the schemes that have one (0.02).

    Raises
    ------
    ValueError
        If ``scheme`` is unknown, a size is below its minimum, ``d_model``
        is not divisible by ``num_heads`` without ``head_dim``, or a grid
        scheme has no ``grid``.
    TypeError
        If a size is not an int.

    See Also
    --------
    layer_attention : The forward of the layer.
    init_parameters : Its parameters as NumPy arrays.

    Examples
    --------
    >>> from relattn.layers import LayerConfig
    >>> config = LayerConfig(d_model=64, num_heads=4, scheme="t5", causal=True)
    >>> config.dim, config.biased
    (16, False)
    >>> [p.name for p in config.parameters()][-1]
    'relative_attention_bias'
    """

    d_model: int
    num_heads: int
    scheme: str = "rope"
    head_dim: int | None = None
    causal: bool = False
    use_bias: bool | None = None
    scale: float | None = None
    num_buckets: int = 32
    max_distance: int = 128
    max_relative_position: int = 16
    position_buckets: int = 256
    max_relative_positions: int = 512
    rope_base: float = 10000.0
    rotary_dim: int | None = None
    rope_scaling: Any = None
    grid: tuple[int, int] | None = None
    memory_length: int = 0
    block_size: Any = None
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme: expected one of {SCHEMES}, got {self.scheme!r}")
        _check_int("d_model", self.d_model, 1)
        _check_int("num_heads", self.num_heads, 1)
        if self.head_dim is None:
            if self.d_model % self.num_heads:
                raise ValueError(
                    f"d_model: expected a multiple of num_heads = {self.num_heads} (or pass "
                    f"head_dim), got {self.d_model}"
                )
        else:
            _check_int("head_dim", self.head_dim, 1)
        if not isinstance(self.causal, bool):
            raise TypeError(f"causal: expected a bool, got {type(self.causal).__name__}")
        for name, low in (
            ("num_buckets", 2), ("max_distance", 1), ("max_relative_position", 1),
            ("position_buckets", 0), ("max_relative_positions", 1), ("memory_length", 0),
        ):  # fmt: skip
            _check_int(name, getattr(self, name), low)
        if self.scheme == "t5":
            # relative_position_bucket: exact buckets are half of one direction's.
            exact = (self.num_buckets // 2 if not self.causal else self.num_buckets) // 2
            if exact and self.max_distance <= exact:
                raise ValueError(
                    f"max_distance: expected > {exact}, the distances with a bucket of their "
                    f"own ({self.num_buckets} buckets, causal={self.causal}), "
                    f"got {self.max_distance}"
                )
        if self.scheme == "deberta" and self.position_buckets:
            if self.position_buckets < 2:
                raise ValueError(
                    f"position_buckets: expected 0 (no buckets) or >= 2, "
                    f"got {self.position_buckets}"
                )
            if self.max_relative_positions <= self.position_buckets // 2 + 1:
                raise ValueError(
                    "max_relative_positions: expected > position_buckets // 2 + 1 = "
                    f"{self.position_buckets // 2 + 1}, got {self.max_relative_positions}"
                )
        if self.scheme in _GRID_SCHEMES:
            grid = self.grid
            if not (isinstance(grid, tuple | list) and len(grid) == 2):
                raise ValueError(
                    f"grid: expected (height, width) for scheme {self.scheme!r}, got {grid!r}"
                )
            for n in grid:
                _check_int("grid", n, 1)
            object.__setattr__(self, "grid", tuple(grid))
        if self.rope_scaling is not None:
            scaling = self.rope_scaling
            if isinstance(scaling, tuple):  # the pairs a config keeps (dataclasses.replace)
                try:
                    scaling = dict(scaling)
                except (TypeError, ValueError):
                    scaling = None
            if not isinstance(scaling, Mapping):
                raise TypeError(
                    "rope_scaling: expected a mapping of rope_frequencies keywords, got "
                    f"{type(self.rope_scaling).__name__}"
                )
            items = tuple(
                (k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(scaling.items())
            )
            object.__setattr__(self, "rope_scaling", items or None)
        if isinstance(self.block_size, list):  # hashable, as the rest
            object.__setattr__(self, "block_size", tuple(self.block_size))
        if self.scheme == "rope" and self.rotary_dim is not None:
            _check_int("rotary_dim", self.rotary_dim, 0)
            if self.rotary_dim > self.dim or self.rotary_dim % 2:
                raise ValueError(
                    f"rotary_dim: expected an even int <= head_dim = {self.dim}, "
                    f"got {self.rotary_dim}"
                )

    @property
    def dim(self) -> int:
        """``d_head``, the width of one head.

        Examples
        --------
        >>> from relattn.layers import LayerConfig
        >>> LayerConfig(16, 2).dim, LayerConfig(16, 2, head_dim=4).dim
        (8, 4)
        """
        return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

    @property
    def biased(self) -> bool:
        """Whether the projections carry biases.

        Examples
        --------
        >>> from relattn.layers import LayerConfig
        >>> LayerConfig(16, 2, "alibi").biased, LayerConfig(16, 2, "rope").biased
        (True, False)
        """
        return self.scheme in _BIASED if self.use_bias is None else bool(self.use_bias)

    @property
    def rope_keywords(self) -> dict[str, Any]:
        """The ``rope_scaling`` keywords, as given."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.rope_scaling or ()}

    def parameters(self) -> tuple[Parameter, ...]:
        """Every parameter of the layer, with the reference model's initialiser.

        Returns
        -------
        tuple of Parameter
            The projections (``w_q``, ``w_k``, ``w_v``, ``w_o`` and, where
            :attr:`biased`, ``b_q`` … ``b_o``), then the scheme's own.

        Examples
        --------
        >>> from relattn.layers import LayerConfig
        >>> [p.name for p in LayerConfig(16, 2, "shaw").parameters()]
        ['w_q', 'w_k', 'w_v', 'w_o', 'key_embeddings', 'value_embeddings']
        """
        d, h, dh = self.d_model, self.num_heads, self.dim
        std = self.initializer_range
        stds = {"w_q": std, "w_k": std, "w_v": std, "w_o": std}
        if self.scheme == "t5":  # HF T5's _init_weights with factor 1
            stds = {
                "w_q": (d * dh) ** -0.5,
                "w_k": d**-0.5,
                "w_v": d**-0.5,
                "w_o": (h * dh) ** -0.5,
            }
        params = [
            Parameter(name, (d, h * dh), ("embed", "heads"), "normal", stds[name])
            for name in ("w_q", "w_k", "w_v")
        ]
        params.append(Parameter("w_o", (h * dh, d), ("heads", "embed"), "normal", stds["w_o"]))
        if self.biased:
            params += [Parameter(f"b_{n}", (h * dh,), ("heads",), "zeros") for n in "qkv"]
            params.append(Parameter("b_o", (d,), ("embed",), "zeros"))
        if self.scheme == "transformer_xl":
            params += [
                Parameter("w_r", (d, h * dh), ("embed", "heads"), "normal", std),
                Parameter("content_bias", (h, dh), ("heads", "head_dim"), "normal", std),
                Parameter("position_bias", (h, dh), ("heads", "head_dim"), "normal", std),
            ]
        elif self.scheme == "t5":
            params.append(
                Parameter("relative_attention_bias", (self.num_buckets, h), (None, "heads"),
                          "normal", d**-0.5)
            )  # fmt: skip
        elif self.scheme == "deberta":
            rows = 2 * (self.position_buckets or self.max_relative_positions)
            params.append(Parameter("rel_embeddings", (rows, d), (None, "embed"), "normal", std))
        elif self.scheme == "shaw":
            rows = 2 * self.max_relative_position + 1
            params += [
                Parameter(name, (rows, dh), (None, "head_dim"), "glorot_uniform")
                for name in ("key_embeddings", "value_embeddings")
            ]
        elif self.scheme == "swin":
            gh, gw = self.grid  # type: ignore[misc]
            params.append(
                Parameter("relative_position_bias_table", ((2 * gh - 1) * (2 * gw - 1), h),
                          (None, "heads"), "truncated_normal", std)
            )  # fmt: skip
        elif self.scheme == "decomposed":
            gh, gw = self.grid  # type: ignore[misc]
            params += [
                Parameter("rel_pos_h", (2 * gh - 1, dh), (None, "head_dim"), "zeros"),
                Parameter("rel_pos_w", (2 * gw - 1, dh), (None, "head_dim"), "zeros"),
            ]
        return tuple(params)


def init_parameters(config: LayerConfig, rng: Any, dtype: Any = "float64") -> dict[str, Any]:
    """NumPy parameters of a layer, each drawn from its reference initialiser.

    Parameters
    ----------
    config : LayerConfig
        The layer.
    rng : numpy.random.Generator
        The random numbers.
    dtype : str or numpy dtype, optional
        The arrays' dtype (float64).

    Returns
    -------
    dict of str to numpy.ndarray
        One array per :meth:`LayerConfig.parameters` entry.

    See Also
    --------
    layer_attention : The forward that takes them.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn.layers import LayerConfig, init_parameters
    >>> sorted(init_parameters(LayerConfig(8, 2, "alibi"), np.random.default_rng(0)))
    ['b_k', 'b_o', 'b_q', 'b_v', 'w_k', 'w_o', 'w_q', 'w_v']
    """
    return {p.name: p.sample(rng, dtype) for p in config.parameters()}


def _project(x: Array, params: Mapping[str, Array], name: str, biased: bool) -> Array:
    y = x @ params[f"w_{name}"]
    return y + params[f"b_{name}"] if biased else y


def layer_attention(
    config: LayerConfig,
    params: Mapping[str, Array],
    x: Array,
    *,
    memory: Array = None,
    cache: tuple[Array, Array] | None = None,
    return_cache: bool = False,
    mask: Array = None,
    bias: Array = None,
    positions: Any = None,
    segment_ids: Any = None,
    score_mod: Any = None,
    mask_mod: Any = None,
) -> Any:
    """Multi-head self-attention of ``x`` with the position scheme of ``config``.

    Parameters
    ----------
    config : LayerConfig
        The layer's scheme and sizes.
    params : mapping of str to array
        One array per :meth:`LayerConfig.parameters` entry, of the library of
        ``x`` (gradients reach them through it).
    x : array of shape (B, L, d_model), real floating
        The layer's input (any leading dimensions).
    memory : array of shape (B, M, d_model), optional
        Transformer-XL's segment memory: earlier hidden states the keys and
        values also see (the first ``M`` keys), from :func:`layer_memory`.
        Not with ``swin`` and ``decomposed``.
    cache : (array, array) of shape (B, H, M, d_head), optional
        A decoder's key–value cache: the projected (for ``rope``, rotated)
        keys and values of the ``M`` earlier tokens.
    return_cache : bool, optional
        Return ``(out, (k, v))``, the cache extended by this call's keys and
        values (``M + L`` positions).
    mask : array, bool, optional
        ``True`` = may attend, broadcastable to ``(B, H, L, M + L)``.
    bias : array, real floating, optional
        Added to the scaled scores, broadcastable to ``(B, H, L, M + L)``.
    positions : array of shape (..., L) or a pair, integer dtype, optional
        Positions as data, as in :func:`relattn.scaled_dot_product_attention`:
        one array for the queries (keys at the same, without memory or
        cache), or ``(query_positions, key_positions)``. ``rope`` rotates
        queries and keys by them. Default: the earlier tokens at ``0 … M-1``,
        then ``x``.
    segment_ids, score_mod, mask_mod : optional
        As in :func:`relattn.scaled_dot_product_attention`.

    Returns
    -------
    array of shape (B, L, d_model), or (array, (array, array)) with ``return_cache``
        The attended values projected by ``w_o``, dtype of the inputs.

    Raises
    ------
    ValueError
        If a parameter is missing, ``x``'s last dimension is not ``d_model``,
        a grid scheme gets ``L != h·w``, or ``memory``, ``cache``, ``mask``,
        ``positions`` … reach a scheme that cannot take them.
    TypeError
        From relattn's functions, for arrays of the wrong dtype or library.

    See Also
    --------
    LayerConfig : The schemes.
    relattn.relative_attention : Called by ``transformer_xl``.
    relattn.scaled_dot_product_attention : Called by ``t5``, ``alibi``, ``rope``, ``swin``.
    relattn.disentangled_attention : Called by ``deberta``.
    relattn.shaw_attention : Called by ``shaw``.
    relattn.decomposed_relative_attention : Called by ``decomposed``.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn.layers import LayerConfig, init_parameters, layer_attention
    >>> config = LayerConfig(d_model=8, num_heads=2, scheme="rope", causal=True)
    >>> params = init_parameters(config, np.random.default_rng(0))
    >>> out, cache = layer_attention(config, params, np.ones((1, 3, 8)), return_cache=True)
    >>> step = layer_attention(config, params, np.ones((1, 1, 8)), cache=cache)
    >>> bool(np.allclose(step, layer_attention(config, params, np.ones((1, 4, 8)))[:, 3:]))
    True
    """
    missing = [p.name for p in config.parameters() if p.name not in params]
    if missing:
        raise ValueError(f"params: missing {missing} for scheme {config.scheme!r}")
    if x.ndim < 2 or x.shape[-1] != config.d_model:
        raise ValueError(
            f"x: expected shape (..., L, d_model = {config.d_model}), got {tuple(x.shape)}"
        )
    scheme, heads, causal = config.scheme, config.num_heads, config.causal
    xp = array_api_compat.array_namespace(x, *params.values())
    if scheme in _GRID_SCHEMES:
        for name, value in (("memory", memory), ("cache", cache), ("positions", positions),
                            ("segment_ids", segment_ids)):  # fmt: skip
            if value is not None:
                raise ValueError(f"{name}: scheme {scheme!r} attends within one grid; got one")
    context = x if memory is None else xp.concat((memory, x), axis=-2)
    biased = config.biased
    q = split_heads(_project(x, params, "q", biased), heads)
    k = split_heads(_project(context, params, "k", biased), heads)
    v = split_heads(_project(context, params, "v", biased), heads)
    cached = 0 if cache is None else int(cache[0].shape[-2])
    device = device_of(x)
    if scheme == "rope":
        # Queries and this call's keys: the given positions, or after the earlier tokens
        # (the cache's, then the memory's).
        earlier = cached + context.shape[-2] - x.shape[-2]
        if isinstance(positions, tuple | list):
            q_pos, k_pos = positions[0], positions[1][..., cached:]
        else:
            q_pos = positions
            if positions is None:
                q_pos = xp.arange(earlier, earlier + x.shape[-2], device=device)
            k_pos = positions
            if positions is None or memory is not None:
                k_pos = xp.arange(cached, cached + context.shape[-2], device=device)
        rotary_dim = config.dim if config.rotary_dim is None else config.rotary_dim
        keywords = config.rope_keywords
        if keywords.get("scaling") in ("dynamic", "longrope"):
            keywords.setdefault("sequence_length", cached + context.shape[-2])
        frequencies, factor = rope_frequencies(
            rotary_dim, base=config.rope_base, **keywords, xp=xp, dtype=q.dtype, device=device
        )
        q, k = (
            rotary_position_embedding(
                t, p, layout="concatenated", rotary_dim=rotary_dim, frequencies=frequencies
            )
            for t, p in ((q, q_pos), (k, k_pos))
        )
        if factor != 1.0:
            # YaRN's and LongRoPE's attention factor scales cos and sin: the rotated
            # features of queries and keys, not those that pass unrotated.
            q, k = (
                xp.concat((t[..., :rotary_dim] * factor, t[..., rotary_dim:]), axis=-1)
                for t in (q, k)
            )
    if cache is not None:
        k = xp.concat((cache[0], k), axis=-2)
        v = xp.concat((cache[1], v), axis=-2)
    lq, lk = x.shape[-2], k.shape[-2]
    common = dict(
        mask=mask, bias=bias, causal=causal, scale=config.scale, block_size=config.block_size,
        positions=positions, segment_ids=segment_ids, score_mod=score_mod, mask_mod=mask_mod,
    )  # fmt: skip
    if scheme in ("t5", "alibi", "transformer_xl"):
        delta = relative_distances(lq, lk, causal=causal, xp=xp, device=device)
    if scheme == "transformer_xl":
        # Transformer-XL's r_{i-j}: the sinusoid of i - j = -δ, projected by W_{k,R}.
        sinusoid = sinusoidal_position_encoding(
            -delta, config.d_model, layout="concatenated", dtype=x.dtype, device=device, xp=xp
        )
        out = relative_attention(
            q, k, v, split_heads(sinusoid @ params["w_r"], heads),
            content_bias=params["content_bias"][:, None, :],
            position_bias=params["position_bias"][:, None, :], **common,
        )  # fmt: skip
    elif scheme == "t5":
        buckets = relative_position_bucket(
            delta, num_buckets=config.num_buckets, max_distance=config.max_distance,
            bidirectional=not causal,
        )  # fmt: skip
        table = params["relative_attention_bias"]
        relative_bias = xp.permute_dims(xp.take(table, buckets, axis=0), (1, 0))  # (H, W)
        common["scale"] = 1.0 if config.scale is None else config.scale
        out = scaled_dot_product_attention(q, k, v, relative_bias=relative_bias, **common)
    elif scheme == "alibi":
        slopes = alibi_slopes(heads, dtype=x.dtype, device=device, xp=xp)
        distance = xp.astype(-xp.abs(delta), x.dtype)
        out = scaled_dot_product_attention(
            q, k, v, relative_bias=slopes[:, None] * distance, **common
        )
    elif scheme == "rope":
        out = scaled_dot_product_attention(q, k, v, **common)
    elif scheme == "deberta":
        out = _deberta(xp, config, params, q, k, v, lq, lk, common, device)
    elif scheme == "shaw":
        out = shaw_attention(q, k, v, params["key_embeddings"], params["value_embeddings"],
                             **common)  # fmt: skip
    elif scheme == "swin":
        gh, gw = config.grid  # type: ignore[misc]
        _check_grid(lq, gh, gw)
        table = xp.permute_dims(params["relative_position_bias_table"], (1, 0))
        grid_bias = grid_relative_bias(table, gh, gw)
        common["bias"] = grid_bias if bias is None else grid_bias + bias
        out = scaled_dot_product_attention(q, k, v, **common)
    else:
        gh, gw = config.grid  # type: ignore[misc]
        _check_grid(lq, gh, gw)
        for name in ("mask", "bias", "score_mod", "mask_mod"):
            if common[name] is not None:
                raise ValueError(f"{name}: scheme 'decomposed' takes none (SAM has no mask)")
        if causal:
            raise ValueError("causal: scheme 'decomposed' attends over a whole grid")
        out = decomposed_relative_attention(
            q, k, v, params["rel_pos_h"], params["rel_pos_w"], query_grid=(gh, gw),
            scale=config.scale, block_size=config.block_size,
        )  # fmt: skip
    result = _project(merge_heads(out), params, "o", biased)
    return (result, (k, v)) if return_cache else result


def _check_grid(length: int, height: int, width: int) -> None:
    if length != height * width:
        raise ValueError(
            f"x: expected L = h·w = {height * width} tokens of the grid {(height, width)}, "
            f"got L = {length}"
        )


def _deberta(
    xp: Any,
    config: LayerConfig,
    params: Mapping[str, Array],
    q: Array,
    k: Array,
    v: Array,
    lq: int,
    lk: int,
    common: dict[str, Any],
    device: Any,
) -> Array:
    """DeBERTa's c2p and p2c terms: the shared table projected by ``w_k`` and ``w_q``."""
    buckets = config.position_buckets
    span = buckets or config.max_relative_positions
    # DeBERTa indexes its table by k + bucket(i - j) = k - bucket(δ): the buckets are odd.
    delta = relative_distances(lq, lk, causal=config.causal, xp=xp, device=device)
    if buckets:
        delta = log_bucket_position(
            delta, bucket_size=buckets, max_position=config.max_relative_positions
        )
    index = xp.clip(span - delta, 0, 2 * span - 1)
    rows = params["rel_embeddings"]
    key_table = xp.take(_project(rows, params, "k", config.biased), index, axis=0)
    query_table = xp.take(_project(rows, params, "q", config.biased), index, axis=0)
    heads = config.num_heads
    return disentangled_attention(
        q, k, v, split_heads(key_table, heads), split_heads(query_table, heads), **common
    )


def layer_memory(config: LayerConfig, memory: Array, x: Array) -> Array:
    """Transformer-XL's next segment memory of a layer: the last ``memory_length`` inputs.

    Parameters
    ----------
    config : LayerConfig
        The layer (its ``memory_length``).
    memory : array of shape (B, M, d_model) or None
        The memory the layer saw (``None`` for the first segment).
    x : array of shape (B, L, d_model)
        The layer's input of this segment.

    Returns
    -------
    array of shape (B, min(memory_length, M + L), d_model)
        Cut from autograd (:func:`relattn.update_memory`).

    See Also
    --------
    relattn.update_memory : The function called.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn.layers import LayerConfig, layer_memory
    >>> config = LayerConfig(8, 2, "transformer_xl", causal=True, memory_length=4)
    >>> layer_memory(config, None, np.ones((1, 3, 8))).shape
    (1, 3, 8)
    """
    return update_memory(memory, x, config.memory_length)
