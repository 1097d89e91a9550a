"""What each public function supports, declared once.

Every name in ``relattn.__all__`` but the settings (:data:`SETTINGS`) has one
:class:`Capabilities` record in :data:`CAPABILITIES`: the array libraries it
runs on (and why not, where it does not), whether it compiles whole
(``jax.jit``, ``torch.compile``), whether gradients reach its inputs, whether
it runs blockwise in ``O(L)`` memory or sequence-parallel across devices, and
the kinds of dtypes it computes in. The libraries themselves are described by
:data:`LIBRARIES` (their dtypes, devices, compiler and autograd).

The same declarations write the documentation's support table and decide the
test suite's skips (:func:`relattn.testing.skip_unless_capable`), so that each
fact is stated in one place. Like SciPy's ``xp_capabilities``, but a table,
kept beside the functions rather than on them.

Examples
--------
>>> from relattn.capabilities import CAPABILITIES, unsupported
>>> CAPABILITIES["relative_attention"].blockwise
True
>>> unsupported("relative_attention", "torch", "grad") is None
True
>>> unsupported("ring_attention", "numpy", "run").startswith("runs inside jax.shard_map")
True
>>> unsupported("relative_attention", "numpy", "bfloat16")
'numpy has no bfloat16'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = [
    "CAPABILITIES",
    "CAPABILITY_NAMES",
    "DTYPE_KINDS",
    "LIBRARIES",
    "SETTINGS",
    "Capabilities",
    "Library",
    "dtypes",
    "unsupported",
]


@dataclass(frozen=True)
class Library:
    """One array library, as relattn's declarations see it.

    Attributes
    ----------
    module : str
        The module a user passes as ``xp=`` (``"numpy"``, ``"jax.numpy"`` …).
    devices : tuple of str
        The kinds of device its arrays live on: ``"cpu"``, ``"gpu"``.
    dtypes : tuple of str
        Its floating and complex dtypes, by name. JAX has its 64-bit ones
        only with ``JAX_ENABLE_X64`` set.
    compiler : str or None
        The compiler that traces a function whole, or ``None``.
    autograd : str or None
        The automatic differentiation it offers, or ``None``.
    """

    module: str
    devices: tuple[str, ...]
    dtypes: tuple[str, ...]
    compiler: str | None = None
    autograd: str | None = None


_HALF = ("float16", "float32", "float64", "complex64", "complex128")

#: relattn's name of each library it is tested on -> what that library offers.
LIBRARIES: Mapping[str, Library] = MappingProxyType(
    {
        "numpy": Library("numpy", ("cpu",), _HALF),
        "array_api_strict": Library(
            "array_api_strict", ("cpu",), ("float32", "float64", "complex64", "complex128")
        ),
        "torch": Library(
            "torch", ("cpu", "gpu"), ("bfloat16", *_HALF), "torch.compile", "torch.autograd"
        ),
        "jax": Library("jax.numpy", ("cpu", "gpu"), ("bfloat16", *_HALF), "jax.jit", "jax.grad"),
        "dask": Library("dask.array", ("cpu",), _HALF),
        "cupy": Library("cupy", ("gpu",), _HALF),
    }
)

#: Kinds of dtype a function computes in -> the dtype names of that kind.
DTYPE_KINDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "real floating": ("float16", "bfloat16", "float32", "float64"),
        "complex floating": ("complex64", "complex128"),
        "integral": (),
        "bool": (),
    }
)

#: The capabilities :func:`unsupported` answers for, besides dtype names.
CAPABILITY_NAMES = ("run", "jit", "grad", "blockwise", "ring")


@dataclass(frozen=True)
class Capabilities:
    """What one public name of relattn supports.

    Attributes
    ----------
    dtypes : tuple of str
        The kinds of dtype it computes in, keys of :data:`DTYPE_KINDS`
        (``"real floating"``; ``"integral"`` and ``"bool"`` for distances,
        buckets and masks). Functions that only move elements (``rel_shift``,
        ``split_heads`` …) take every dtype: both floating kinds and more.
    skip_backends : mapping of str to str
        The libraries (keys of :data:`LIBRARIES`) it does not run on, each with
        the reason.
    jit : bool
        It compiles whole, with static shapes, under ``jax.jit`` and
        ``torch.compile(fullgraph=True)``.
    grad : bool or None
        Gradients reach its floating inputs (``torch.autograd``,
        ``jax.grad``); ``False`` where it cuts them by design (the reason is in
        ``why``); ``None`` where it has no floating input to differentiate.
    blockwise : bool
        It runs blockwise in ``O(L)`` memory (``block_size=``, SPEC §2.13), or
        is itself a block of that computation.
    ring : bool
        It runs sequence-parallel across devices, as :func:`relattn.ring_attention`
        or one of the terms that function takes.
    why : mapping of str to str
        The reason for each capability above that is missing.
    """

    dtypes: tuple[str, ...] = ("real floating",)
    skip_backends: Mapping[str, str] = field(default_factory=dict)
    jit: bool = True
    grad: bool | None = True
    blockwise: bool = False
    ring: bool = False
    why: Mapping[str, str] = field(default_factory=dict)


_REAL = ("real floating",)
_COMPLEX = ("complex floating",)
_ANY = ("real floating", "complex floating", "integral", "bool")
_NO_FLOATING_INPUT = "no floating input to differentiate"
_RING = (
    "runs inside jax.shard_map (jax.lax.ppermute) or over a torch.distributed process group "
    "(batch_isend_irecv)"
)


def _creation(kind: str) -> Capabilities:
    """A function without array arguments: it builds its result from ``xp=``, lengths and counts."""
    return Capabilities(dtypes=(kind,), grad=None, why={"grad": "takes no array"})


def _attention() -> Capabilities:
    """An attention function: blockwise with ``block_size=``, its terms taken by the ring."""
    return Capabilities(blockwise=True, ring=True)


def _cut(reason: str, dtypes: tuple[str, ...] = _REAL) -> Capabilities:
    return Capabilities(dtypes=dtypes, grad=False, why={"grad": reason})


def _no_floating(kind: str) -> Capabilities:
    return Capabilities(dtypes=(kind,), grad=None, why={"grad": _NO_FLOATING_INPUT})


#: Public names that compute nothing of their own: relattn's settings and the plan of
#: another function's call (tests/test_plan.py).
SETTINGS = frozenset({"config", "explain"})

#: Public name -> its capabilities.
CAPABILITIES: Mapping[str, Capabilities] = MappingProxyType(
    {
        "cope_bias": Capabilities(),
        "dynamic_position_bias": Capabilities(),
        "fire_bias": Capabilities(),
        "fire_score_mod": Capabilities(),
        "xpos_embedding": Capabilities(),
        "axial_rotary_embedding": Capabilities(),
        "mixed_rotary_embedding": Capabilities(),
        "mixed_rotary_frequencies": _creation("real floating"),
        "multimodal_rotary_embedding": Capabilities(),
        "rope_index": Capabilities(
            dtypes=("integral",),
            jit=False,
            grad=None,
            why={
                "jit": "index bookkeeping on the host: the block sizes come from the grid values",
                "grad": _NO_FLOATING_INPUT,
            },
        ),
        "decomposed_relative_attention": Capabilities(blockwise=True),
        "decomposed_relative_terms": Capabilities(),
        "resize_relative_table": Capabilities(),
        "continuous_position_bias": Capabilities(),
        "continuous_position_coordinates": _creation("real floating"),
        "grid_bias_mod": Capabilities(),
        "grid_positions": Capabilities(
            dtypes=("integral", "real floating"), grad=None, why={"grad": "takes no array"}
        ),
        "grid_relative_bias": Capabilities(),
        "grid_relative_index": _creation("integral"),
        "shifted_window_mask": _creation("bool"),
        "window_merge": Capabilities(dtypes=_ANY),
        "window_partition": Capabilities(dtypes=_ANY),
        "zigzag_shard": Capabilities(dtypes=_ANY),
        "zigzag_unshard": Capabilities(dtypes=_ANY),
        "BlockState": Capabilities(blockwise=True),
        "additive_scores": Capabilities(),
        "alibi_slopes": _creation("real floating"),
        "attention_block": Capabilities(blockwise=True),
        "backward_mask": _creation("bool"),
        "bilinear_scores": Capabilities(),
        "causal_mask": _creation("bool"),
        "complex_attention": Capabilities(dtypes=_COMPLEX),
        "complex_linear": Capabilities(dtypes=_COMPLEX),
        "complex_order_embedding": Capabilities(dtypes=_COMPLEX),
        "cosine_scores": Capabilities(),
        "diagonal_disabled_mask": _creation("bool"),
        "disentangled_attention": _attention(),
        "dot_product_scores": Capabilities(),
        "finish_block_state": Capabilities(blockwise=True),
        "forward_mask": _creation("bool"),
        "inverse_frequencies": _creation("real floating"),
        "kerple_bias": Capabilities(),
        "local_p_weights": Capabilities(),
        "local_window_mask": _creation("bool"),
        "location_scores": Capabilities(),
        "log_bucket_position": _no_floating("integral"),
        "mask_to_bias": _no_floating("bool"),
        "masked_softmax": Capabilities(),
        "merge_block_states": Capabilities(blockwise=True),
        "merge_heads": Capabilities(dtypes=_ANY),
        "multi_dimensional_attention": Capabilities(),
        "padding_mask": _no_floating("integral"),
        "predicted_positions": Capabilities(),
        "rel_shift": Capabilities(dtypes=_ANY),
        "rel_unshift": Capabilities(dtypes=_ANY),
        "relative_attention": _attention(),
        "relative_bias_matrix": Capabilities(),
        "relative_distances": _creation("integral"),
        "relative_position_bucket": _no_floating("integral"),
        "relative_positions": _creation("integral"),
        "relative_scores": Capabilities(),
        "relative_table": Capabilities(dtypes=_ANY),
        "ring_attention": Capabilities(
            skip_backends={name: _RING for name in ("numpy", "array_api_strict", "dask", "cupy")},
            blockwise=True,
            ring=True,
        ),
        "ulysses_attention": Capabilities(
            skip_backends={name: _RING for name in ("numpy", "array_api_strict", "dask", "cupy")},
            blockwise=True,
            ring=True,
        ),
        "rope_frequencies": _creation("real floating"),
        "rotary_position_embedding": Capabilities(),
        "sandwich_bias": _no_floating("integral"),
        "scaled_dot_product_attention": _attention(),
        "scaled_dot_product_scores": Capabilities(),
        "shaw_attention": _attention(),
        "sinusoidal_position_encoding": Capabilities(),
        "source2token_attention": Capabilities(),
        "split_heads": Capabilities(dtypes=_ANY),
        "stop_gradient": _cut("cuts the gradient: that is its purpose", _ANY),
        "update_memory": _cut("the memory is a constant of the next segment (stop-gradient)"),
    }
)


def dtypes(name: str, library: str) -> tuple[str, ...]:
    """The floating and complex dtypes ``name`` computes in on ``library``.

    Parameters
    ----------
    name : str
        A public name of relattn.
    library : str
        A key of :data:`LIBRARIES`.

    Returns
    -------
    tuple of str
        The dtype names, in the order of ``LIBRARIES[library].dtypes``; empty
        for functions of integers and booleans alone, and on a library the
        function does not run on.

    Examples
    --------
    >>> from relattn.capabilities import dtypes
    >>> dtypes("complex_attention", "numpy")
    ('complex64', 'complex128')
    >>> dtypes("rel_shift", "array_api_strict")
    ('float32', 'float64', 'complex64', 'complex128')
    """
    declared = _declared(name)
    if library in declared.skip_backends:
        return ()
    kinds = {dtype for kind in declared.dtypes for dtype in DTYPE_KINDS[kind]}
    return tuple(dtype for dtype in _library(library).dtypes if dtype in kinds)


def unsupported(name: str, library: str, capability: str) -> str | None:
    """Why ``name`` lacks ``capability`` on ``library``, or ``None`` where it has it.

    Parameters
    ----------
    name : str
        A public name of relattn (a key of :data:`CAPABILITIES`).
    library : str
        A key of :data:`LIBRARIES`.
    capability : str
        One of :data:`CAPABILITY_NAMES` (``"run"``, ``"jit"``, ``"grad"``,
        ``"blockwise"``, ``"ring"``) or a dtype name (``"bfloat16"`` …).

    Returns
    -------
    str or None
        The reason, for a test's skip or the documentation's table.

    Raises
    ------
    ValueError
        If ``name``, ``library`` or ``capability`` is unknown.

    Examples
    --------
    >>> from relattn.capabilities import unsupported
    >>> unsupported("stop_gradient", "jax", "grad")
    'cuts the gradient: that is its purpose'
    >>> unsupported("masked_softmax", "numpy", "jit")
    'numpy has no compiler'
    >>> unsupported("masked_softmax", "jax", "jit") is None
    True
    """
    declared = _declared(name)
    lib = _library(library)
    if capability not in CAPABILITY_NAMES and not any(
        capability in names for names in DTYPE_KINDS.values()
    ):
        raise ValueError(
            f"capability must be one of {CAPABILITY_NAMES} or a dtype name, got {capability!r}"
        )
    skipped = declared.skip_backends.get(library)
    if skipped is not None or capability == "run":
        return skipped
    if capability == "jit":
        if lib.compiler is None:
            return f"{library} has no compiler"
        return None if declared.jit else declared.why["jit"]
    if capability == "grad":
        if lib.autograd is None:
            return f"{library} has no automatic differentiation"
        return None if declared.grad else declared.why["grad"]
    if capability in ("blockwise", "ring"):
        return None if getattr(declared, capability) else f"{name} has no {capability} form"
    if capability not in lib.dtypes:
        return f"{library} has no {capability}"
    if capability not in dtypes(name, library):
        return f"{name} computes in {' or '.join(declared.dtypes)} dtypes, not {capability}"
    return None


def _declared(name: str) -> Capabilities:
    try:
        return CAPABILITIES[name]
    except KeyError:
        raise ValueError(f"name must be a public name of relattn, got {name!r}") from None


def _library(name: str) -> Library:
    try:
        return LIBRARIES[name]
    except KeyError:
        raise ValueError(f"library must be one of {tuple(LIBRARIES)}, got {name!r}") from None
