"""relattn.grid: 2-D patch positions, Swin's and BEiT's bias, windows, Swin V2 (SPEC §2.18).

Each function against a float64 loop written in this file from the papers' formulas
(Swin, Liu et al. 2021, §3.2; BEiT, Bao et al. 2022, §2.5; Swin V2, Liu et al. 2022,
§3.3), sharing no code with relattn, on every backend. Whole-image attention with
:func:`grid_bias_mod` run blockwise equals the dense bias of :func:`grid_relative_bias`
and the pair loop; gradients reach the table through both; jit/compile equal eager.
With HF transformers installed, Swin's, Swin V2's and BEiT's modules with copied
weights, float64, to 1e-10 -- and HF BEiT's reading of a non-square table, which
differs from the paper's and timm's order (relattn's). :func:`grid_positions`' options
(EVA-02's reference grid, Qwen2-VL's spatial-merge order; formerly
``rotary_axes.patch_positions``) against loops too.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import relattn
from relattn.grid import (
    continuous_position_bias,
    continuous_position_coordinates,
    grid_bias_mod,
    grid_positions,
    grid_relative_bias,
    grid_relative_index,
    shifted_window_mask,
    window_merge,
    window_partition,
)

B, H, D = 2, 3, 4

#: (height, width, class_token): square and non-square grids, with and without BEiT's token.
GRIDS = [(2, 2, False), (2, 3, False), (3, 2, True), (1, 4, False), (3, 3, True)]


# ===============================================================================================
# Loop references, from the formulas
# ===============================================================================================


def _coords(h, w):
    """Row-major ``(row, col)`` of each patch."""
    return [(r, c) for r in range(h) for c in range(w)]


def _entry(h, w, cls, i, j):
    """Table entry of query token ``i`` and key token ``j``: Swin's ``(Δrow + h - 1)(2w - 1)
    + (Δcol + w - 1)``, ``Δ = query - key``; BEiT's class token (token 0) takes the last
    three entries: cls -> token ``T-3``, token -> cls ``T-2``, cls -> cls ``T-1``."""
    t = (2 * h - 1) * (2 * w - 1) + (3 if cls else 0)
    if cls:
        if i == 0 and j == 0:
            return t - 1
        if i == 0:
            return t - 3
        if j == 0:
            return t - 2
        i, j = i - 1, j - 1
    (ri, ci), (rj, cj) = _coords(h, w)[i], _coords(h, w)[j]
    return (ri - rj + h - 1) * (2 * w - 1) + (ci - cj + w - 1)


def _index_loop(h, w, cls):
    n = h * w + (1 if cls else 0)
    return np.array([[_entry(h, w, cls, i, j) for j in range(n)] for i in range(n)])


def _bias_loop(table, h, w, cls):
    """``table[..., entry(i, j)]`` per pair."""
    n = h * w + (1 if cls else 0)
    out = np.zeros((*table.shape[:-1], n, n))
    for i in range(n):
        for j in range(n):
            out[..., i, j] = table[..., _entry(h, w, cls, i, j)]
    return out


def _attention_loop(q, k, v, bias, scale=None):
    """``softmax(scale·q_i·k_j + bias[h, i, j]) v`` per pair, ``bias (H, L, L)``."""
    b_, h_, lq, d = q.shape
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = np.zeros((b_, h_, lq, v.shape[-1]))
    for b in range(b_):
        for h in range(h_):
            for i in range(lq):
                s = np.array([scale * float(q[b, h, i] @ k[b, h, j]) for j in range(k.shape[2])])
                s = s + bias[h, i]
                p = np.exp(s - s.max())
                out[b, h, i] = (p / p.sum()) @ v[b, h]
    return out


def _table_size(h, w, cls):
    return (2 * h - 1) * (2 * w - 1) + (3 if cls else 0)


def _host(backend, x):
    assert backend.is_array(x)
    return backend.to_host(x)


# ===============================================================================================
# Positions, index, dense bias
# ===============================================================================================


@pytest.mark.parametrize("h, w", [(2, 3), (3, 1), (0, 2)])
def test_grid_positions(backend, h, w):
    got = _host(backend, grid_positions(h, w, xp=backend.lib, device=backend.device))
    want = np.array(_coords(h, w)).reshape(h * w, 2)
    np.testing.assert_array_equal(got, want)


def _merge_loop(h, w, m):
    """Qwen2-VL's vision-tower order: ``m × m`` blocks row-major, patches row-major inside."""
    return np.array(
        [
            (m * br + r, m * bc + c)
            for br in range(h // m)
            for bc in range(w // m)
            for r in range(m)
            for c in range(m)
        ]
    ).reshape(h * w, 2)


@pytest.mark.parametrize("h, w, m", [(4, 6, 2), (2, 4, 2), (6, 3, 3), (0, 4, 2), (2, 2, 1)])
def test_grid_positions_merge_order(backend, h, w, m):
    got = grid_positions(h, w, merge_size=m, xp=backend.lib, device=backend.device)
    info = backend.xp.__array_namespace_info__()
    assert got.dtype == info.default_dtypes(device=backend.device)["integral"]
    np.testing.assert_array_equal(_host(backend, got), _merge_loop(h, w, m))


@pytest.mark.parametrize("h, w, ref, m", [(2, 4, (8, 8), 1), (3, 3, (4, 4), 1), (4, 2, (3, 5), 2)])
def test_grid_positions_reference_grid(backend, dtype, h, w, ref, m):
    """EVA-02: ``(row·H_pt/h, col·W_pt/w)`` in float64, then one rounding to ``dtype``."""
    got = grid_positions(
        h,
        w,
        reference_shape=ref,
        merge_size=m,
        xp=backend.lib,
        dtype=backend.dtype(dtype),
        device=backend.device,
    )
    assert got.dtype == backend.dtype(dtype)
    want = [(r * ref[0] / h, c * ref[1] / w) for r, c in _merge_loop(h, w, m).tolist()]
    want = np.array(want, dtype=np.float64).astype(dtype)
    np.testing.assert_array_equal(_host(backend, got), want)


def test_grid_positions_dtype_rule(backend):
    """Default: the integer dtype, the real floating one with ``reference_shape``; a given
    ``dtype`` casts the exact integers."""
    xp, dev = backend.lib, backend.device
    info = backend.xp.__array_namespace_info__().default_dtypes(device=dev)
    ref = grid_positions(2, 4, reference_shape=(8, 8), xp=xp, device=dev)
    assert ref.dtype == info["real floating"]
    np.testing.assert_array_equal(_host(backend, ref)[5], [4.0, 2.0])  # (1, 1) · (8/2, 8/4)
    f32 = grid_positions(2, 3, merge_size=1, xp=xp, dtype=backend.dtype("float32"), device=dev)
    assert f32.dtype == backend.dtype("float32")
    np.testing.assert_array_equal(_host(backend, f32), np.array(_coords(2, 3)))
    i32 = backend.xp.int32
    assert grid_positions(2, 3, xp=xp, dtype=i32, device=dev).dtype == i32
    empty = grid_positions(0, 3, reference_shape=(2, 2), xp=xp, device=dev)
    assert empty.shape == (0, 2) and empty.dtype == info["real floating"]


@settings(max_examples=30, deadline=None)
@given(bh=st.integers(0, 3), bw=st.integers(1, 3), m=st.integers(1, 3))
def test_grid_positions_merge_is_a_permutation(bh, bw, m):
    """The merge order visits each patch once, and ``merge_size=1`` is row-major."""
    h, w = bh * m, bw * m
    merged = np.asarray(grid_positions(h, w, merge_size=m))
    plain = np.asarray(grid_positions(h, w))
    assert sorted(map(tuple, merged.tolist())) == sorted(map(tuple, plain.tolist()))
    np.testing.assert_array_equal(np.asarray(grid_positions(h, w, merge_size=1)), plain)


@pytest.mark.parametrize("h, w, cls", GRIDS)
def test_grid_relative_index(backend, h, w, cls):
    got = grid_relative_index(h, w, class_token=cls, xp=backend.lib, device=backend.device)
    info = backend.xp.__array_namespace_info__()
    assert got.dtype == info.default_dtypes(device=backend.device)["integral"]
    np.testing.assert_array_equal(_host(backend, got), _index_loop(h, w, cls))


def test_index_depends_on_the_difference_of_positions_only():
    """Two pairs with the same ``(Δrow, Δcol)`` share an entry; different ones do not."""
    h, w = 3, 4
    index = grid_relative_index(h, w)
    pos = np.asarray(grid_positions(h, w))
    delta = pos[:, None, :] - pos[None, :, :]
    keys = {}
    for i in range(h * w):
        for j in range(h * w):
            keys.setdefault(tuple(delta[i, j]), set()).add(int(index[i, j]))
    assert all(len(v) == 1 for v in keys.values())
    assert len({next(iter(v)) for v in keys.values()}) == (2 * h - 1) * (2 * w - 1)


@settings(max_examples=40, deadline=None)
@given(
    wh=st.integers(1, 4), ww=st.integers(1, 4), nh=st.integers(1, 3), nw=st.integers(1, 3),
    sh=st.integers(0, 3), sw=st.integers(0, 3),
)  # fmt: skip
def test_window_properties(wh, ww, nh, nw, sh, sw):
    """Partition and merge are inverse; the shifted mask is reflexive and symmetric, and
    each window's bias depends on ``(Δrow, Δcol)`` alone (a 2-D Toeplitz structure)."""
    h, w = wh * nh, ww * nw
    x = np.arange(2 * h * w * 2).reshape(2, h, w, 2)
    windows = window_partition(x, (wh, ww))
    assert windows.shape == (2 * nh * nw, wh * ww, 2)
    np.testing.assert_array_equal(window_merge(windows, (wh, ww), h, w), x)
    mask = shifted_window_mask(h, w, (wh, ww), (sh % wh, sw % ww))
    assert np.all(np.diagonal(mask, axis1=1, axis2=2))
    np.testing.assert_array_equal(mask, np.swapaxes(mask, 1, 2))
    table = np.arange((2 * wh - 1) * (2 * ww - 1), dtype=np.float64)
    bias = grid_relative_bias(table, wh, ww)
    pos = grid_positions(wh, ww)
    for i in range(wh * ww):
        for j in range(wh * ww):
            dr, dc = pos[i] - pos[j]
            assert bias[i, j] == table[(dr + wh - 1) * (2 * ww - 1) + dc + ww - 1]


@pytest.mark.parametrize("h, w, cls", GRIDS)
def test_grid_relative_bias(backend, dtype, rng, h, w, cls):
    table = rng.normal(size=(H, _table_size(h, w, cls)))
    got = grid_relative_bias(backend.asarray(table, dtype), h, w, class_token=cls)
    assert got.dtype == backend.dtype(dtype)
    backend.assert_close(got, _bias_loop(table, h, w, cls), dtype)


def test_grid_relative_bias_keeps_leading_dims(backend, rng):
    table = rng.normal(size=(2, H, 15))
    got = grid_relative_bias(backend.asarray(table, "float64"), 3, 2)
    assert tuple(got.shape) == (2, H, 6, 6)
    backend.assert_close(got, _bias_loop(table, 3, 2, False), "float64")
    one = grid_relative_bias(backend.asarray(table[0, 0], "float64"), 3, 2)
    backend.assert_close(one, _bias_loop(table[0, 0], 3, 2, False), "float64")


# ===============================================================================================
# Whole-image attention: score_mod blockwise == dense bias == the loop
# ===============================================================================================


@pytest.mark.parametrize("h, w, cls", [(2, 3, False), (3, 2, True), (4, 4, False)])
@pytest.mark.parametrize("shared", [False, True])
def test_grid_bias_mod_equals_the_dense_bias(backend, rng, h, w, cls, shared):
    n = h * w + (1 if cls else 0)
    table = rng.normal(size=(_table_size(h, w, cls),) if shared else (H, _table_size(h, w, cls)))
    q, k, v = (rng.normal(size=(B, H, n, D)) for _ in "qkv")
    bias = _bias_loop(np.broadcast_to(table, (H, table.shape[-1])), h, w, cls)
    want = _attention_loop(q, k, v, bias)
    xt = backend.asarray(table, "float64")
    xq, xk, xv = (backend.asarray(a, "float64") for a in (q, k, v))
    mod = grid_bias_mod(xt, h, w, class_token=cls)
    dense = relattn.scaled_dot_product_attention(
        xq, xk, xv, bias=grid_relative_bias(xt, h, w, class_token=cls)
    )
    backend.assert_close(dense, want, "float64")
    # Dask builds a task graph per block: one blockwise size there
    for block_size in ((4, 8),) if backend.name == "dask" else (None, 3, (4, 8), (2, 5)):
        got = relattn.scaled_dot_product_attention(xq, xk, xv, score_mod=mod, block_size=block_size)
        backend.assert_close(got, want, "float64")


def test_grid_bias_mod_in_float32(backend, rng):
    h, w = 3, 3
    table = rng.normal(size=(H, 25))
    q, k, v = (rng.normal(size=(B, H, 9, D)) for _ in "qkv")
    want = _attention_loop(q, k, v, _bias_loop(table, h, w, False))
    xq, xk, xv = (backend.asarray(a, "float32") for a in (q, k, v))
    got = relattn.scaled_dot_product_attention(
        xq, xk, xv, score_mod=grid_bias_mod(backend.asarray(table, "float32"), h, w), block_size=4
    )
    assert got.dtype == backend.dtype("float32")
    backend.assert_close(got, want, "float32")


def test_grid_bias_mod_in_flex_attention(rng):
    """The same function runs in FlexAttention (eager, CPU), called with 0-d tensors."""
    torch = pytest.importorskip("torch")
    from relattn import problem
    from relattn.backends import _flex

    h, w = 3, 2
    table = torch.asarray(rng.normal(size=(H, _table_size(h, w, True))))
    q, k, v = (torch.asarray(rng.normal(size=(B, H, 7, D))) for _ in "qkv")
    mod = grid_bias_mod(table, h, w, class_token=True)
    p = problem.check(q, k, v, score_mod=mod)
    assert _flex.refusal(p, compiled=False) is None
    out = _flex.flex_run(p, False)
    want = _attention_loop(*(a.numpy() for a in (q, k, v)), _bias_loop(table.numpy(), h, w, True))
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-10, atol=1e-12)


# ===============================================================================================
# Swin's windows and the shifted-window mask
# ===============================================================================================


def _partition_loop(x, wh, ww):
    b_, h, w, _ = x.shape
    out = []
    for b in range(b_):
        for r0 in range(0, h, wh):
            for c0 in range(0, w, ww):
                out.append([x[b, r0 + r, c0 + cc] for r in range(wh) for cc in range(ww)])
    return np.array(out)


def _shift_mask_loop(h, w, wh, ww, sh, sw):
    """Swin's ``img_mask``: one id per region, the three slices of each axis
    ``[0, -window), [-window, -shift), [-shift, None)``, then per window ``id_i == id_j``."""
    ids = np.zeros((h, w), dtype=int)
    count = 0
    for rows in (slice(0, -wh), slice(-wh, -sh), slice(-sh, None)):
        for cols in (slice(0, -ww), slice(-ww, -sw), slice(-sw, None)):
            ids[rows, cols] = count
            count += 1
    windows = _partition_loop(ids[None, :, :, None], wh, ww)[..., 0]
    return windows[:, :, None] == windows[:, None, :]


@pytest.mark.parametrize("window, h, w", [(2, 4, 6), ((2, 3), 4, 6), ((1, 2), 3, 4)])
def test_window_partition_and_merge(backend, rng, window, h, w):
    x = rng.normal(size=(2, h, w, 3))
    wh, ww = window if isinstance(window, tuple) else (window, window)
    windows = window_partition(backend.asarray(x, "float64"), window)
    backend.assert_close(windows, _partition_loop(x, wh, ww), "float64")
    back = window_merge(windows, window, h, w)
    backend.assert_close(back, x, "float64")


def test_empty_grids_and_batches(backend):
    x = backend.asarray(np.zeros((0, 4, 6, 2)), "float64")
    assert tuple(window_partition(x, 2).shape) == (0, 4, 2)
    assert tuple(window_merge(window_partition(x, 2), 2, 4, 6).shape) == (0, 4, 6, 2)
    flat = backend.asarray(np.zeros((2, 0, 6, 2)), "float64")
    assert tuple(window_partition(flat, (2, 3)).shape) == (0, 6, 2)
    mask = shifted_window_mask(0, 4, 2, 1, xp=backend.lib, device=backend.device)
    assert tuple(mask.shape) == (0, 4, 4)
    table = backend.asarray(np.zeros((0, 15)), "float64")
    assert tuple(grid_relative_bias(table, 2, 3).shape) == (0, 6, 6)


@pytest.mark.parametrize(
    "h, w, window, shift", [(4, 4, 2, 1), (6, 8, (3, 4), (1, 2)), (8, 8, 4, 2), (4, 6, (2, 3), 0)]
)
def test_shifted_window_mask(backend, h, w, window, shift):
    wh, ww = window if isinstance(window, tuple) else (window, window)
    sh, sw = shift if isinstance(shift, tuple) else (shift, shift)
    got = shifted_window_mask(h, w, window, shift, xp=backend.lib, device=backend.device)
    assert got.dtype == backend.xp.bool
    if sh == 0:  # the slice [-0, None) would be everything: no mask at all
        want = np.ones(((h // wh) * (w // ww), wh * ww, wh * ww), dtype=bool)
    else:
        want = _shift_mask_loop(h, w, wh, ww, sh, sw)
    np.testing.assert_array_equal(_host(backend, got), want)


# ===============================================================================================
# Swin V2: log-spaced coordinates and the continuous bias
# ===============================================================================================


def _log_coords_loop(wh, ww, ph, pw):
    out = []
    for dr in range(-(wh - 1), wh):
        for dc in range(-(ww - 1), ww):
            pair = []
            for delta, p in ((dr, ph), (dc, pw)):
                x = 8.0 * delta / max(p - 1, 1)
                pair.append(np.sign(x) * np.log2(np.abs(x) + 1.0) / np.log2(8.0))
            out.append(pair)
    return np.array(out)


@pytest.mark.parametrize("window, pretrained", [(3, None), ((2, 4), None), ((4, 3), (2, 6))])
def test_continuous_position_coordinates(backend, dtype, window, pretrained):
    wh, ww = window if isinstance(window, tuple) else (window, window)
    ph, pw = (wh, ww) if pretrained is None else pretrained
    got = continuous_position_coordinates(
        window,
        pretrained_window=pretrained,
        xp=backend.lib,
        dtype=backend.dtype(dtype),
        device=backend.device,
    )
    assert got.dtype == backend.dtype(dtype)
    backend.assert_close(got, _log_coords_loop(wh, ww, ph, pw), dtype)


def test_continuous_position_bias(backend, dtype, rng):
    h, w = 2, 3
    values = rng.normal(scale=3.0, size=(H, 15))
    got = continuous_position_bias(backend.asarray(values, dtype), h, w)
    want = _bias_loop(16.0 / (1.0 + np.exp(-values)), h, w, False)
    assert got.dtype == backend.dtype(dtype)
    backend.assert_close(got, want, dtype)


def test_continuous_position_bias_saturates_without_overflow():
    values = np.array([[-1000.0, 0.0, 1000.0]])
    got = continuous_position_bias(values, 1, 2)
    np.testing.assert_array_equal(got, [[[8.0, 0.0], [16.0, 8.0]]])


# ===============================================================================================
# Gradients and jit/compile
# ===============================================================================================


def test_torch_gradients_reach_the_table(torch_backend, rng):
    """Through the dense bias and the score_mod (blockwise): equal gradients, and
    ``gradcheck`` of each; Swin V2's values through the sigmoid."""
    torch = torch_backend.lib
    h, w = 2, 3
    q, k, v = (torch_backend.asarray(rng.normal(size=(1, H, 7, D)), "float64") for _ in "qkv")
    table0 = rng.normal(size=(H, _table_size(h, w, True)))

    def dense(t):
        bias = grid_relative_bias(t, h, w, class_token=True)
        return relattn.scaled_dot_product_attention(q, k, v, bias=bias)

    def blockwise(t):
        mod = grid_bias_mod(t, h, w, class_token=True)
        return relattn.scaled_dot_product_attention(q, k, v, score_mod=mod, block_size=(3, 4))

    grads = []
    for f in (dense, blockwise):
        t = torch_backend.asarray(table0, "float64").requires_grad_(True)
        (f(t) ** 2).sum().backward()
        grads.append(t.grad.cpu().numpy())
        assert torch.autograd.gradcheck(f, (t,))
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-10, atol=1e-14)
    assert np.abs(grads[0]).max() > 0
    values = torch_backend.asarray(rng.normal(size=(H, 15)), "float64").requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: continuous_position_bias(x, h, w), (values,))


def test_jax_gradients_reach_the_table(jax_backend, rng):
    import jax
    import jax.numpy as jnp

    h, w = 3, 2
    q, k, v = (jax_backend.asarray(rng.normal(size=(1, H, 6, D)), "float64") for _ in "qkv")
    table = jax_backend.asarray(rng.normal(size=(H, 15)), "float64")
    weights = jax_backend.asarray(rng.normal(size=(1, H, 6, D)), "float64")

    def dense(t):
        out = relattn.scaled_dot_product_attention(q, k, v, bias=grid_relative_bias(t, h, w))
        return jnp.sum(out * weights)

    def blockwise(t):
        out = relattn.scaled_dot_product_attention(
            q, k, v, score_mod=grid_bias_mod(t, h, w), block_size=(4, 2)
        )
        return jnp.sum(out * weights)

    g_dense = jax.jit(jax.grad(dense))(table)
    g_block = jax.jit(jax.grad(blockwise))(table)
    np.testing.assert_allclose(np.asarray(g_dense), np.asarray(g_block), rtol=1e-10, atol=1e-14)
    assert float(jnp.abs(g_dense).max()) > 0
    jax_backend.assert_directional_derivatives(jax.jit(blockwise), g_block, table, rng)


def test_compiled_equals_eager(jit_backend, rng):
    """``jax.jit`` / ``torch.compile`` (fullgraph) of the bias, the windows, the mask and
    the whole-image attention through ``grid_bias_mod``: equal to eager."""
    h, w = 4, 4
    dtype = "float64" if jit_backend.is_jax else "float32"
    x = jit_backend.asarray(rng.normal(size=(1, h, w, 2)), dtype)
    table = jit_backend.asarray(rng.normal(size=(H, 9)), dtype)
    image = jit_backend.asarray(rng.normal(size=(H, 49)), dtype)
    q, k, v = (jit_backend.asarray(rng.normal(size=(1, H, 16, D)), dtype) for _ in "qkv")
    xp = jit_backend.xp

    def swin_window(x, table, image, q, k, v):
        windows = window_partition(xp.roll(x, shift=(-1, -1), axis=(1, 2)), 2)
        mask = shifted_window_mask(h, w, 2, 1, xp=xp, device=jit_backend.device)
        merged = window_merge(windows, 2, h, w)
        out = relattn.scaled_dot_product_attention(
            q, k, v, score_mod=grid_bias_mod(image, h, w), block_size=8
        )
        return merged, xp.astype(mask, x.dtype), grid_relative_bias(table, 2, 2), out

    eager = swin_window(x, table, image, q, k, v)
    compiled = jit_backend.jit(swin_window)(x, table, image, q, k, v)
    for a, b in zip(eager, compiled, strict=True):
        jit_backend.assert_close(b, jit_backend.to_host(a), dtype)


# ===============================================================================================
# HF transformers 5.24 with copied weights, float64
# ===============================================================================================


def _hf(name):
    pytest.importorskip("torch")
    return pytest.importorskip(f"transformers.models.{name}.modeling_{name}")


@pytest.mark.parametrize("window", [(3, 3), (2, 4), (4, 3)])
def test_hf_swin_relative_position_bias(rng, window):
    torch = pytest.importorskip("torch")
    swin = _hf("swin")
    module = swin.SwinRelativePositionBias(H, window).double()
    table = rng.normal(size=(H, _table_size(*window, False)))
    with torch.no_grad():
        module.relative_position_bias_table.copy_(torch.asarray(table.T))
    want = module()[0].detach().numpy()
    got = grid_relative_bias(table, *window)
    assert np.abs(got - want).max() <= 1e-10
    np.testing.assert_array_equal(
        module.relative_position_index.numpy().reshape(got.shape[1:]), grid_relative_index(*window)
    )


def _hf_linear(layer):
    weight = layer.weight.detach().numpy()
    bias = 0.0 if layer.bias is None else layer.bias.detach().numpy()
    return lambda x: x @ weight.T + bias


def test_hf_swin_shifted_window_attention(rng):
    """HF's SwinAttention over the windows of a rolled map with its cyclic-shift mask
    (``-100`` added) against relattn: the same window bias, the boolean mask."""
    torch = pytest.importorskip("torch")
    swin = _hf("swin")
    from transformers import SwinConfig

    height, width, window, shift, channels = 4, 6, 2, 1, 6
    config = SwinConfig(embed_dim=channels, num_heads=[H], window_size=window, qkv_bias=True)
    config._attn_implementation = "sdpa"  # HF's "eager" takes its softmax in float32
    attention = swin.SwinAttention(config, channels, H, window).double().eval()
    with torch.no_grad():
        for p in attention.parameters():
            p.copy_(torch.asarray(rng.normal(scale=0.3, size=tuple(p.shape))))
    layer = type("Shifted", (), {"window_size": window, "shift_size": shift})()
    hf_mask = swin.SwinLayer.get_attn_mask(layer, height, width, torch.float64, "cpu")
    mask = shifted_window_mask(height, width, window, shift)
    np.testing.assert_array_equal(hf_mask.numpy() == 0, mask)

    x = rng.normal(size=(B, height, width, channels))
    windows = window_partition(np.roll(x, (-shift, -shift), axis=(1, 2)), window)
    with torch.no_grad():
        want = attention(torch.asarray(windows), attention_mask=hf_mask)[0].numpy()

    n_windows, n = mask.shape[0], window * window
    d = channels // H

    def heads(a):  # (B·nW, N, C) -> (B, nW, H, N, d)
        return np.moveaxis(a.reshape(B, n_windows, n, H, d), 3, 2)

    q, k, v = (heads(_hf_linear(getattr(attention, f"{n}_proj"))(windows)) for n in ("q", "k", "v"))
    table = attention.relative_position_bias.relative_position_bias_table.detach().numpy().T
    out = relattn.scaled_dot_product_attention(
        q, k, v, bias=grid_relative_bias(table, window, window), mask=mask[:, None]
    )
    out = np.moveaxis(out, 2, 3).reshape(B * n_windows, n, channels)
    got = _hf_linear(attention.o_proj)(out)
    assert np.abs(got - want).max() <= 1e-10
    merged = window_merge(windows, window, height, width)
    np.testing.assert_array_equal(np.roll(merged, (shift, shift), axis=(1, 2)), x)


@pytest.mark.parametrize(
    "window, pretrained", [((3, 3), [0, 0]), ((2, 4), [0, 0]), ((3, 3), [5, 5])]
)
def test_hf_swinv2_continuous_position_bias(rng, window, pretrained):
    """Swinv2SelfAttention with copied weights: its coordinates (HF forms them in float32:
    compared at float32's precision, then relattn's float64 ones put in its buffer), and
    its whole cosine attention with the shifted-window mask, to 1e-10."""
    torch = pytest.importorskip("torch")
    swinv2 = _hf("swinv2")
    from transformers import Swinv2Config

    channels = 6
    config = Swinv2Config(qkv_bias=True, attention_probs_dropout_prob=0.0)
    module = swinv2.Swinv2SelfAttention(config, channels, H, window, pretrained).double().eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.asarray(rng.normal(scale=0.5, size=tuple(p.shape))))
    coords = continuous_position_coordinates(
        window, pretrained_window=None if pretrained[0] == 0 else tuple(pretrained)
    )
    hf_coords = module.relative_coords_table[0].reshape(-1, 2).numpy()
    np.testing.assert_allclose(coords, hf_coords, rtol=1e-6, atol=1e-7)
    module.relative_coords_table = torch.asarray(
        coords[None].reshape(module.relative_coords_table.shape)
    )

    height, width = 2 * window[0], 2 * window[1]
    mask = shifted_window_mask(height, width, window, 1)
    hf_mask = torch.asarray(np.where(mask, 0.0, -100.0))
    n = window[0] * window[1]
    windows = rng.normal(size=(B * mask.shape[0], n, channels))
    with torch.no_grad():
        want = module(torch.asarray(windows), attention_mask=hf_mask)[0].numpy()

        def heads(a):  # (B·nW, N, C) -> (B, nW, H, N, d)
            return np.moveaxis(a.reshape(B, mask.shape[0], n, H, channels // H), 3, 2)

        q, k, v = (
            heads(_hf_linear(getattr(module, name))(windows)) for name in ("query", "key", "value")
        )
        mlp = module.continuous_position_bias_mlp
        hidden = np.maximum(_hf_linear(mlp[0])(coords), 0.0)
        values = _hf_linear(mlp[2])(hidden)  # (T, H)
        logit_scale = np.exp(np.minimum(module.logit_scale.numpy(), math.log(100.0)))  # (H, 1, 1)
    qn = q / np.linalg.norm(q, axis=-1, keepdims=True) * logit_scale
    kn = k / np.linalg.norm(k, axis=-1, keepdims=True)
    bias = continuous_position_bias(values.T, *window)
    out = relattn.scaled_dot_product_attention(qn, kn, v, bias=bias, mask=mask[:, None], scale=1.0)
    got = np.moveaxis(out, 2, 3).reshape(B * mask.shape[0], n, channels)
    assert np.abs(got - want).max() <= 1e-10


def _beit_bias(table, window):
    torch = pytest.importorskip("torch")
    beit = _hf("beit")
    from transformers import BeitConfig

    config = BeitConfig(
        image_size=(window[0] * 2, window[1] * 2), patch_size=2, num_attention_heads=H
    )
    module = beit.BeitRelativePositionBias(config).double()
    with torch.no_grad():
        module.relative_position_bias_table.copy_(torch.asarray(table.T))
        bias = module(window)[0].numpy()
    return bias, module.generate_relative_position_index(window).numpy()


@pytest.mark.parametrize("window", [(2, 2), (3, 3)])
def test_hf_beit_class_token_square(rng, window):
    table = rng.normal(size=(H, _table_size(*window, True)))
    want, index = _beit_bias(table, window)
    got = grid_relative_bias(table, *window, class_token=True)
    assert np.abs(got - want).max() <= 1e-10
    np.testing.assert_array_equal(index, grid_relative_index(*window, class_token=True))


@pytest.mark.parametrize("window", [(2, 3), (3, 2)])
def test_hf_beit_reads_a_non_square_table_column_first(rng, window):
    """Reference disagreement: HF's ``BeitRelativePositionBias.forward`` reshapes the
    ``(2h-1)(2w-1)`` table as ``(2w-1, 2h-1)`` (column first) before resizing it to the
    window's ``(2h-1, 2w-1)``, so a non-square window's bias is a resampled, transposed
    table. Its index agrees with relattn's (the paper's, timm's order) and square windows
    agree exactly (test above); here the biases differ, while relattn's equals the loop."""
    table = rng.normal(size=(H, _table_size(*window, True)))
    hf, index = _beit_bias(table, window)
    np.testing.assert_array_equal(index, grid_relative_index(*window, class_token=True))
    got = grid_relative_bias(table, *window, class_token=True)
    np.testing.assert_allclose(got, _bias_loop(table, *window, True), rtol=0, atol=0)
    body = (slice(None), slice(1, None), slice(1, None))
    assert np.abs(got[body] - hf[body]).max() > 1e-2
    # the class-token entries are not resampled: they agree
    np.testing.assert_allclose(got[:, 0], hf[:, 0], rtol=1e-12)
    np.testing.assert_allclose(got[:, :, 0], hf[:, :, 0], rtol=1e-12)


# ===============================================================================================
# Bad input
# ===============================================================================================

_T = np.zeros((H, 15))

BAD = {
    "table-size": (
        lambda: grid_relative_bias(_T, 3, 3),
        ValueError,
        r"^table must have \(2·height - 1\)·\(2·width - 1\) = 25 entries .* got shape \(3, 15\)",
    ),
    "table-size-cls": (
        lambda: grid_relative_bias(_T, 2, 3, class_token=True),
        ValueError,
        r"^table must have .* \+ 3 \(class token\) = 18 entries",
    ),
    "table-0d": (
        lambda: grid_relative_bias(np.asarray(1.0), 1, 1),
        ValueError,
        r"^table must have shape \(\.\.\., T\), got shape \(\)",
    ),
    "table-int": (
        lambda: grid_relative_bias(np.zeros((H, 15), dtype=int), 2, 3),
        TypeError,
        r"^table must have a real floating dtype",
    ),
    "table-none": (lambda: grid_relative_bias(None, 2, 3), TypeError, r"^table must be an array"),
    "table-list": (
        lambda: grid_bias_mod([0.0] * 15, 2, 3),
        TypeError,
        r"^table must be an array, got list",
    ),
    "mod-table-3d": (
        lambda: grid_bias_mod(_T[None], 2, 3),
        ValueError,
        r"^table must have shape \(H, T\) or \(T,\), got shape \(1, 3, 15\)",
    ),
    "mod-table-size": (
        lambda: grid_bias_mod(_T, 3, 2, class_token=True),
        ValueError,
        r"^table must have",
    ),
    "height-negative": (
        lambda: grid_relative_index(-1, 2),
        ValueError,
        r"^height must be >= 1, got -1",
    ),
    "width-zero": (lambda: grid_relative_bias(_T, 2, 0), ValueError, r"^width must be >= 1, got 0"),
    "positions-negative": (
        lambda: grid_positions(2, -3),
        ValueError,
        r"^width must be >= 0, got -3",
    ),
    "height-float": (
        lambda: grid_positions(2.0, 3),
        TypeError,
        r"^height must be an integer, got float",
    ),
    "positions-merge": (
        lambda: grid_positions(3, 4, merge_size=2),
        ValueError,
        r"^height and width must be multiples of merge_size = 2, got 3 x 4",
    ),
    "positions-merge-zero": (
        lambda: grid_positions(2, 2, merge_size=0),
        ValueError,
        r"^merge_size must be >= 1, got 0",
    ),
    "positions-reference-int": (
        lambda: grid_positions(3, 4, reference_shape=4),
        TypeError,
        r"^reference_shape must be a pair \(H_pt, W_pt\), got 4",
    ),
    "positions-reference-zero": (
        lambda: grid_positions(3, 4, reference_shape=(4, 0)),
        ValueError,
        r"^reference_shape\[1\] must be >= 1, got 0",
    ),
    "positions-reference-int-dtype": (
        lambda: grid_positions(3, 4, reference_shape=(4, 4), dtype=np.int64),
        TypeError,
        r"^dtype must be a real floating dtype, got .*int64",
    ),
    "positions-dtype-complex": (
        lambda: grid_positions(3, 4, dtype=np.complex128),
        TypeError,
        r"^dtype must be an integer or real floating dtype, got .*complex128",
    ),
    "positions-dtype-str": (
        lambda: grid_positions(3, 4, dtype="float32"),
        TypeError,
        r"^dtype must be a dtype object of numpy",
    ),
    "class_token-str": (
        lambda: grid_relative_index(2, 2, class_token="yes"),
        TypeError,
        r"^class_token must be a bool",
    ),
    "window-not-dividing": (
        lambda: window_partition(np.zeros((1, 4, 6, 2)), 4),
        ValueError,
        r"^window must divide the grid: a 4×6 grid .* windows of 4×4",
    ),
    "window-triple": (
        lambda: window_partition(np.zeros((1, 4, 6, 2)), (2, 2, 2)),
        ValueError,
        r"^window must be an integer or a pair \(rows, cols\), got 3 values",
    ),
    "window-zero": (
        lambda: shifted_window_mask(4, 4, 0, 0),
        ValueError,
        r"^window must be >= 1, got 0",
    ),
    "x-3d": (
        lambda: window_partition(np.zeros((4, 6, 2)), 2),
        ValueError,
        r"^x must have shape \(B, height, width, C\), got shape \(4, 6, 2\)",
    ),
    "x-none": (lambda: window_partition(None, 2), TypeError, r"^x must be an array"),
    "windows-wrong": (
        lambda: window_merge(np.zeros((6, 4, 2)), 2, 4, 4),
        ValueError,
        r"^windows must have shape \(B·nW, wh·ww, C\) with nW = 4 windows",
    ),
    "windows-trailing": (
        lambda: window_merge(np.zeros((4, 6, 2)), 2, 4, 4),
        ValueError,
        r"^windows must have shape .* got shape \(4, 6, 2\)",
    ),
    "merge-empty-grid": (
        lambda: window_merge(np.zeros((0, 4, 2)), 2, 0, 4),
        ValueError,
        r"^height must be >= 1, got 0",
    ),
    "merge-not-dividing": (
        lambda: window_merge(np.zeros((4, 4, 2)), 2, 5, 4),
        ValueError,
        r"^window must divide the grid",
    ),
    "shift-too-large": (
        lambda: shifted_window_mask(4, 4, 2, 2),
        ValueError,
        r"^shift must be smaller than the window on each axis, 2×2, got \(2, 2\)",
    ),
    "shift-negative": (
        lambda: shifted_window_mask(4, 4, 2, (1, -1)),
        ValueError,
        r"^shift must be >= 0, got -1",
    ),
    "pretrained-zero": (
        lambda: continuous_position_coordinates(3, pretrained_window=0),
        ValueError,
        r"^pretrained_window must be >= 1, got 0",
    ),
    "coords-dtype-int": (
        lambda: continuous_position_coordinates(3, dtype=np.int64),
        TypeError,
        r"^dtype must be",
    ),
    "values-size": (
        lambda: continuous_position_bias(_T, 3, 3),
        ValueError,
        r"^values must have \(2·height - 1\)·\(2·width - 1\) = 25 entries",
    ),
    "values-none": (
        lambda: continuous_position_bias(None, 3, 3),
        TypeError,
        r"^values must be an array",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input(name):
    call, error, match = BAD[name]
    with pytest.raises(error, match=match):
        call()
