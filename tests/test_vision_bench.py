"""The vision benchmarks (``asv_bench/benchmarks/vision.py``, ``compare.py --only vision``):
SAM's decomposed relative positions and Swin's shifted windows written natively in NumPy,
PyTorch and JAX (``asv_bench/benchmarks/native.py``) equal relattn and a float64 loop over
the papers' formulas; the compare rows, CPU and GPU, run on CPU stand-ins at small sizes."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ASV = Path(__file__).parents[1] / "asv_bench"
LIBRARIES = ("numpy", "torch", "jax")


@pytest.fixture(scope="module")
def bench():
    """``(native, vision)`` of ``asv_bench/benchmarks``."""
    pytest.importorskip("relattn.testing")
    if str(ASV) not in sys.path:
        sys.path.insert(0, str(ASV))
    from benchmarks import native, vision

    return native, vision


@pytest.fixture(scope="module")
def compare(bench):
    if "compare" in sys.modules and hasattr(sys.modules["compare"], "vision_gpu"):
        return sys.modules["compare"]
    spec = importlib.util.spec_from_file_location("compare", ASV / "compare.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["compare"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=LIBRARIES)
def target(request, bench):
    from relattn.testing import target

    found = target(request.param)
    if found.unavailable:
        pytest.skip(f"{request.param}: {found.unavailable}")
    return found


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sam_loop(q, k, v, rel_pos_h, rel_pos_w, grid):
    """Kirillov et al. 2023 / Li et al. 2022 (MViTv2, eq. 4), pair by pair in float64:
    ``s_ij = (q_i · k_j)/√d + q_i · Rʰ[y_i - y_j + h - 1] + q_i · Rʷ[x_i - x_j + w - 1]``."""
    h, w = grid
    length, d = q.shape[-2:]
    scores = np.empty((*q.shape[:-2], length, length))
    for i in range(length):
        yi, xi = divmod(i, w)
        for j in range(length):
            yj, xj = divmod(j, w)
            rel = rel_pos_h[yi - yj + h - 1] + rel_pos_w[xi - xj + w - 1]
            scores[..., i, j] = np.sum(q[..., i, :] * (k[..., j, :] / math.sqrt(d) + rel), -1)
    return _softmax(scores) @ v


def swin_loop(q, k, v, table, window, shifted_regions):
    """Liu et al. 2021, eq. (4), per window in float64: ``softmax(q kᵀ/√d + B̂[Δrow, Δcol])
    v`` with ``Δ = query - key`` over the window's patches, the pairs of different regions
    (``shifted_regions (nW, N)``: each patch's region) left out."""
    windows, _, n, d = q.shape
    nw = shifted_regions.shape[0]
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(d)
    for i in range(n):
        ri, ci = divmod(i, window)
        for j in range(n):
            rj, cj = divmod(j, window)
            entry = (ri - rj + window - 1) * (2 * window - 1) + (ci - cj + window - 1)
            scores[..., i, j] += table[:, entry]
    same = shifted_regions[:, :, None] == shifted_regions[:, None, :]  # (nW, N, N)
    same = np.tile(same, (windows // nw, 1, 1))[:, None]
    return _softmax(np.where(same, scores, -np.inf)) @ v


def _regions(height, window, shift):
    """Each patch's region of the rolled map, per window: Swin's three slices per axis."""
    ids = np.zeros((height, height), dtype=int)
    cuts = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
    for a, rows in enumerate(cuts):
        for b, cols in enumerate(cuts):
            ids[rows, cols] = 3 * a + b
    ids = ids.reshape(height // window, window, height // window, window).transpose(0, 2, 1, 3)
    return ids.reshape(-1, window * window)


def _host(x) -> np.ndarray:
    return np.asarray(x.cpu() if hasattr(x, "cpu") else x)


@pytest.mark.parametrize("grid", [(4, 4), (3, 5)])
def test_native_sam_equals_relattn_and_the_loop(bench, target, grid):
    native, vision = bench
    from relattn.decomposed import decomposed_relative_attention

    host = {n: a.astype(np.float64) for n, a in
            vision.sam_inputs(grid=grid, heads=2, batch=2, d=8).items()}  # fmt: skip
    arrays = {n: target.asarray(a, "float64") for n, a in host.items()}
    args = tuple(arrays[n] for n in ("q", "k", "v", "rel_pos_h", "rel_pos_w"))
    theirs = native.native("decomposed_relative_attention", target, grid=grid)(*args)
    ours = decomposed_relative_attention(*args, query_grid=grid)
    expected = sam_loop(*(host[n] for n in ("q", "k", "v", "rel_pos_h", "rel_pos_w")), grid)
    np.testing.assert_allclose(target.to_host(theirs), expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(target.to_host(ours), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("grid", "window", "shift"), [(8, 4, 2), (6, 3, 1), (6, 3, 0)])
def test_native_swin_equals_relattn_and_the_loop(bench, target, grid, window, shift):
    _, vision = bench
    if shift == 0:  # Swin's unshifted blocks add no mask; the same arrays without one
        host = vision.swin_inputs(grid=grid, window=window, shift=1, heads=2, batch=2, d=4)
        host["window_bias"] = np.zeros_like(host["window_bias"])
        host["attn_mask"] = np.zeros_like(host["attn_mask"])
        regions = np.zeros(host["window_bias"].shape[:2], dtype=int)
    else:
        host = vision.swin_inputs(grid=grid, window=window, shift=shift, heads=2, batch=2, d=4)
        regions = _regions(grid, window, shift)
    host = {n: a.astype(np.float64) if a.dtype == np.float32 else a for n, a in host.items()}
    arrays = {n: target.asarray(a, "float64" if a.dtype.kind == "f" else None)
              for n, a in host.items()}  # fmt: skip
    ours, ours_args, theirs, theirs_args = vision.functions("swin", target, arrays)
    expected = swin_loop(host["q"], host["k"], host["v"], host["table"], window, regions)
    np.testing.assert_allclose(target.to_host(theirs(*theirs_args)), expected, rtol=1e-10,
                               atol=1e-12)  # fmt: skip
    np.testing.assert_allclose(target.to_host(ours(*ours_args)), expected, rtol=1e-10,
                               atol=1e-12)  # fmt: skip


@pytest.mark.parametrize(("grid", "window", "shift"), [(8, 4, 2), (14, 7, 3), (56, 7, 3)])
def test_swins_buffers_are_relattns_index_and_mask(bench, grid, window, shift):
    native, _ = bench
    from relattn.grid import grid_relative_index, shifted_window_mask

    np.testing.assert_array_equal(native.swin_relative_index(window),
                                  np.asarray(grid_relative_index(window, window)))  # fmt: skip
    mask = native.swin_attn_mask(grid, grid, window, shift)
    assert mask.dtype == np.float32 and set(np.unique(mask)) <= {0.0, -100.0}
    np.testing.assert_array_equal(
        mask == 0, np.asarray(shifted_window_mask(grid, grid, window, shift))
    )


def test_check_passes(bench, target):
    _, vision = bench
    vision.check(target.name)


def test_check_refuses_dask(bench):
    pytest.importorskip("dask")
    _, vision = bench
    with pytest.raises(NotImplementedError, match="no native"):
        vision.check("dask")


def test_benchmark_sizes(bench):
    """SAM ViT-B at a 64×64 grid (12 heads on a GPU, fewer on a CPU) and Swin-T stage 1."""
    _, vision = bench
    from relattn.testing import target

    host = vision.sam_inputs(heads=1)
    assert host["q"].shape == (1, 1, 4096, 64) and host["rel_pos_h"].shape == (127, 64)
    assert vision.sam_heads(target("numpy"), quick=True) == vision.SAM_QUICK_HEADS
    assert vision.sam_heads(target("numpy"), quick=False) == vision.SAM_CPU_HEADS
    assert vision.SAM_HEADS == 12
    host = vision.swin_inputs(batch=1)
    assert host["q"].shape == (64, 3, 49, 32) and host["table"].shape == (3, 169)
    assert host["window_bias"].shape == host["attn_mask"].shape == (64, 49, 49)


def test_memory_helpers(compare, target):
    """tracemalloc sees NumPy's buffers; the resident high-water mark any library's; JAX's
    compiled program its own."""
    n = 1 << 21  # 16 MiB of float64
    lib = target.lib
    if target.library == "numpy":
        assert compare.traced_peak_bytes(lambda: np.ones(n), target) >= 8 * n
    if target.library == "jax":
        import jax

        fn = jax.jit(lambda x: x * 2.0 + 1.0)
        assert compare._jax_program_bytes(fn, target.asarray(np.ones(n), "float64")) >= 8 * n
        return
    try:
        grown = compare.rss_peak_bytes(lambda: lib.ones(n, dtype=lib.float64) + 1, target)
    except LookupError as e:
        pytest.skip(str(e))
    assert grown >= 8 * n


def test_vision_rows_on_cpu_stand_ins(compare, monkeypatch):
    """Both cases on each CPU library at small sizes: a time row and a memory row each."""
    from benchmarks import vision

    small = {"sam": {"grid": (8, 8), "heads": 2, "d": 16},
             "swin": {"grid": 14, "window": 7, "shift": 3, "batch": 2}}  # fmt: skip

    def inputs(case, backend, quick=False):
        maker = vision.sam_inputs if case == "sam" else vision.swin_inputs
        return vision.common.on(backend, maker(**small[case]))

    monkeypatch.setattr(vision, "inputs", inputs)
    names = [n for n in LIBRARIES if importlib.util.find_spec(n)]
    rows = compare.vision_rows(names, 1, quick=True)
    assert len(rows) == 4 * len(names), [r.what for r in rows]
    for row in rows:
        assert row.value > 0 and row.target == "<= 1.0", row
    assert any("tracemalloc" in r.what for r in rows)
    sam = [r for r in rows if "SAM" in r.what and "peak memory" not in r.what]
    assert sam[0].what.startswith("decomposed rel-pos (SAM), 8×8 grid (L=64), B=1 H=2 d=16")
    assert sam[0].what.endswith("relattn / segment-anything written natively")


def test_vision_gpu_rows_on_cpu_stand_ins(compare):
    """The GPU rows' cases on JAX and on NumPy (standing in for CuPy), small: a time row
    each, and a memory row where the library counts bytes (JAX's compiled programs)."""
    pytest.importorskip("jax")
    sizes = {"sam": {"grid": (8, 8), "heads": 2, "d": 16}, "swin": {"grid": 14, "batch": 2}}
    rows = compare.vision_gpu(["jax", "numpy"], 1, dtypes=("float32",), sizes=sizes)
    what = [(r.backend, r.what) for r in rows]
    assert ("numpy", "gpu: decomposed rel-pos (SAM), 8×8 grid (L=64), B=1 H=2 d=16, float32: "
            "relattn / segment-anything written natively") in what  # fmt: skip
    assert ("jax", "gpu: Swin windows 7×7, 14×14 grid, shifted, B=2 H=3 d=32, float32: "
            "relattn / Swin written natively") in what  # fmt: skip
    jax_rows = [r for r in rows if r.backend == "jax"]
    assert len(jax_rows) == 4 and sum("peak memory" in r.what for r in jax_rows) == 2
    assert all(r.value > 0 for r in rows), rows
    assert all(r.ok is None for r in rows)  # the targets apply to bf16
