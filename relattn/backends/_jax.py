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


def _peak_device_bytes(fn: Any, device: Any) -> int:
    """XLA's ``peak_bytes_in_use`` on ``device`` after ``fn()``, over ``bytes_in_use`` before.

    XLA keeps one peak per process and cannot reset it: the largest call made
    before on the same device shows through where it exceeds this one's.
    """
    import jax

    device = jax.devices()[0] if device is None else device
    stats = device.memory_stats()
    if not stats:
        raise LookupError(f"jax keeps no memory statistics on {device}")
    before = stats.get("bytes_in_use", 0)
    _ready(fn())
    peak = (device.memory_stats() or {}).get("peak_bytes_in_use", 0)
    return max(peak - before, 0)


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


def _checkpoint(fn: Any, *args: Any) -> Any:
    import jax

    return jax.checkpoint(fn)(*args)


def _pad_axis(x: Any, axis: int, size: int, value: Any = 0) -> Any:
    """``x`` padded with ``value`` to ``size`` along ``axis``, unless that axis broadcasts."""
    import jax.numpy as jnp

    if x is None or x.ndim < -axis or x.shape[axis] in (1, size):
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def _slice_axis(x: Any, start: Any, size: int, axis: int) -> Any:
    """``x[start : start + size]`` along ``axis`` for a traced ``start``, unless it broadcasts."""
    from jax import lax

    if x is None or x.ndim < -axis or x.shape[axis] == 1:
        return x
    return lax.dynamic_slice_in_dim(x, start, size, axis=x.ndim + axis)


def blockwise(blocks: Any, xp: Any, *, block_size: tuple[int, int], dtype: Any) -> Any:
    """relattn's blockwise path in JAX's own loops: one block step, compiled once.

    Query blocks run under ``lax.map`` (one after the other), each wrapped in
    ``jax.checkpoint`` so that the backward pass recomputes it; key blocks under
    ``lax.fori_loop``, with ``lax.cond`` skipping those wholly after a causal
    query block. Offsets are traced, so the block's table slices are gathers
    (:func:`relattn.blocks.relative_term`). Queries and keys are padded to whole
    blocks; padded keys are masked and padded queries dropped.
    """
    import jax
    import jax.numpy as jnp
    from jax import lax

    from .. import blocks as blk

    rel = blocks.rel
    lq, lk = rel.lq, rel.lk
    bq, bk = min(block_size[0], lq), min(block_size[1], lk)
    nq, nk = -(-lq // bq), -(-lk // bk)
    rows, cols = nq * bq, nk * bk
    padded = blk.Blocks(
        _pad_axis(blocks.q, -2, rows),
        _pad_axis(blocks.k, -2, cols),
        _pad_axis(blocks.v, -2, cols),
        rel,
        _pad_axis(blocks.qp, -2, rows),
        _pad_axis(blocks.ks, -2, cols),
        blocks.value_table,
        _pad_axis(_pad_axis(blocks.bias, -1, cols), -2, rows),
        _pad_axis(_pad_axis(blocks.mask, -1, cols, False), -2, rows, False),
    )
    key_limit = lk if cols != lk else None
    # Inside a shard_map the loop's carry must vary over the axes its inputs vary over.
    axes = _inputs_axes(
        blocks.q, blocks.k, blocks.v, blocks.qp, blocks.ks, blocks.value_table, blocks.bias,
        blocks.mask, rel.key_table, rel.query_table, rel.relative_bias,
    )  # fmt: skip
    offset = lk - lq
    lead, d_v = blocks.lead, blocks.v.shape[-1]
    work = blk.accumulator_dtype(dtype, xp)

    def query_block(iq: Any) -> Any:
        i0 = iq * bq
        q = _slice_axis(padded.q, i0, bq, -2)
        qp = _slice_axis(padded.qp, i0, bq, -2)
        bias = _slice_axis(padded.bias, i0, bq, -2) if _has_rows(padded.bias) else padded.bias
        mask = _slice_axis(padded.mask, i0, bq, -2) if _has_rows(padded.mask) else padded.mask

        def step(jk: Any, state: Any) -> Any:
            j0 = jk * bk
            block = (i0, bq, j0, bk)

            def fold(state: Any) -> Any:
                s = blk.pair_scores(
                    padded, q, _slice_axis(padded.k, j0, bk, -2), qp,
                    _slice_axis(padded.ks, j0, bk, -2), block, xp,
                    bias=_slice_axis(bias, j0, bk, -1), mask=_slice_axis(mask, j0, bk, -1),
                    key_limit=key_limit,
                )  # fmt: skip
                v = _slice_axis(padded.v, j0, bk, -2)
                return blk.block_step(
                    state, s, v, xp, value_table=blk.value_slice(padded, block, xp)
                )

            if not rel.causal:
                return fold(state)
            return lax.cond(j0 <= i0 + bq - 1 + offset, fold, lambda state: state, state)

        start = blk.block_start((*lead, bq, d_v), work, None, xp)
        start = blk.BlockState(*(_varying(x, axes) for x in start))
        return blk.block_finish(lax.fori_loop(0, nk, step, start), dtype, xp)

    outputs = lax.map(jax.checkpoint(query_block), jnp.arange(nq))  # (nq, *lead, bq, d_v)
    out = jnp.reshape(jnp.moveaxis(outputs, 0, -3), (*lead, rows, d_v))
    return out[..., :lq, :]


def _axes(x: Any) -> frozenset[Any]:
    """The mesh axes ``x`` varies over inside ``shard_map`` (none outside it)."""
    import jax

    if x is None:
        return frozenset()
    aval = jax.typeof(x)
    varying = aval.vma if hasattr(aval, "vma") else aval.mat.varying  # JAX < 0.10 / >= 0.10
    return frozenset(varying)


def _varying(x: Any, axes: frozenset[Any]) -> Any:
    """``x`` typed as varying over ``axes`` inside ``shard_map`` (``None`` stays ``None``).

    ``shard_map`` types each value by the mesh axes it varies over, and a loop's
    carry or a ``lax.cond``'s branches must agree: a state built from constants
    varies over none, the blocks folded into it over the inputs' axes.
    """
    from jax import lax

    missing = axes - _axes(x)
    if x is None or not missing:
        return x
    return lax.pcast(x, tuple(sorted(missing, key=str)), to="varying")


def _inputs_axes(*arrays: Any) -> frozenset[Any]:
    axes: frozenset[Any] = frozenset()
    for x in arrays:
        axes |= _axes(x)
    return axes


class _Ring:
    """relattn's ring attention on a JAX mesh axis (:func:`relattn.ring_attention`)."""

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
    def attend(
        q: Any, k: Any, v: Any, xp: Any, *, axis_name: Any, scale: Any, mask: Any, causal: bool,
        **terms: Any,
    ) -> Any:  # fmt: skip
        """``n`` steps: fold the key block at hand, pass it on to the next device."""
        from jax import lax

        from .. import blocks as blk

        n = _Ring.axis_size(axis_name)
        bq, bk = q.shape[-2], k.shape[-2]
        # Every operand varies over the ring's axis: replicated tables and masks are cast
        # to varying here, once, so that their cotangents are summed over the devices
        # here too (a psum), and not inside a lax.cond branch that some devices skip.
        axes = _inputs_axes(q, k, v) | {axis_name}
        terms = {name: _varying(x, axes) for name, x in terms.items()}
        mask = _varying(mask, axes)
        q, k, v = (_varying(x, axes) for x in (q, k, v))
        problem = blk.problem(
            q, k, v, xp, scale=scale, lq=n * bq, lk=n * bk, causal=causal, **terms
        )
        rel = problem.rel
        me = lax.axis_index(axis_name)
        i0 = me * bq
        offset = rel.lk - rel.lq
        work = blk.accumulator_dtype(xp.result_type(q, v), xp)
        state = blk.block_start((*problem.lead, bq, v.shape[-1]), work, None, xp)
        # shard_map types each value by the mesh axes it varies over: the state varies like
        # the blocks folded into it (both branches of the cond below must agree).
        state = blk.BlockState(*(_varying(x, axes) for x in state))
        ring = [(j, (j + 1) % n) for j in range(n)]
        mask = _slice_axis(mask, i0, bq, -2) if _has_rows(mask) else mask
        keys, values = k, v
        for step in range(n):
            j0 = ((me - step) % n) * bk  # the block at hand started on device me - step
            block = (i0, bq, j0, bk)

            def fold(state: Any, keys=keys, values=values, block=block):
                # DeBERTa's position-to-content term reads the scaled keys: scaled here,
                # not passed round the ring beside the keys.
                scaled_keys = None if problem.ks is None else keys * scale
                s = blk.pair_scores(
                    problem, problem.q, keys, problem.qp, scaled_keys, block, xp,
                    mask=_slice_axis(mask, block[2], bk, -1),
                )  # fmt: skip
                table = blk.value_slice(problem, block, xp)
                return blk.block_step(state, s, values, xp, value_table=table)

            if rel.causal:
                visible = j0 <= i0 + bq - 1 + offset
                state = lax.cond(visible, fold, lambda state: state, state)
            else:
                state = fold(state)
            if step < n - 1:
                keys, values = lax.ppermute((keys, values), axis_name, ring)
        return blk.block_finish(state, xp.result_type(q, v), xp)


def _has_rows(x: Any) -> bool:
    return x is not None and x.ndim >= 2 and x.shape[-2] != 1


def _fused_attention(q: Any, k: Any, v: Any) -> Any:
    """cuDNN's flash attention on a GPU for float16/bfloat16, where it takes the shapes.

    ``jax.nn.dot_product_attention`` without ``implementation="cudnn"`` runs the
    same XLA graph as relattn's generic path, so the kernel is offered only
    where cuDNN can run: a CUDA default backend, a half dtype, ``d <= 128`` and
    a multiple of 8, ``(B, H, L, d)`` inputs with ``d_v = d``. A layout cuDNN
    still turns down runs JAX's XLA implementation instead.
    """
    import functools

    import jax
    import jax.numpy as jnp

    half = q.dtype in (jnp.float16, jnp.bfloat16)
    if not half or jax.default_backend() != "gpu" or q.shape[-1] > 128 or q.shape[-1] % 8:
        return None
    if not (q.ndim == k.ndim == v.ndim == 4 and q.shape[:2] == k.shape[:2] == v.shape[:2]):
        return None
    if v.shape[-1] != q.shape[-1]:
        return None
    return functools.partial(_cudnn_or_xla, q, k, v)


def _cudnn_or_xla(q: Any, k: Any, v: Any, *, bias: Any, mask: Any, scale: float) -> Any:
    try:
        return dot_product_attention(
            q, k, v, bias=bias, mask=mask, scale=scale, implementation="cudnn"
        )
    except (NotImplementedError, ValueError, RuntimeError):
        return dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale)


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
    query_chunks=False,
    checkpoint=_checkpoint,
    blockwise=blockwise,
    ring_attention=_Ring,
    fused_attention=_fused_attention,
    peak_device_bytes=_peak_device_bytes,
)
