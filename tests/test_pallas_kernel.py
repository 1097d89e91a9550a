"""relattn's Pallas kernel (relattn.backends._pallas), in Pallas's interpreter on the CPU.

The output against a float64 loop over the ``(i, j)`` pairs written here from the formula
(Transformer-XL's content-to-position term, DeBERTa's position-to-content term, a
per-distance bias): each term alone and all together, the full and the causal layout,
``Lq = Lk``, ``Lq < Lk`` and ``Lq > Lk`` (rows that see no key), lengths that are not
multiples of the tiles, ``d`` not a power of two, tables with fewer leading dims. Against
relattn's own block fold. Every input's gradient against autodiff of a dense float64
implementation, also written here. float32 to about 1e-5, bfloat16 and float16 loosely;
``jax.jit`` equal to eager; bad input. Segment ids and key masks (packed documents, key
padding): against the references with the mask, NaN in the masked keys' rows, rows with
no visible key in the middle of a sequence, broadcast shapes. The decomposed 2-D terms of
MViTv2 / ViTDet / SAM (keys on a ``kh × kw`` grid): alone and with every other term, the
causal rule, segments, a key mask; their gradients; against relattn's own
``decomposed_relative_attention``. Positions as data (SPEC §2.15): a cache's offset
positions, packed documents restarting at 0, permutations, repeated positions and distances
beyond the table (clipped), against the loop reference and (gradients, NaN in the rows only
hidden pairs read) a dense float64 implementation; positions equal to the defaults against
the contiguous path. Lowered for CUDA through Pallas's Triton lowering (``interpret=False``,
run on the CPU without executing): every term, forward and backward.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import reference

jax = pytest.importorskip("jax")
pytest.importorskip("jax.experimental.pallas")

import jax.numpy as jnp  # noqa: E402 - after the skip

import relattn  # noqa: E402 - after the skip
from relattn.backends._pallas import relative_attention_kernel  # noqa: E402 - after the skip

pytestmark = [pytest.mark.slow]

B, H = 2, 2
TABLES = ("key_table", "query_table", "relative_bias")
#: The kernel's inputs, in the order the gradient tests differentiate them.
INPUTS = ("q", "k", "v", "qp", "key_table", "ks", "query_table", "relative_bias",
          "grid_rows", "grid_cols")  # fmt: skip

needs_x64 = pytest.mark.skipif(
    not jax.config.jax_enable_x64, reason="float64 needs jax_enable_x64 (tests/conftest.py)"
)


# ------------------------------------------------------------------------------------------
# References
# ------------------------------------------------------------------------------------------
def _full(x, trailing, dtype=np.float64):
    """A table (or bias, segment ids, mask) with up to two leading dims, broadcast to
    ``(B, H, ...)``."""
    x = np.asarray(x, dtype)
    x = x.reshape((1,) * (trailing + 2 - x.ndim) + x.shape)
    return np.broadcast_to(x, (B, H, *x.shape[2:]))


def dense_jax(q, k, v, qp, key_table, ks, query_table, relative_bias, grid_rows, grid_cols,
              causal, query_segments=None, key_segments=None, key_mask=None,
              grid_width=None, query_positions=None, key_positions=None):  # fmt: skip
    """The same scores as one gathered ``(B, H, Lq, Lk)`` array, for ``jax.grad``: each
    table gathered at ``m = δ + Lk - 1`` clipped to its rows, ``δ = key_positions[j] -
    query_positions[i]`` (by default ``j - i - (Lk - Lq)``), the decomposed terms at ``j //
    kw`` and ``j % kw``; the causal rule (``δ <= 0``), segments and the key mask as a
    select of the visible cells (so its inputs must be finite)."""
    lq, lk = q.shape[2], k.shape[2]
    default = query_positions is None
    query_positions = np.arange(lq) + lk - lq if default else query_positions
    key_positions = np.arange(lk) if default else key_positions
    distance = (
        _full(key_positions, 1, np.int64)[..., None, :]
        - _full(query_positions, 1, np.int64)[..., :, None]
    )  # (B, H, Lq, Lk)
    batch, heads = np.arange(B)[:, None, None, None], np.arange(H)[None, :, None, None]

    def at_m(table, trailing):
        lead = table.shape[: table.ndim - trailing]
        table = table.reshape((1,) * (2 - len(lead)) + table.shape)
        table = jnp.broadcast_to(table, (B, H, *table.shape[2:]))
        return table[batch, heads, np.clip(distance + lk - 1, 0, table.shape[2] - 1)]

    s = jnp.einsum("bhid,bhjd->bhij", q, k)
    if key_table is not None:
        s += jnp.einsum("bhid,bhijd->bhij", qp, at_m(key_table, 2))
    if query_table is not None:
        s += jnp.einsum("bhjd,bhijd->bhij", ks, at_m(query_table, 2))
    if relative_bias is not None:
        s += at_m(relative_bias, 1)
    if grid_rows is not None:
        kw = grid_width or grid_cols.shape[-1]
        keys = np.arange(lk)
        s += grid_rows[..., keys // kw] + grid_cols[..., keys % kw]
    visible = jnp.asarray(distance <= 0 if causal else np.ones(distance.shape, bool))
    if query_segments is not None:
        qs, kseg = _full(query_segments, 1, np.int64), _full(key_segments, 1, np.int64)
        visible = visible & (qs[..., :, None] == kseg[..., None, :])
    if key_mask is not None:
        visible = visible & _full(key_mask, 1, bool)[..., None, :]
    s = jnp.where(visible, s, -jnp.inf)
    top = jnp.max(s, axis=-1, keepdims=True)
    e = jnp.where(visible, jnp.exp(s - jnp.where(visible.any(-1, keepdims=True), top, 0)), 0)
    total = jnp.sum(e, axis=-1, keepdims=True)
    return jnp.einsum("bhij,bhjd->bhid", e / jnp.where(total > 0, total, 1), v)


# ------------------------------------------------------------------------------------------
# Problems
# ------------------------------------------------------------------------------------------
def make_inputs(rng, lq, lk, d, *, terms=TABLES, layout="full", table_lead=(B, H), dv=5,
                grid=None, grid_lead=(B, H)):  # fmt: skip
    """float64 NumPy inputs: ``q, k, v`` and the given terms' tables (``qp`` with ``Kʳ``,
    ``ks`` with ``Qʳ``), width ``Lq + Lk - 1`` (full) or ``Lk`` (causal layout), with
    leading dims ``table_lead``; with a key ``grid = (kh, kw)`` the decomposed terms
    ``grid_rows (*grid_lead, Lq, kh)`` and ``grid_cols (*grid_lead, Lq, kw)``."""
    width = lq + lk - 1 if layout == "full" else lk
    x = {
        "q": rng.normal(size=(B, H, lq, d)),
        "k": rng.normal(size=(B, H, lk, d)),
        "v": rng.normal(size=(B, H, lk, dv)),
    }
    if "key_table" in terms:
        x["qp"] = rng.normal(size=(B, H, lq, d))
        x["key_table"] = rng.normal(size=(*table_lead, width, d))
    if "query_table" in terms:
        x["ks"] = rng.normal(size=(B, H, lk, d))
        x["query_table"] = rng.normal(size=(*table_lead, width, d))
    if "relative_bias" in terms:
        x["relative_bias"] = rng.normal(size=(*table_lead, width))
    if grid is not None:
        kh, kw = grid
        assert kh * kw == lk
        x["grid_rows"] = rng.normal(size=(*grid_lead, lq, kh))
        x["grid_cols"] = rng.normal(size=(*grid_lead, lq, kw))
    return x


def as_jax(x, dtype):
    return {name: jnp.asarray(a, dtype) for name, a in x.items()}


def run(x, *, causal, blocks, **options):
    q, k, v = x["q"], x["k"], x["v"]
    rest = {name: a for name, a in x.items() if name not in ("q", "k", "v")}
    return relative_attention_kernel(
        q, k, v, causal=causal, block_q=blocks[0], block_k=blocks[1], **rest, **options
    )


#: name -> (Lq, Lk, d, terms, layout, causal, tiles, table leading dims).
FORWARD_CASES = {
    "content-only": (20, 20, 8, (), "full", False, (16, 16), (B, H)),
    "key-table-d12": (20, 20, 12, ("key_table",), "full", False, (16, 16), (B, H)),
    "query-table-lq<lk": (13, 29, 8, ("query_table",), "full", False, (16, 16), (B, H)),
    "bias-causal-layout": (24, 24, 8, ("relative_bias",), "causal", True, (16, 16), (B, H)),
    "all-causal-full-tiles-8x16": (17, 33, 6, TABLES, "full", True, (8, 16), (B, H)),
    "all-causal-lq>lk": (24, 10, 8, TABLES, "full", True, (16, 8), (B, H)),
    "all-causal-layout-decode": (9, 25, 8, TABLES, "causal", True, (8, 8), (B, H)),
    "all-broadcast-tables": (11, 18, 8, TABLES, "full", False, (16, 16), (1, H)),
    "all-one-table": (11, 18, 8, TABLES, "full", True, (16, 16), ()),
}


@pytest.mark.parametrize("case", FORWARD_CASES)
def test_forward_matches_loop_reference(case, rng):
    lq, lk, d, terms, layout, causal, blocks, lead = FORWARD_CASES[case]
    x = make_inputs(rng, lq, lk, d, terms=terms, layout=layout, table_lead=lead)
    out = run(as_jax(x, jnp.float32), causal=causal, blocks=blocks)
    assert out.shape == (B, H, lq, 5) and out.dtype == jnp.float32
    expected = reference.relative_kernel_attention(**x, causal=causal)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=2e-5)
    if causal and lq > lk:
        assert not np.asarray(out)[:, :, : lq - lk].any()  # rows that see no key: zeros


@needs_x64
def test_float64_matches_loop_reference_tightly(rng):
    x = make_inputs(rng, 12, 21, 8, table_lead=(H,))
    out = run(as_jax(x, jnp.float64), causal=True, blocks=(8, 16))
    assert out.dtype == jnp.float64
    np.testing.assert_allclose(
        np.asarray(out), reference.relative_kernel_attention(**x, causal=True), atol=1e-12
    )


@needs_x64
def test_matches_relattn_block_fold(rng):
    """``relattn.relative_attention`` (its block fold) with a content bias ``u``, a position
    bias, ``Qʳ`` and ``b``; the kernel takes ``(q + u)·scale``, ``(q + v)·scale`` and
    ``k·scale``."""
    lq, lk, d = 10, 19, 8
    scale = 1 / np.sqrt(d)
    x = make_inputs(rng, lq, lk, d, layout="causal", table_lead=(H,))
    u, vb = rng.normal(size=(H, 1, d)), rng.normal(size=(H, 1, d))
    q, k, v = x["q"], x["k"], x["v"]
    expected = relattn.relative_attention(
        q, k, v, x["key_table"], content_bias=u, position_bias=vb,
        query_position_table=x["query_table"], relative_bias=x["relative_bias"], causal=True,
        block_size=(8, 8),
    )  # fmt: skip
    kernel_inputs = {
        "q": (q + u) * scale, "k": k, "v": v, "qp": (q + vb) * scale,
        "key_table": x["key_table"], "ks": k * scale, "query_table": x["query_table"],
        "relative_bias": x["relative_bias"],
    }  # fmt: skip
    out = run(as_jax(kernel_inputs, jnp.float64), causal=True, blocks=(8, 8))
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-12)


# ------------------------------------------------------------------------------------------
# Gradients
# ------------------------------------------------------------------------------------------
def grads(f, x, cotangent, causal):
    """Gradients of ``Σ f(...) ⊙ cotangent`` w.r.t. every given input, by name."""
    names = [n for n in INPUTS if n in x]

    def loss(*arrays):
        given = dict(zip(names, arrays, strict=True))
        return jnp.sum(f(given, causal) * cotangent)

    values = jax.grad(loss, argnums=tuple(range(len(names))))(*(x[n] for n in names))
    return dict(zip(names, values, strict=True))


def kernel_fn(blocks, **masks):
    return lambda x, causal: run({**x, **masks}, causal=causal, blocks=blocks)


def dense_fn(x, causal, **masks):
    return dense_jax(*(x.get(n) for n in INPUTS), causal, **masks)


#: name -> (Lq, Lk, d, layout, causal, tiles, table leading dims).
GRADIENT_CASES = {
    "full-lq<lk-tiles-8x16": (13, 20, 6, "full", False, (8, 16), (B, H)),
    "causal-layout-broadcast": (19, 19, 8, "causal", True, (16, 16), (H,)),
    "causal-lq>lk-zero-rows-one-table": (20, 7, 8, "full", True, (8, 8), ()),
}


@needs_x64
@pytest.mark.parametrize("case", GRADIENT_CASES)
def test_gradients_match_dense_autodiff(case, rng):
    lq, lk, d, layout, causal, blocks, lead = GRADIENT_CASES[case]
    x = as_jax(make_inputs(rng, lq, lk, d, layout=layout, table_lead=lead), jnp.float64)
    cotangent = jnp.asarray(rng.normal(size=(B, H, lq, 5)))
    got = grads(kernel_fn(blocks), x, cotangent, causal)
    expected = grads(dense_fn, x, cotangent, causal)
    for name in got:
        assert got[name].shape == x[name].shape, name
        np.testing.assert_allclose(got[name], expected[name], atol=1e-11, err_msg=name)
    if lq > lk:  # the rows that see no key: finite, and zero gradients
        for name in ("q", "qp"):
            assert np.isfinite(got[name]).all()
            assert not np.asarray(got[name])[:, :, : lq - lk].any()


@needs_x64
def test_float32_gradients(rng):
    x = make_inputs(rng, 18, 23, 8, layout="full", table_lead=(H,))
    cotangent = jnp.asarray(rng.normal(size=(B, H, 18, 5)))
    got = grads(kernel_fn((16, 8)), as_jax(x, jnp.float32), cotangent.astype(jnp.float32), True)
    expected = grads(dense_fn, as_jax(x, jnp.float64), cotangent, True)
    for name in got:
        assert got[name].dtype == jnp.float32
        scale = float(np.abs(expected[name]).max())
        np.testing.assert_allclose(got[name], expected[name], atol=2e-5 * scale, err_msg=name)


@needs_x64
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision(dtype, rng):
    """Half-precision inputs, float32 accumulation: the output, and for bfloat16 every
    gradient, against float64 on the same (rounded) inputs; every term, the decomposed
    ones too."""
    x = as_jax(make_inputs(rng, 21, 21, 8, layout="causal", grid=(3, 7)), dtype)
    wide = {name: a.astype(jnp.float64) for name, a in x.items()}
    out = run(x, causal=True, blocks=(16, 16))
    assert out.dtype == dtype
    np.testing.assert_allclose(
        np.asarray(out, np.float64),
        reference.relative_kernel_attention(**wide, causal=True),
        atol=2e-2,
    )
    if dtype == "bfloat16":
        cotangent = jnp.asarray(rng.normal(size=(B, H, 21, 5)))
        got = grads(kernel_fn((16, 16)), x, cotangent.astype(dtype), True)
        expected = grads(dense_fn, wide, cotangent, True)
        for name in got:
            assert got[name].dtype == dtype
            scale = float(np.abs(expected[name]).max())
            np.testing.assert_allclose(
                np.asarray(got[name], np.float64), expected[name], atol=3e-2 * scale, err_msg=name
            )


# ------------------------------------------------------------------------------------------
# Segments and key masks
# ------------------------------------------------------------------------------------------
def documents(rng, lead, length, dtype=np.int32, count=3):
    """Sorted document ids ``(*lead, length)`` in ``[0, count)`` (packed documents)."""
    return np.sort(rng.integers(0, count, size=(*lead, length)), axis=-1).astype(dtype)


def key_keep(rng, lead, lk):
    """A random key mask ``(*lead, Lk)``, about one key in four masked."""
    return rng.random(size=(*lead, lk)) > 0.25


def with_nan_keys(x, key_mask):
    """``x`` (float64 NumPy) with NaN in the masked keys' rows of ``k``, ``v`` and ``ks``
    (an unfilled cache slot)."""
    masked = ~_full(key_mask, 1, bool)
    x = dict(x)
    for name in ("k", "v", "ks"):
        if name in x:
            x[name] = np.where(masked[..., None], np.nan, x[name])
    return x


def no_visible_key(out):
    """The rows of a reference output that are exactly zero: those with no visible key."""
    return ~np.asarray(out).any(axis=-1)


#: name -> (Lq, Lk, layout, causal, tiles, table lead, masks(rng, lq, lk)).
MASKED_FORWARD_CASES = {
    "segments-causal-all-tables": (20, 20, "full", True, (8, 16), (B, H), lambda r, lq, lk: {
        "query_segments": (s := documents(r, (B, H), lq)), "key_segments": s}),
    "segments-(B,1,L)-int8-int64-mask-(Lk,)-lq<lk": (
        11, 26, "full", False, (16, 16), (H,), lambda r, lq, lk: {
            "query_segments": documents(r, (B, 1), lq, np.int8),
            "key_segments": documents(r, (B, 1), lk, np.int64), "key_mask": key_keep(r, (), lk)}),
    "mask-(B,1,Lk)-one-batch-masked-causal-layout-decode": (
        5, 23, "causal", True, (8, 8), (B, H), lambda r, lq, lk: {
            "key_mask": key_keep(r, (B, 1), lk) & np.array([True, False])[:, None, None]}),
    "segments-(Lq,)-(H,Lk)-uint8-mask-(H,Lk)-causal-layout": (
        17, 17, "causal", True, (16, 16), (), lambda r, lq, lk: {
            "query_segments": documents(r, (), lq, np.uint8),
            "key_segments": documents(r, (H,), lk, np.uint8), "key_mask": key_keep(r, (H,), lk)}),
}  # fmt: skip


@pytest.mark.parametrize("case", MASKED_FORWARD_CASES)
def test_masked_forward_matches_loop_reference(case, rng):
    lq, lk, layout, causal, blocks, lead, masks = MASKED_FORWARD_CASES[case]
    x = make_inputs(rng, lq, lk, 8, layout=layout, table_lead=lead)
    m = masks(rng, lq, lk)
    out = run({**as_jax(x, jnp.float32), **{n: jnp.asarray(a) for n, a in m.items()}},
              causal=causal, blocks=blocks)  # fmt: skip
    expected = reference.relative_kernel_attention(**x, **m, causal=causal)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=2e-5)
    empty = no_visible_key(expected)
    assert not np.asarray(out)[empty].any()  # rows that see no key: exactly zero


#: name -> (Lq, Lk, layout, causal, tiles, table lead, masks(rng, lq, lk)).
MASKED_GRADIENT_CASES = {
    # Random key mask, batch 1 wholly masked: its outputs and gradients are all zero.
    "segments-(B,1,L)-mask-(B,1,Lk)-lq<lk": (13, 20, "full", False, (8, 16), (B, H),
        lambda r, lq, lk: {
            "query_segments": documents(r, (B, 1), lq, count=2),
            "key_segments": documents(r, (B, 1), lk, count=2),
            "key_mask": key_keep(r, (B, 1), lk) & np.array([True, False])[:, None, None]}),
    # Self-attention over packed documents 0, 1, 2 with every key of document 1 masked:
    # its rows see no key, in the middle of the sequence.
    "segments-causal-layout-masked-document": (19, 19, "causal", True, (16, 16), (H,),
        lambda r, lq, lk: {
            "query_segments": (s := np.repeat([[0] * 6 + [1] * 5 + [2] * 8], H, 0)),
            "key_segments": s, "key_mask": (s[0] != 1) & key_keep(r, (), lk)}),
}  # fmt: skip


@needs_x64
@pytest.mark.parametrize("case", MASKED_GRADIENT_CASES)
def test_masked_gradients_with_nan_in_masked_keys(case, rng):
    """NaN in the masked keys' ``k``, ``v``, ``ks`` rows: the output and every gradient
    finite and equal to the dense reference without those keys (there given finite
    values); the masked keys' gradients and those of rows with no visible key are 0."""
    lq, lk, layout, causal, blocks, lead, masks = MASKED_GRADIENT_CASES[case]
    x = make_inputs(rng, lq, lk, 8, layout=layout, table_lead=lead)
    m = masks(rng, lq, lk)
    masked_keys = ~_full(m["key_mask"], 1, bool)
    poisoned = as_jax(with_nan_keys(x, m["key_mask"]), jnp.float64)
    clean = as_jax(x, jnp.float64)
    f = kernel_fn(blocks, **{n: jnp.asarray(a) for n, a in m.items()})
    out = f(poisoned, causal)
    expected_out = reference.relative_kernel_attention(**x, **m, causal=causal)
    np.testing.assert_allclose(np.asarray(out), expected_out, atol=1e-12)
    empty = no_visible_key(expected_out)
    assert empty.any() and not np.asarray(out)[empty].any()
    cotangent = jnp.asarray(rng.normal(size=(B, H, lq, 5)))
    got = grads(f, poisoned, cotangent, causal)
    expected = grads(functools.partial(dense_fn, **m), clean, cotangent, causal)
    for name in got:
        assert np.isfinite(got[name]).all(), name
        np.testing.assert_allclose(got[name], expected[name], atol=1e-11, err_msg=name)
    for name in ("k", "v", "ks"):
        assert not np.asarray(got[name])[masked_keys].any(), name
    for name in ("q", "qp"):
        assert not np.asarray(got[name])[empty].any(), name


# ------------------------------------------------------------------------------------------
# The decomposed 2-D terms (MViTv2, ViTDet, SAM)
# ------------------------------------------------------------------------------------------
#: name -> (Lq, key grid, terms, layout, causal, tiles, grid lead, masks(rng, lq, lk)).
GRID_FORWARD_CASES = {
    # SAM: the decomposed terms are the only relative ones; Lq != Lk (any query grid).
    "alone-lq<lk-no-lead": (13, (3, 7), (), "full", False, (8, 16), (), None),
    "all-tables-causal-lq>lk": (20, (3, 6), TABLES, "full", True, (16, 8), (B, H), None),
    "causal-layout-decode-segments-mask-(1,H)": (
        9, (5, 5), TABLES, "causal", True, (8, 8), (1, H), lambda r, lq, lk: {
            "query_segments": documents(r, (B, 1), lq, count=2),
            "key_segments": documents(r, (B, 1), lk, count=2),
            "key_mask": key_keep(r, (B, 1), lk)}),
    "bias-kh=1-(H,)": (17, (1, 17), ("relative_bias",), "full", False, (16, 16), (H,), None),
    "alone-kw=1-(B,1)": (7, (10, 1), (), "full", False, (8, 8), (B, 1), None),
}  # fmt: skip


@pytest.mark.parametrize("case", GRID_FORWARD_CASES)
def test_grid_forward_matches_loop_reference(case, rng):
    lq, grid, terms, layout, causal, blocks, lead, masks = GRID_FORWARD_CASES[case]
    lk = grid[0] * grid[1]
    x = make_inputs(rng, lq, lk, 8, terms=terms, layout=layout, grid=grid, grid_lead=lead)
    m = {} if masks is None else masks(rng, lq, lk)
    inputs = {**as_jax(x, jnp.float32), **{n: jnp.asarray(a) for n, a in m.items()}}
    out = run(inputs, causal=causal, blocks=blocks, grid_width=grid[1])
    expected = reference.relative_kernel_attention(**x, **m, causal=causal)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=2e-5)
    assert not np.asarray(out)[no_visible_key(expected)].any()


#: name -> (Lq, key grid, terms, layout, causal, tiles, grid lead, masks(rng, lq, lk)).
GRID_GRADIENT_CASES = {
    "all-tables-causal-mask-(Lk,)-(H,)": (
        14, (3, 6), TABLES, "full", True, (8, 16), (H,), lambda r, lq, lk: {
            "key_mask": key_keep(r, (), lk)}),
}  # fmt: skip


@needs_x64
@pytest.mark.parametrize("case", GRID_GRADIENT_CASES)
def test_grid_gradients_match_dense_autodiff(case, rng):
    """Every input's gradient, ``grid_rows`` and ``grid_cols`` in their given (broadcast)
    shapes; NaN in the masked keys' rows."""
    lq, grid, terms, layout, causal, blocks, lead, masks = GRID_GRADIENT_CASES[case]
    lk = grid[0] * grid[1]
    x = make_inputs(rng, lq, lk, 8, terms=terms, layout=layout, grid=grid, grid_lead=lead)
    m = {} if masks is None else masks(rng, lq, lk)
    poisoned = as_jax(with_nan_keys(x, m["key_mask"]) if m else x, jnp.float64)
    cotangent = jnp.asarray(rng.normal(size=(B, H, lq, 5)))
    f = kernel_fn(blocks, grid_width=grid[1], **{n: jnp.asarray(a) for n, a in m.items()})
    got = grads(f, poisoned, cotangent, causal)
    expected = grads(functools.partial(dense_fn, **m), as_jax(x, jnp.float64), cotangent, causal)
    assert set(got) == set(expected) >= {"grid_rows", "grid_cols"}
    for name in got:
        assert got[name].shape == x[name].shape, name
        np.testing.assert_allclose(got[name], expected[name], atol=1e-11, err_msg=name)


@needs_x64
def test_matches_relattn_decomposed(rng):
    """``relattn.decomposed.decomposed_relative_attention`` (SAM's scores ``(q·scale)·kᵀ +
    q·Rʸ + q·Rˣ``, MViTv2's keys pooled to a coarser grid): the kernel takes ``q·scale``
    and the terms of ``decomposed_relative_terms``; the outputs and the gradients of
    ``q``, ``k``, ``v`` and both tables through it."""
    decomposed = pytest.importorskip("relattn.decomposed")
    query_grid, key_grid, d = (3, 4), (2, 4), 8
    lq, lk, scale = 12, 8, d**-0.5
    inputs = [
        rng.normal(size=(B, H, lq, d)), rng.normal(size=(B, H, lk, d)),
        rng.normal(size=(B, H, lk, 5)),
        rng.normal(size=(2 * 3 - 1, d)), rng.normal(size=(2 * 4 - 1, d)),  # 2·max(q, k) - 1
    ]  # fmt: skip
    inputs = [jnp.asarray(a, jnp.float64) for a in inputs]

    def ours(q, k, v, table_h, table_w):
        rows, cols = decomposed.decomposed_relative_terms(
            q, table_h, table_w, query_grid=query_grid, key_grid=key_grid
        )
        return relative_attention_kernel(
            q * scale, k, v, grid_rows=rows, grid_cols=cols, grid_width=key_grid[1],
            block_q=8, block_k=8,
        )  # fmt: skip

    def theirs(q, k, v, table_h, table_w):
        return decomposed.decomposed_relative_attention(
            q, k, v, table_h, table_w, query_grid=query_grid, key_grid=key_grid
        )

    out, ours_vjp = jax.vjp(ours, *inputs)
    expected_out, theirs_vjp = jax.vjp(theirs, *inputs)
    np.testing.assert_allclose(out, expected_out, atol=1e-12)
    cotangent = jnp.asarray(rng.normal(size=(B, H, lq, 5)))
    got, expected = ours_vjp(cotangent), theirs_vjp(cotangent)
    for name, g, e in zip(("q", "k", "v", "table_h", "table_w"), got, expected, strict=True):
        np.testing.assert_allclose(g, e, atol=1e-11, err_msg=name)


# ------------------------------------------------------------------------------------------
# Positions as data (SPEC §2.15)
# ------------------------------------------------------------------------------------------
def restarting(ids):
    """Positions that restart at 0 with each document of the sorted ids ``(..., L)``."""
    ids = np.asarray(ids)
    index = np.arange(ids.shape[-1])
    starts = np.maximum.accumulate(np.where(np.diff(ids, prepend=-1) != 0, index, 0), axis=-1)
    return index - starts


def packed(r, lq, lk):
    """Self-attention over packed documents: their ids, positions restarting with each, a
    random key mask."""
    ids = documents(r, (B, 1), lq)
    return {"query_segments": ids, "key_segments": ids, "query_positions": restarting(ids),
            "key_positions": restarting(ids), "key_mask": key_keep(r, (), lk)}  # fmt: skip


def table_rows(name, rows):
    """The index of rows ``rows`` of a table (its axis ``-2``) or of the bias (axis ``-1``)."""
    return (..., rows) if name == "relative_bias" else (..., rows, slice(None))


def with_nan_rows(x, rows):
    """``x`` (float64 NumPy) with NaN in rows ``rows`` of each table."""
    x = dict(x)
    for name in TABLES:
        if name in x:
            x[name] = x[name].copy()
            x[name][table_rows(name, rows)] = np.nan
    return x


#: name -> (Lq, Lk, terms, layout, causal, tiles, table lead, key grid, positions etc.(rng,
#: lq, lk)).
POSITION_FORWARD_CASES = {
    # A cache: queries at 100.. after 16 earlier keys; the default positions, offset.
    "cache-offset-causal-layout-decode": (7, 23, TABLES, "causal", True, (8, 8), (B, H), None,
        lambda r, lq, lk: {"query_positions": 100 + np.arange(lq),
                           "key_positions": 100 - (lk - lq) + np.arange(lk)}),
    # Packed documents, positions restarting at 0 in each, a key mask.
    "packed-documents-causal-(H,)": (20, 20, TABLES, "full", True, (8, 16), (H,), None, packed),
    # Permutations per head: any distance, Lq > Lk, int16 with uint8 positions.
    "permutations-lq>lk-(1,H)-int16-uint8": (19, 11, TABLES, "full", False, (16, 8), (1, H), None,
        lambda r, lq, lk: {
            "query_positions": np.stack([r.permutation(lq) for _ in range(H)]).astype(np.int16),
            "key_positions": r.permutation(lk).astype(np.uint8)}),
    # Repeated positions and distances beyond the table (clipped), rows that see no key,
    # with the decomposed terms and a key mask.
    "repeated-clipped-causal-grid-mask": (13, 18, TABLES, "full", True, (8, 8), (B, H), (3, 6),
        lambda r, lq, lk: {"query_positions": r.integers(-60, 60, (B, 1, lq)),
                           "key_positions": r.integers(-60, 60, (B, 1, lk)),
                           "key_mask": key_keep(r, (B, 1), lk)}),
    "bias-alone-clipped-not-causal": (10, 25, ("relative_bias",), "full", False, (8, 16), (H,),
        None, lambda r, lq, lk: {"query_positions": r.integers(0, 400, lq),
                                 "key_positions": r.integers(0, 400, lk)}),
}  # fmt: skip


def position_problem(case, table, rng):
    """A case's float64 NumPy inputs and its positions (segments, masks) as NumPy arrays."""
    lq, lk, terms, layout, causal, blocks, lead, grid, extras = table[case]
    x = make_inputs(rng, lq, lk, 8, terms=terms, layout=layout, table_lead=lead, grid=grid)
    return x, extras(rng, lq, lk), causal, blocks


@pytest.mark.parametrize("case", POSITION_FORWARD_CASES)
def test_positions_forward_matches_loop_reference(case, rng):
    x, m, causal, blocks = position_problem(case, POSITION_FORWARD_CASES, rng)
    out = run({**as_jax(x, jnp.float32), **{n: jnp.asarray(a) for n, a in m.items()}},
              causal=causal, blocks=blocks)  # fmt: skip
    expected = reference.relative_kernel_attention(**x, **m, causal=causal)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=2e-5)
    assert not np.asarray(out)[no_visible_key(expected)].any()  # rows that see no key: zeros


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_positions_half_precision(dtype, rng):
    """Half-precision inputs with positions (several windows per pair, clipping), against
    float64 on the same rounded inputs."""
    x, m, causal, blocks = position_problem(
        "repeated-clipped-causal-grid-mask", POSITION_FORWARD_CASES, rng
    )
    x = as_jax(x, dtype)
    out = run({**x, **{n: jnp.asarray(a) for n, a in m.items()}}, causal=causal, blocks=blocks)
    assert out.dtype == dtype
    wide = {name: np.asarray(a, np.float64) for name, a in x.items()}
    expected = reference.relative_kernel_attention(**wide, **m, causal=causal)
    np.testing.assert_allclose(np.asarray(out, np.float64), expected, atol=2e-2)


#: name -> (Lq, Lk, terms, layout, causal, tiles, table lead, key grid, positions etc.(rng,
#: lq, lk)).
POSITION_GRADIENT_CASES = {
    # NaN in the masked keys' rows and in the table rows of δ > 0 (m >= Lk), which only
    # hidden pairs read.
    "packed-documents-causal-nan": (19, 19, TABLES, "full", True, (8, 16), (H,), None, packed),
    "repeated-clipped-not-causal-lq<lk-grid-(1,H)": (
        11, 18, TABLES, "full", False, (8, 8), (1, H), (3, 6), lambda r, lq, lk: {
            "query_positions": r.integers(-30, 30, (H, lq)),
            "key_positions": r.integers(-30, 30, (B, 1, lk))}),
    "permutations-causal-layout-lq>lk": (18, 9, TABLES, "causal", True, (16, 8), (), None,
        lambda r, lq, lk: {"query_positions": r.permutation(lq),
                           "key_positions": r.permutation(lk)}),
}  # fmt: skip


@needs_x64
@pytest.mark.parametrize("case", POSITION_GRADIENT_CASES)
def test_positions_gradients_match_dense_autodiff(case, rng):
    """Every input's gradient against autodiff of the dense float64 scores; where the case
    has a key mask, NaN in the masked keys' rows and in the tables' rows of ``δ > 0``
    (finite values for the reference): every gradient finite, those rows' zero."""
    x, m, causal, blocks = position_problem(case, POSITION_GRADIENT_CASES, rng)
    lq, lk = x["q"].shape[2], x["k"].shape[2]
    poisoned = x
    if "key_mask" in m:
        poisoned = with_nan_rows(with_nan_keys(x, m["key_mask"]), np.arange(lk, lq + lk - 1))
    cotangent = jnp.asarray(rng.normal(size=(B, H, lq, 5)))
    f = kernel_fn(blocks, **{n: jnp.asarray(a) for n, a in m.items()})
    out = f(as_jax(poisoned, jnp.float64), causal)
    expected_out = reference.relative_kernel_attention(**x, **m, causal=causal)
    np.testing.assert_allclose(np.asarray(out), expected_out, atol=1e-12)
    got = grads(f, as_jax(poisoned, jnp.float64), cotangent, causal)
    expected = grads(functools.partial(dense_fn, **m), as_jax(x, jnp.float64), cotangent, causal)
    assert set(got) == set(expected) >= {"key_table", "query_table", "relative_bias"}
    for name in got:
        assert got[name].shape == x[name].shape, name
        assert np.isfinite(got[name]).all(), name
        np.testing.assert_allclose(got[name], expected[name], atol=1e-11, err_msg=name)
    if "key_mask" in m:  # the rows of δ > 0, which no visible pair reads
        for name in TABLES:
            assert not np.asarray(got[name])[table_rows(name, slice(lk, None))].any()


@needs_x64
def test_default_positions_match_the_contiguous_path(rng):
    """Positions equal to the defaults, offset by ``2⁴⁰`` (int64): the positions path's
    output and gradients equal the contiguous path's (every term, ``causal``, ``Lq !=
    Lk``, a key mask), also under ``jax.jit``."""
    lq, lk = 12, 21
    x = as_jax(make_inputs(rng, lq, lk, 8, grid=(3, 7), table_lead=(H,)), jnp.float64)
    mask = {"key_mask": jnp.asarray(key_keep(rng, (), lk))}
    offset = 2**40
    positions = {
        "query_positions": jnp.asarray(offset + np.arange(lq) + lk - lq, jnp.int64),
        "key_positions": jnp.asarray(offset + np.arange(lk), jnp.int64),
    }
    cotangent = jnp.asarray(rng.normal(size=(B, H, lq, 5)))
    contiguous = kernel_fn((8, 16), **mask)
    with_positions = kernel_fn((8, 16), **mask, **positions)
    np.testing.assert_allclose(
        jax.jit(with_positions, static_argnums=1)(x, True), contiguous(x, True), atol=1e-13
    )
    got = grads(with_positions, x, cotangent, True)
    expected = grads(contiguous, x, cotangent, True)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-12, err_msg=name)


@needs_x64
def test_positions_under_jit(rng):
    """The positions traced arguments of ``jax.jit``: equal to eager, and differentiated."""
    x = as_jax(make_inputs(rng, 9, 14, 8), jnp.float64)
    m = {
        "query_positions": rng.integers(0, 20, (B, 1, 9)),
        "key_positions": rng.integers(0, 20, 14),
    }
    positions = {n: jnp.asarray(a) for n, a in m.items()}

    def f(x, positions):
        return run({**x, **positions}, causal=True, blocks=(8, 8))

    eager = f(x, positions)
    np.testing.assert_allclose(jax.jit(f)(x, positions), eager, atol=1e-14)
    cotangent = jnp.asarray(rng.normal(size=eager.shape))
    grad = jax.jit(jax.grad(lambda x, p: jnp.sum(f(x, p) * cotangent)))(x, positions)
    expected = grads(functools.partial(dense_fn, **m), x, cotangent, True)
    for name in expected:
        np.testing.assert_allclose(grad[name], expected[name], atol=1e-11, err_msg=name)


# ------------------------------------------------------------------------------------------
# jax.jit
# ------------------------------------------------------------------------------------------
@needs_x64
def test_jit_equals_eager_and_differentiates(rng):
    """Under ``jax.jit``, the segment ids, key mask and decomposed terms traced arguments
    too."""
    x = as_jax(make_inputs(rng, 9, 14, 8, grid=(2, 7), grid_lead=(B, 1)), jnp.float64)
    m = {
        "query_segments": documents(rng, (B, 1), 9, count=2),
        "key_segments": documents(rng, (B, 1), 14, count=2),
        "key_mask": key_keep(rng, (), 14),
    }
    masks = {n: jnp.asarray(a) for n, a in m.items()}  # fmt: skip

    def f(x, masks):
        return run({**x, **masks}, causal=False, blocks=(8, 8), grid_width=7)

    eager = f(x, masks)
    jitted = jax.jit(f)(x, masks)
    np.testing.assert_allclose(jitted, eager, atol=1e-14)
    cotangent = jnp.asarray(rng.normal(size=eager.shape))
    grad = jax.jit(jax.grad(lambda x, masks: jnp.sum(f(x, masks) * cotangent)))(x, masks)
    expected = grads(functools.partial(dense_fn, **m), x, cotangent, False)
    assert set(grad) == set(expected) >= {"grid_rows", "grid_cols"}
    for name in expected:
        np.testing.assert_allclose(grad[name], expected[name], atol=1e-11, err_msg=name)


# ------------------------------------------------------------------------------------------
# Compiled for GPUs: Pallas's Triton lowering, run on the CPU (nothing executes)
# ------------------------------------------------------------------------------------------
def lower_for_cuda(x, ints, **options):
    """The StableHLO text of the kernel's forward and backward (``jax.vjp`` through its
    ``custom_vjp``) lowered for CUDA with ``interpret=False``: each ``pallas_call`` through
    Pallas's Triton lowering, into a Triton custom call."""
    names = list(x)

    def kernel(*arrays):
        return relative_attention_kernel(
            **dict(zip(names, arrays, strict=True)), **ints, interpret=False, **options
        )

    def forward_backward(*arrays):
        out, vjp = jax.vjp(kernel, *arrays)
        return out, vjp(out)

    lowered = jax.jit(forward_backward).trace(*x.values()).lower(lowering_platforms=("cuda",))
    return lowered.as_text()


#: name -> (terms, key grid, causal, Lq, integer inputs(rng, lq, lk)); Lk = 18.
LOWERING_CASES = {
    "content": ((), None, False, 20, None),
    "key-table": (("key_table",), None, False, 20, None),
    "query-table-causal-lq<lk": (("query_table",), None, True, 11, None),
    "bias-causal-lq>lk": (("relative_bias",), None, True, 33, None),
    "grid": ((), (3, 6), False, 20, None),
    "all-segments-mask-causal": (TABLES, (3, 6), True, 20, lambda r, lq, lk: {
        "query_segments": documents(r, (B, 1), lq), "key_segments": documents(r, (B, 1), lk),
        "key_mask": key_keep(r, (), lk)}),
    "positions-all-causal-segments-mask": (TABLES, (3, 6), True, 20, lambda r, lq, lk: {
        "query_positions": r.integers(0, 40, (B, 1, lq)), "key_positions": r.integers(0, 40, lk),
        "query_segments": documents(r, (B, 1), lq), "key_segments": documents(r, (B, 1), lk),
        "key_mask": key_keep(r, (), lk)}),
    "positions-bias-int64": (("relative_bias",), None, False, 11, lambda r, lq, lk: {
        "query_positions": np.arange(lq, dtype=np.int64) + 2**40,
        "key_positions": np.arange(lk, dtype=np.int64) + 2**40}),
}  # fmt: skip


#: Every case in float32, those with every term in the half dtypes too (float64 is not for
#: GPUs).
LOWERINGS = [(case, "float32") for case in LOWERING_CASES] + [
    (case, dtype)
    for case in ("all-segments-mask-causal", "positions-all-causal-segments-mask")
    for dtype in ("bfloat16", "float16")
]


@pytest.mark.parametrize(("case", "dtype"), LOWERINGS)
def test_lowers_to_triton_for_cuda(case, dtype, rng):
    """Every term, the masks and the positions, forward and backward: one Triton kernel per
    ``pallas_call``, the tables' gradient kernel only with contiguous positions (with
    positions the ``dq`` kernel adds the tables' gradients)."""
    terms, grid, causal, lq, extras = LOWERING_CASES[case]
    lk = 18
    x = as_jax(make_inputs(rng, lq, lk, 8, terms=terms, grid=grid), dtype)
    ints = {} if extras is None else {n: jnp.asarray(a) for n, a in extras(rng, lq, lk).items()}
    text = lower_for_cuda(x, ints, causal=causal, grid_width=None if grid is None else grid[1])
    tables_kernel = bool(terms) and "query_positions" not in ints
    assert text.count("__gpu$xla.gpu.triton") == 3 + tables_kernel  # forward, dq, dkv


def test_compiled_run_on_the_cpu_fails_cleanly(rng):
    """``interpret=False`` on CPU arrays lowers (above) but does not run: JAX's ValueError."""
    x = as_jax(make_inputs(rng, 4, 6, 8), jnp.float32)
    with pytest.raises(ValueError, match="interpret mode"):
        run(x, causal=False, blocks=(16, 16), interpret=False)


# ------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------
def _bad(rng, **changes):
    """Valid float32 inputs (Lq = 4, Lk = 6, d = 8, every term), with ``changes``."""
    x = as_jax(make_inputs(rng, 4, 6, 8), jnp.float32)
    x.update(changes)
    return {name: a for name, a in x.items() if a is not None}


def _zeros(shape):
    return jnp.zeros(shape, jnp.float32)


BAD = {
    "q-3d": (lambda r: _bad(r, q=_zeros((2, 4, 8))), ValueError,
             r"q must have shape \(B, H, Lq, d\)"),
    "k-d": (lambda r: _bad(r, k=_zeros((B, H, 6, 7))), ValueError, r"k must have shape"),
    "v-lk": (lambda r: _bad(r, v=_zeros((B, H, 5, 5))), ValueError, r"v must have shape"),
    "qp-shape": (lambda r: _bad(r, qp=_zeros((B, H, 3, 8))), ValueError, r"qp must have shape"),
    "table-without-qp": (lambda r: _bad(r, qp=None), ValueError, r"key_table needs qp"),
    "ks-without-table": (lambda r: _bad(r, query_table=None), ValueError, r"ks needs query_table"),
    "width": (lambda r: _bad(r, key_table=_zeros((8, 8))), ValueError,
              r"key_table must have width W = Lq \+ Lk - 1 = 9 \(full layout\), got W = 8"),
    "causal-layout-not-causal": (lambda r: _bad(r, relative_bias=_zeros(6)), ValueError,
                                 r"relative_bias must have width .* got W = 6"),
    "table-lead": (lambda r: _bad(r, query_table=_zeros((3, 9, 8))), ValueError,
                   r"query_table's leading dims \(3,\) must broadcast to \(B, H\)"),
    "table-features": (lambda r: _bad(r, key_table=_zeros((9, 4))), ValueError,
                       r"key_table must have d = 8"),
    "d-too-large": (lambda r: {"q": _zeros((1, 1, 2, 257)), "k": _zeros((1, 1, 2, 257)),
                               "v": _zeros((1, 1, 2, 4))}, ValueError, r"at most 256"),
    "dtype-mix": (lambda r: _bad(r, v=jnp.zeros((B, H, 6, 5), jnp.bfloat16)), TypeError,
                  r"v must have q's dtype float32, got bfloat16"),
    "int": (lambda r: {"q": jnp.zeros((1, 1, 2, 4), int), "k": jnp.zeros((1, 1, 2, 4), int),
                       "v": jnp.zeros((1, 1, 2, 4), int)}, TypeError, r"q must be float16"),
    "query-segments-alone": (lambda r: _bad(r, query_segments=jnp.zeros(4, int)), ValueError,
                             r"query_segments needs key_segments: give both or neither"),
    "key-segments-alone": (lambda r: _bad(r, key_segments=jnp.zeros(6, int)), ValueError,
                           r"key_segments needs query_segments"),
    "segments-length": (lambda r: _bad(r, query_segments=jnp.zeros(5, int),
                                       key_segments=jnp.zeros(6, int)), ValueError,
                        r"query_segments must have shape \(\.\.\., Lq\) = \(\.\.\., 4\), "
                        r"got Lq = 5"),
    "segments-lead": (lambda r: _bad(r, query_segments=jnp.zeros(4, int),
                                     key_segments=jnp.zeros((3, 6), int)), ValueError,
                      r"key_segments's leading dims \(3,\) must broadcast to \(B, H\) = \(2, 2\)"),
    "segments-float": (lambda r: _bad(r, query_segments=jnp.zeros(4),
                                      key_segments=jnp.zeros(6, int)), TypeError,
                       r"query_segments must have an integer dtype \(document ids\), got float"),
    "mask-length": (lambda r: _bad(r, key_mask=jnp.ones(5, bool)), ValueError,
                    r"key_mask must have shape \(\.\.\., Lk\) = \(\.\.\., 6\), got Lk = 5"),
    "mask-3-leading-dims": (lambda r: _bad(r, key_mask=jnp.ones((1, 1, 1, 6), bool)),
                            ValueError, r"key_mask must have shape .* with at most 2 leading "
                            r"dims, got shape \(1, 1, 1, 6\)"),
    "mask-int": (lambda r: _bad(r, key_mask=jnp.ones(6, jnp.int32)), TypeError,
                 r"key_mask must be bool \(True: the key may be seen\), got int32"),
    # Positions: Lq = 4, Lk = 6.
    "query-positions-alone": (lambda r: _bad(r, query_positions=jnp.arange(4)), ValueError,
                              r"query_positions needs key_positions: give both or neither"),
    "key-positions-alone": (lambda r: _bad(r, key_positions=jnp.arange(6)), ValueError,
                            r"key_positions needs query_positions"),
    "positions-float": (lambda r: _bad(r, query_positions=jnp.arange(4.0),
                                       key_positions=jnp.arange(6)), TypeError,
                        r"query_positions must have an integer dtype \(positions\), got float"),
    "positions-bool": (lambda r: _bad(r, query_positions=jnp.arange(4),
                                      key_positions=jnp.ones(6, bool)), TypeError,
                       r"key_positions must have an integer dtype \(positions\), got bool"),
    "positions-length": (lambda r: _bad(r, query_positions=jnp.arange(4),
                                        key_positions=jnp.arange(5)), ValueError,
                         r"key_positions must have shape \(\.\.\., Lk\) = \(\.\.\., 6\), "
                         r"got Lk = 5"),
    "positions-lead": (lambda r: _bad(r, query_positions=jnp.zeros((3, 4), int),
                                      key_positions=jnp.arange(6)), ValueError,
                       r"query_positions's leading dims \(3,\) must broadcast to \(B, H\)"),
    "positions-3-leading-dims": (lambda r: _bad(r, query_positions=jnp.arange(4),
                                                key_positions=jnp.zeros((1, 1, 1, 6), int)),
                                 ValueError, r"key_positions must have shape .* with at most 2 "
                                 r"leading dims"),
    # The decomposed terms: Lq = 4, a key grid of 2 × 3 (Lk = 6).
    "grid-rows-alone": (lambda r: _bad(r, grid_rows=_zeros((4, 2))), ValueError,
                        r"grid_rows needs grid_cols: give both or neither"),
    "grid-cols-alone": (lambda r: _bad(r, grid_cols=_zeros((4, 3))), ValueError,
                        r"grid_cols needs grid_rows"),
    "grid-width-alone": (lambda r: _bad(r, grid_width=3), ValueError,
                         r"grid_width needs grid_rows and grid_cols"),
    "grid-width-float": (lambda r: _bad(r, grid_rows=_zeros((4, 2)), grid_cols=_zeros((4, 3)),
                                        grid_width=3.0), TypeError,
                         r"grid_width must be an int, got float"),
    "grid-width-divides": (lambda r: _bad(r, grid_rows=_zeros((4, 2)), grid_cols=_zeros((4, 4)),
                                          grid_width=4), ValueError,
                           r"grid_width must be a width kw >= 1 of the key grid "
                           r"\(Lk = kh·kw = 6\), got 4"),
    "grid-rows-kh": (lambda r: _bad(r, grid_rows=_zeros((4, 3)), grid_cols=_zeros((4, 3))),
                     ValueError, r"grid_rows must have shape \(\.\.\., Lq, kh\) = "
                     r"\(\.\.\., 4, 2\), got shape \(4, 3\)"),
    "grid-cols-lq": (lambda r: _bad(r, grid_rows=_zeros((4, 2)), grid_cols=_zeros((5, 3)),
                                    grid_width=3), ValueError,
                     r"grid_cols must have shape \(\.\.\., Lq, kw\) = \(\.\.\., 4, 3\)"),
    "grid-lead": (lambda r: _bad(r, grid_rows=_zeros((3, 4, 2)), grid_cols=_zeros((4, 3))),
                  ValueError, r"grid_rows's leading dims \(3,\) must broadcast to \(B, H\)"),
    "grid-1d": (lambda r: _bad(r, grid_rows=_zeros(2), grid_cols=_zeros((4, 3))), ValueError,
                r"grid_rows must have shape .* with at most 2 leading dims, got shape \(2,\)"),
    "grid-dtype": (lambda r: _bad(r, grid_rows=jnp.zeros((4, 2), jnp.float64),
                                  grid_cols=_zeros((4, 3))), TypeError,
                   r"grid_rows must have q's dtype float32, got float64"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_bad_input(case, rng):
    make, error, message = BAD[case]
    with pytest.raises(error, match=message):
        run(make(rng), causal=False, blocks=(8, 8))


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"causal": "yes"}, TypeError, r"causal must be a bool, got str"),
        ({"block_q": 12}, ValueError, r"block_q must be a power of two >= 8, got 12"),
        ({"block_k": 4}, ValueError, r"block_k must be a power of two >= 8, got 4"),
        ({"block_k": 8.0}, TypeError, r"block_k must be an int, got float"),
        ({"interpret": 1}, TypeError, r"interpret must be a bool or None, got int"),
    ],
)
def test_bad_options(options, error, message, rng):
    x = _bad(rng)
    q, k, v = x.pop("q"), x.pop("k"), x.pop("v")
    with pytest.raises(error, match=message):
        relative_attention_kernel(q, k, v, **x, **{"causal": False, **options})
