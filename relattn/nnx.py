"""A Flax NNX attention layer with relative positions: :class:`RelativeAttention`.

The layer holds a :class:`relattn.layers.LayerConfig` and one ``nnx.Param``
per :meth:`~relattn.layers.LayerConfig.parameters` entry, under the same name,
drawn from the entry's initialiser with the layer's ``nnx.Rngs``; its call is
:func:`relattn.layers.layer_attention`. Each parameter carries the entry's
logical axes as NNX's sharding metadata (``out_sharding``), so that
``nnx.get_partition_spec`` and Flax's eager sharding (a mesh set with
``jax.set_mesh`` while the layer is built) place it on a device mesh.

This module imports Flax; ``import relattn`` does not import it.

Examples
--------
>>> import jax.numpy as jnp
>>> from flax import nnx
>>> from relattn.nnx import RelativeAttention
>>> layer = RelativeAttention(16, 2, "t5", causal=True, rngs=nnx.Rngs(0))
>>> layer(jnp.ones((1, 5, 16), dtype=jnp.float32)).shape
(1, 5, 16)
>>> layer.relative_attention_bias.out_sharding
(None, 'heads')
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import spmd as _spmd

from ._typing import Array
from .backends._jax import random_parameter
from .layers import LayerConfig, Parameter, layer_attention, layer_memory

__all__ = ["RelativeAttention"]


def _check_rules(rules: Any) -> tuple[tuple[str, Any], ...]:
    if isinstance(rules, str) or not isinstance(rules, Sequence):
        raise TypeError(
            "sharding_rules: expected pairs (logical axis, mesh axis or None), got "
            f"{type(rules).__name__}"
        )
    pairs = []
    for rule in rules:
        if (
            isinstance(rule, str)
            or not isinstance(rule, Sequence)
            or len(rule) != 2
            or not isinstance(rule[0], str)
        ):
            raise TypeError(
                f"sharding_rules: expected pairs (logical axis, mesh axis or None), got {rule!r}"
            )
        pairs.append((rule[0], tuple(rule[1]) if isinstance(rule[1], list) else rule[1]))
    return tuple(pairs)


class RelativeAttention(nnx.Module):
    """Multi-head self-attention with relative positions, as a Flax NNX module.

    Parameters
    ----------
    d_model : int
        The width of the input and output.
    num_heads : int
        The number of heads.
    scheme : str, optional
        One of :data:`relattn.layers.SCHEMES`: ``"transformer_xl"``,
        ``"t5"``, ``"alibi"``, ``"rope"`` (default), ``"deberta"``,
        ``"shaw"``, ``"swin"``, ``"decomposed"``.
    head_dim, causal, use_bias, scale, num_buckets, max_distance, \
max_relative_position, position_buckets, max_relative_positions, rope_base, \
rotary_dim, rope_scaling, grid, memory_length, block_size, initializer_range : optional
        The keywords of :class:`relattn.layers.LayerConfig`.
    param_dtype : dtype, optional
        The parameters' dtype (float32). The call computes in the dtype that
        JAX promotes the input and the parameters to.
    rngs : flax.nnx.Rngs
        The random numbers: each parameter draws one key of ``rngs.params``.
    sharding_rules : sequence of (str, str or None), optional
        Logical axis to mesh axis pairs, e.g. ``[("heads", "model")]``,
        stored with every parameter (NNX's ``sharding_rules`` metadata).
        Where these rules are given, or a mesh is set (``jax.set_mesh``)
        while the layer is built, the layer's logical axes (``"embed"``,
        ``"heads"``, ``"head_dim"``) that neither these rules, nor
        ``nnx.logical_axis_rules``, nor the mesh's own axis names map are
        replicated.

    Attributes
    ----------
    config : relattn.layers.LayerConfig
        The scheme and sizes.
    w_q, w_k, w_v, w_o, ... : flax.nnx.Param
        One per ``config.parameters()`` entry, under its name, with the
        entry's axes as ``out_sharding`` metadata. Built while a mesh is set
        with ``jax.set_mesh`` (and Flax's eager sharding is on, its
        default), each is placed on the mesh as its axes say.

    Raises
    ------
    ValueError
        From :class:`~relattn.layers.LayerConfig`: an unknown ``scheme``, a
        size below its minimum, a grid scheme without ``grid``.
    TypeError
        If ``rngs`` is not a ``flax.nnx.Rngs``, ``param_dtype`` is not a real
        floating dtype, ``sharding_rules`` are not pairs, or a size is not
        an int.

    See Also
    --------
    relattn.layers.layer_attention : The forward the call runs.
    relattn.layers.LayerConfig : The schemes and their keywords.

    Examples
    --------
    >>> import jax
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from relattn.nnx import RelativeAttention
    >>> layer = RelativeAttention(16, 2, "rope", causal=True, rngs=nnx.Rngs(0))
    >>> x = jax.random.normal(jax.random.key(1), (2, 6, 16))
    >>> out, cache = layer(x[:, :5], return_cache=True)
    >>> step = nnx.jit(lambda m, x, c: m(x, cache=c))(layer, x[:, 5:], cache)
    >>> bool(jnp.allclose(step, layer(x)[:, 5:], atol=1e-5))
    True
    >>> sorted(nnx.state(layer, nnx.Param))
    ['w_k', 'w_o', 'w_q', 'w_v']
    """

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
        rope_scaling: Any = None,
        grid: tuple[int, int] | None = None,
        memory_length: int = 0,
        block_size: Any = None,
        initializer_range: float = 0.02,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
        sharding_rules: Sequence[tuple[str, Any]] | None = None,
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
        if not isinstance(rngs, nnx.Rngs):
            raise TypeError(f"rngs: expected a flax.nnx.Rngs, got {type(rngs).__name__}")
        try:
            dtype = jnp.dtype(param_dtype)
        except TypeError as error:
            raise TypeError(
                f"param_dtype: expected a real floating dtype, got {param_dtype!r}"
            ) from error
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(f"param_dtype: expected a real floating dtype, got {dtype}")
        self.config = config
        parameters = config.parameters()
        metadata = self._sharding_metadata(parameters, sharding_rules)
        for parameter in parameters:
            value = random_parameter(
                parameter.init, parameter.std, parameter.shape, rngs.params(), dtype
            )
            setattr(self, parameter.name, nnx.Param(value, out_sharding=parameter.axes, **metadata))

    @staticmethod
    def _sharding_metadata(
        parameters: tuple[Parameter, ...], rules: Sequence[tuple[str, Any]] | None
    ) -> dict[str, Any]:
        """``eager_sharding`` and ``sharding_rules`` for the parameters' ``nnx.Param``."""
        mesh = jax.sharding.get_abstract_mesh()
        meshed = not mesh.empty
        # Flax shards a Variable with sharding metadata as it is made, and then needs a mesh:
        # without one the parameters only carry their axes (nnx.get_partition_spec reads them).
        metadata: dict[str, Any] = {"eager_sharding": meshed and nnx.using_eager_sharding()}
        if rules is None and not meshed:
            return metadata
        local = _check_rules(() if rules is None else rules)
        mapped = {name for name, _ in (*local, *_spmd.get_logical_axis_rules())}
        if meshed:
            mapped |= set(mesh.axis_names)
        logical = sorted({a for p in parameters for a in p.axes if a is not None} - mapped)
        local += tuple((name, None) for name in logical)
        if local:
            metadata["sharding_rules"] = local
        return metadata

    def _values(self) -> dict[str, Any]:
        return {p.name: getattr(self, p.name)[...] for p in self.config.parameters()}

    def __call__(
        self,
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
        """Attend over ``x`` (and ``memory`` or ``cache``) with the layer's scheme.

        Parameters
        ----------
        x : array of shape (B, L, d_model), real floating
            The input; NumPy arrays are converted to JAX arrays.
        memory : array of shape (B, M, d_model), optional
            Transformer-XL's memory, from :meth:`next_memory`.
        cache : (array, array) of shape (B, H, M, d_head), optional
            A decoder's key–value cache, from a call with ``return_cache``.
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
            If ``x``'s last dimension is not ``d_model``, or an argument
            reaches a scheme that cannot take it (see
            :func:`~relattn.layers.layer_attention`).
        TypeError
            From relattn's functions, for arrays of the wrong dtype.

        See Also
        --------
        relattn.layers.layer_attention : The function called.

        Examples
        --------
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from relattn.nnx import RelativeAttention
        >>> layer = RelativeAttention(8, 2, "alibi", rngs=nnx.Rngs(0))
        >>> layer(jnp.zeros((3, 4, 8), dtype=jnp.float32)).dtype
        dtype('float32')
        """
        return layer_attention(
            self.config, self._values(), _as_jax(x), memory=_as_jax(memory),
            cache=None if cache is None else (_as_jax(cache[0]), _as_jax(cache[1])),
            return_cache=return_cache, mask=_as_jax(mask), bias=_as_jax(bias),
            positions=positions, segment_ids=segment_ids, score_mod=score_mod,
            mask_mod=mask_mod,
        )  # fmt: skip

    def next_memory(self, memory: Array, x: Array) -> jax.Array:
        """Transformer-XL's memory for the next segment: the last ``memory_length`` inputs.

        Parameters
        ----------
        memory : array of shape (B, M, d_model) or None
            The memory this segment's call saw (``None`` for the first).
        x : array of shape (B, L, d_model)
            This segment's input.

        Returns
        -------
        jax.Array of shape (B, min(memory_length, M + L), d_model)
            Cut from the gradient.

        See Also
        --------
        relattn.layers.layer_memory : The function called.

        Examples
        --------
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from relattn.nnx import RelativeAttention
        >>> layer = RelativeAttention(
        ...     8, 2, "transformer_xl", causal=True, memory_length=4, rngs=nnx.Rngs(0)
        ... )
        >>> x = jnp.ones((1, 3, 8), dtype=jnp.float32)
        >>> memory = layer.next_memory(None, x)
        >>> layer(x, memory=memory).shape, layer.next_memory(memory, x).shape
        ((1, 3, 8), (1, 4, 8))
        """
        return layer_memory(self.config, _as_jax(memory), _as_jax(x))


# Flax's metaclass shows inspect (help, Sphinx, numpydoc) its own ``__call__(*args, **kwargs)``
# in place of the constructor's signature.
_signature = inspect.signature(RelativeAttention.__init__)
setattr(  # noqa: B010 - mypy knows no __signature__ on a class
    RelativeAttention,
    "__signature__",
    _signature.replace(parameters=list(_signature.parameters.values())[1:]),
)


def _as_jax(a: Any) -> Any:
    """A JAX array of an array-like (JAX arrays and tracers as they are); ``None`` stays."""
    if a is None or isinstance(a, jax.Array):
        return a
    return jnp.asarray(a)
