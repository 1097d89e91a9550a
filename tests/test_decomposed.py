"""Decomposed relative positions of MViTv2, ViTDet and SAM (SPEC §2.18).

Against a float64 loop over every ``(i, j)`` pair written here from the formulas:
MViTv2's (Li et al. 2022, §3.1) ``score_ij = (q_i·scale)·k_j + q_i·Rʰ[r(y_i, ky_j)] +
q_i·Rʷ[r(x_i, kx_j)]`` with SAM's row ``r(a, b) = ⌊a·max(k/q, 1) - b·max(q/k, 1) +
(k - 1)·max(q/k, 1)⌋`` (float32, as their ``torch.arange(n) * ratio`` is) and SAM's
resizing of a table by linear interpolation (``align_corners=False``). Then against
HF transformers' ``SamVisionAttention`` with copied weights (torch float64, 1e-10),
including resized tables and a key grid other than the query grid; blockwise equals
dense; gradients reach q, k, v and both tables; jit and compile equal eager.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import relattn
from relattn.decomposed import (
    decomposed_relative_attention,
    decomposed_relative_terms,
    resize_relative_table,
)

D = 4

#: name -> (query grid, key grid, table_h rows, table_w rows): SAM's global attention
#: (tables of 2·size - 1 rows), SAM at another resolution (tables resized), MViTv2's
#: pooled keys and values (kh < qh), a finer key grid, and 10 → 6 / 8 → 6, ratios whose
#: float32 rows differ from exact arithmetic.
CASES = {
    "square": ((3, 3), (3, 3), 5, 5),
    "resized": ((3, 4), (3, 4), 9, 4),
    "pooled": ((4, 6), (2, 3), 7, 11),
    "finer-keys": ((2, 3), (4, 5), 7, 9),
    "float32-rows": ((8, 2), (6, 2), 15, 3),
}


def _row(a: int, b: int, q: int, k: int) -> int:
    """SAM's ``get_rel_pos`` / MViTv2's ``cal_rel_pos_spatial`` row, in float32 as theirs."""
    f32 = np.float32
    q_ratio, k_ratio = f32(max(k / q, 1.0)), max(q / k, 1.0)
    return int((f32(a) * q_ratio - f32(b) * f32(k_ratio)) + f32((k - 1) * k_ratio))


def _resize(table: np.ndarray, size: int) -> np.ndarray:
    """Linear interpolation along the rows, ``align_corners=False`` (torch's ``interpolate``)."""
    width = table.shape[0]
    out = np.zeros((size, table.shape[1]))
    for o in range(size):
        src = max((o + 0.5) * width / size - 0.5, 0.0)
        i0 = min(math.floor(src), width - 1)
        i1 = min(i0 + 1, width - 1)
        lam = src - i0
        out[o] = (1 - lam) * table[i0] + lam * table[i1]
    return out


def _terms_loop(q, table_h, table_w, qgrid, kgrid):
    """``rel_h[..., i, ky] = q_i·Rʰ[r(y, ky)]``, ``rel_w[..., i, kx] = q_i·Rʷ[r(x, kx)]``."""
    (qh, qw), (kh, kw) = qgrid, kgrid
    rh = _resize(table_h, 2 * max(qh, kh) - 1)
    rw = _resize(table_w, 2 * max(qw, kw) - 1)
    lead = q.shape[:-2]
    rel_h = np.zeros((*lead, qh * qw, kh))
    rel_w = np.zeros((*lead, qh * qw, kw))
    for idx in np.ndindex(*lead):
        for i in range(qh * qw):
            y, x = divmod(i, qw)
            for ky in range(kh):
                rel_h[(*idx, i, ky)] = q[(*idx, i)] @ rh[_row(y, ky, qh, kh)]
            for kx in range(kw):
                rel_w[(*idx, i, kx)] = q[(*idx, i)] @ rw[_row(x, kx, qw, kw)]
    return rel_h, rel_w


def _attention_loop(q, k, v, table_h, table_w, qgrid, kgrid, scale=None):
    """``softmax_j((q_i·scale)·k_j + q_i·Rʰ[r(y, ky)] + q_i·Rʷ[r(x, kx)]) v_j`` per pair."""
    (qh, qw), (kh, kw) = qgrid, kgrid
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    rh = _resize(table_h, 2 * max(qh, kh) - 1)
    rw = _resize(table_w, 2 * max(qw, kw) - 1)
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k, v = (np.broadcast_to(a, (*lead, *a.shape[-2:])) for a in (q, k, v))
    out = np.zeros((*lead, qh * qw, v.shape[-1]))
    for idx in np.ndindex(*lead):
        for i in range(qh * qw):
            y, x = divmod(i, qw)
            qi = q[(*idx, i)]
            scores = np.zeros(kh * kw)
            for j in range(kh * kw):
                ky, kx = divmod(j, kw)
                scores[j] = (
                    (qi * scale) @ k[(*idx, j)]
                    + qi @ rh[_row(y, ky, qh, kh)]
                    + qi @ rw[_row(x, kx, qw, kw)]
                )
            w = np.exp(scores - scores.max())
            out[(*idx, i)] = (w / w.sum()) @ v[(*idx,)]
    return out


def _inputs(rng, case, lead=(2, 2), dv=3):
    qgrid, kgrid, wh, ww = CASES[case]
    lq, lk = qgrid[0] * qgrid[1], kgrid[0] * kgrid[1]
    return (
        rng.normal(size=(*lead, lq, D)),
        rng.normal(size=(*lead, lk, D)),
        rng.normal(size=(*lead, lk, dv)),
        rng.normal(size=(wh, D)),
        rng.normal(size=(ww, D)),
    )


# ===============================================================================================
# resize_relative_table
# ===============================================================================================


@pytest.mark.parametrize(("width", "size"), [(5, 5), (3, 5), (7, 13), (13, 7), (1, 4), (6, 1)])
def test_resize_matches_the_loop(backend, dtype, rng, width, size):
    table = rng.normal(size=(width, D))
    got = resize_relative_table(backend.asarray(table, dtype), size)
    assert backend.is_array(got)
    assert got.dtype == backend.dtype(dtype)
    assert tuple(got.shape) == (size, D)
    backend.assert_close(got, _resize(table, size), dtype)


def test_resize_keeps_leading_dims_and_returns_the_table_at_its_size(rng):
    table = rng.normal(size=(2, 5, D))
    got = resize_relative_table(table, 9)
    np.testing.assert_allclose(got[1], _resize(table[1], 9), rtol=0, atol=1e-14)
    assert resize_relative_table(table, 5) is table


def test_resize_equals_torch_interpolate():
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    rng = np.random.default_rng(3)
    for width, size in [(3, 5), (7, 13), (13, 7), (27, 127), (127, 27), (2, 3), (9, 9)]:
        table = rng.normal(size=(width, D))
        t = torch.from_numpy(table)
        want = functional.interpolate(t.T[None], size=size, mode="linear")[0].T
        got = resize_relative_table(t, size)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=1e-12)


# ===============================================================================================
# decomposed_relative_terms and decomposed_relative_attention against the loops
# ===============================================================================================


@pytest.mark.parametrize("case", list(CASES))
def test_terms_match_the_loop(backend, dtype, rng, case):
    qgrid, kgrid, _, _ = CASES[case]
    q, _, _, th, tw = _inputs(rng, case)
    want_h, want_w = _terms_loop(q, th, tw, qgrid, kgrid)
    rel_h, rel_w = decomposed_relative_terms(
        *(backend.asarray(a, dtype) for a in (q, th, tw)), qgrid, kgrid
    )
    assert rel_h.dtype == backend.dtype(dtype)
    backend.assert_close(rel_h, want_h, dtype)
    backend.assert_close(rel_w, want_w, dtype)


@pytest.mark.parametrize("case", list(CASES))
def test_attention_matches_the_loop(backend, dtype, rng, case):
    qgrid, kgrid, _, _ = CASES[case]
    arrays = _inputs(rng, case)
    want = _attention_loop(*arrays, qgrid, kgrid)
    xq, xk, xv, th, tw = (backend.asarray(a, dtype) for a in arrays)
    for block_size in (None, (3, 5)):
        out = decomposed_relative_attention(
            xq, xk, xv, th, tw, query_grid=qgrid, key_grid=kgrid, block_size=block_size
        )
        assert backend.is_array(out)
        assert out.dtype == backend.dtype(dtype)
        backend.assert_close(out, want, dtype)


#: leading dims of (q, k, v): (B, H, L, d), (N, L, d), (L, d), broadcast heads and batch,
#: and three leading dims (flattened for the blockwise path).
LEADS = {
    "BH": ((2, 3), (2, 3), (2, 3)),
    "N": ((3,), (3,), (3,)),
    "none": ((), (), ()),
    "broadcast": ((1, 3), (2, 1), (2, 3)),
    "three": ((2, 1, 2), (2, 2, 2), (1, 2, 2)),
}


@pytest.mark.parametrize("lead", list(LEADS))
def test_leading_dims_dense_and_blockwise(backend, rng, lead):
    """Every leading layout, on the dense bias, the ``score_mod`` blockwise (its (batch, head)
    read the right rows of the terms) and the dense bias one query row at a time (a budget
    of 1 byte)."""
    qgrid, kgrid = (3, 2), (2, 2)
    ql, kl, vl = LEADS[lead]
    q = rng.normal(size=(*ql, 6, D))
    k, v = rng.normal(size=(*kl, 4, D)), rng.normal(size=(*vl, 4, 2))
    th, tw = rng.normal(size=(5, D)), rng.normal(size=(3, D))
    want = _attention_loop(q, k, v, th, tw, qgrid, kgrid, scale=0.7)
    arrays = [backend.asarray(a, "float64") for a in (q, k, v, th, tw)]

    def run(block_size):
        return decomposed_relative_attention(
            *arrays, query_grid=qgrid, key_grid=kgrid, scale=0.7, block_size=block_size
        )

    backend.assert_close(run(None), want, "float64")
    backend.assert_close(run(2), want, "float64")
    with relattn.config.override(max_score_bytes=1):
        backend.assert_close(run(None), want, "float64")


@given(
    qh=st.integers(1, 5), qw=st.integers(1, 5), kh=st.integers(1, 5), kw=st.integers(1, 5),
    wh=st.integers(1, 9), ww=st.integers(1, 9),
)  # fmt: skip
def test_terms_and_attention_on_any_grid(qh, qw, kh, kw, wh, ww):
    rng = np.random.default_rng(qh * 1000 + qw * 100 + kh * 10 + kw)
    q, k = rng.normal(size=(qh * qw, D)), rng.normal(size=(kh * kw, D))
    v = rng.normal(size=(kh * kw, 2))
    th, tw = rng.normal(size=(wh, D)), rng.normal(size=(ww, D))
    want_h, want_w = _terms_loop(q, th, tw, (qh, qw), (kh, kw))
    rel_h, rel_w = decomposed_relative_terms(q, th, tw, (qh, qw), (kh, kw))
    np.testing.assert_allclose(rel_h, want_h, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rel_w, want_w, rtol=1e-12, atol=1e-12)
    want = _attention_loop(q, k, v, th, tw, (qh, qw), (kh, kw))
    for block_size in (None, 2):
        out = decomposed_relative_attention(
            q, k, v, th, tw, query_grid=(qh, qw), key_grid=(kh, kw), block_size=block_size
        )
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


def test_zero_tables_give_plain_attention(rng):
    q, k, v, _, _ = _inputs(rng, "pooled")
    zeros = np.zeros((3, D))
    out = decomposed_relative_attention(q, k, v, zeros, zeros, query_grid=(4, 6), key_grid=(2, 3))
    np.testing.assert_allclose(
        out, relattn.scaled_dot_product_attention(q, k, v), rtol=1e-13, atol=1e-13
    )


def test_inputs_are_not_modified(rng):
    arrays = _inputs(rng, "resized")
    copies = [a.copy() for a in arrays]
    for a in arrays:
        a.flags.writeable = False
    decomposed_relative_attention(*arrays, query_grid=(3, 4), block_size=5)
    for a, b in zip(arrays, copies, strict=True):
        np.testing.assert_array_equal(a, b)


# ===============================================================================================
# HF transformers' SamVisionAttention, copied weights, torch float64
# ===============================================================================================


def _sam_attention(torch, grid, rel_rows, heads=2, hidden=8):
    modeling = pytest.importorskip("transformers.models.sam.modeling_sam")
    from transformers import SamVisionConfig

    config = SamVisionConfig(
        hidden_size=hidden, num_attention_heads=heads, image_size=grid * 16, patch_size=16,
        use_rel_pos=True, qkv_bias=True,
    )  # fmt: skip
    layer = modeling.SamVisionAttention(config, window_size=0).double().eval()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64))
        # tables learned for another resolution: get_rel_pos interpolates them
        head_dim = hidden // heads
        layer.rel_pos_h = torch.nn.Parameter(
            torch.randn(rel_rows[0], head_dim, generator=generator, dtype=torch.float64)
        )
        layer.rel_pos_w = torch.nn.Parameter(
            torch.randn(rel_rows[1], head_dim, generator=generator, dtype=torch.float64)
        )
    return layer


@pytest.mark.parametrize("rel_rows", [(7, 7), (11, 5)])
def test_equals_transformers_sam_vision_attention(monkeypatch, rel_rows):
    torch = pytest.importorskip("torch")
    grid, heads, hidden, batch = 4, 2, 8, 2
    layer = _sam_attention(torch, grid, rel_rows, heads, hidden)
    x = torch.randn(batch, grid, grid, hidden, generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64)  # fmt: skip
    # SamVisionAttention takes its softmax in float32 (dtype=torch.float32) and casts back:
    # for a float64 comparison at 1e-10 the softmax stays in the input's dtype.
    softmax = torch.nn.functional.softmax
    monkeypatch.setattr(
        torch.nn.functional, "softmax", lambda x, dim=None, dtype=None: softmax(x, dim=dim)
    )
    with torch.no_grad():
        want = layer(x)[0]
        qkv = layer.qkv(x).reshape(batch, grid * grid, 3, heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, H, L, d) each
        for block_size in (None, 5):
            out = decomposed_relative_attention(
                q, k, v, layer.rel_pos_h, layer.rel_pos_w, query_grid=(grid, grid),
                scale=layer.scale, block_size=block_size,
            )  # fmt: skip
            out = out.permute(0, 2, 1, 3).reshape(batch, grid, grid, hidden)
            got = layer.proj(out)
            assert float((got - want).abs().max()) <= 1e-10


@pytest.mark.parametrize(("qgrid", "kgrid"), [((4, 6), (2, 3)), ((2, 3), (4, 5)), ((8, 3), (6, 3))])
def test_terms_equal_transformers_get_decomposed_rel_pos(qgrid, kgrid):
    """A key grid other than the query grid (MViTv2's pooling) through HF's
    ``get_decomposed_rel_pos``, which takes both sizes, with tables of other widths."""
    torch = pytest.importorskip("torch")
    layer = _sam_attention(torch, 4, (9, 4))
    generator = torch.Generator().manual_seed(2)
    query = torch.randn(3, qgrid[0] * qgrid[1], 4, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        want = layer.get_decomposed_rel_pos(
            query, layer.rel_pos_h, layer.rel_pos_w, qgrid, kgrid
        ).reshape(3, qgrid[0] * qgrid[1], kgrid[0] * kgrid[1])
        rel_h, rel_w = decomposed_relative_terms(
            query, layer.rel_pos_h, layer.rel_pos_w, qgrid, kgrid
        )
    got = (rel_h[..., :, None] + rel_w[..., None, :]).reshape(want.shape)
    assert float((got - want).abs().max()) <= 1e-10


# ===============================================================================================
# Gradients, jit and compile
# ===============================================================================================


def test_torch_gradients(torch_backend, rng):
    torch = torch_backend.lib
    # pooled keys (2, 3) -> (1, 2) and tables of other widths, both resized
    shapes = [(1, 2, 6, 3), (1, 2, 2, 3), (1, 2, 2, 2), (4, 3), (2, 3)]
    leaves = [
        torch_backend.asarray(rng.normal(size=s), "float64").requires_grad_(True) for s in shapes
    ]

    for block_size in (None, (4, 1)):

        def f(*a, b=block_size):
            return decomposed_relative_attention(
                *a, query_grid=(2, 3), key_grid=(1, 2), block_size=b
            )

        assert torch.autograd.gradcheck(f, leaves)
    with relattn.config.override(max_score_bytes=1):  # the bias one query row at a time
        assert torch.autograd.gradcheck(functools.partial(f, b=None), leaves)
    decomposed_relative_attention(*leaves, query_grid=(2, 3), key_grid=(1, 2)).sum().backward()
    assert all(float(leaf.grad.abs().max()) > 0 for leaf in leaves)


def test_jax_gradients(jax_backend, rng):
    import jax
    import jax.numpy as jnp

    arrays = [jax_backend.asarray(a, "float64") for a in _inputs(rng, "resized", lead=(2,))]
    weights = jax_backend.asarray(rng.normal(size=(2, 12, 3)), "float64")

    for block_size in (None, 5):

        def loss(p, b=block_size):
            out = decomposed_relative_attention(*p, query_grid=(3, 4), block_size=b)
            return jnp.sum(out * weights)

        grad = jax.jit(jax.grad(loss))(arrays)
        assert all(float(jnp.abs(g).max()) > 0 for g in grad)
        jax_backend.assert_directional_derivatives(loss, grad, arrays, rng)


def test_jit_equals_eager(jit_backend, rng):
    arrays = [jit_backend.asarray(a, "float64") for a in _inputs(rng, "pooled", lead=(2, 1))]

    def both(q, k, v, th, tw):
        terms = decomposed_relative_terms(q, th, tw, (4, 6), (2, 3))
        blockwise = decomposed_relative_attention(
            q, k, v, th, tw, query_grid=(4, 6), key_grid=(2, 3), block_size=(8, 4)
        )
        return (*terms, blockwise)

    eager = both(*arrays)
    compiled = jit_backend.jit(both)(*arrays)
    for a, b in zip(eager, compiled, strict=True):
        jit_backend.assert_close(b, jit_backend.to_host(a), "float64")


@pytest.mark.parametrize("budget", [None, 1], ids=["whole", "row-chunks"])
def test_jit_equals_eager_dense(jit_backend, rng, budget):
    """The dense bias, of every query row at once or (a budget of 1 byte) one row at a
    time (the fold's ``score_mod`` on JAX)."""
    arrays = [jit_backend.asarray(a, "float64") for a in _inputs(rng, "pooled", lead=(2, 1))]

    def dense(q, k, v, th, tw):
        return decomposed_relative_attention(q, k, v, th, tw, query_grid=(4, 6), key_grid=(2, 3))

    with relattn.config.override(max_score_bytes=budget):
        eager = dense(*arrays)
        compiled = jit_backend.jit(dense)(*arrays)
    jit_backend.assert_close(compiled, jit_backend.to_host(eager), "float64")


# ===============================================================================================
# Bad input
# ===============================================================================================

_Q = np.zeros((2, 6, D))
_K = np.zeros((2, 4, D))
_V = np.zeros((2, 4, 3))
_T = np.zeros((3, D))


def _attend(q=_Q, k=_K, v=_V, th=_T, tw=_T, **kwargs):
    kwargs.setdefault("query_grid", (2, 3))
    kwargs.setdefault("key_grid", (2, 2))
    return decomposed_relative_attention(q, k, v, th, tw, **kwargs)


BAD = {
    "query-grid-tokens": (
        lambda: _attend(query_grid=(3, 3)),
        ValueError,
        r"^query_grid \(3, 3\) holds 9 tokens, but q has Lq = 6",
    ),
    "key-grid-tokens": (
        lambda: _attend(key_grid=(1, 3)),
        ValueError,
        r"^key_grid \(1, 3\) holds 3 tokens, but k has Lk = 4",
    ),
    "grid-zero": (
        lambda: _attend(query_grid=(0, 6)),
        ValueError,
        r"^query_grid\[0\] \(height\) must be >= 1, got 0",
    ),
    "grid-negative": (
        lambda: _attend(key_grid=(4, -1)),
        ValueError,
        r"^key_grid\[1\] \(width\) must be >= 1, got -1",
    ),
    "grid-float": (
        lambda: _attend(query_grid=(2.0, 3)),
        TypeError,
        r"^query_grid\[0\] \(height\) must be an integer, got float",
    ),
    "grid-int": (
        lambda: _attend(query_grid=6),
        TypeError,
        r"^query_grid must be a pair of integers \(height, width\), got int 6",
    ),
    "table-features": (
        lambda: _attend(tw=np.zeros((3, D + 1))),
        ValueError,
        r"^table_w must have the feature size of q, d = 4, got shape \(3, 5\)",
    ),
    "table-1d": (
        lambda: _attend(th=np.zeros(3)),
        ValueError,
        r"^table_h must have shape \(W, d\) with W >= 1",
    ),
    "table-empty": (
        lambda: _attend(th=np.zeros((0, D))),
        ValueError,
        r"^table_h must have shape \(W, d\) with W >= 1 .*got shape \(0, 4\)",
    ),
    "table-none": (lambda: _attend(th=None), TypeError, r"^table_h must be an array"),
    "table-int": (
        lambda: _attend(tw=np.zeros((3, D), dtype=np.int64)),
        TypeError,
        r"^table_w must have a real floating dtype",
    ),
    "v-length": (
        lambda: _attend(v=np.zeros((2, 5, 3))),
        ValueError,
        r"^v must have one row per key, Lk = 4",
    ),
    "k-features": (
        lambda: _attend(k=np.zeros((2, 4, D + 1))),
        ValueError,
        r"^k must have the feature size of q",
    ),
    "q-1d": (
        lambda: decomposed_relative_terms(np.zeros(4), _T, _T, (2, 2)),
        ValueError,
        r"^q must have shape \(\.\.\., Lq, d\)",
    ),
    "terms-grid": (
        lambda: decomposed_relative_terms(_Q, _T, _T, (2, 2)),
        ValueError,
        r"^query_grid \(2, 2\) holds 4 tokens, but q has Lq = 6",
    ),
    "size-zero": (
        lambda: resize_relative_table(_T, 0),
        ValueError,
        r"^size must be >= 1, got 0",
    ),
    "size-float": (
        lambda: resize_relative_table(_T, 2.5),
        TypeError,
        r"^size must be an integer, got float",
    ),
    "resize-1d": (
        lambda: resize_relative_table(np.zeros(3), 5),
        ValueError,
        r"^table must have shape \(\.\.\., W, d\), got shape \(3,\)",
    ),
    "resize-empty": (
        lambda: resize_relative_table(np.zeros((0, D)), 5),
        ValueError,
        r"^table must have at least one row",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input(name):
    call, error, match = BAD[name]
    with pytest.raises(error, match=match):
        call()


def test_mixed_libraries():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError):
        _attend(th=torch.zeros(3, D, dtype=torch.float64))
