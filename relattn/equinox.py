"""The attention layer of relattn as an Equinox module: :class:`RelativeAttention`.

One multi-head self-attention layer per position scheme of
:mod:`relattn.layers` (Transformer-XL, T5, ALiBi, RoPE, DeBERTa, Shaw, Swin,
SAM's decomposed tables), as an :class:`equinox.Module`: its parameters are
JAX arrays in the dict field ``params`` (one per
:meth:`relattn.layers.LayerConfig.parameters` entry, under the same name,
drawn from ``jax.random`` with the scheme's reference initialiser), its
:class:`~relattn.layers.LayerConfig` the static field ``config``, and its call
is :func:`relattn.layers.layer_attention`. It is a pytree like any Equinox
module: :func:`equinox.filter_jit`, :func:`equinox.filter_grad`, optax (through
``equinox.filter(layer, equinox.is_array)``), :func:`equinox.tree_serialise_leaves`
and :func:`equinox.filter_shard` take it as it is. :func:`partition_specs` and
:func:`named_shardings` lay its parameters out on a device mesh by their
logical axes.

This module imports Equinox and JAX; ``import relattn`` does not import it.

Examples
--------
>>> import jax, jax.numpy as jnp
>>> from relattn.equinox import RelativeAttention
>>> layer = RelativeAttention(16, 2, "t5", causal=True, key=jax.random.key(0))
>>> sorted(layer.params)
['relative_attention_bias', 'w_k', 'w_o', 'w_q', 'w_v']
>>> layer(jnp.ones((3, 5, 16), dtype=jnp.float32)).shape
(3, 5, 16)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from .backends._jax import random_parameter
from .layers import LayerConfig, layer_attention, layer_memory

__all__ = ["RelativeAttention", "named_shardings", "partition_specs"]


class RelativeAttention(eqx.Module):
    """Multi-head self-attention with relative positions, as an Equinox module.

    Parameters
    ----------
    d_model : int
        The width of the input and output.
    num_heads : int
        ``H``, the number of heads.
    scheme : str, optional
        One of :data:`relattn.layers.SCHEMES`: ``"transformer_xl"``,
        ``"t5"``, ``"alibi"``, ``"rope"`` (default), ``"deberta"``,
        ``"shaw"``, ``"swin"``, ``"decomposed"``.
    head_dim, causal, use_bias, scale, num_buckets, max_distance, \
max_relative_position, position_buckets, max_relative_positions, rope_base, \
rotary_dim, rope_scaling, grid, memory_length, block_size, initializer_range : optional
        The keywords of :class:`relattn.layers.LayerConfig` (see there).
    param_dtype : dtype, optional
        The parameters' floating dtype (float32).
    key : jax.Array
        A JAX PRNG key (keyword only, required): one subkey per parameter.

    Attributes
    ----------
    config : relattn.layers.LayerConfig
        The scheme and sizes; a static field (part of the pytree's structure,
        not a leaf).
    params : dict of str to jax.Array
        One array per ``config.parameters()`` entry, under its name
        (``w_q``, ``w_k``, ``w_v``, ``w_o``, the biases ``b_*`` where the
        scheme has them, then the scheme's own, e.g. T5's
        ``relative_attention_bias``).

    Raises
    ------
    ValueError
        From :class:`~relattn.layers.LayerConfig`: an unknown ``scheme``, a
        size below its minimum, ``d_model`` not divisible by ``num_heads``, a
        grid scheme without ``grid``.
    TypeError
        If ``key`` is missing or not a PRNG key, ``param_dtype`` is not a
        floating dtype, or a size is not an int.

    See Also
    --------
    relattn.layers.layer_attention : The forward it calls.
    partition_specs : Its parameters' ``PartitionSpec`` on a mesh.

    Examples
    --------
    >>> import jax, jax.numpy as jnp
    >>> import equinox as eqx
    >>> from relattn.equinox import RelativeAttention
    >>> layer = RelativeAttention(16, 2, "rope", causal=True, key=jax.random.key(0))
    >>> x = jax.random.normal(jax.random.key(1), (2, 6, 16), dtype=jnp.float32)
    >>> out = eqx.filter_jit(lambda m, x: m(x))(layer, x)
    >>> out.shape, out.dtype
    ((2, 6, 16), dtype('float32'))
    >>> grads = eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2))(layer)
    >>> grads.params["w_q"].shape
    (16, 16)

    A decoder's key–value cache: the prompt, then one token at a time.

    >>> y, cache = layer(x[:, :5], return_cache=True)
    >>> step = layer(x[:, 5:], cache=cache)
    >>> bool(jnp.allclose(step, layer(x)[:, 5:], atol=1e-6))
    True
    """

    config: LayerConfig = eqx.field(static=True)
    params: dict[str, jax.Array]

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        scheme: str = "rope",
        *,
        head_dim: int | None = None,
        causal: bool = False,
        use_bias: bool | None = None,
        scale: float | None = None,
        num_buckets: int = 32,
        max_distance: int = 128,
        max_relative_position: int = 16,
        position_buckets: int = 256,
        max_relative_positions: int = 512,
        rope_base: float = 10000.0,
        rotary_dim: int | None = None,
        rope_scaling: Mapping[str, Any] | None = None,
        grid: tuple[int, int] | None = None,
        memory_length: int = 0,
        block_size: Any = None,
        initializer_range: float = 0.02,
        param_dtype: Any = jnp.float32,
        key: jax.Array | None = None,
    ) -> None:
        config = LayerConfig(
            d_model, num_heads, scheme, head_dim=head_dim, causal=causal, use_bias=use_bias,
            scale=scale, num_buckets=num_buckets, max_distance=max_distance,
            max_relative_position=max_relative_position, position_buckets=position_buckets,
            max_relative_positions=max_relative_positions, rope_base=rope_base,
            rotary_dim=rotary_dim, rope_scaling=rope_scaling, grid=grid,
            memory_length=memory_length, block_size=block_size,
            initializer_range=initializer_range,
        )  # fmt: skip
        if key is None:
            raise TypeError("key: expected a JAX PRNG key (jax.random.key(seed)), got None")
        if not isinstance(key, jax.Array):
            raise TypeError(f"key: expected a JAX PRNG key, got {type(key).__name__}")
        try:
            dtype = jnp.dtype(param_dtype)
        except TypeError:
            dtype = None
        if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(f"param_dtype: expected a floating dtype, got {param_dtype!r}")
        parameters = config.parameters()
        keys = jax.random.split(key, len(parameters))
        self.config = config
        self.params = {
            p.name: random_parameter(p.init, p.std, p.shape, k, dtype)
            for p, k in zip(parameters, keys, strict=True)
        }

    def __call__(
        self,
        x: jax.Array,
        *,
        memory: jax.Array | None = None,
        cache: tuple[jax.Array, jax.Array] | None = None,
        return_cache: bool = False,
        mask: jax.Array | None = None,
        bias: jax.Array | None = None,
        positions: Any = None,
        segment_ids: Any = None,
        score_mod: Any = None,
        mask_mod: Any = None,
    ) -> Any:
        """Self-attention of ``x``: :func:`relattn.layers.layer_attention` with ``params``.

        Parameters
        ----------
        x : jax.Array of shape (B, L, d_model)
            The input (any leading dimensions).
        memory : jax.Array of shape (B, M, d_model), optional
            Transformer-XL's memory, from :meth:`next_memory`.
        cache : (jax.Array, jax.Array) of shape (B, H, M, d_head), optional
            A decoder's key–value cache, from an earlier call with
            ``return_cache=True``.
        return_cache : bool, optional
            Return ``(out, (k, v))``, the cache extended by this call.
        mask, bias, positions, segment_ids, score_mod, mask_mod : optional
            As in :func:`relattn.layers.layer_attention`.

        Returns
        -------
        jax.Array of shape (B, L, d_model), or (jax.Array, (jax.Array, jax.Array))
            The output (and the cache with ``return_cache``).

        Raises
        ------
        ValueError
            If ``x``'s last dimension is not ``d_model``, a grid scheme gets
            ``L != h·w``, or an argument reaches a scheme that cannot take it.

        Examples
        --------
        >>> import jax, jax.numpy as jnp
        >>> from relattn.equinox import RelativeAttention
        >>> layer = RelativeAttention(16, 2, "alibi", causal=True, key=jax.random.key(0))
        >>> x = jnp.ones((1, 4, 16), dtype=jnp.float32)
        >>> padding = jnp.asarray([True, True, True, False])  # the last key is padding
        >>> layer(x, mask=padding).shape
        (1, 4, 16)
        """
        return layer_attention(
            self.config, self.params, x, memory=memory, cache=cache,
            return_cache=return_cache, mask=mask, bias=bias, positions=positions,
            segment_ids=segment_ids, score_mod=score_mod, mask_mod=mask_mod,
        )  # fmt: skip

    def next_memory(self, memory: jax.Array | None, x: jax.Array) -> jax.Array:
        """Transformer-XL's next memory: the last ``memory_length`` of ``memory`` and ``x``.

        Parameters
        ----------
        memory : jax.Array of shape (B, M, d_model) or None
            The memory this segment's call saw (``None`` for the first).
        x : jax.Array of shape (B, L, d_model)
            This segment's input.

        Returns
        -------
        jax.Array of shape (B, min(memory_length, M + L), d_model)
            Cut from the gradient (:func:`relattn.layers.layer_memory`).

        Examples
        --------
        >>> import jax, jax.numpy as jnp
        >>> from relattn.equinox import RelativeAttention
        >>> layer = RelativeAttention(16, 2, "transformer_xl", causal=True, memory_length=4,
        ...                           key=jax.random.key(0))
        >>> x1, x2 = jnp.ones((2, 1, 3, 16), dtype=jnp.float32)
        >>> memory = layer.next_memory(None, x1)
        >>> layer(x2, memory=memory).shape, layer.next_memory(memory, x2).shape
        ((1, 3, 16), (1, 4, 16))
        """
        return layer_memory(self.config, memory, x)


def _mesh_axes(rules: Any) -> dict[str, Any]:
    if not isinstance(rules, Mapping):
        raise TypeError(
            "rules: expected a mapping of logical axis to mesh axis, e.g. {'heads': 'model'}, "
            f"got {type(rules).__name__}"
        )
    for logical, mesh_axis in rules.items():
        names = mesh_axis if isinstance(mesh_axis, tuple) else (mesh_axis,)
        if mesh_axis is not None and not all(isinstance(n, str) for n in names):
            raise TypeError(
                f"rules: expected a mesh axis name, a tuple of names or None for {logical!r}, "
                f"got {mesh_axis!r}"
            )
    return dict(rules)


def partition_specs(layer: RelativeAttention, rules: Mapping[str, Any]) -> RelativeAttention:
    """The ``PartitionSpec`` of each parameter of ``layer``, by its logical axes.

    Each parameter's :attr:`~relattn.layers.Parameter.axes` name its
    dimensions ``"embed"`` (``d_model``), ``"heads"`` (``H`` or ``H·d_head``),
    ``"head_dim"`` or ``None`` (a table's positions); ``rules`` maps these
    logical names to mesh axes, and a dimension whose name it lacks is
    replicated.

    Parameters
    ----------
    layer : RelativeAttention
        The layer.
    rules : mapping of str to str, tuple of str or None
        Logical axis name → mesh axis name (or a tuple of them, or ``None``:
        replicated), e.g. ``{"heads": "model"}`` (tensor parallelism over the
        heads, Megatron's layout: ``w_q``, ``w_k``, ``w_v`` split by columns,
        ``w_o`` by rows, the per-head tables by heads). Names that no
        parameter has are ignored, so that one mapping can serve a whole
        model.

    Returns
    -------
    RelativeAttention
        A pytree of the layer's structure whose leaves are
        :class:`jax.sharding.PartitionSpec` (``params[name]`` the spec of
        that parameter): map it to :class:`jax.sharding.NamedSharding` on a
        mesh (:func:`named_shardings` does) for :func:`equinox.filter_shard`
        or :func:`jax.device_put`.

    Raises
    ------
    TypeError
        If ``layer`` is not a :class:`RelativeAttention` or ``rules`` not a
        mapping of names.
    ValueError
        If ``rules`` puts two dimensions of one parameter on the same mesh
        axis (``{"embed": "model", "heads": "model"}``).

    See Also
    --------
    named_shardings : The same on a mesh.
    relattn.layers.Parameter : The logical axes.

    Examples
    --------
    >>> import jax
    >>> from relattn.equinox import RelativeAttention, partition_specs
    >>> layer = RelativeAttention(16, 2, "t5", key=jax.random.key(0))
    >>> specs = partition_specs(layer, {"heads": "model"})
    >>> [tuple(specs.params[n]) for n in ("w_q", "w_o", "relative_attention_bias")]
    [(None, 'model'), ('model', None), (None, 'model')]
    """
    if not isinstance(layer, RelativeAttention):
        raise TypeError(f"layer: expected a RelativeAttention, got {type(layer).__name__}")
    mesh_axes = _mesh_axes(rules)
    specs = {}
    for parameter in layer.config.parameters():
        spec = tuple(mesh_axes.get(axis) if axis is not None else None for axis in parameter.axes)
        used = [n for s in spec if s is not None for n in (s if isinstance(s, tuple) else (s,))]
        if len(used) != len(set(used)):
            raise ValueError(
                f"rules: {parameter.name} (axes {parameter.axes}) would take a mesh axis twice: "
                f"{spec}"
            )
        specs[parameter.name] = PartitionSpec(*spec)
    return eqx.tree_at(lambda m: m.params, layer, specs)


def named_shardings(
    layer: RelativeAttention, mesh: jax.sharding.Mesh, rules: Mapping[str, Any]
) -> RelativeAttention:
    """The :class:`jax.sharding.NamedSharding` of each parameter of ``layer`` on ``mesh``.

    Parameters
    ----------
    layer : RelativeAttention
        The layer.
    mesh : jax.sharding.Mesh
        The device mesh (its axes of type ``Auto``, as
        ``jax.sharding.Mesh(devices, names)`` makes them: the layer's matrix
        products contract sharded dimensions, which ``Explicit`` axes refuse
        without an ``out_sharding``).
    rules : mapping of str to str, tuple of str or None
        Logical axis name → mesh axis name, as in :func:`partition_specs`.

    Returns
    -------
    RelativeAttention
        A pytree of the layer's structure whose leaves are ``NamedSharding``:
        ``equinox.filter_shard(layer, named_shardings(layer, mesh, rules))``
        lays the parameters out (outside :func:`equinox.filter_jit`) or
        constrains them (inside).

    Raises
    ------
    TypeError, ValueError
        As :func:`partition_specs`.

    See Also
    --------
    partition_specs : The specs alone.

    Examples
    --------
    >>> import jax, equinox as eqx
    >>> from jax.sharding import Mesh
    >>> from relattn.equinox import RelativeAttention, named_shardings
    >>> layer = RelativeAttention(16, 2, "swin", grid=(2, 3), key=jax.random.key(0))
    >>> mesh = Mesh(jax.devices()[:1], ("model",))
    >>> sharded = eqx.filter_shard(layer, named_shardings(layer, mesh, {"heads": "model"}))
    >>> tuple(sharded.params["relative_position_bias_table"].sharding.spec)
    (None, 'model')
    """
    specs = partition_specs(layer, rules)
    return jax.tree.map(
        lambda spec: NamedSharding(mesh, spec),
        specs,
        is_leaf=lambda leaf: isinstance(leaf, PartitionSpec),
    )
