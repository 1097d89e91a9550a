"""relattn's Triton kernel (:mod:`relattn.backends._triton`) in Triton's interpreter.

Checked against a NumPy float64 loop over ``(i, j)`` of the formula, autodiff of a dense
float64 PyTorch implementation (the gradients) and relattn's own block fold. Sizes are tiny
and tiles 16 (the interpreter runs each tile op in NumPy): several tiles per axis, lengths
that are not multiples of a tile, ``d`` not a power of two and ``dv < 16`` (padded axes).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import reference

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import relattn  # noqa: E402
from relattn.backends._triton import (  # noqa: E402
    _Config,
    _inputs,
    _kernels,
    _language_interpreted,
    relative_attention_kernel,
)

pytestmark = [pytest.mark.slow]

D, DV = 24, 8
#: (Lq, Lk, causal, layout): layout "causal" is W = Lk, "full" W = Lq + Lk - 1.
CASES = {
    "square": (20, 20, False, "full"),
    "causal-square": (20, 20, True, "causal"),
    "short-queries-causal-layout": (13, 37, True, "causal"),
    "zero-rows": (37, 13, True, "full"),  # causal, Lq > Lk: the first 24 rows see no key
    "short-queries": (9, 30, False, "full"),
}
TERMS = {
    "content": (),
    "key_table": ("key_table",),
    "query_table": ("query_table",),
    "relative_bias": ("relative_bias",),
    "all": ("key_table", "query_table", "relative_bias"),
}
NAMES = (
    "q", "k", "v", "qp", "key_table", "ks", "query_table", "relative_bias", "grid_rows",
    "grid_cols",
)  # fmt: skip
MASKS = ("query_segments", "key_segments", "key_mask", "query_positions", "key_positions")


def make_inputs(lq, lk, layout, terms, *, batch=2, heads=1, seed=0, grid_width=None):
    """NumPy float64 inputs: ``q, k, v`` and the arrays of ``terms`` (tables per head; the
    term "grid": ``grid_rows``, ``grid_cols`` of a key grid ``grid_width`` wide)."""
    rng = np.random.default_rng(seed)
    width = lk if layout == "causal" else lq + lk - 1

    def normal(*shape):
        return 0.5 * rng.standard_normal(shape)

    x = {"q": normal(batch, heads, lq, D), "k": normal(batch, heads, lk, D)}
    x["v"] = normal(batch, heads, lk, DV)
    if "key_table" in terms:
        x["qp"], x["key_table"] = normal(batch, heads, lq, D), normal(heads, width, D)
    if "query_table" in terms:
        x["ks"], x["query_table"] = normal(batch, heads, lk, D), normal(heads, width, D)
    if "relative_bias" in terms:
        x["relative_bias"] = normal(heads, width)
    if "grid" in terms:
        x["grid_rows"] = normal(batch, heads, lq, lk // grid_width)
        x["grid_cols"] = normal(batch, heads, lq, grid_width)
    return x


def dense_reference(
    t, causal, query_segments=None, key_segments=None, key_mask=None, grid_width=None,
    query_positions=None, key_positions=None,
):  # fmt: skip
    """The same in float64 PyTorch, whole ``(Lq, Lk)`` scores, for autodiff: table rows
    ``m = δ + Lk - 1`` clipped to the table, ``δ`` from the positions (by default query
    ``i`` at ``i + Lk - Lq``, key ``j`` at ``j``)."""
    q, k, v = t["q"], t["k"], t["v"]
    lq, lk = q.shape[2], k.shape[2]
    lead = q.shape[:2]
    if query_positions is None:
        query_positions, key_positions = torch.arange(lq) + lk - lq, torch.arange(lk)
    delta = key_positions[..., None, :] - query_positions[..., :, None]
    m = (delta + lk - 1).expand(*lead, lq, lk)  # (B, H, Lq, Lk)
    batch = torch.arange(lead[0])[:, None, None, None]
    head = torch.arange(lead[1])[None, :, None, None]
    s = q @ k.transpose(-1, -2)

    def rows(table, trailing=2):  # each cell's row, clipped to the table (B, H, Lq, Lk, ...)
        table = table.expand(*lead, *table.shape[table.ndim - trailing :])
        return table[batch, head, m.clamp(0, table.shape[2] - 1)]

    if t.get("key_table") is not None:
        s = s + torch.einsum("bhid,bhijd->bhij", t["qp"], rows(t["key_table"]))
    if t.get("query_table") is not None:
        s = s + torch.einsum("bhjd,bhijd->bhij", t["ks"], rows(t["query_table"]))
    if t.get("relative_bias") is not None:
        s = s + rows(t["relative_bias"], 1)
    if t.get("grid_rows") is not None:
        j = torch.arange(lk)
        s = s + t["grid_rows"][..., j // grid_width] + t["grid_cols"][..., j % grid_width]
    visible = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        visible = delta <= 0
    if query_segments is not None:
        visible = visible & (query_segments[..., :, None] == key_segments[..., None, :])
    if key_mask is not None:
        visible = visible & key_mask[..., None, :]
    seen = visible.any(-1, keepdim=True)
    # Rows without a visible key: softmax over all keys (finite), then zeroed.
    p = torch.softmax(s.masked_fill(~(visible | ~seen), -math.inf), -1) * seen
    return p @ v


def run_kernel(t, causal, **kwargs):
    """The kernel on the arrays of ``t`` (segments, key mask, grid terms and their
    ``grid_width`` included, if there)."""
    masks = {n: t[n] for n in (*MASKS, "grid_rows", "grid_cols", "grid_width") if n in t}
    return relative_attention_kernel(
        t["q"], t["k"], t["v"], qp=t.get("qp"), key_table=t.get("key_table"), ks=t.get("ks"),
        query_table=t.get("query_table"), relative_bias=t.get("relative_bias"),
        causal=causal, **masks, **kwargs,
    )  # fmt: skip


def tensors(x, dtype):
    return {n: torch.tensor(a, dtype=dtype, requires_grad=True) for n, a in x.items()}


def check_gradients(x, causal, dtype, tol, masks=None):
    """Forward and every input's gradient of the kernel in ``dtype`` against the dense
    float64 reference at the same (rounded) inputs; ``masks``: segments, key mask and
    ``grid_width``."""
    masks = masks or {}
    got = tensors(x, dtype)
    want = {n: a.detach().double().requires_grad_() for n, a in got.items()}
    out = run_kernel(got, causal, block_q=16, block_k=16, **masks)
    expected = dense_reference(want, causal, **masks)
    assert out.dtype == dtype and out.shape == expected.shape
    grad = torch.randn(
        expected.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
    )
    names = [n for n in NAMES if n in got]
    grads = torch.autograd.grad(out, [got[n] for n in names], grad.to(dtype))
    expected_grads = torch.autograd.grad(expected, [want[n] for n in names], grad)
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol)
    for name, g, e in zip(names, grads, expected_grads, strict=True):
        assert g.shape == got[name].shape and g.dtype == dtype, name
        torch.testing.assert_close(
            g.double(), e, rtol=tol, atol=tol, msg=lambda m, n=name: f"{n}: {m}"
        )


@pytest.mark.parametrize("terms", TERMS)
@pytest.mark.parametrize("case", CASES)
def test_forward_against_loop(case, terms):
    lq, lk, causal, layout = CASES[case]
    x = make_inputs(lq, lk, layout, TERMS[terms])
    out = run_kernel(tensors(x, torch.float32), causal, block_q=16, block_k=16)
    np.testing.assert_allclose(
        out.detach().double().numpy(),
        reference.relative_kernel_attention(**x, causal=causal),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("case", CASES)
def test_gradients_all_terms(case):
    lq, lk, causal, layout = CASES[case]
    check_gradients(make_inputs(lq, lk, layout, TERMS["all"]), causal, torch.float32, 1e-5)


@pytest.mark.parametrize("terms", ["content", "key_table", "query_table", "relative_bias"])
@pytest.mark.parametrize("case", ["zero-rows", "short-queries-causal-layout"])
def test_gradients_one_term(case, terms):
    lq, lk, causal, layout = CASES[case]
    check_gradients(make_inputs(lq, lk, layout, TERMS[terms]), causal, torch.float32, 1e-5)


def test_zero_rows():
    """Causal with Lq > Lk: the rows without a visible key are exactly 0, their gradients 0."""
    lq, lk, causal, layout = CASES["zero-rows"]
    t = tensors(make_inputs(lq, lk, layout, TERMS["all"]), torch.float32)
    out = run_kernel(t, causal, block_q=16, block_k=16)
    empty = lq - lk
    assert torch.equal(out[..., :empty, :], torch.zeros_like(out[..., :empty, :]))
    out.sum().backward()
    for name, a in t.items():
        assert a.grad is not None and torch.isfinite(a.grad).all(), name
    assert torch.equal(t["q"].grad[..., :empty, :], torch.zeros_like(t["q"].grad[..., :empty, :]))


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.bfloat16, 2e-2), (torch.float16, 5e-3), (torch.float64, 1e-10)]
)
def test_dtypes(dtype, tol):
    """bfloat16 runs in float32 in the interpreter (no bfloat16 tl.dot there). With the
    grid terms of a key grid 1 wide (kh = Lk = 13)."""
    lq, lk, causal, layout = CASES["zero-rows"]
    x = make_inputs(lq, lk, layout, (*TERMS["all"], "grid"), grid_width=1)
    check_gradients(x, causal, dtype, tol, {"grid_width": 1})


def test_tile_shapes():
    """block_q != block_k (the table gradients take square tiles of the smaller), and the
    default tiles (one tile holds everything)."""
    lq, lk, causal, layout = CASES["short-queries-causal-layout"]
    x = make_inputs(lq, lk, layout, TERMS["all"])
    check_gradients(x, causal, torch.float32, 1e-5)  # 16 x 16
    t = tensors(x, torch.float32)
    expected = torch.from_numpy(reference.relative_kernel_attention(**x, causal=causal))
    for blocks in ({"block_q": 16, "block_k": 32}, {"block_q": 32, "block_k": 16}, {}):
        out = run_kernel(t, causal, **blocks)
        torch.testing.assert_close(out.detach().double(), expected, rtol=1e-5, atol=1e-5)


def test_broadcast_and_strided_inputs():
    """Tables given as (W, d), an expanded (B, H, W, d) view with stride 0 and a bias per
    head; q a transposed view: gradients in the given shapes, summed over broadcast dims."""
    lq, lk, causal, layout = CASES["square"]
    x = make_inputs(lq, lk, layout, TERMS["all"], batch=2, heads=2)
    t = tensors(x, torch.float64)
    width = lq + lk - 1
    kr = torch.tensor(x["key_table"][0], requires_grad=True)  # (W, d)
    qr = torch.tensor(x["query_table"][:1], requires_grad=True)  # (1, W, d)
    q = torch.tensor(np.ascontiguousarray(x["q"].transpose(0, 2, 1, 3)), requires_grad=True)
    inputs = {
        **t,
        "q": q.transpose(1, 2),
        "key_table": kr,
        "query_table": qr.expand(2, 2, width, D),
    }
    assert inputs["q"].stride() != inputs["q"].contiguous().stride()
    assert inputs["query_table"].stride()[:2] == (0, 0)
    out = run_kernel(inputs, causal, block_q=16, block_k=16)
    expected = dense_reference(inputs, causal)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    leaves = (q, kr, qr, t["relative_bias"])
    grads = torch.autograd.grad(out.sum(), leaves)
    expected_grads = torch.autograd.grad(expected.sum(), leaves)
    for leaf, g, e in zip(leaves, grads, expected_grads, strict=True):
        assert g.shape == leaf.shape
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


def test_mixed_layouts_and_frozen_table():
    """A causal problem with tables in both layouts, and a table without a gradient."""
    lq, lk = 13, 37
    x = make_inputs(lq, lk, "full", TERMS["all"])
    x["query_table"] = x["query_table"][:, :lk]  # causal layout, W = Lk
    t = tensors(x, torch.float64)
    t["key_table"].requires_grad_(False)
    out = run_kernel(t, True, block_q=16, block_k=16)
    expected = dense_reference(t, True)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    leaves = [a for a in t.values() if a.requires_grad]
    grads = torch.autograd.grad(out.sum(), leaves)
    expected_grads = torch.autograd.grad(expected.sum(), leaves)
    for g, e in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_against_fold(causal):
    """relattn.relative_attention's fold: scores ((q+u)·k + (q+v)·Kʳ[m] + k·Qʳ[m])·scale + b[m]."""
    lq, lk = 13, 29
    rng = np.random.default_rng(3)
    width = lq + lk - 1

    def leaf(*shape):
        return torch.tensor(0.5 * rng.standard_normal(shape), requires_grad=True)

    q, k, v = leaf(2, 2, lq, D), leaf(2, 2, lk, D), leaf(2, 2, lk, DV)
    u, vb = leaf(2, 1, D), leaf(2, 1, D)  # per head, broadcast over the rows
    kr, qr, b = leaf(2, width, D), leaf(width, D), leaf(2, width)
    leaves = (q, k, v, u, vb, kr, qr, b)
    expected = relattn.relative_attention(
        q, k, v, kr, content_bias=u, position_bias=vb, query_position_table=qr,
        relative_bias=b, causal=causal, block_size=(8, 8),
    )  # fmt: skip
    scale = 1 / math.sqrt(D)
    f32 = [a.float() for a in leaves]
    out = relative_attention_kernel(
        (f32[0] + f32[3]) * scale, f32[1], f32[2], qp=(f32[0] + f32[4]) * scale,
        key_table=f32[5], ks=f32[1] * scale, query_table=f32[6], relative_bias=f32[7],
        causal=causal, block_q=16, block_k=16,
    )  # fmt: skip
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(out.sum(), leaves)
    expected_grads = torch.autograd.grad(expected.sum(), leaves)
    for g, e in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g.double(), e, rtol=1e-5, atol=2e-5)


def make_masks(lq, lk, which, *, batch=2):
    """Packed documents (3 per row, batch 1's boundaries shifted; the queries are the last
    ``Lq`` keys where ``Lq <= Lk``) and a key mask, as NumPy arrays ``(B, 1, L)``."""
    keys = np.stack([np.arange(lk) * 3 // lk, np.minimum(2, (np.arange(lk) + 5) * 3 // lk)])
    if lq <= lk:
        queries = keys[:, lk - lq :]
    else:
        queries = np.stack([np.arange(lq) * 3 // lq] * batch)
    keep = np.random.default_rng(7).random((batch, lk)) < 0.75
    masks = {}
    if which in ("segments", "both"):
        masks["query_segments"], masks["key_segments"] = queries[:, None], keys[:, None]
    if which in ("key_mask", "both"):
        masks["key_mask"] = keep[:, None]
    return masks


@pytest.mark.parametrize(
    ("case", "which"),
    [
        ("causal-square", "segments"),
        ("zero-rows", "segments"),
        ("short-queries", "key_mask"),
        ("short-queries-causal-layout", "both"),
        ("square", "both"),
    ],
)
def test_segments_and_key_mask(case, which):
    """Segments, a key mask or both, with causal and every term: the loop reference's
    forward, the dense reference's gradients."""
    lq, lk, _, _ = CASES[case]
    check_with_integers(case, make_masks(lq, lk, which))


def check_with_integers(case, given):
    """Every term of ``case`` with the integer inputs ``given`` (segments, a key mask,
    positions): the loop reference's forward, the dense reference's gradients."""
    lq, lk, causal, layout = CASES[case]
    x = make_inputs(lq, lk, layout, TERMS["all"])
    t = {n: torch.from_numpy(np.ascontiguousarray(a)) for n, a in given.items()}
    out = run_kernel(tensors(x, torch.float32), causal, block_q=16, block_k=16, **t)
    np.testing.assert_allclose(
        out.detach().double().numpy(),
        reference.relative_kernel_attention(**x, causal=causal, **given),
        rtol=1e-5,
        atol=1e-5,
    )
    check_gradients(x, causal, torch.float32, 1e-5, t)


@pytest.mark.parametrize("causal", [False, True])
def test_masked_keys_never_read(causal):
    """NaN in the masked keys' k, v and ks rows (and, without causal, in the table rows
    that only masked keys meet): output and every gradient finite and equal to the
    reference's with finite values there; the masked rows' gradients are 0."""
    lq, lk = 13, 29
    x = make_inputs(lq, lk, "full", TERMS["all"])
    keep = np.ones((2, 1, lk), dtype=bool)
    keep[..., -3:] = False  # the last 3 keys: an unfilled cache
    keep[0, 0, [4, 17]] = keep[1, 0, 20] = False
    poisoned = dict(x)
    for name in ("k", "v", "ks"):
        poisoned[name] = np.where(keep[..., None], x[name], np.nan)
    if not causal:  # the 3 largest distances meet the last 3 keys only
        for name in ("key_table", "query_table", "relative_bias"):
            poisoned[name] = x[name].copy()
            poisoned[name][:, -3:] = np.inf if name == "relative_bias" else np.nan
    mask = torch.from_numpy(keep)
    got = tensors(poisoned, torch.float32)
    want = {n: a.double().detach().requires_grad_() for n, a in tensors(x, torch.float32).items()}
    out = run_kernel(got, causal, block_q=16, block_k=16, key_mask=mask)
    expected = dense_reference(want, causal, key_mask=mask)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    grad = torch.randn(
        expected.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2)
    )
    names = [n for n in NAMES if n in got]
    grads = torch.autograd.grad(out, [got[n] for n in names], grad.float())
    expected_grads = torch.autograd.grad(expected, [want[n] for n in names], grad)
    for name, g, e in zip(names, grads, expected_grads, strict=True):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(
            g.double(), e, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}"
        )
        if name in ("k", "v", "ks"):
            assert not g[~mask.expand(2, 1, lk)].any(), name


def test_rows_without_visible_keys():
    """Batch 0's keys all masked, and in batch 1 a query mid-sequence whose document has no
    key: those rows are exactly 0, their gradients 0, the rest as the reference."""
    lq, lk = 20, 20
    x = make_inputs(lq, lk, "full", TERMS["all"])
    segments = np.zeros((2, 1, lq), dtype=np.int64)
    segments[:, :, 12:] = 1
    query_segments = segments.copy()
    query_segments[1, 0, 9] = 7  # no key is in document 7
    keep = np.ones((2, 1, lk), dtype=bool)
    keep[0] = False
    masks = {
        "query_segments": torch.from_numpy(query_segments),
        "key_segments": torch.from_numpy(segments),
        "key_mask": torch.from_numpy(keep),
    }
    check_gradients(x, False, torch.float32, 1e-5, masks)
    t = tensors(x, torch.float32)
    out = run_kernel(t, False, block_q=16, block_k=16, **masks)
    assert not out[0].any() and not out[1, 0, 9].any() and out[1, 0, 8].all()
    out.backward(torch.ones_like(out))
    for name in t:
        assert torch.isfinite(t[name].grad).all(), name
    for name in ("q", "qp"):
        assert not t[name].grad[0].any() and not t[name].grad[1, 0, 9].any(), name
    for name in ("k", "v", "ks"):
        assert not t[name].grad[0].any(), name


def test_broadcast_segments_and_mask():
    """Segments (Lq,) uint8 and (B, 1, Lk) int32 expanded over heads (stride 0), unsorted
    ids; a key mask (1, H, Lk) sliced with stride 2: as the reference (float64)."""
    lq, lk = 9, 30
    x = make_inputs(lq, lk, "full", TERMS["all"], batch=2, heads=2)
    rng = np.random.default_rng(11)
    query_segments = torch.tensor(rng.integers(0, 2, lq), dtype=torch.uint8)
    key_segments = torch.tensor(rng.integers(0, 2, (2, 1, lk)), dtype=torch.int32)
    key_mask = torch.tensor(rng.random((1, 2, 2 * lk)) < 0.8)[..., ::2]
    masks = {
        "query_segments": query_segments,
        "key_segments": key_segments.expand(2, 2, lk),
        "key_mask": key_mask,
    }
    assert masks["key_segments"].stride()[1] == 0 and key_mask.stride()[-1] == 2
    check_gradients(x, False, torch.float64, 1e-10, masks)


#: (Lq, Lk, causal, layout, grid_width, terms, masks): the decomposed 2-D terms of a key grid
#: ``Lk / grid_width`` rows by ``grid_width`` columns, alone or with the others.
def make_positions(lq, lk, kind, *, batch=2, seed=3):
    """Positions ``(B, 1, L)`` of kind ``"offset"`` (a cache: the queries are keys 40 on, the
    keys start at 40 - (Lk - Lq)), ``"packed"`` (three documents per row restarting at 0,
    with their segment ids), ``"scattered"`` (random, repeated, and distances past the
    table's edges: clipped) or ``"reversed"``, as NumPy arrays by keyword."""
    if kind == "offset":
        keys = np.arange(lk) + 40 - max(0, lk - lq)
        queries = np.arange(lq) + 40
        return {"query_positions": queries[None, None], "key_positions": keys[None, None]}
    if kind == "packed":
        masks = make_masks(lq, lk, "segments", batch=batch)
        positions = {}
        for name, axis in (("query", "query_segments"), ("key", "key_segments")):
            ids = masks[axis][:, 0]
            starts = np.array([[np.flatnonzero(row == row[i])[0] for i in range(row.size)]
                               for row in ids])  # fmt: skip
            positions[f"{name}_positions"] = (np.arange(ids.shape[1]) - starts)[:, None]
        return {**masks, **positions}
    rng = np.random.default_rng(seed)
    if kind == "scattered":
        span = lq + lk
        return {
            "query_positions": rng.integers(-span, span, (batch, 1, lq)),
            "key_positions": rng.integers(-span, span, (batch, 1, lk)),
        }
    return {
        "query_positions": np.arange(lq)[::-1].copy(),
        "key_positions": np.arange(lk)[::-1].copy(),
    }


POSITION_CASES = [
    ("square", "offset"), ("causal-square", "packed"), ("short-queries-causal-layout", "offset"),
    ("zero-rows", "scattered"), ("short-queries", "reversed"), ("causal-square", "scattered"),
    ("square", "packed"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "kind"), POSITION_CASES)
def test_positions(case, kind):
    """Positions as data with every term: the loop reference's forward, the dense
    reference's gradients (the tables' through the atomic adds)."""
    lq, lk, _, _ = CASES[case]
    check_with_integers(case, make_positions(lq, lk, kind))


def test_contiguous_positions_equal_the_default():
    """The default positions given as data take the windows' path to the same numbers."""
    lq, lk = 21, 35
    x = make_inputs(lq, lk, "causal", TERMS["all"])
    t = tensors(x, torch.float64)
    given = {"query_positions": torch.arange(lq) + lk - lq, "key_positions": torch.arange(lk)}
    out = run_kernel(t, True, block_q=16, block_k=16, **given)
    torch.testing.assert_close(out, run_kernel(t, True, block_q=16, block_k=16), rtol=1e-12,
                               atol=1e-12)  # fmt: skip


def test_positions_table_rows_met_by_hidden_pairs_only():
    """A masked key far away reads the table's last row, which no visible pair reads: NaN
    there reaches neither the output nor a gradient (the windows' rows are selected)."""
    lq, lk = 13, 20
    x = make_inputs(lq, lk, "full", TERMS["all"])
    # Visible distances δ <= 18 - 7 < Lq - 1: rows m < W - 1.
    positions = {"query_positions": torch.arange(lq) + 7, "key_positions": torch.arange(lk)}
    positions["key_positions"][-1] = 1000  # m clipped to the last row, W - 1
    keep = torch.ones(lk, dtype=torch.bool)
    keep[-1] = False
    poisoned = dict(x)
    for name in ("key_table", "query_table", "relative_bias"):
        poisoned[name] = x[name].copy()
        poisoned[name][:, -1] = np.nan
    got = tensors(poisoned, torch.float64)
    want = {n: a.detach().requires_grad_() for n, a in tensors(x, torch.float64).items()}
    out = run_kernel(got, False, block_q=16, block_k=16, key_mask=keep, **positions)
    expected = dense_reference(want, False, key_mask=keep, **positions)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    names = [n for n in NAMES if n in got]
    grads = torch.autograd.grad(out.sum(), [got[n] for n in names])
    expected_grads = torch.autograd.grad(expected.sum(), [want[n] for n in names])
    for name, g, e in zip(names, grads, expected_grads, strict=True):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10, msg=lambda m, n=name: f"{n}: {m}")


GRID_CASES = {
    "alone": (20, 20, False, "full", 5, ("grid",), None),
    "all-terms-tall-grid": (9, 34, False, "full", 2, (*TERMS["all"], "grid"), None),
    "causal": (13, 36, True, "causal", 4, (*TERMS["all"], "grid"), None),
    "causal-zero-rows-key-mask": (30, 12, True, "full", 3, ("relative_bias", "grid"), "key_mask"),
    "segments-and-key-mask": (20, 24, False, "full", 8, (*TERMS["all"], "grid"), "both"),
}


@pytest.mark.parametrize("case", GRID_CASES)
def test_grid_terms(case):
    """``grid_rows[i, j // kw] + grid_cols[i, j % kw]``: the loop reference's forward, the
    dense reference's gradients of every input (grid_rows and grid_cols included)."""
    lq, lk, causal, layout, width, terms, which = GRID_CASES[case]
    x = make_inputs(lq, lk, layout, terms, grid_width=width)
    masks = make_masks(lq, lk, which) if which else {}
    t = {n: torch.from_numpy(np.ascontiguousarray(a)) for n, a in masks.items()}
    out = run_kernel(
        tensors(x, torch.float32), causal, block_q=16, block_k=16, grid_width=width, **t
    )
    expected = reference.relative_kernel_attention(**x, causal=causal, grid_width=width, **masks)
    np.testing.assert_allclose(out.detach().double().numpy(), expected, rtol=1e-5, atol=1e-5)
    check_gradients(x, causal, torch.float32, 1e-5, {**t, "grid_width": width})


def test_grid_broadcast_and_strided():
    """grid_rows given as (Lq, kh), grid_cols as a transposed (H, kw, Lq) array viewed as
    (H, Lq, kw): gradients in the given shapes, summed over (B, H) (float64)."""
    lq, lk, width = 20, 18, 6
    x = make_inputs(lq, lk, "full", ("key_table",), batch=1, heads=2)
    t = tensors(x, torch.float64)
    rng = np.random.default_rng(5)
    rows = torch.tensor(rng.standard_normal((lq, lk // width)), requires_grad=True)
    cols = torch.tensor(rng.standard_normal((2, width, lq)), requires_grad=True)
    inputs = {**t, "grid_rows": rows, "grid_cols": cols.transpose(1, 2)}
    assert inputs["grid_cols"].stride()[-1] == lq
    out = run_kernel(inputs, False, block_q=16, block_k=16, grid_width=width)
    expected = dense_reference(inputs, False, grid_width=width)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    default_tiles = run_kernel(inputs, False, grid_width=width)  # 32 rows (float64, d = 24)
    torch.testing.assert_close(default_tiles, expected, rtol=1e-10, atol=1e-10)
    leaves = (t["q"], t["qp"], t["key_table"], rows, cols)
    grads = torch.autograd.grad(out.sum(), leaves)
    expected_grads = torch.autograd.grad(expected.sum(), leaves)
    for leaf, g, e in zip(leaves, grads, expected_grads, strict=True):
        assert g.shape == leaf.shape
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    ("query_grid", "key_grid"), [((4, 5), None), ((4, 5), (3, 6))], ids=["same", "pooled-keys"]
)
def test_grid_against_decomposed(query_grid, key_grid):
    """relattn.decomposed.decomposed_relative_attention (SAM / MViTv2): scores
    (q·scale)·kᵀ + q·Rʸ + q·Rˣ; the kernel takes q·scale and the terms of
    decomposed_relative_terms. Output and gradients w.r.t. q, k, v and both tables
    (through the terms' autodiff), float64; tables of another width are resized."""
    from relattn.decomposed import decomposed_relative_attention, decomposed_relative_terms

    kh, kw = key_grid or query_grid
    lq, lk = math.prod(query_grid), kh * kw
    rng = np.random.default_rng(4)

    def leaf(*shape):
        return torch.tensor(0.5 * rng.standard_normal(shape), requires_grad=True)

    q, k, v = leaf(2, 1, lq, D), leaf(2, 1, lk, D), leaf(2, 1, lk, DV)
    table_h, table_w = leaf(7, D), leaf(2 * max(query_grid[1], kw) - 1, D)
    leaves = (q, k, v, table_h, table_w)
    expected = decomposed_relative_attention(
        q, k, v, table_h, table_w, query_grid=query_grid, key_grid=key_grid
    )
    rows, cols = decomposed_relative_terms(q, table_h, table_w, query_grid, key_grid)
    assert rows.shape == (2, 1, lq, kh) and cols.shape == (2, 1, lq, kw)
    out = relative_attention_kernel(
        q / math.sqrt(D), k, v, grid_rows=rows, grid_cols=cols, grid_width=kw,
        block_q=16, block_k=16,
    )  # fmt: skip
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    grads = torch.autograd.grad(out.sum(), leaves)
    expected_grads = torch.autograd.grad(expected.sum(), leaves)
    for g, e in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


def test_builds():
    """interpret=None runs the interpreter for CPU tensors whatever TRITON_INTERPRET says
    (each build sets it only while it decorates); the compiled build is Triton's JIT."""
    from triton.runtime.interpreter import InterpretedFunction

    before = os.environ.get("TRITON_INTERPRET")
    assert isinstance(_kernels(True)._forward, InterpretedFunction)
    assert isinstance(_kernels(False)._forward, triton.JITFunction)
    assert os.environ.get("TRITON_INTERPRET") == before


@pytest.mark.skipif(
    tuple(int(p) for p in triton.__version__.split(".")[:2]) < (3, 9)
    or "nvidia" not in triton.backends.backends
    or _language_interpreted(),
    reason="the ASTSource signature format of Triton >= 3.9, its NVIDIA backend, and "
    "triton.language imported without TRITON_INTERPRET=1",
)
@pytest.mark.parametrize(
    ("arch", "dtype", "masks"), [(80, torch.bfloat16, True), (90, torch.float32, False)]
)
def test_compiles_for_nvidia(arch, dtype, masks, monkeypatch, tmp_path):
    """The GPU build through Triton's whole NVIDIA pipeline (ptxas included), without a GPU:
    every term, causal, tiles of 16, the launch's own constexprs and options; with
    segments, a key mask (the skipped tiles' branch), the grid terms and positions (the
    windows' loop, one-hot sums and atomic adds), or without."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    t = {n: a.to(dtype) for n, a in valid_inputs().items()}
    config = _Config(causal=True, block_q=16, block_k=16, interpret=False)
    segments = torch.zeros(2, 1, 7, dtype=torch.int64) if masks else None
    key_mask = torch.ones(2, 1, 7, dtype=torch.bool) if masks else None
    rows = torch.zeros(2, 1, 5, 1, dtype=dtype) if masks else None
    cols = torch.zeros(2, 1, 5, 7, dtype=dtype) if masks else None
    query_segments = None if segments is None else segments[:, :, :5]
    _, meta = _inputs(
        t["q"], t["k"], t["v"], t["qp"], t["ks"], t["key_table"].expand(2, 1, 11, D),
        t["query_table"].expand(2, 1, 11, D), t["relative_bias"].expand(2, 1, 11), rows, cols,
        query_segments, segments, key_mask, query_segments, segments, config,
    )  # fmt: skip
    assert meta["HAS_SEG"] is masks and meta["HAS_MASK"] is masks
    assert meta["HAS_GRID"] is masks and meta["HAS_POS"] is masks
    options = {
        "num_stages": meta.pop("num_stages"),
        "enable_fp_fusion": meta.pop("enable_fp_fusion"),
    }
    element = {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]
    for kernel in vars(_kernels(False)).values():
        signature = {}
        for param in kernel.params:
            if param.is_constexpr:
                signature[param.name] = "constexpr"
            elif param.name in ("qseg_ptr", "kseg_ptr", "qpos_ptr", "kpos_ptr"):
                signature[param.name] = "*i64"
            elif param.name == "kmask_ptr":
                signature[param.name] = "*u8"  # the bool mask read as bytes
            elif param.name.endswith("_ptr"):
                # The log-sum-exp, D and the table gradients' buffers are float32.
                own = param.name in ("lse_ptr", "delta_ptr", "dkr_ptr", "dqr_ptr", "db_ptr")
                signature[param.name] = "*fp32" if own else f"*{element}"
            else:
                signature[param.name] = "i32"
        source = ASTSource(kernel, signature, meta)
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
        assert compiled.metadata.shared <= 100 * 1024


def valid_inputs(**changes):
    """Float32 inputs with every term (Lq = 5, Lk = 7, full layout), ``changes`` replacing some."""
    x = make_inputs(5, 7, "full", TERMS["all"])
    return {**{n: torch.tensor(a, dtype=torch.float32) for n, a in x.items()}, **changes}


def zeros(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype)


def ids(*shape):
    return torch.zeros(shape, dtype=torch.int32)


#: Replaced inputs, the error and the message it must match.
BAD = {
    "q-3d": ({"q": zeros(1, 5, D)}, ValueError, r"q must have shape \(B, H, Lq, d\)"),
    "k-d": ({"k": zeros(2, 1, 7, D + 1)}, ValueError, r"k must have shape"),
    "v-length": ({"v": zeros(2, 1, 6, DV)}, ValueError, r"v must have shape"),
    "table-no-qp": ({"qp": None}, ValueError, r"key_table is given without qp"),
    "ks-no-table": ({"query_table": None}, ValueError, r"ks is given without query_table"),
    "width": (
        {"key_table": zeros(1, 10, D)}, ValueError,
        r"key_table must have W = Lq \+ Lk - 1 = 11 .* or W = Lk = 7 .*got W = 10",
    ),
    "causal-layout-not-causal": ({"relative_bias": zeros(1, 7)}, ValueError, r"relative_bias must"),
    "table-heads": (
        {"query_table": zeros(3, 11, D)}, ValueError,
        r"query_table's leading dims \(3,\) do not broadcast to \(B, H\) = \(2, 1\)",
    ),
    "head-dim": (
        {"q": zeros(2, 1, 5, 257), "k": zeros(2, 1, 7, 257)}, ValueError,
        r"d and dv must be at most 256, got d = 257",
    ),
    "dtypes": ({"v": zeros(2, 1, 7, DV, dtype=torch.float64)}, TypeError, r"v must have q's dtype"),
    "integer": (
        {n: zeros(*a.shape, dtype=torch.int32) for n, a in valid_inputs().items() if n in "qkv"},
        TypeError, r"q must be float16, bfloat16, float32 or float64, got torch.int32",
    ),
    "not-a-tensor": ({"ks": np.zeros((2, 1, 7, D))}, TypeError, r"ks must be a torch.Tensor"),
    "query-segments-alone": (
        {"query_segments": ids(5)}, ValueError,
        r"query_segments is given without key_segments: give both or neither",
    ),
    "key-segments-alone": (
        {"key_segments": ids(7)}, ValueError, r"key_segments is given without query_segments",
    ),
    "segment-length": (
        {"query_segments": ids(7), "key_segments": ids(7)}, ValueError,
        r"query_segments must have shape \(\.\.\., Lq\) = \(\.\.\., 5\), .*got \(7,\)",
    ),
    "mask-length": (
        {"key_mask": zeros(2, 1, 5, dtype=torch.bool)}, ValueError,
        r"key_mask must have shape \(\.\.\., Lk\) = \(\.\.\., 7\)",
    ),
    "mask-dims": ({"key_mask": zeros(1, 2, 1, 7, dtype=torch.bool)}, ValueError, r"key_mask must"),
    "segment-heads": (
        {"query_segments": ids(3, 5), "key_segments": ids(7)}, ValueError,
        r"query_segments's leading dims \(3,\) do not broadcast to \(B, H\) = \(2, 1\)",
    ),
    "float-segments": (
        {"query_segments": zeros(5), "key_segments": zeros(7)}, TypeError,
        r"query_segments must have an integer dtype \(document ids\), got torch.float32",
    ),
    "bool-segments": (
        {"query_segments": ids(5), "key_segments": zeros(7, dtype=torch.bool)},
        TypeError, r"key_segments must have an integer dtype",
    ),
    "integer-mask": (
        {"key_mask": zeros(7, dtype=torch.int64)}, TypeError,
        r"key_mask must be torch.bool \(True: the key is seen\), got torch.int64",
    ),
    "mask-not-a-tensor": (
        {"key_mask": np.ones(7, dtype=bool)}, TypeError, r"key_mask must be a torch.Tensor"
    ),
    "grid-rows-alone": (
        {"grid_rows": zeros(5, 1), "grid_width": 7}, ValueError,
        r"grid_rows is given without grid_cols: give both or neither",
    ),
    "grid-cols-alone": ({"grid_cols": zeros(5, 7)}, ValueError, r"grid_cols is given without"),
    "grid-width-missing": (
        {"grid_rows": zeros(5, 1), "grid_cols": zeros(5, 7)}, ValueError,
        r"grid_rows and grid_cols need grid_width",
    ),
    "grid-width-alone": (
        {"grid_width": 7}, ValueError, r"grid_width is given without grid_rows and grid_cols"
    ),
    "grid-width-float": (
        {"grid_rows": zeros(5, 1), "grid_cols": zeros(5, 7), "grid_width": 7.0}, TypeError,
        r"grid_width must be an int, got float",
    ),
    "grid-width-divisor": (
        {"grid_rows": zeros(5, 1), "grid_cols": zeros(5, 7), "grid_width": 2}, ValueError,
        r"grid_width must divide Lk = 7 \(kw of a kh × kw key grid\), got 2",
    ),
    "grid-rows-kh": (
        {"grid_rows": zeros(5, 7), "grid_cols": zeros(5, 7), "grid_width": 7}, ValueError,
        r"grid_rows must have shape \(\.\.\., Lq, kh\) = \(\.\.\., 5, 1\), .*got \(5, 7\)",
    ),
    "grid-cols-lq": (
        {"grid_rows": zeros(5, 1), "grid_cols": zeros(6, 7), "grid_width": 7}, ValueError,
        r"grid_cols must have shape \(\.\.\., Lq, kw\) = \(\.\.\., 5, 7\)",
    ),
    "grid-dims": (
        {"grid_rows": zeros(1, 2, 1, 5, 1), "grid_cols": zeros(5, 7), "grid_width": 7},
        ValueError, r"grid_rows must have shape",
    ),
    "grid-heads": (
        {"grid_rows": zeros(3, 5, 1), "grid_cols": zeros(5, 7), "grid_width": 7}, ValueError,
        r"grid_rows's leading dims \(3,\) do not broadcast to \(B, H\) = \(2, 1\)",
    ),
    "grid-dtype": (
        {"grid_rows": zeros(5, 1), "grid_cols": zeros(5, 7, dtype=torch.float64),
         "grid_width": 7}, TypeError, r"grid_cols must have q's dtype torch.float32",
    ),
    "grid-not-a-tensor": (
        {"grid_rows": np.zeros((5, 1)), "grid_cols": zeros(5, 7), "grid_width": 7}, TypeError,
        r"grid_rows must be a torch.Tensor",
    ),
    "positions-alone": (
        {"query_positions": ids(5)}, ValueError,
        r"query_positions is given without key_positions: give both or neither",
    ),
    "positions-float": (
        {"query_positions": zeros(5), "key_positions": ids(7)}, TypeError,
        r"query_positions must have an integer dtype \(positions\), got torch.float32",
    ),
    "positions-length": (
        {"query_positions": ids(5), "key_positions": ids(6)}, ValueError,
        r"key_positions must have shape \(\.\.\., Lk\) = \(\.\.\., 7\)",
    ),
    "grid-too-large": (
        {"k": zeros(2, 1, 514, D), "v": zeros(2, 1, 514, DV), "ks": zeros(2, 1, 514, D),
         "grid_rows": zeros(5, 257), "grid_cols": zeros(5, 2), "grid_width": 2}, ValueError,
        r"grid_width = 2 gives a key grid kh × kw = 257 × 2: the kernel takes kh, kw <= 256",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_bad_inputs(case):
    changes, error, message = BAD[case]
    with pytest.raises(error, match=message):
        run_kernel(valid_inputs(**changes), False)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"block_q": 24}, ValueError, r"block_q must be a power of two >= 16, got 24"),
        ({"block_k": 8}, ValueError, r"block_k must be a power of two >= 16, got 8"),
        ({"interpret": False}, ValueError, r"interpret=False needs GPU tensors"),
        ({"causal": 1}, TypeError, r"causal must be a bool, got int"),
    ],
)
def test_bad_options(kwargs, error, message):
    causal = kwargs.pop("causal", False)
    with pytest.raises(error, match=message):
        run_kernel(valid_inputs(), causal, **kwargs)
