"""Transforms and invariants of every public compute function.

- ``jax.jit`` and ``torch.compile`` of every function in ``relattn.__all__`` equal the eager
  result;
- ``torch.autograd.gradcheck`` and ``jax.grad`` (against central differences)
  through attention, softmax and the shift, fully masked rows included;
- fully masked rows are exactly 0 and never NaN, in every dtype a backend has;
- inputs are never written to, and torch inputs keep their autograd graph;
- results are arrays of the caller's library, on the caller's device, for
  ``xp`` given as the library module or as its array-api-compat namespace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import array_api_compat
import numpy as np
import pytest
import reference as ref

import relattn
from relattn.capabilities import SETTINGS, unsupported
from relattn.testing import skip_unless_capable

# --------------------------------------------------------------------------------------------
# The table of cases: one or more per public name.
#
# ``inputs(rng)`` builds the array arguments in NumPy (floating ones are cast to the test dtype,
# boolean and integer ones keep their dtype); ``call(backend, dtype, *arrays)`` calls relattn with
# every static argument (lengths, ``xp``, ``device`` ...) closed over, so that ``jax.jit`` sees the
# arrays alone.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    inputs: Callable[[np.random.Generator], tuple[np.ndarray, ...]]
    call: Callable[..., Any]


def _none(rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    return ()


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.normal(size=shape)


def _mask(lq: int, lk: int, empty_row: int, rng: np.random.Generator) -> np.ndarray:
    """A random boolean (lq, lk) mask with row ``empty_row`` fully masked, others non-empty."""
    mask = rng.random((lq, lk)) < 0.6
    mask[:, 0] = True
    mask[empty_row] = False
    return mask


def _order_inputs(rng: np.random.Generator, length: int, d: int) -> tuple[np.ndarray, ...]:
    """Amplitude, frequency, phase ``(length, d)`` and positions ``(length,)``."""
    return (
        rng.uniform(0.5, 1.5, size=(length, d)),
        rng.normal(scale=0.5, size=(length, d)),
        rng.uniform(-3, 3, size=(length, d)),
        np.arange(length, dtype=np.float64),
    )


def _parts(backend: Any, z: Any) -> Any:
    """Real and imaginary parts side by side: a real result the table's checks can use."""
    xp = backend.xp
    return xp.concat((xp.real(z), xp.imag(z)), axis=-1)


def _complex_attention(order: tuple[Any, ...], mask: Any, **variant: Any) -> Any:
    x = relattn.complex_order_embedding(*order)  # (5, d) complex: keys and values
    return relattn.complex_attention(x[:3, :], x, x, mask=mask, **variant)


#: Creation functions: ``f(xp, device, dtype)``, ``dtype`` the library's floating dtype.
CREATION: dict[str, Callable[[Any, Any, Any], Any]] = {
    "mixed_rotary_frequencies": lambda xp, dev, dt: relattn.mixed_rotary_frequencies(
        8, 2, angles=[0.5, 1.0], dtype=dt, device=dev, xp=xp
    ),
    "grid_positions": lambda xp, dev, dt: relattn.grid_positions(2, 3, xp=xp, device=dev),
    "grid_positions[merge_size]": lambda xp, dev, dt: relattn.grid_positions(
        4, 4, merge_size=2, xp=xp, device=dev
    ),
    "grid_positions[reference_shape]": lambda xp, dev, dt: relattn.grid_positions(
        3, 3, reference_shape=(4, 4), dtype=dt, device=dev, xp=xp
    ),
    "grid_relative_index[class_token]": lambda xp, dev, dt: relattn.grid_relative_index(
        2, 3, class_token=True, xp=xp, device=dev
    ),
    "shifted_window_mask": lambda xp, dev, dt: relattn.shifted_window_mask(
        4, 6, 2, 1, xp=xp, device=dev
    ),
    "continuous_position_coordinates": lambda xp, dev, dt: relattn.continuous_position_coordinates(
        (2, 3), pretrained_window=4, dtype=dt, device=dev, xp=xp
    ),
    "sinusoidal_position_encoding[count]": lambda xp, dev, dt: relattn.sinusoidal_position_encoding(
        5, 6, dtype=dt, device=dev, xp=xp
    ),
    "relative_distances": lambda xp, dev, dt: relattn.relative_distances(3, 5, xp=xp, device=dev),
    "relative_distances[causal]": lambda xp, dev, dt: relattn.relative_distances(
        4, 3, causal=True, xp=xp, device=dev
    ),
    "relative_positions": lambda xp, dev, dt: relattn.relative_positions(3, 5, xp=xp, device=dev),
    "causal_mask": lambda xp, dev, dt: relattn.causal_mask(4, 3, xp=xp, device=dev),
    "forward_mask": lambda xp, dev, dt: relattn.forward_mask(4, xp=xp, device=dev),
    "backward_mask": lambda xp, dev, dt: relattn.backward_mask(4, xp=xp, device=dev),
    "diagonal_disabled_mask": lambda xp, dev, dt: relattn.diagonal_disabled_mask(
        4, xp=xp, device=dev
    ),
    "local_window_mask": lambda xp, dev, dt: relattn.local_window_mask(3, 5, 1, xp=xp, device=dev),
    "alibi_slopes": lambda xp, dev, dt: relattn.alibi_slopes(6, dtype=dt, device=dev, xp=xp),
    "inverse_frequencies": lambda xp, dev, dt: relattn.inverse_frequencies(
        4, dtype=dt, device=dev, xp=xp
    ),
    # the frequencies; the attention factor is a Python float
    "rope_frequencies[yarn]": lambda xp, dev, dt: relattn.rope_frequencies(
        8, scaling="yarn", factor=4.0, original_max_position=64, dtype=dt, device=dev, xp=xp
    )[0],
}
#: Creation functions whose result has the floating ``dtype`` they are given.
FLOATING_CREATION = (
    "mixed_rotary_frequencies",
    "continuous_position_coordinates",
    "grid_positions[reference_shape]",
    "sinusoidal_position_encoding", "alibi_slopes", "inverse_frequencies", "rope_frequencies",
)  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _process_group():
    """A torch.distributed group of this process alone, for ``ring_attention`` on torch
    (made here, not in the call: ``torch.compile`` traces the call)."""
    try:
        import torch.distributed as dist
    except ImportError:
        yield
        return
    if not (dist.is_available() and dist.is_gloo_available()):
        yield
        return
    from relattn.testing import single_process_group

    with single_process_group():
        yield


def _ring_call(b: Any, dt: str, q: Any, k: Any, v: Any, table: Any) -> Any:
    """``ring_attention`` on one device: in ``jax.shard_map`` on a one-device mesh, or on
    torch over a gloo group of this process alone (``test_devices.py`` and
    ``test_torch_ring.py`` run rings of 2, 4 and 8); the other libraries skip."""
    skip_unless_capable(b, "ring_attention", "run")
    if b.is_torch:  # in the gloo group of one of _process_group
        return relattn.ring_attention(q, k, v, table, causal=True, sharding="zigzag")
    import jax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:1]), ("seq",))
    ring = jax.shard_map(
        lambda q, k, v, t: relattn.ring_attention(q, k, v, t, axis_name="seq", causal=True),
        mesh=mesh,
        in_specs=(P(None, "seq"), P(None, "seq"), P(None, "seq"), P()),
        out_specs=P(None, "seq"),
    )
    return ring(q, k, v, table)


def _ulysses_call(b: Any, dt: str, q: Any, k: Any, v: Any, table: Any) -> Any:
    """``ulysses_attention`` on one device, as :func:`_ring_call` runs the ring
    (``test_ulysses.py`` runs it on 2, 4 and 8)."""
    skip_unless_capable(b, "ulysses_attention", "run")
    if b.is_torch:  # in the gloo group of one of _process_group
        return relattn.ulysses_attention(q, k, v, table, causal=True)
    import jax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:1]), ("seq",))
    seq = P(None, None, "seq")
    ulysses = jax.shard_map(
        lambda q, k, v, t: relattn.ulysses_attention(q, k, v, t, axis_name="seq", causal=True),
        mesh=mesh,
        in_specs=(seq, seq, seq, P()),
        out_specs=seq,
    )
    return ulysses(q, k, v, table)


def _block(b: Any, q: Any, k: Any, v: Any, t: Any, *, i0: int, j0: int) -> Any:
    """The statistics of queries ``[i0, i0 + 2)`` of 4 over one block of 6 keys from ``j0``."""
    return relattn.attention_block(
        q, k, v, t, query_start=i0, key_start=j0, query_length=4, key_length=6
    )


def _state(rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """A block state of 3 queries: accumulator, running peak and (positive) total."""
    return _normal(rng, 2, 3, 4), _normal(rng, 2, 3, 1), rng.uniform(0.5, 2.0, size=(2, 3, 1))


def _block_inputs(rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Queries [2, 4) of 4, keys [0, 3) and [3, 6) of 6; a full-layout table (W = 9)."""
    return (_normal(rng, 2, 2, 4), _normal(rng, 2, 6, 4), _normal(rng, 2, 6, 3),
            _normal(rng, 9, 4))  # fmt: skip


def _creation_case(make: Callable[[Any, Any, Any], Any]) -> Case:
    return Case(_none, lambda b, dt: make(b.lib, b.device, b.dtype(dt)))


CASES: dict[str, Case] = {name: _creation_case(make) for name, make in CREATION.items()}
CASES.update(
    {
        "fire_bias": Case(
            lambda r: (
                np.arange(3, 6),
                np.arange(6),
                _normal(r, 1, 4),
                _normal(r, 4),
                _normal(r, 4, 3),
                _normal(r, 3),
                np.array(0.5),
                np.array(3.5),
            ),
            lambda b, dt, qp, kp, w1, b1, w2, b2, c, t: relattn.fire_bias(
                qp, kp, [w1, w2], [b1, b2], c, t
            ),
        ),
        "fire_score_mod": Case(
            lambda r: (
                _normal(r, 3, 4, 4),
                _normal(r, 3, 6, 4),
                _normal(r, 3, 6, 2),
                _normal(r, 1, 4),
                _normal(r, 4),
                _normal(r, 4, 3),
                _normal(r, 3),
                np.array(0.5),
                np.array(3.5),
            ),
            lambda b, dt, q, k, v, w1, b1, w2, b2, c, t: relattn.scaled_dot_product_attention(
                q,
                k,
                v,
                causal=True,
                block_size=4,
                score_mod=relattn.fire_score_mod([w1, w2], [b1, b2], c, t),
            ),
        ),
        "dynamic_position_bias": Case(
            lambda r: (
                np.arange(-6, 1),
                _normal(r, 1, 4),
                _normal(r, 4),
                _normal(r, 4, 4),
                _normal(r, 4),
                _normal(r, 4, 3),
                _normal(r, 3),
            ),
            lambda b, dt, d, w1, b1, w2, b2, w3, b3: relattn.dynamic_position_bias(
                d, [w1, w2, w3], [b1, b2, b3], log_distance=True
            ),
        ),
        "cope_bias": Case(
            lambda r: (_normal(r, 2, 3, 4), _normal(r, 2, 6, 4), _normal(r, 5, 4)),
            lambda b, dt, q, k, e: relattn.cope_bias(q, k, e),
        ),
        "xpos_embedding": Case(
            lambda r: (_normal(r, 2, 5, 8), np.array([3.0, 4.0, 5.0, 6.0, 7.0])),
            lambda b, dt, x, p: relattn.xpos_embedding(x, p, layout="interleaved", centre=4.0),
        ),
        "xpos_embedding[keys,concatenated,partial]": Case(
            lambda r: (_normal(r, 2, 5, 8),),
            lambda b, dt, x: relattn.xpos_embedding(
                x, layout="concatenated", downscale=True, rotary_dim=4
            ),
        ),
        "multimodal_rotary_embedding": Case(
            lambda r: (_normal(r, 2, 5, 8), r.integers(0, 20, size=(5, 3))),
            lambda b, dt, x, p: relattn.multimodal_rotary_embedding(x, p, mrope_section=[2, 1, 1]),
        ),
        "axial_rotary_embedding": Case(
            lambda r: (_normal(r, 2, 7, 8), np.indices((3, 2)).reshape(2, -1).T.copy()),
            lambda b, dt, x, p: relattn.axial_rotary_embedding(
                x, p, layout="interleaved", base=100.0, prefix_tokens=1
            ),
        ),
        "mixed_rotary_embedding": Case(
            lambda r: (_normal(r, 2, 2, 5, 8), r.uniform(0, 3, size=(5, 2)), _normal(r, 2, 2, 4)),
            lambda b, dt, x, p, f: relattn.mixed_rotary_embedding(x, p, f, layout="concatenated"),
        ),
        "rope_index": Case(
            lambda r: (np.array([[1, 2, 7, 7, 7, 7, 3]]), np.array([[1, 4, 4]])),
            lambda b, dt, ids, g: relattn.rope_index(
                ids, image_token_id=7, video_token_id=8, image_grid_thw=g
            )[0],
        ),
        "decomposed_relative_attention": Case(
            lambda r: (
                _normal(r, 2, 6, 4),
                _normal(r, 2, 2, 4),
                _normal(r, 2, 2, 3),
                _normal(r, 3, 4),
                _normal(r, 5, 4),
            ),
            lambda b, dt, q, k, v, th, tw: relattn.decomposed_relative_attention(
                q, k, v, th, tw, query_grid=(2, 3), key_grid=(1, 2), block_size=4
            ),
        ),
        "decomposed_relative_attention[dense]": Case(
            lambda r: (
                _normal(r, 2, 6, 4),
                _normal(r, 2, 2, 4),
                _normal(r, 2, 2, 3),
                _normal(r, 3, 4),
                _normal(r, 5, 4),
            ),
            lambda b, dt, q, k, v, th, tw: relattn.decomposed_relative_attention(
                q, k, v, th, tw, query_grid=(2, 3), key_grid=(1, 2)
            ),
        ),
        "decomposed_relative_terms": Case(
            lambda r: (_normal(r, 2, 6, 4), _normal(r, 3, 4), _normal(r, 5, 4)),
            lambda b, dt, q, th, tw: (lambda h, w: h[..., :1] + w[..., :1])(
                *relattn.decomposed_relative_terms(q, th, tw, (2, 3), (1, 2))
            ),
        ),
        "resize_relative_table": Case(
            lambda r: (_normal(r, 3, 4),),
            lambda b, dt, t: relattn.resize_relative_table(t, 7),
        ),
        "grid_relative_bias": Case(
            lambda r: (_normal(r, 3, 15),),
            lambda b, dt, t: relattn.grid_relative_bias(t, 3, 2),
        ),
        "grid_relative_bias[class_token]": Case(
            lambda r: (_normal(r, 2, 28),),
            lambda b, dt, t: relattn.grid_relative_bias(t, 3, 3, class_token=True),
        ),
        "grid_bias_mod": Case(
            lambda r: (
                _normal(r, 2, 2, 7, 4),
                _normal(r, 2, 2, 7, 4),
                _normal(r, 2, 2, 7, 3),
                _normal(r, 2, 18),
            ),
            lambda b, dt, q, k, v, t: relattn.scaled_dot_product_attention(
                q, k, v, score_mod=relattn.grid_bias_mod(t, 2, 3, class_token=True), block_size=4
            ),
        ),
        "window_partition": Case(
            lambda r: (_normal(r, 2, 4, 6, 3),),
            lambda b, dt, x: relattn.window_partition(x, (2, 3)),
        ),
        "window_merge": Case(
            lambda r: (_normal(r, 8, 6, 3),),
            lambda b, dt, w: relattn.window_merge(w, (2, 3), 4, 6),
        ),
        "zigzag_shard": Case(
            lambda r: (_normal(r, 2, 8, 3),),
            lambda b, dt, x: relattn.zigzag_shard(x, 2, axis=-2),
        ),
        "zigzag_unshard": Case(
            lambda r: (_normal(r, 3, 12),),
            lambda b, dt, x: relattn.zigzag_unshard(x, 3, axis=-1),
        ),
        "continuous_position_bias": Case(
            lambda r: (_normal(r, 3, 15),),
            lambda b, dt, v: relattn.continuous_position_bias(v, 2, 3),
        ),
        "sinusoidal_position_encoding[array]": Case(
            lambda r: (np.array([-3.0, -1.5, 0.0, 2.0, 7.0]),),
            lambda b, dt, p: relattn.sinusoidal_position_encoding(p, 6, layout="concatenated"),
        ),
        "padding_mask": Case(
            lambda r: (np.array([0, 2, 5]),),
            lambda b, dt, lengths: relattn.padding_mask(lengths, 4),
        ),
        "mask_to_bias": Case(
            lambda r: (_mask(3, 4, 1, r),),
            lambda b, dt, m: relattn.mask_to_bias(m, dtype=b.dtype(dt)),
        ),
        "masked_softmax": Case(
            lambda r: (_normal(r, 2, 3, 4), _mask(3, 4, 1, r)),
            lambda b, dt, s, m: relattn.masked_softmax(s, m),
        ),
        "masked_softmax[axis]": Case(
            lambda r: (_normal(r, 2, 3, 4),),
            lambda b, dt, s: relattn.masked_softmax(s, axis=-2),
        ),
        "scaled_dot_product_attention": Case(
            lambda r: (
                _normal(r, 2, 3, 4),
                _normal(r, 2, 5, 4),
                _normal(r, 2, 5, 3),
                _mask(3, 5, 2, r),
                _normal(r, 3, 5),
            ),
            lambda b, dt, q, k, v, m, bias: relattn.scaled_dot_product_attention(
                q, k, v, mask=m, bias=bias
            ),
        ),
        "relative_scores": Case(
            lambda r: (_normal(r, 2, 3, 4), _normal(r, 6, 4), _normal(r, 4)),
            lambda b, dt, q, t, bias: relattn.relative_scores(q, t, 4, bias=bias),
        ),
        "relative_table": Case(
            lambda r: (_normal(r, 5, 4),),
            lambda b, dt, t: relattn.relative_table(t, 3, 4),
        ),
        "relative_table[zero,causal]": Case(
            lambda r: (_normal(r, 2, 3, 4),),
            lambda b, dt, t: relattn.relative_table(t, 3, 5, causal=True, out_of_range="zero"),
        ),
        "rel_shift": Case(
            lambda r: (_normal(r, 2, 3, 6),),
            lambda b, dt, x: relattn.rel_shift(x, 4),
        ),
        "rel_shift[causal]": Case(
            lambda r: (_normal(r, 2, 3, 4),),
            lambda b, dt, x: relattn.rel_shift(x, 4),
        ),
        "rel_unshift": Case(
            lambda r: (_normal(r, 2, 3, 4),),
            lambda b, dt, x: relattn.rel_unshift(x),
        ),
        "relative_attention[causal]": Case(
            lambda r: (
                _normal(r, 2, 3, 4),
                _normal(r, 2, 5, 4),
                _normal(r, 2, 5, 3),
                _normal(r, 5, 4),
                _normal(r, 4),
                _normal(r, 2, 1, 4),
                _mask(3, 5, 0, r),
            ),
            lambda b, dt, q, k, v, t, u, pb, m: relattn.relative_attention(
                q, k, v, t, content_bias=u, position_bias=pb, mask=m
            ),
        ),
        "relative_attention[full]": Case(
            lambda r: (
                _normal(r, 2, 3, 4),
                _normal(r, 2, 4, 4),
                _normal(r, 2, 4, 3),
                _normal(r, 2, 6, 4),
                _normal(r, 2, 1, 4),
                _normal(r, 4),
                _mask(3, 4, 1, r),
            ),
            lambda b, dt, q, k, v, t, u, pb, m: relattn.relative_attention(
                q, k, v, t, content_bias=u, position_bias=pb, mask=m, scale=1.0
            ),
        ),
        "split_heads": Case(
            lambda r: (_normal(r, 2, 3, 8),),
            lambda b, dt, x: relattn.split_heads(x, 2),
        ),
        "merge_heads": Case(
            lambda r: (_normal(r, 2, 2, 3, 4),),
            lambda b, dt, x: relattn.merge_heads(x),
        ),
        "update_memory": Case(
            lambda r: (_normal(r, 2, 3, 4), _normal(r, 2, 2, 4)),
            lambda b, dt, m, h: relattn.update_memory(m, h, 4),
        ),
        "update_memory[first]": Case(
            lambda r: (_normal(r, 2, 3, 4),), lambda b, dt, h: relattn.update_memory(None, h, 2)
        ),
        "stop_gradient": Case(
            lambda r: (_normal(r, 3, 4),), lambda b, dt, x: relattn.stop_gradient(x)
        ),
        "shaw_attention": Case(
            lambda r: (
                _normal(r, 2, 3, 4),
                _normal(r, 2, 5, 4),
                _normal(r, 2, 5, 3),
                _normal(r, 5, 4),
                _normal(r, 3, 3),
                _mask(3, 5, 1, r),
            ),
            lambda b, dt, q, k, v, tk, tv, m: relattn.shaw_attention(q, k, v, tk, tv, mask=m),
        ),
        "complex_order_embedding": Case(
            lambda r: _order_inputs(r, 3, 4),
            lambda b, dt, *a: _parts(b, relattn.complex_order_embedding(*a)),
        ),
        "complex_linear": Case(
            lambda r: (*_order_inputs(r, 3, 4), *_order_inputs(r, 4, 2)),
            lambda b, dt, *a: _parts(
                b,
                relattn.complex_linear(
                    relattn.complex_order_embedding(*a[:4]),
                    relattn.complex_order_embedding(*a[4:]),
                ),
            ),
        ),
        "complex_attention": Case(
            lambda r: (*_order_inputs(r, 5, 4), _mask(3, 5, 2, r)),
            lambda b, dt, *a: _parts(b, _complex_attention(a[:4], a[4])),
        ),
        "complex_attention[modulus]": Case(
            lambda r: _order_inputs(r, 5, 4),
            lambda b, dt, *a: _parts(
                b, _complex_attention(a, None, conjugate=False, reduction="modulus")
            ),
        ),
        "multi_dimensional_attention": Case(
            lambda r: (
                _normal(r, 2, 4, 3),
                *(_normal(r, 3, 3), _normal(r, 3, 3), _normal(r, 3)),
                *(_normal(r, 3, 3), _normal(r, 3, 3), _normal(r, 3)),
            ),
            lambda b, dt, h, w1, w2, b1, ws, wh, bf: relattn.multi_dimensional_attention(
                h, w1, w2, b1, direction="forward", fusion=(ws, wh, bf), chunk_size=2
            ),
        ),
        "source2token_attention": Case(
            lambda r: (
                _normal(r, 2, 4, 3),
                *(_normal(r, 3, 3), _normal(r, 3), _normal(r, 3, 3), _normal(r, 3)),
                np.array([True, True, False, True]),
            ),
            lambda b, dt, h, w1, b1, w, bias, m: relattn.source2token_attention(
                h, w1, b1, w, bias, mask=m
            ),
        ),
        "dot_product_scores": Case(
            lambda r: (_normal(r, 2, 3, 4), _normal(r, 2, 5, 4)),
            lambda b, dt, q, k: relattn.dot_product_scores(q, k),
        ),
        "scaled_dot_product_scores": Case(
            lambda r: (_normal(r, 2, 3, 4), _normal(r, 5, 4)),
            lambda b, dt, q, k: relattn.scaled_dot_product_scores(q, k),
        ),
        "bilinear_scores": Case(
            lambda r: (_normal(r, 2, 3, 4), _normal(r, 2, 5, 3), _normal(r, 4, 3)),
            lambda b, dt, q, k, w: relattn.bilinear_scores(q, k, w),
        ),
        "additive_scores": Case(
            lambda r: (
                _normal(r, 2, 3, 4),
                _normal(r, 2, 5, 3),
                _normal(r, 4, 6),
                _normal(r, 3, 6),
                _normal(r, 6),
                _normal(r, 6),
            ),
            lambda b, dt, q, k, wq, wk, v, bias: relattn.additive_scores(
                q, k, wq, wk, v, bias=bias, chunk_size=2
            ),
        ),
        "cosine_scores": Case(
            lambda r: (_normal(r, 2, 3, 4), _normal(r, 2, 5, 4)),
            lambda b, dt, q, k: relattn.cosine_scores(q, k),
        ),
        "location_scores": Case(
            lambda r: (_normal(r, 2, 3, 4), _normal(r, 4, 7)),
            lambda b, dt, q, w: relattn.location_scores(q, w),
        ),
        "predicted_positions": Case(
            lambda r: (_normal(r, 2, 3, 4), _normal(r, 4, 5), _normal(r, 5)),
            lambda b, dt, q, w, v: relattn.predicted_positions(q, w, v, 6),
        ),
        "local_p_weights": Case(
            lambda r: (_normal(r, 2, 3, 6), 5 * r.random((2, 3))),
            lambda b, dt, scores, p: relattn.local_p_weights(scores, p, 2),
        ),
        "relative_bias_matrix": Case(
            lambda r: (_normal(r, 2, 6),), lambda b, dt, x: relattn.relative_bias_matrix(x, 3, 4)
        ),
        "relative_bias_matrix[causal]": Case(
            lambda r: (_normal(r, 2, 4),), lambda b, dt, x: relattn.relative_bias_matrix(x, 3, 4)
        ),
        "relative_position_bucket": Case(
            lambda r: (np.arange(-20, 21),),
            lambda b, dt, d: relattn.relative_position_bucket(d, num_buckets=8, max_distance=12),
        ),
        "relative_position_bucket[unidirectional]": Case(
            lambda r: (np.arange(-20, 21),),
            lambda b, dt, d: relattn.relative_position_bucket(
                d, num_buckets=8, max_distance=12, bidirectional=False
            ),
        ),
        "log_bucket_position": Case(
            lambda r: (np.arange(-40, 41),),
            lambda b, dt, d: relattn.log_bucket_position(d, bucket_size=8, max_position=32),
        ),
        "kerple_bias[log]": Case(
            lambda r: (np.arange(-6, 7), r.uniform(0.5, 2, 3), r.uniform(0.5, 2, 3)),
            lambda b, dt, d, r1, r2: relattn.kerple_bias(d, r1, r2, kind="log"),
        ),
        "kerple_bias[power]": Case(
            lambda r: (np.arange(-6, 1), r.uniform(0.5, 2, 3), r.uniform(0.2, 2, 3)),
            lambda b, dt, d, r1, r2: relattn.kerple_bias(d, r1, r2, kind="power"),
        ),
        "sandwich_bias": Case(
            lambda r: (np.arange(-40, 41),),
            lambda b, dt, d: relattn.sandwich_bias(d, 16, num_heads=4, dtype=b.dtype(dt)),
        ),
        "rotary_position_embedding": Case(
            lambda r: (_normal(r, 2, 5, 8), np.array([3.0, 4.0, 5.0, 6.0, 7.0])),
            lambda b, dt, x, p: relattn.rotary_position_embedding(x, p, layout="interleaved"),
        ),
        "rotary_position_embedding[concatenated,partial]": Case(
            lambda r: (_normal(r, 2, 5, 8),),
            lambda b, dt, x: relattn.rotary_position_embedding(
                x, layout="concatenated", rotary_dim=4
            ),
        ),
        "disentangled_attention": Case(
            lambda r: (
                _normal(r, 2, 3, 4),
                _normal(r, 2, 5, 4),
                _normal(r, 2, 5, 3),
                _normal(r, 7, 4),
                _normal(r, 7, 4),
                _mask(3, 5, 1, r),
            ),
            lambda b, dt, q, k, v, kr, qr, m: relattn.disentangled_attention(
                q, k, v, kr, qr, mask=m
            ),
        ),
        "disentangled_attention[causal,blockwise]": Case(
            lambda r: (
                _normal(r, 2, 5, 4),
                _normal(r, 2, 5, 4),
                _normal(r, 2, 5, 3),
                _normal(r, 9, 4),
                _normal(r, 9, 4),
            ),
            lambda b, dt, q, k, v, kr, qr: relattn.disentangled_attention(
                q, k, v, kr, qr, causal=True, block_size=2
            ),
        ),
        "attention_block": Case(
            _block_inputs,
            lambda b, dt, q, k, v, t: relattn.finish_block_state(
                _block(b, q, k[:, :3, :], v[:, :3, :], t, i0=2, j0=0)
            ),
        ),
        "merge_block_states": Case(
            _block_inputs,
            lambda b, dt, q, k, v, t: relattn.finish_block_state(
                relattn.merge_block_states(
                    _block(b, q, k[:, :3, :], v[:, :3, :], t, i0=2, j0=0),
                    _block(b, q, k[:, 3:, :], v[:, 3:, :], t, i0=2, j0=3),
                )
            ),
        ),
        "finish_block_state": Case(
            lambda r: _state(r)[::2],  # the accumulator and total; the peak is not read
            lambda b, dt, a, t: relattn.finish_block_state(
                relattn.BlockState(a, b.xp.zeros_like(t), t)
            ),
        ),
        "BlockState": Case(
            _state,
            lambda b, dt, a, p, t: relattn.finish_block_state(
                relattn.merge_block_states(
                    relattn.BlockState(a, p, t), relattn.BlockState(0.5 * a, p - 1.0, t)
                )
            ),
        ),
        "ring_attention": Case(
            lambda r: (
                _normal(r, 2, 4, 4),
                _normal(r, 2, 4, 4),
                _normal(r, 2, 4, 3),
                _normal(r, 4, 4),
            ),
            _ring_call,
        ),
        "ulysses_attention": Case(
            lambda r: (
                _normal(r, 2, 2, 4, 4),
                _normal(r, 2, 2, 4, 4),
                _normal(r, 2, 2, 4, 3),
                _normal(r, 2, 4, 4),
            ),
            _ulysses_call,
        ),
    }
)

ARRAY_CASES = sorted(name for name, case in CASES.items() if case.inputs is not _none)


def _convert(backend: Any, a: np.ndarray, dtype: str) -> Any:
    """NumPy input to the backend: floating arrays in ``dtype``, others as they are."""
    return backend.asarray(a, dtype if a.dtype.kind == "f" else None)


def _arrays(backend: Any, case: Case, dtype: str, rng: np.random.Generator) -> list[Any]:
    return [_convert(backend, a, dtype) for a in case.inputs(rng)]


def _rounded(backend: Any, a: np.ndarray, dtype: str) -> tuple[Any, np.ndarray]:
    """``a`` on the backend in ``dtype``, and the float64 values it actually holds."""
    x = backend.asarray(a, dtype)
    return x, np.asarray(backend.to_host(x), dtype=np.float64)


# --------------------------------------------------------------------------------------------
# jax.jit
# --------------------------------------------------------------------------------------------


def test_jit_table_covers_every_public_function():
    covered = {name.partition("[")[0] for name in CASES}
    assert set(relattn.__all__) - covered - SETTINGS == set(), "public functions missing"
    assert covered - set(relattn.__all__) == set(), "CASES names a function relattn lacks"


@pytest.mark.parametrize("name", sorted(CASES))
def test_jit_equals_eager(jit_backend, dtype, name, rng):
    skip_unless_capable(jit_backend, name.partition("[")[0], "jit")
    case = CASES[name]

    def fn(*arrays):
        return case.call(jit_backend, dtype, *arrays)

    jitted = jit_backend.jit(fn)
    arrays = _arrays(jit_backend, case, dtype, rng)
    eager = fn(*arrays)
    compiled = jitted(*arrays)
    assert jit_backend.is_array(compiled)
    assert compiled.shape == eager.shape
    assert compiled.dtype == eager.dtype
    got, want = jit_backend.to_host(compiled), jit_backend.to_host(eager)
    if np.issubdtype(want.dtype, np.floating):
        tol = {"float32": 1e-5, "float64": 1e-12}[dtype]
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(got, want)


def test_torch_compile_of_a_program_first_call_warns_nothing(torch_backend, monkeypatch):
    """A trace that makes the program's first relattn calls (no namespace, backend or device
    looked up yet) warns of nothing: relattn knows PyTorch's namespace, backend and devices
    by type and name, not through array-api-compat's ``functools.lru_cache``-wrapped type
    tests, of each of which Dynamo warns (19 warnings on one call before). Later traces are
    covered by the suite's warnings-as-errors (pyproject.toml)."""
    import warnings

    from relattn import _namespace, backends

    for cache in ("_NAMESPACE_OF_TYPE", "_RESOLVED"):
        monkeypatch.setattr(_namespace, cache, {})
    monkeypatch.setattr(backends, "_BACKENDS", {})
    rng = np.random.default_rng(0)
    q, table, clipped = (
        torch_backend.asarray(rng.normal(size=shape), "float32")
        for shape in ((2, 5, 4), (5, 4), (3, 4))
    )

    def calls(q, table, clipped):
        return (
            relattn.relative_attention(q, q, q, table, block_size=2),
            relattn.shaw_attention(q, q, q, clipped, None),
            relattn.sinusoidal_position_encoding(table[:, 0], 4),
        )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = torch_backend.jit(calls)(q, table, clipped)
    assert [str(w.message) for w in caught] == []
    for got, want in zip(compiled, calls(q, table, clipped), strict=True):
        torch_backend.assert_close(got, torch_backend.to_host(want), "float32")


def test_jit_padding_mask_skips_value_check(jit_backend):
    """Under a trace the lengths cannot be read: a negative one gives an empty row, no error."""
    jitted = jit_backend.jit(lambda lengths: relattn.padding_mask(lengths, 4))
    out = jitted(jit_backend.asarray(np.array([2, -1, 6])))
    expected = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
    np.testing.assert_array_equal(jit_backend.to_host(out), expected)


def test_jit_of_grad_equals_grad(jax_backend, dtype, rng):
    import jax
    import jax.numpy as jnp

    case = CASES["relative_attention[causal]"]
    q, k, v, t, u, pb, m = _arrays(jax_backend, case, dtype, rng)

    def loss(q, k, v, t):
        out = relattn.relative_attention(q, k, v, t, content_bias=u, position_bias=pb, mask=m)
        return jnp.sum(out**2)

    grad = jax.grad(loss, argnums=(0, 1, 2, 3))
    tol = {"float32": 1e-5, "float64": 1e-12}[dtype]
    for eager, compiled in zip(grad(q, k, v, t), jax.jit(grad)(q, k, v, t), strict=True):
        np.testing.assert_allclose(
            jax_backend.to_host(compiled), jax_backend.to_host(eager), rtol=tol, atol=tol
        )


# --------------------------------------------------------------------------------------------
# torch.autograd.gradcheck (float64)
# --------------------------------------------------------------------------------------------


def _torch_leaves(torch_backend: Any, *arrays: np.ndarray) -> tuple[Any, ...]:
    """float64 tensors on the target's device that require a gradient."""
    return tuple(torch_backend.asarray(a, "float64").requires_grad_(True) for a in arrays)


@pytest.mark.parametrize(
    ("lq", "lk", "width"),
    [(3, 4, 4), (3, 4, 6), (5, 3, 3), (1, 3, 3), (4, 2, 5)],
    ids=["causal", "full", "causal-lq>lk", "causal-lq1", "full-lq>lk"],
)
def test_gradcheck_relative_attention(torch_backend, lq, lk, width, rng):
    torch = torch_backend.lib
    d = 4
    mask = _mask(lq, lk, lq - 1, rng) if lq > 1 else np.ones((lq, lk), bool)
    leaves = _torch_leaves(
        torch_backend,
        _normal(rng, 2, lq, d),
        _normal(rng, 2, lk, d),
        _normal(rng, 2, lk, 3),
        _normal(rng, width, d),
        _normal(rng, d),
        _normal(rng, 2, 1, d),
    )
    mask_t = torch_backend.asarray(mask)

    def f(q, k, v, table, u, pb):
        return relattn.relative_attention(
            q, k, v, table, content_bias=u, position_bias=pb, mask=mask_t
        )

    out = f(*leaves)
    if lq > 1:
        assert torch.all(out[:, lq - 1] == 0)
    assert torch.autograd.gradcheck(f, leaves)


def test_gradcheck_masked_softmax(torch_backend, rng):
    torch = torch_backend.lib
    (scores,) = _torch_leaves(torch_backend, _normal(rng, 2, 3, 4))
    mask = torch_backend.asarray(_mask(3, 4, 1, rng))
    assert torch.autograd.gradcheck(lambda s: relattn.masked_softmax(s, mask), (scores,))
    assert torch.autograd.gradcheck(lambda s: relattn.masked_softmax(s, axis=-2), (scores,))


def test_gradcheck_scaled_dot_product_attention(torch_backend, rng):
    torch = torch_backend.lib
    leaves = _torch_leaves(
        torch_backend,
        _normal(rng, 2, 3, 4),
        _normal(rng, 2, 5, 4),
        _normal(rng, 2, 5, 3),
        _normal(rng, 3, 5),
    )
    mask = torch_backend.asarray(_mask(3, 5, 0, rng))

    def f(q, k, v, bias):
        return relattn.scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, scale=0.7)

    assert torch.autograd.gradcheck(f, leaves)


@pytest.mark.parametrize(("lq", "lk", "width"), [(3, 4, 6), (3, 4, 4), (1, 3, 3), (4, 2, 5)])
def test_gradcheck_rel_shift_and_unshift(torch_backend, lq, lk, width, rng):
    torch = torch_backend.lib
    (x,) = _torch_leaves(torch_backend, _normal(rng, 2, lq, width))
    (y,) = _torch_leaves(torch_backend, _normal(rng, 2, lq, lk))
    assert torch.autograd.gradcheck(lambda a: relattn.rel_shift(a, lk), (x,))
    assert torch.autograd.gradcheck(relattn.rel_unshift, (y,))


# --------------------------------------------------------------------------------------------
# jax.grad against central differences (float64)
# --------------------------------------------------------------------------------------------


def _relative_attention_params(rng, lq, lk, width, d=4):
    return {
        "q": _normal(rng, 2, lq, d),
        "k": _normal(rng, 2, lk, d),
        "v": _normal(rng, 2, lk, 3),
        "table": _normal(rng, width, d),
        "u": _normal(rng, d),
        "pb": _normal(rng, 2, 1, d),
    }


def _relative_attention_of(params, mask):
    return relattn.relative_attention(
        params["q"],
        params["k"],
        params["v"],
        params["table"],
        content_bias=params["u"],
        position_bias=params["pb"],
        mask=mask,
    )


@pytest.mark.parametrize(
    ("lq", "lk", "width"), [(3, 4, 4), (3, 4, 6), (5, 3, 3)], ids=["causal", "full", "lq>lk"]
)
def test_jax_grad_matches_central_differences(jax_backend, lq, lk, width, rng):
    import jax
    import jax.numpy as jnp

    def on(a):
        return jax_backend.asarray(a, "float64" if a.dtype.kind == "f" else None)

    params = {n: on(a) for n, a in _relative_attention_params(rng, lq, lk, width).items()}
    mask = on(_mask(lq, lk, 1, rng))
    weights = on(_normal(rng, 2, lq, 3))

    @jax.jit  # one compilation instead of op-by-op dispatch: the eager grad is checked below
    def loss(p):
        return jnp.sum(_relative_attention_of(p, mask) * weights)

    grad = jax.jit(jax.grad(loss))(params)
    jax_backend.assert_directional_derivatives(loss, grad, params, rng, count=4)


@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize(("lq", "lk", "width"), [(3, 4, 6), (5, 3, 3)], ids=["masked", "lq>lk"])
def test_jax_grad_of_fully_masked_row_is_finite(jax_backend, precision, lq, lk, width, rng):
    import jax
    import jax.numpy as jnp

    params = {
        n: jax_backend.asarray(a, precision)
        for n, a in _relative_attention_params(rng, lq, lk, width).items()
    }
    # Row 1 masked by hand; with Lq > Lk in the causal layout rows 0, 1 have no key at all.
    mask = jax_backend.asarray(_mask(lq, lk, 1, rng))
    out = _relative_attention_of(params, mask)
    assert bool(jnp.all(out[:, 1] == 0))
    grad = jax.jit(jax.grad(lambda p: jnp.sum(_relative_attention_of(p, mask) ** 2)))(params)
    for name, g in grad.items():
        assert bool(jnp.all(jnp.isfinite(g))), name
    assert bool(jnp.all(grad["q"][:, 1] == 0))

    scores = jax_backend.asarray(_normal(rng, 2, 3, 4), precision)
    smask = jax_backend.asarray(_mask(3, 4, 2, rng))
    g = jax.jit(jax.grad(lambda s: jnp.sum(relattn.masked_softmax(s, smask) ** 2)))(scores)
    assert bool(jnp.all(jnp.isfinite(g)))
    assert bool(jnp.all(g[:, 2] == 0))


# --------------------------------------------------------------------------------------------
# Fully masked rows: exactly 0, never NaN, in every dtype the backend has
# --------------------------------------------------------------------------------------------

ALL_FLOATS = ["float16", "bfloat16", "float32", "float64"]


def _check_rows(backend, out, expected, empty_rows, fdtype):
    got = np.asarray(backend.to_host(out), dtype=np.float64)
    assert not np.isnan(got).any()
    assert np.isfinite(got).all()
    for row in empty_rows:
        assert np.all(got[..., row, :] == 0), f"row {row} is not exactly 0"
    backend.assert_close(out, expected, fdtype)


@pytest.mark.parametrize("fdtype", ALL_FLOATS)
def test_masked_softmax_fully_masked_row(backend, fdtype, rng):
    dt = backend.dtype(fdtype)
    scores, scores_np = _rounded(backend, _normal(rng, 2, 3, 4), fdtype)
    mask_np = _mask(3, 4, 1, rng)
    out = relattn.masked_softmax(scores, backend.asarray(mask_np))
    assert out.dtype == dt
    _check_rows(backend, out, ref.masked_softmax(scores_np, mask_np), [1], fdtype)


@pytest.mark.parametrize("fdtype", ALL_FLOATS)
def test_masked_softmax_large_scores(backend, fdtype):
    """Scores of ±1e4 (representable in float16) with a mask: no overflow to NaN."""
    scores_np = np.array(
        [
            [1e4, -1e4, 0.0, 1e4],
            [-1e4, -1e4, 5.0, 1e4],
            [1e4, 1e4, -1e4, -1e4],
            [-1e4, 3.0, 1e4, 2.0],
        ]
    )
    mask_np = np.array(
        [
            [True, True, False, False],
            [True, True, True, False],
            [False] * 4,
            [True, True, False, True],
        ]
    )
    dt = backend.dtype(fdtype)
    scores, scores_np = _rounded(backend, scores_np, fdtype)
    out = relattn.masked_softmax(scores, backend.asarray(mask_np))
    assert out.dtype == dt
    _check_rows(backend, out, ref.masked_softmax(scores_np, mask_np), [2], fdtype)
    unmasked = relattn.masked_softmax(scores)
    _check_rows(backend, unmasked, ref.masked_softmax(scores_np), [], fdtype)


@pytest.mark.parametrize("fdtype", ALL_FLOATS)
def test_scaled_dot_product_attention_empty_rows(backend, fdtype, rng):
    dt = backend.dtype(fdtype)
    q, q_np = _rounded(backend, 0.5 * _normal(rng, 2, 4, 4), fdtype)
    k, k_np = _rounded(backend, 0.5 * _normal(rng, 2, 5, 4), fdtype)
    v, v_np = _rounded(backend, _normal(rng, 2, 5, 3), fdtype)
    mask_np = _mask(4, 5, 0, rng)
    # Row 2: a -inf bias on every key; row 3: -inf on some keys and ±1e4 on others.
    bias_np = np.zeros((4, 5))
    bias_np[2] = -np.inf
    bias_np[3] = [-np.inf, 1e4, -1e4, -np.inf, 0.0]
    bias, bias_np = _rounded(backend, bias_np, fdtype)
    out = relattn.scaled_dot_product_attention(q, k, v, mask=backend.asarray(mask_np), bias=bias)
    assert out.dtype == dt
    finite = np.isfinite(bias_np)
    expected = ref.attention(
        q_np, k_np, v_np, mask=mask_np & finite, bias=np.where(finite, bias_np, 0.0)
    )
    _check_rows(backend, out, expected, [0, 2], fdtype)

    # Without a mask, the -inf bias alone empties row 2.
    out = relattn.scaled_dot_product_attention(q, k, v, bias=bias)
    expected = ref.attention(q_np, k_np, v_np, mask=finite, bias=np.where(finite, bias_np, 0.0))
    _check_rows(backend, out, expected, [2], fdtype)


@pytest.mark.parametrize("fdtype", ALL_FLOATS)
def test_mask_to_bias_stays_finite(backend, fdtype, rng):
    """Two mask biases add without overflow; rows with an allowed key match the masked result."""
    dt = backend.dtype(fdtype)
    q, q_np = _rounded(backend, 0.5 * _normal(rng, 4, 4), fdtype)
    k, k_np = _rounded(backend, 0.5 * _normal(rng, 5, 4), fdtype)
    v, v_np = _rounded(backend, _normal(rng, 5, 3), fdtype)
    m1, m2 = _mask(4, 5, 0, rng), _mask(4, 5, 1, rng)
    bias = relattn.mask_to_bias(backend.asarray(m1), dtype=dt) + relattn.mask_to_bias(
        backend.asarray(m2), dtype=dt
    )
    assert bias.dtype == dt
    assert np.isfinite(np.asarray(backend.to_host(bias), dtype=np.float64)).all()
    out = relattn.scaled_dot_product_attention(q, k, v, bias=bias)
    got = np.asarray(backend.to_host(out), dtype=np.float64)
    # Rows 0 and 1 have no allowed key: finite (not zero: a bias is not a mask).
    assert np.isfinite(got).all()
    expected = ref.attention(q_np, k_np, v_np, mask=m1 & m2)
    backend.assert_close(out[2:, :], expected[2:], fdtype)


@pytest.mark.parametrize("fdtype", ALL_FLOATS)
@pytest.mark.parametrize(
    ("lq", "lk", "width", "empty"),
    [(5, 3, 3, [0, 1, 3]), (3, 4, 6, [1]), (3, 5, 5, [1])],
    ids=["causal-lq>lk", "full", "causal-memory"],
)
def test_relative_attention_empty_rows(backend, fdtype, lq, lk, width, empty, rng):
    dt = backend.dtype(fdtype)
    d = 4
    named = {}
    for name, shape, s in [
        ("q", (2, lq, d), 0.5),
        ("k", (2, lk, d), 0.5),
        ("v", (2, lk, 3), 1.0),
        ("table", (width, d), 0.5),
        ("u", (d,), 0.5),
        ("pb", (2, 1, d), 0.5),
    ]:
        named[name] = _rounded(backend, s * _normal(rng, *shape), fdtype)
    mask_np = _mask(lq, lk, empty[-1], rng)
    out = relattn.relative_attention(
        named["q"][0],
        named["k"][0],
        named["v"][0],
        named["table"][0],
        content_bias=named["u"][0],
        position_bias=named["pb"][0],
        mask=backend.asarray(mask_np),
    )
    assert out.dtype == dt
    expected = ref.relative_attention(
        *(named[n][1] for n in ("q", "k", "v", "table", "u", "pb")), mask=mask_np
    )
    _check_rows(backend, out, expected, empty, fdtype)


# --------------------------------------------------------------------------------------------
# torch inputs keep their graph
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ARRAY_CASES)
def test_torch_inputs_keep_their_graph(torch_backend, name, rng):
    torch = torch_backend.lib
    case = CASES[name]
    arrays = _arrays(torch_backend, case, "float64", rng)
    leaves = []
    for a in arrays:
        if a.is_floating_point():
            a.requires_grad_(True)
            leaves.append(a)
    out = case.call(torch_backend, "float64", *arrays)
    if not leaves:
        assert not out.requires_grad
        return
    cut = unsupported(name.partition("[")[0], "torch", "grad")
    if cut is not None:
        assert not out.requires_grad, f"the result carries a graph, yet relattn declares: {cut}"
        return
    assert out.requires_grad, "result lost the autograd graph of its inputs"
    weights = torch.as_tensor(rng.normal(size=tuple(out.shape)), device=out.device)
    (out * weights).sum().backward()
    for i, leaf in enumerate(leaves):
        assert leaf.grad is not None, f"no gradient reached floating input {i}"
        assert torch.all(torch.isfinite(leaf.grad))


def test_torch_update_memory_cuts_the_graph_of_both_inputs(torch_backend, rng):
    memory, hidden = _torch_leaves(torch_backend, _normal(rng, 2, 4), _normal(rng, 3, 4))
    out = relattn.update_memory(memory, hidden, 3)
    assert not out.requires_grad
    np.testing.assert_array_equal(torch_backend.to_host(out), torch_backend.to_host(hidden))
    # hidden itself still carries its graph: only the new memory is cut.
    assert hidden.requires_grad


# --------------------------------------------------------------------------------------------
# The caller's library, the caller's device; inputs are never mutated
# --------------------------------------------------------------------------------------------


def _compat_namespace(backend: Any) -> Any:
    return array_api_compat.array_namespace(backend.asarray(np.zeros(1)))


@pytest.mark.parametrize("form", ["module", "compat"])
@pytest.mark.parametrize("name", sorted(CREATION))
def test_creation_returns_callers_library(backend, form, name):
    xp = backend.lib if form == "module" else _compat_namespace(backend)
    dt = backend.dtype("float32")
    out = CREATION[name](xp, backend.device, dt)
    assert backend.is_array(out), f"{name}(xp={xp.__name__}) returned {type(out)}"
    if backend.device is not None:
        assert array_api_compat.device(out) == backend.device
    info = backend.xp.__array_namespace_info__()
    if name in FLOATING_CREATION or name.partition("[")[0] in FLOATING_CREATION:
        assert out.dtype == dt
    elif name.startswith(("relative_", "grid_")):
        assert out.dtype == info.default_dtypes(device=backend.device)["integral"]
    else:
        assert out.dtype == backend.xp.bool


@pytest.mark.parametrize("name", sorted(CREATION))
def test_creation_default_is_numpy(name):
    out = CREATION[name](None, None, None)
    assert isinstance(out, np.ndarray)


@pytest.mark.every_dtype
@pytest.mark.parametrize("name", ARRAY_CASES)
def test_results_in_callers_library_and_device_inputs_kept(backend, dtype, name, rng):
    """The result: the caller's library, device and dtype. The inputs: never written to."""
    case = CASES[name]
    arrays = _arrays(backend, case, dtype, rng)
    before = [backend.to_host(a).copy() for a in arrays]
    out = case.call(backend, dtype, *arrays)
    assert backend.is_array(out), f"{name} returned {type(out)}"
    assert array_api_compat.device(out) == array_api_compat.device(arrays[0])
    if any(backend.xp.isdtype(a.dtype, "real floating") for a in arrays):
        assert out.dtype == backend.dtype(dtype)
    backend.to_host(out)  # computes a Dask graph, which could write to its inputs
    for i, (a, kept) in enumerate(zip(arrays, before, strict=True)):
        np.testing.assert_array_equal(backend.to_host(a), kept, err_msg=f"argument {i} changed")
