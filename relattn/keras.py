"""relattn's attention layers for Keras 3, on its JAX and PyTorch backends.

:class:`RelativeAttention` is a ``keras.layers.Layer``: its weights are Keras
variables, one per :meth:`relattn.layers.LayerConfig.parameters` entry and
under the same name, created in ``build`` with Keras's initialisers and
random numbers; its ``call`` hands their backend tensors (JAX arrays, torch
parameters) to :func:`relattn.layers.layer_attention`, which holds the math.
So the layer trains with ``model.fit``, compiles with ``jit_compile``,
differentiates under ``jax.grad`` (through ``stateless_call``) and torch
autograd, saves to ``.keras`` files and shards with ``keras.distribution``
(:func:`layout_map` maps its weights' logical axes to a device mesh).

Keras fixes its backend when it is first imported: set ``KERAS_BACKEND`` to
``"jax"`` or ``"torch"`` before that (``os.environ["KERAS_BACKEND"] = "jax"``
or ``KERAS_BACKEND=torch python …``). The TensorFlow backend is not
supported (relattn computes with the array API, which TensorFlow's tensors
lack). This module imports Keras; ``import relattn`` does not import it.

Examples
--------
>>> import numpy as np
>>> import keras
>>> from relattn.keras import RelativeAttention
>>> inputs = keras.Input((6, 16))
>>> hidden = RelativeAttention(16, 2, "t5", causal=True)(inputs)
>>> model = keras.Model(inputs, keras.layers.Dense(4)(hidden))
>>> tuple(model(np.ones((3, 6, 16), "float32")).shape)
(3, 6, 4)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from .layers import SCHEMES, LayerConfig, Parameter, layer_attention, layer_memory

#: The Keras backends the layers run on.
BACKENDS = ("jax", "torch")

_PICK = (
    "relattn's Keras layers run on the 'jax' and 'torch' backends: pick one with the "
    "KERAS_BACKEND environment variable before Keras is first imported "
    "(os.environ['KERAS_BACKEND'] = 'jax' in Python, or KERAS_BACKEND=torch in the shell), "
    'or with "backend" in ~/.keras/keras.json'
)

try:
    import keras
except ModuleNotFoundError as exc:  # Keras's default backend is TensorFlow
    if not (exc.name or "").startswith("tensorflow"):
        raise
    raise ImportError(
        f"relattn.keras: Keras is set to its 'tensorflow' backend, which is not installed. {_PICK}."
    ) from exc

__all__ = ["BACKENDS", "RelativeAttention", "layout_map"]


def _check_backend() -> str:
    backend = keras.backend.backend()
    if backend not in BACKENDS:
        raise RuntimeError(f"relattn.keras: Keras runs on its {backend!r} backend here. {_PICK}.")
    return str(backend)


def _initializer(parameter: Parameter, seed: int | None) -> Any:
    """The Keras initialiser of a :class:`relattn.layers.Parameter`."""
    init = parameter.init
    if init == "zeros":
        return keras.initializers.Zeros()
    if init == "normal":
        return keras.initializers.RandomNormal(stddev=parameter.std, seed=seed)
    if init == "truncated_normal":  # Keras redraws beyond ±2σ
        return keras.initializers.TruncatedNormal(stddev=parameter.std, seed=seed)
    if len(parameter.shape) == 2:  # Glorot's fans are then shape[0] and shape[-1]
        return keras.initializers.GlorotUniform(seed=seed)
    bound = math.sqrt(6.0 / (parameter.shape[0] + parameter.shape[-1]))
    return keras.initializers.RandomUniform(-bound, bound, seed=seed)


def _keras_mask(x: Any) -> Any:
    """The padding mask Keras attached to ``x`` (``Embedding(mask_zero=True)``), or None."""
    try:
        from keras.src.backend import get_keras_mask
    except ImportError:  # pragma: no cover - a Keras that moved it
        return getattr(x, "_keras_mask", None)
    return get_keras_mask(x)


def _length(*tensors: Any) -> int | None:
    """The summed lengths (axis -2) of the tensors given, None where one is unknown."""
    total = 0
    for t in tensors:
        if t is not None:
            if t.shape[-2] is None:
                return None
            total += t.shape[-2]
    return total


@keras.saving.register_keras_serializable(package="relattn")
class RelativeAttention(keras.layers.Layer):
    """Multi-head self-attention with a relative position scheme, as a Keras layer.

    The weights are created on the first call (or by ``build``), one Keras
    variable per :meth:`relattn.layers.LayerConfig.parameters` entry, named
    as it (``layer.w_q``, ``layer.relative_attention_bias`` …, paths
    ``"<layer name>/w_q"`` …) and drawn from its reference initialiser with
    Keras's random numbers. The forward is
    :func:`relattn.layers.layer_attention`.

    Parameters
    ----------
    d_model : int
        The width of the input and output.
    num_heads : int
        The number of heads.
    scheme : str, optional
        One of :data:`relattn.layers.SCHEMES` (default ``"rope"``).
    head_dim, causal, use_bias, scale, num_buckets, max_distance, max_relative_position, \
position_buckets, max_relative_positions, rope_base, rotary_dim, rope_scaling, grid, \
memory_length, block_size, initializer_range : optional
        As in :class:`relattn.layers.LayerConfig`.
    param_dtype : str, optional
        The weights' dtype. Default: the layer's dtype policy's variable dtype
        (``keras.config.floatx()``, float32, unless ``dtype`` says otherwise);
        given without ``dtype``, it is also the layer's dtype (the compute
        dtype: ``param_dtype="float64"`` makes a float64 layer).
    seed : int, optional
        Seeds the initialisers (parameter ``i`` with ``seed + i``); default
        Keras's global random numbers (``keras.utils.set_random_seed``).
    **kwargs
        ``keras.layers.Layer``'s: ``name``, ``dtype`` (the dtype policy:
        ``"float64"``, ``"mixed_bfloat16"`` …), ``trainable``.

    Attributes
    ----------
    config : relattn.layers.LayerConfig
        The scheme and sizes.

    Raises
    ------
    RuntimeError
        If Keras runs on a backend other than ``"jax"`` and ``"torch"``.
    ValueError, TypeError
        From :class:`relattn.layers.LayerConfig`, naming the argument.

    See Also
    --------
    relattn.layers.layer_attention : The forward.
    layout_map : Shards the weights with ``keras.distribution``.

    Notes
    -----
    ``get_config`` returns every constructor keyword, so the layer saves to
    and loads from ``.keras`` files (``import relattn.keras`` registers it
    as ``"relattn>RelativeAttention"``). A padding mask that Keras attaches
    to the input (``keras.layers.Embedding(mask_zero=True)``) masks the
    padded keys, and the output keeps it.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn.keras import RelativeAttention
    >>> layer = RelativeAttention(16, 2, "t5", causal=True, seed=0, name="attention")
    >>> out = layer(np.ones((2, 5, 16), "float32"))
    >>> tuple(out.shape), [w.path for w in layer.weights][:2]
    ((2, 5, 16), ['attention/w_q', 'attention/w_k'])
    >>> tuple(layer.relative_attention_bias.shape)
    (32, 2)
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
        rope_scaling: Mapping[str, Any] | None = None,
        grid: tuple[int, int] | None = None,
        memory_length: int = 0,
        block_size: Any = None,
        initializer_range: float = 0.02,
        param_dtype: Any = None,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        _check_backend()  # (LayerConfig takes a .keras file's JSON lists as tuples)
        self.config = LayerConfig(
            d_model, num_heads, scheme, head_dim=head_dim, causal=causal, use_bias=use_bias,
            scale=scale, num_buckets=num_buckets, max_distance=max_distance,
            max_relative_position=max_relative_position, position_buckets=position_buckets,
            max_relative_positions=max_relative_positions, rope_base=rope_base,
            rotary_dim=rotary_dim, rope_scaling=rope_scaling, grid=grid,
            memory_length=memory_length, block_size=block_size,
            initializer_range=initializer_range,
        )  # fmt: skip
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed: expected an int or None, got {type(seed).__name__}")
        if param_dtype is not None:
            param_dtype = keras.backend.standardize_dtype(param_dtype)
            if not keras.backend.is_float_dtype(param_dtype):
                raise TypeError(f"param_dtype: expected a floating dtype, got {param_dtype!r}")
            if kwargs.get("dtype") is None:
                kwargs["dtype"] = param_dtype
        super().__init__(**kwargs)
        self.param_dtype = param_dtype
        self.seed = seed
        # A Keras padding mask on the input passes through to the output.
        self.supports_masking = True

    def build(self, input_shape: Any = None) -> None:
        """Creates the weights, one per :meth:`relattn.layers.LayerConfig.parameters` entry.

        Parameters
        ----------
        input_shape : tuple, optional
            The shape of ``x``; its last dimension must be ``d_model``.

        Raises
        ------
        ValueError
            If the last dimension of ``input_shape`` is not ``d_model``.
        """
        d_model = self.config.d_model
        if input_shape is not None and input_shape[-1] not in (None, d_model):
            raise ValueError(
                f"x: expected shape (..., L, d_model = {d_model}), got {tuple(input_shape)}"
            )
        dtype = self.param_dtype or self.variable_dtype
        for index, parameter in enumerate(self.config.parameters()):
            seed = None if self.seed is None else self.seed + index
            weight = self.add_weight(
                name=parameter.name,
                shape=parameter.shape,
                initializer=_initializer(parameter, seed),
                dtype=dtype,
            )
            setattr(self, parameter.name, weight)
        self.built = True

    def parameter_values(self) -> dict[str, Any]:
        """The weights' values as backend tensors, in the layer's compute dtype.

        Returns
        -------
        dict of str to tensor
            One JAX array or torch tensor per parameter (torch: the
            variables' parameters themselves, which autograd reaches).
        """
        dtype = self.compute_dtype
        values = {}
        for parameter in self.config.parameters():
            value = getattr(self, parameter.name).value
            if keras.backend.standardize_dtype(value.dtype) != dtype:
                value = keras.ops.cast(value, dtype)
            values[parameter.name] = value
        return values

    def call(
        self,
        x: Any,
        memory: Any = None,
        cache: Any = None,
        return_cache: bool = False,
        mask: Any = None,
        bias: Any = None,
        positions: Any = None,
        segment_ids: Any = None,
        score_mod: Any = None,
        mask_mod: Any = None,
    ) -> Any:
        """Attend ``x`` to itself (and to ``memory`` and the ``cache``).

        Parameters
        ----------
        x : tensor of shape (B, L, d_model)
            The input (NumPy arrays are converted; floats cast to the compute
            dtype).
        memory, cache, return_cache, mask, bias, positions, segment_ids, score_mod, \
mask_mod : optional
            As in :func:`relattn.layers.layer_attention`. A ``mask`` that
            Keras fills in from the input's padding mask ``(B, L)`` masks
            the padded keys.

        Returns
        -------
        tensor of shape (B, L, d_model), or (tensor, (tensor, tensor)) with ``return_cache``
            See :func:`relattn.layers.layer_attention`.

        Examples
        --------
        >>> import numpy as np
        >>> from relattn.keras import RelativeAttention
        >>> layer = RelativeAttention(16, 2, "alibi", causal=True, seed=0)
        >>> out, cache = layer(np.ones((1, 3, 16)), return_cache=True)
        >>> tuple(out.shape), tuple(cache[0].shape)
        ((1, 3, 16), (1, 2, 3, 8))
        """
        if mask is not None and mask is _keras_mask(x):
            mask = self._padding_mask(mask, memory, cache)
        params = self.parameter_values()
        return layer_attention(
            self.config, params, x, memory=memory, cache=cache,
            return_cache=return_cache, mask=mask, bias=bias, positions=positions,
            segment_ids=segment_ids, score_mod=score_mod, mask_mod=mask_mod,
        )  # fmt: skip

    @staticmethod
    def _padding_mask(keep: Any, memory: Any, cache: Any) -> Any:
        """A Keras padding mask (B, L) as relattn's (B, 1, 1, M + L): padded keys masked."""
        keep = keras.ops.cast(keep, "bool")
        earlier = _length(memory, None if cache is None else cache[0]) or 0
        if earlier:
            ones = keras.ops.ones((*keep.shape[:-1], earlier), dtype="bool")
            keep = keras.ops.concatenate((ones, keep), axis=-1)
        return keep[..., None, None, :]

    def compute_output_spec(
        self,
        x: Any,
        memory: Any = None,
        cache: Any = None,
        return_cache: bool = False,
        **kwargs: Any,
    ) -> Any:
        """The output's shape and dtype, for Keras's functional models."""
        out = keras.KerasTensor(x.shape, dtype=self.compute_dtype)
        if not return_cache:
            return out
        length = _length(x, memory, None if cache is None else cache[0])
        shape = (*x.shape[:-2], self.config.num_heads, length, self.config.dim)
        return out, (
            keras.KerasTensor(shape, dtype=self.compute_dtype),
            keras.KerasTensor(shape, dtype=self.compute_dtype),
        )

    def next_memory(self, memory: Any, x: Any) -> Any:
        """Transformer-XL's memory for the next segment: the last ``memory_length`` inputs.

        Parameters
        ----------
        memory : tensor of shape (B, M, d_model) or None
            The memory this segment saw.
        x : tensor of shape (B, L, d_model)
            This segment's input.

        Returns
        -------
        tensor of shape (B, min(memory_length, M + L), d_model)
            Cut from autograd (:func:`relattn.layers.layer_memory`).

        Examples
        --------
        >>> import numpy as np
        >>> from relattn.keras import RelativeAttention
        >>> layer = RelativeAttention(16, 2, "transformer_xl", causal=True, memory_length=4)
        >>> tuple(layer.next_memory(None, np.ones((1, 6, 16))).shape)
        (1, 4, 16)
        """
        x = keras.ops.convert_to_tensor(x)
        if memory is not None:
            memory = keras.ops.convert_to_tensor(memory)
        return layer_memory(self.config, memory, x)

    def get_config(self) -> dict[str, Any]:
        """Every constructor keyword (and ``keras.layers.Layer``'s), JSON-friendly.

        Returns
        -------
        dict
            ``RelativeAttention(**layer.get_config())`` builds the same layer.
        """
        # Every LayerConfig field, tuples as JSON lists, rope_scaling as its mapping.
        fields = {f.name: getattr(self.config, f.name) for f in dataclasses.fields(LayerConfig)}
        fields = {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}
        return {
            **super().get_config(),
            **fields,
            "rope_scaling": self.config.rope_keywords or None,
            "param_dtype": self.param_dtype,
            "seed": self.seed,
        }


def _logical_axes() -> dict[str, tuple[str | None, ...]]:
    """Every parameter name of every scheme, with its logical axes."""
    axes: dict[str, tuple[str | None, ...]] = {}
    for scheme in SCHEMES:
        config = LayerConfig(4, 2, scheme, use_bias=True, grid=(2, 2))
        for parameter in config.parameters():
            axes[parameter.name] = parameter.axes
    return axes


def layout_map(
    device_mesh: Any,
    rules: Mapping[str, str | None],
    *,
    path: str = ".*",
    into: Any = None,
) -> Any:
    """A ``keras.distribution.LayoutMap`` placing :class:`RelativeAttention`'s weights.

    Each weight's layout names, per dimension, the mesh axis that
    ``rules`` gives its logical axis (:attr:`relattn.layers.Parameter.axes`:
    ``"embed"``, ``"heads"``, ``"head_dim"``; ``None``, a table's positions,
    and axes that ``rules`` leaves out are replicated). One regex key per
    weight name of every scheme: ``f"{path}/w_q"`` …

    Parameters
    ----------
    device_mesh : keras.distribution.DeviceMesh
        The devices.
    rules : mapping of str to str or None
        Logical axis -> mesh axis name, e.g. ``{"heads": "model"}``
        (Megatron's split: heads sharded, ``w_o`` along its input).
    path : str, optional
        A regex that the layers' paths match in full (default ``".*"``: every
        layer with weights of these names).
    into : keras.distribution.LayoutMap, optional
        A map to add the keys to (the rest of a model's layouts); default a
        new one on ``device_mesh``.

    Returns
    -------
    keras.distribution.LayoutMap
        For ``keras.distribution.ModelParallel(layout_map=...)``.

    Raises
    ------
    ValueError
        If a rule names an axis that ``device_mesh`` lacks.

    Examples
    --------
    >>> import keras
    >>> from relattn.keras import layout_map
    >>> mesh = keras.distribution.DeviceMesh((1, 2), ("batch", "model"), ["cpu:0", "cpu:1"])
    >>> layouts = layout_map(mesh, {"heads": "model"})
    >>> layouts["block/relative_attention/w_o"].axes
    ('model', None)
    """
    names = tuple(device_mesh.axis_names)
    for logical, mesh_axis in rules.items():
        if mesh_axis is not None and mesh_axis not in names:
            raise ValueError(
                f"rules: {logical!r} maps to mesh axis {mesh_axis!r}, not one of {names}"
            )
    layouts = keras.distribution.LayoutMap(device_mesh) if into is None else into
    for name, axes in _logical_axes().items():
        layouts[f"{path}/{name}"] = tuple(
            None if axis is None else rules.get(axis) for axis in axes
        )
    return layouts
