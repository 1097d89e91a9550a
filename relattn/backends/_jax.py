"""JAX: immutable arrays, traced under ``jax.jit``, ``lax.stop_gradient``; cuDNN attention."""

from __future__ import annotations

from typing import Any

from ._base import Backend


def _stop_gradient(x: Any) -> Any:
    import jax

    return jax.lax.stop_gradient(x)


def _has_values(x: Any) -> bool:
    import jax

    return not isinstance(x, jax.core.Tracer)


def _from_host(a: Any, device: Any = None, chunks: Any = None) -> Any:
    import jax
    import numpy as np

    return jax.device_put(np.array(a, copy=True), device)


def _to_host(x: Any) -> Any:
    import numpy as np

    return np.asarray(x)


def _ready(x: Any) -> Any:
    import jax

    return jax.block_until_ready(x)


def _jit(fn: Any, **options: Any) -> Any:
    import jax

    return jax.jit(fn, **options)


def _device(kind: str) -> Any:
    import jax

    try:
        return jax.devices(kind)[0]
    except RuntimeError:
        raise LookupError(f"jax has no {kind.upper()} device") from None


def dot_product_attention(
    q: Any, k: Any, v: Any, *, bias: Any, mask: Any, scale: float, implementation: Any = None
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
        scale=scale, implementation=implementation,
    )  # fmt: skip
    out = heads_last(out)
    if mask is not None:
        out = jnp.where(jnp.any(mask, axis=-1, keepdims=True), out, 0)
    return out


def _fused_attention(q: Any, k: Any, v: Any, *, bias: Any, mask: Any, scale: float) -> Any:
    """cuDNN's flash attention on a GPU for float16/bfloat16, where it takes the shapes.

    ``jax.nn.dot_product_attention`` without ``implementation="cudnn"`` runs the
    same XLA graph as relattn's generic path, so it is used only where cuDNN can
    run: a CUDA default backend, a half dtype, ``d <= 128`` and a multiple of 8.
    """
    import jax
    import jax.numpy as jnp

    half = q.dtype in (jnp.float16, jnp.bfloat16)
    if not half or jax.default_backend() != "gpu" or q.shape[-1] > 128 or q.shape[-1] % 8:
        return None
    try:
        return dot_product_attention(
            q, k, v, bias=bias, mask=mask, scale=scale, implementation="cudnn"
        )
    except (NotImplementedError, ValueError, RuntimeError):
        return None  # a shape or layout cuDNN turns down: the generic path runs


BACKEND = Backend(
    name="jax",
    library="jax",
    module="jax.numpy",
    stop_gradient=_stop_gradient,
    has_values=_has_values,
    from_host=_from_host,
    to_host=_to_host,
    ready=_ready,
    jit=_jit,
    compile=_jit,
    device=_device,
    fused_attention=_fused_attention,
)
