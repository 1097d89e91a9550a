"""relattn's Pallas kernel (relattn.backends._pallas), in Pallas's interpreter on the CPU.

The output against a float64 loop over the ``(i, j)`` pairs written here from the formula
(Transformer-XL's content-to-position term, DeBERTa's position-to-content term, a
per-distance bias): each term alone and all together, the full and the causal layout,
``Lq = Lk``, ``Lq < Lk`` and ``Lq > Lk`` (rows that see no key), lengths that are not
multiples of the tiles, ``d`` not a power of two, tables with fewer leading dims. Against
relattn's own block fold. Every input's gradient against autodiff of a dense float64
implementation, also written here. float32 to about 1e-5, bfloat16 and float16 loosely;
``jax.jit`` equal to eager; bad input.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("jax.experimental.pallas")

import jax.numpy as jnp  # noqa: E402 - after the skip

import relattn  # noqa: E402 - after the skip
from relattn.backends._pallas import relative_attention_kernel  # noqa: E402 - after the skip

pytestmark = [pytest.mark.slow]

B, H = 2, 2
TABLES = ("key_table", "query_table", "relative_bias")
#: The kernel's inputs, in the order the gradient tests differentiate them.
INPUTS = ("q", "k", "v", "qp", "key_table", "ks", "query_table", "relative_bias")

needs_x64 = pytest.mark.skipif(
    not jax.config.jax_enable_x64, reason="float64 needs jax_enable_x64 (tests/conftest.py)"
)


# ------------------------------------------------------------------------------------------
# References
# ------------------------------------------------------------------------------------------
def _full(x, trailing):
    """A table (or bias) with up to two leading dims, broadcast to ``(B, H, ...)``."""
    x = np.asarray(x, np.float64)
    x = x.reshape((1,) * (trailing + 2 - x.ndim) + x.shape)
    return np.broadcast_to(x, (B, H, *x.shape[2:]))


def loop_reference(q, k, v, *, qp=None, key_table=None, ks=None, query_table=None,
                   relative_bias=None, causal=False):  # fmt: skip
    """``softmax_j(q_i·k_j + qp_i·Kʳ[m] + ks_j·Qʳ[m] + b[m]) v`` pair by pair in float64,
    ``m = j - i + Lq - 1``; with ``causal`` the keys with ``j - i - (Lk - Lq) > 0`` are
    left out; a query with no key gives zeros."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    lq, lk = q.shape[2], k.shape[2]
    kt = None if key_table is None else _full(key_table, 2)
    qt = None if query_table is None else _full(query_table, 2)
    bias = None if relative_bias is None else _full(relative_bias, 1)
    qp = None if qp is None else np.asarray(qp, np.float64)
    ks = None if ks is None else np.asarray(ks, np.float64)
    out = np.zeros((*q.shape[:3], v.shape[-1]))
    for b in range(B):
        for h in range(H):
            for i in range(lq):
                scores, keys = [], []
                for j in range(lk):
                    if causal and j - i - (lk - lq) > 0:
                        continue
                    m = j - i + lq - 1
                    s = q[b, h, i] @ k[b, h, j]
                    if kt is not None:
                        s += qp[b, h, i] @ kt[b, h, m]
                    if qt is not None:
                        s += ks[b, h, j] @ qt[b, h, m]
                    if bias is not None:
                        s += bias[b, h, m]
                    scores.append(s)
                    keys.append(j)
                if scores:
                    w = np.exp(np.array(scores) - max(scores))
                    out[b, h, i] = (w / w.sum()) @ v[b, h, keys]
    return out


def dense_jax(q, k, v, qp, key_table, ks, query_table, relative_bias, causal):
    """The same scores as one gathered ``(B, H, Lq, Lk)`` array, for ``jax.grad``: each
    table gathered at ``m(i, j)`` (zero where a causal-layout table lacks the column, a
    masked cell)."""
    lq, lk = q.shape[2], k.shape[2]
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    m = j - i + lq - 1

    def at_m(table, trailing):
        lead = table.shape[: table.ndim - trailing]
        table = table.reshape((1,) * (2 - len(lead)) + table.shape)
        width = table.shape[2]
        rows = table[:, :, np.minimum(m, width - 1)]
        inside = (m < width)[..., None] if trailing == 2 else m < width
        return jnp.where(inside, rows, 0)

    s = jnp.einsum("bhid,bhjd->bhij", q, k)
    if key_table is not None:
        s += jnp.einsum("bhid,bhijd->bhij", qp, at_m(key_table, 2))
    if query_table is not None:
        s += jnp.einsum("bhjd,bhijd->bhij", ks, at_m(query_table, 2))
    if relative_bias is not None:
        s += at_m(relative_bias, 1)
    visible = (j - i - (lk - lq) <= 0) if causal else np.ones((lq, lk), bool)
    s = jnp.where(visible, s, -jnp.inf)
    top = jnp.max(s, axis=-1, keepdims=True)
    e = jnp.where(visible, jnp.exp(s - jnp.where(visible.any(-1, keepdims=True), top, 0)), 0)
    total = jnp.sum(e, axis=-1, keepdims=True)
    return jnp.einsum("bhij,bhjd->bhid", e / jnp.where(total > 0, total, 1), v)


# ------------------------------------------------------------------------------------------
# Problems
# ------------------------------------------------------------------------------------------
def make_inputs(rng, lq, lk, d, *, terms=TABLES, layout="full", table_lead=(B, H), dv=5):
    """float64 NumPy inputs: ``q, k, v`` and the given terms' tables (``qp`` with ``Kʳ``,
    ``ks`` with ``Qʳ``), width ``Lq + Lk - 1`` (full) or ``Lk`` (causal layout), with
    leading dims ``table_lead``."""
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
    expected = loop_reference(**x, causal=causal)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=2e-5)
    if causal and lq > lk:
        assert not np.asarray(out)[:, :, : lq - lk].any()  # rows that see no key: zeros


@needs_x64
def test_float64_matches_loop_reference_tightly(rng):
    x = make_inputs(rng, 12, 21, 8, table_lead=(H,))
    out = run(as_jax(x, jnp.float64), causal=True, blocks=(8, 16))
    assert out.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(out), loop_reference(**x, causal=True), atol=1e-12)


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


def kernel_fn(blocks):
    return lambda x, causal: run(x, causal=causal, blocks=blocks)


def dense_fn(x, causal):
    return dense_jax(*(x.get(n) for n in INPUTS), causal)


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
    for name in INPUTS:
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
    for name in INPUTS:
        assert got[name].dtype == jnp.float32
        scale = float(np.abs(expected[name]).max())
        np.testing.assert_allclose(got[name], expected[name], atol=2e-5 * scale, err_msg=name)


@needs_x64
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision(dtype, rng):
    """Half-precision inputs, float32 accumulation: the output, and for bfloat16 every
    gradient, against float64 on the same (rounded) inputs."""
    x = as_jax(make_inputs(rng, 21, 21, 8, layout="causal"), dtype)
    wide = {name: a.astype(jnp.float64) for name, a in x.items()}
    out = run(x, causal=True, blocks=(16, 16))
    assert out.dtype == dtype
    np.testing.assert_allclose(
        np.asarray(out, np.float64), loop_reference(**wide, causal=True), atol=2e-2
    )
    if dtype == "bfloat16":
        cotangent = jnp.asarray(rng.normal(size=(B, H, 21, 5)))
        got = grads(kernel_fn((16, 16)), x, cotangent.astype(dtype), True)
        expected = grads(dense_fn, wide, cotangent, True)
        for name in INPUTS:
            assert got[name].dtype == dtype
            scale = float(np.abs(expected[name]).max())
            np.testing.assert_allclose(
                np.asarray(got[name], np.float64), expected[name], atol=3e-2 * scale, err_msg=name
            )


# ------------------------------------------------------------------------------------------
# jax.jit
# ------------------------------------------------------------------------------------------
@needs_x64
def test_jit_equals_eager_and_differentiates(rng):
    x = as_jax(make_inputs(rng, 9, 14, 8), jnp.float64)
    f = kernel_fn((8, 8))
    eager = f(x, False)
    jitted = jax.jit(functools.partial(f, causal=False))(x)
    np.testing.assert_allclose(jitted, eager, atol=1e-14)
    cotangent = jnp.asarray(rng.normal(size=eager.shape))
    grad = jax.jit(jax.grad(lambda x: jnp.sum(f(x, False) * cotangent)))(x)
    expected = grads(dense_fn, x, cotangent, False)
    for name in INPUTS:
        np.testing.assert_allclose(grad[name], expected[name], atol=1e-11, err_msg=name)


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
