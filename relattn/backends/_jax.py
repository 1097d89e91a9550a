"""JAX: traced loops and branches, checkpoints, the ring's collective (``shard_map``),
``jax.nn.dot_product_attention`` (cuDNN on NVIDIA GPUs, XLA elsewhere)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ._base import Backend
from ._relative import PALLAS


def _stop_gradient(x: Any) -> Any:
    import jax

    return jax.lax.stop_gradient(x)


def _has_values(x: Any) -> bool:
    import jax

    return not isinstance(x, jax.core.Tracer)


@functools.lru_cache(maxsize=64)
def _jitted(fn: Callable[..., Any], statics: tuple[Any, ...]) -> Callable[..., Any]:
    import jax

    return jax.jit(functools.partial(fn, *statics))


def _staged(fn: Callable[..., Any], statics: tuple[Any, ...], arrays: tuple[Any, ...]) -> Any:
    """``fn(*statics, *arrays)`` under one ``jax.jit`` per ``statics`` (hashable), kept
    for later calls; JAX's own cache keys it by the arrays' shapes and dtypes."""
    return _jitted(fn, statics)(*arrays)


def dot_product_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    bias: Any,
    mask: Any = None,
    causal: bool = False,
    scale: float,
    implementation: Any = None,
) -> Any:
    """``jax.nn.dot_product_attention`` with relattn's layout and semantics, or ``None``.

    relattn's ``(B, H, L, d)`` becomes JAX's ``(B, L, H, d)`` and back; bias and
    mask are passed as they are (``True`` = may attend in both). Rows with no
    allowed key are set to zero. ``None`` where the inputs do not fit JAX's
    function: not 4-D, leading dimensions that differ, or ``d_v != d``.
    """
    import jax
    import jax.numpy as jnp

    if not (q.ndim == k.ndim == v.ndim == 4 and q.shape[:2] == k.shape[:2] == v.shape[:2]):
        return None
    if v.shape[-1] != q.shape[-1]:
        return None

    def heads_last(x: Any) -> Any:
        return None if x is None else jnp.swapaxes(x, -2, -3)

    def four_dims(x: Any) -> Any:
        return None if x is None else jnp.reshape(x, (1,) * (4 - x.ndim) + x.shape)

    out = jax.nn.dot_product_attention(
        heads_last(q), heads_last(k), heads_last(v), four_dims(bias), four_dims(mask),
        scale=scale, is_causal=causal, implementation=implementation,
    )  # fmt: skip
    out = heads_last(out)
    if mask is not None:
        out = jnp.where(jnp.any(mask, axis=-1, keepdims=True), out, 0)
    return out


def _matmul_transposed(a: Any, b: Any) -> Any:
    """``a @ bᵀ``; for one row of ``a`` (a decode step) as one ``dot_general`` contracting
    both last axes, with no transposed copy of ``b``.

    Under ``jax.jit`` on the CPU, ``swapaxes`` + ``matmul`` copies a transposed ``b``
    first: a decode step against 8k–64k cached keys then takes 1.9–2.5 times as long as
    ``jnp.einsum``. With many rows the copy is amortised, and ``einsum`` inside the block
    fold's loops measured 1.3–1.4 times slower than ``matmul`` (causal Transformer-XL,
    Lq = 512, Lk = 1024): ``matmul`` there.
    """
    import jax.numpy as jnp

    if a.shape[-2] == 1:
        return jnp.einsum("...qd,...kd->...qk", a, b)
    return a @ jnp.swapaxes(b, -1, -2)


def _checkpoint(fn: Any, *args: Any) -> Any:
    import jax

    return jax.checkpoint(fn)(*args)


def _fori_loop(n: int, body: Any, carry: Any) -> Any:
    from jax import lax

    return lax.fori_loop(0, n, body, carry)


def _cond(pred: Any, true_fn: Any, false_fn: Any, operand: Any) -> Any:
    from jax import lax

    if isinstance(pred, bool):
        return true_fn(operand) if pred else false_fn(operand)
    return lax.cond(pred, true_fn, false_fn, operand)


def _map(fn: Any, n: int) -> Any:
    import jax.numpy as jnp
    from jax import lax

    return lax.map(fn, jnp.arange(n))


def _dynamic_slice(x: Any, start: Any, size: int, axis: int) -> Any:
    """``x[start : start + size]`` along ``axis`` for a traced ``start``, unless it broadcasts."""
    from jax import lax

    if x is None or x.ndim < -axis or x.shape[axis] == 1:
        return x
    return lax.dynamic_slice_in_dim(x, start, size, axis=x.ndim + axis)


def _axes(x: Any) -> frozenset[Any]:
    """The mesh axes ``x`` varies over inside ``shard_map`` (none outside it)."""
    import jax

    if x is None:
        return frozenset()
    aval = jax.typeof(x)
    varying = aval.vma if hasattr(aval, "vma") else aval.mat.varying  # JAX < 0.10 / >= 0.10
    return frozenset(varying)


def _align(x: Any, inputs: Any, extra: Any = ()) -> Any:
    """``x`` typed as varying over the mesh axes of ``inputs`` (and ``extra``) in ``shard_map``.

    ``shard_map`` types each value by the mesh axes it varies over, and a loop's
    carry or a ``lax.cond``'s branches must agree: a state built from constants
    varies over none, the blocks folded into it over the inputs' axes. ``None``
    stays ``None``; outside ``shard_map`` nothing varies and ``x`` is returned.
    """
    from jax import lax

    if x is None:
        return x
    axes = frozenset(extra)
    for a in inputs:
        axes |= _axes(a)
    missing = axes - _axes(x)
    if not missing:
        return x
    names = tuple(sorted(missing, key=str))
    if hasattr(lax, "pcast"):
        return lax.pcast(x, names, to="varying")
    return lax.pvary(x, names)  # type: ignore[attr-defined]  # JAX before lax.pcast (0.6)


class _Collective:
    """A ring over a mesh axis of the enclosing ``jax.shard_map``."""

    @staticmethod
    def axis_size(axis_name: Any) -> int:
        from jax import lax

        try:
            return int(lax.axis_size(axis_name))
        except NameError as e:
            raise ValueError(
                f"axis_name must name a mesh axis of the enclosing jax.shard_map, got "
                f"{axis_name!r} ({e})"
            ) from None

    @staticmethod
    def axis_index(axis_name: Any) -> Any:
        from jax import lax

        return lax.axis_index(axis_name)

    @staticmethod
    def rotate(x: Any, axis_name: Any) -> Any:
        """``x`` of device ``p`` sent to device ``p + 1`` (mod ``n``), every device at once;
        returns the function that gives what arrived (XLA schedules the transfer)."""
        from jax import lax

        n = _Collective.axis_size(axis_name)
        arrived = lax.ppermute(x, axis_name, [(j, (j + 1) % n) for j in range(n)])
        return lambda: arrived

    @staticmethod
    def depend(x: Any, others: Any) -> Any:
        """``x``: a JAX program's transposed transfers run whatever its branches take."""
        return x

    @staticmethod
    def all_to_all(x: Any, split_axis: int, concat_axis: int, axis_name: Any) -> Any:
        """``x`` split along ``split_axis`` into one part per device, part ``r`` to device
        ``r``, the parts received concatenated along ``concat_axis`` in device order."""
        from jax import lax

        return lax.all_to_all(x, axis_name, split_axis % x.ndim, concat_axis % x.ndim, tiled=True)

    @staticmethod
    def all_gather(x: Any, dim: int, axis_name: Any) -> Any:
        """Every device's ``x`` concatenated along ``dim`` in device order."""
        from jax import lax

        return lax.all_gather(x, axis_name, axis=dim % x.ndim, tiled=True)


def _fused_attention(q: Any, k: Any, v: Any) -> Any:
    """``jax.nn.dot_product_attention``: cuDNN's flash attention on an NVIDIA GPU for
    float16/bfloat16 where it takes the shapes, JAX's XLA implementation elsewhere.

    Offered for ``(B, H, L, d)`` inputs with ``d_v = d`` in float32 or a half dtype:
    the function computes its softmax in float32 whatever its inputs' dtype, so a
    float64 call keeps relattn's own path (SPEC §5: 1e-10 in float64). cuDNN needs
    ``d <= 128`` and a multiple of 8; a layout it still turns down runs the XLA
    implementation instead.
    """
    import jax
    import jax.numpy as jnp

    if q.dtype not in (jnp.float32, jnp.float16, jnp.bfloat16):
        return None
    if not (q.ndim == k.ndim == v.ndim == 4 and q.shape[:2] == k.shape[:2] == v.shape[:2]):
        return None
    if v.shape[-1] != q.shape[-1]:
        return None
    half = q.dtype != jnp.float32
    cudnn = half and jax.default_backend() == "gpu" and q.shape[-1] <= 128
    if cudnn and q.shape[-1] % 8 == 0:
        return functools.partial(_cudnn_or_xla, q, k, v)
    return functools.partial(_lower_right, q, k, v, implementation="xla")


def _lower_right(q: Any, k: Any, v: Any, *, causal: bool, mask: Any, **options: Any) -> Any:
    """:func:`dot_product_attention` whose ``causal`` is aligned to the last key (query
    ``i`` sees keys up to ``i + Lk - Lq``): JAX's ``is_causal`` aligns the first ones, so
    ``Lq != Lk`` passes the mask, made of two ranges inside the trace."""
    import jax.numpy as jnp

    lq, lk = q.shape[-2], k.shape[-2]
    if causal and lq != lk:
        rows = jnp.arange(lq)[:, None] + (lk - lq)
        causal_mask = jnp.arange(lk)[None, :] <= rows
        mask = causal_mask if mask is None else mask & causal_mask
        causal = False
    return dot_product_attention(q, k, v, causal=causal, mask=mask, **options)


def _cudnn_or_xla(
    q: Any, k: Any, v: Any, *, bias: Any, mask: Any, causal: bool, scale: float
) -> Any:
    options = {"bias": bias, "mask": mask, "causal": causal, "scale": scale}
    try:
        return _lower_right(q, k, v, **options, implementation="cudnn")
    except (NotImplementedError, ValueError, RuntimeError):
        return _lower_right(q, k, v, **options, implementation="xla")


def _free_memory(device: Any) -> int | None:
    """Free bytes on an accelerator (``Device.memory_stats``); ``None`` on a CPU or where
    the platform keeps no statistics."""
    if getattr(device, "platform", "cpu") == "cpu":
        return None
    stats = device.memory_stats() or {}
    if "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))


BACKEND = Backend(
    name="jax",
    stop_gradient=_stop_gradient,
    has_values=_has_values,
    query_chunks=False,
    checkpoint=_checkpoint,
    fori_loop=_fori_loop,
    staged=_staged,
    cond=_cond,
    map=_map,
    dynamic_slice=_dynamic_slice,
    align=_align,
    collective=_Collective,
    fused_attention=_fused_attention,
    kernel_name="jax.nn.dot_product_attention",
    kernels=(PALLAS,),
    free_memory=_free_memory,
    matmul_transposed=_matmul_transposed,
)


def random_parameter(init: str, std: float, shape: tuple[int, ...], key: Any, dtype: Any) -> Any:
    """A JAX array from one of ``relattn.layers.Parameter``'s initialisers (Flax NNX, Equinox).

    ``"normal"``: ``N(0, std²)``; ``"truncated_normal"``: the same cut at ``±2 std``, drawn
    within the cut; ``"zeros"``; ``"glorot_uniform"``: ``U(±√(6 / (shape[0] + shape[-1])))``.
    """
    import jax
    import jax.numpy as jnp

    if init == "zeros":
        return jnp.zeros(shape, dtype=dtype)
    if init == "normal":
        return std * jax.random.normal(key, shape, dtype=dtype)
    if init == "truncated_normal":
        return std * jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype=dtype)
    if init == "glorot_uniform":
        bound = (6.0 / (shape[0] + shape[-1])) ** 0.5
        return jax.random.uniform(key, shape, dtype=dtype, minval=-bound, maxval=bound)
    raise ValueError(
        f"init: expected one of normal, truncated_normal, zeros, glorot_uniform, got {init!r}"
    )
