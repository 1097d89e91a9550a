"""Vision transformers' relative positions: SAM's decomposed terms and Swin's windows.

Two cases, each relattn against the same attention written natively
(``native.py``), on every backend but Dask:

- ``sam``: Segment Anything's image-encoder attention with decomposed relative
  positions (Kirillov et al. 2023; MViTv2, ViTDet) at a 64×64 grid (``L = 4096``),
  ViT-B's ``H = 12``, ``d = 64``, ``B = 1``, float32, one ``(2·64 - 1, d)`` table
  per axis: :func:`relattn.decomposed.decomposed_relative_attention` against
  segment-anything's ``Attention.forward`` with ``add_decomposed_rel_pos``
  (``native.numpy_sam_attention`` and its PyTorch and JAX twins), which forms the
  ``(B·H, L, L)`` scores and adds the two terms broadcast. On CPU backends
  :data:`SAM_CPU_HEADS` heads (:data:`SAM_QUICK_HEADS` with ``RELATTN_BENCH_QUICK``):
  twelve take seconds per call on two cores.
- ``swin``: Swin-T's first stage (Liu et al. 2021), a 56×56 grid in 7×7 windows
  shifted by 3, ``H = 3``, ``d = 32``, :data:`SWIN_BATCH` images: the ``(B·nW, H,
  N, d)`` windows (``N = 49``) attended with the relative position bias gathered
  from the ``(169, H)`` table (:func:`relattn.grid.grid_relative_bias`) plus the
  shifted-window mask as an additive bias (:func:`relattn.grid.shifted_window_mask`
  through :func:`relattn.mask_to_bias`, made once, as Swin keeps its additive
  ``attn_mask`` buffer; additive, XLA fuses the whole window attention, where a
  boolean mask's NaN-safe select keeps it apart), against the authors'
  ``WindowAttention.forward`` (``native.numpy_swin_window_attention``: the table
  gathered through the ``(N, N)`` index each call, the ``0 / -100`` mask added).

``time_relattn`` / ``time_native`` and ``peakmem_relattn`` / ``peakmem_native``
time and measure each side alone (``VisionRelattn``, ``VisionNative``: each warms
only its own side in ``setup``, which asv's peak memory includes);
``track_relattn_over_native`` is relattn's median time over the native code's,
alternating in one process (target <= 1);
``track_gpu_peak_bytes_*`` the device peaks (GPU backends). ``compare.py
--only vision`` prints the same ratios with host memory (NumPy: tracemalloc;
PyTorch CPU: RSS growth; JAX: the compiled programs' bytes) and its ``gpu``
group the GPU rows. Setup first checks the two sides equal at small sizes
(:func:`check`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import common, native

if TYPE_CHECKING:
    from relattn.testing import Target

CASES = ("sam", "swin")
#: SAM ViT-B's image-encoder attention: a 64×64 grid of 16-pixel patches of a 1024² image.
SAM_GRID, SAM_HEADS, SAM_D, SAM_BATCH = (64, 64), 12, 64, 1
#: Heads of the SAM case on a CPU (``--quick``, ``RELATTN_BENCH_QUICK``: 2): each head's
#: ``(L, L)`` scores are 64 MiB in float32, and the heads are independent.
SAM_CPU_HEADS, SAM_QUICK_HEADS = 4, 2
#: Swin-T's first stage: 56×56 patches of a 224² image, 7×7 windows, shift 3, 3 heads of 32.
SWIN_GRID, SWIN_WINDOW, SWIN_SHIFT, SWIN_HEADS, SWIN_D = 56, 7, 3, 3, 32
SWIN_BATCH = 8


def sam_heads(backend: Target, quick: bool = common.QUICK) -> int:
    """:data:`SAM_HEADS` on a GPU, :data:`SAM_CPU_HEADS` on the host (``quick``:
    :data:`SAM_QUICK_HEADS`)."""
    if backend.gpu:
        return SAM_HEADS
    return SAM_QUICK_HEADS if quick else SAM_CPU_HEADS


# -- inputs (NumPy float32; on a backend through common.on) ------------------------------
def sam_inputs(grid: tuple[int, int] = SAM_GRID, heads: int = SAM_HEADS, batch: int = SAM_BATCH,
               d: int = SAM_D, seed: int = 21) -> dict:  # fmt: skip
    """``q``, ``k``, ``v (B, H, h·w, d)`` and SAM's ``rel_pos_h (2h - 1, d)``,
    ``rel_pos_w (2w - 1, d)``, their entries of variance ``1/d``: each term ``q · R`` of
    unit-normal queries is then of the size of the scaled scores ``(q · scale) · k``."""
    rng = np.random.default_rng(seed)
    h, w = grid
    arrays = {n: common.normal(rng, batch, heads, h * w, d) for n in ("q", "k", "v")}
    arrays["rel_pos_h"] = common.normal(rng, 2 * h - 1, d) * np.float32(d**-0.5)
    arrays["rel_pos_w"] = common.normal(rng, 2 * w - 1, d) * np.float32(d**-0.5)
    return arrays


def swin_inputs(grid: int = SWIN_GRID, window: int = SWIN_WINDOW, shift: int = SWIN_SHIFT,
                heads: int = SWIN_HEADS, batch: int = SWIN_BATCH, d: int = SWIN_D,
                seed: int = 22) -> dict:  # fmt: skip
    """The windows ``q``, ``k``, ``v (B·nW, H, N, d)`` of ``batch`` images, the bias table
    both ways (relattn's ``table (H, T)``, Swin's ``table_t (T, H)``, ``T = (2·window -
    1)²``), relattn's ``window_bias (nW, N, N)`` (:func:`relattn.grid.shifted_window_mask`
    as :func:`relattn.mask_to_bias` makes it additive) and Swin's buffers, ``index (N, N)``
    and ``attn_mask (nW, N, N)`` (0 / -100)."""
    from relattn import mask_to_bias
    from relattn.grid import shifted_window_mask

    rng = np.random.default_rng(seed)
    nw, n = (grid // window) ** 2, window * window
    arrays = {x: common.normal(rng, batch * nw, heads, n, d) for x in ("q", "k", "v")}
    table = common.normal(rng, heads, (2 * window - 1) ** 2)
    arrays["table"] = table
    arrays["table_t"] = np.ascontiguousarray(table.T)
    mask = shifted_window_mask(grid, grid, window, shift)
    arrays["window_bias"] = np.asarray(mask_to_bias(mask, dtype=np.float32))
    arrays["index"] = native.swin_relative_index(window)
    arrays["attn_mask"] = native.swin_attn_mask(grid, grid, window, shift)
    return arrays


def inputs(case: str, backend: Target, quick: bool = common.QUICK) -> dict:
    """The case's arrays on ``backend`` at the benchmark sizes (:func:`sam_heads`)."""
    if case == "sam":
        return common.on(backend, sam_inputs(heads=sam_heads(backend, quick)))
    return common.on(backend, swin_inputs())


# -- relattn's calls -----------------------------------------------------------------------
def sam_attention(q: Any, k: Any, v: Any, rel_pos_h: Any, rel_pos_w: Any, *,
                  grid: tuple[int, int]) -> Any:  # fmt: skip
    """SAM's attention with relattn: one call, the grid static."""
    from relattn.decomposed import decomposed_relative_attention

    return decomposed_relative_attention(q, k, v, rel_pos_h, rel_pos_w, query_grid=grid)


def swin_attention(q: Any, k: Any, v: Any, table: Any, window_bias: Any, *,
                   window: int) -> Any:  # fmt: skip
    """Swin's window attention with relattn: ``grid_relative_bias`` of the ``(H, T)`` table
    (gathered each call, as Swin does) plus the ``(nW, N, N)`` window bias, the windows
    viewed as ``(B, nW, H, N, d)`` so that it broadcasts per window, then
    ``scaled_dot_product_attention``."""
    import array_api_compat
    from relattn import scaled_dot_product_attention
    from relattn.grid import grid_relative_bias

    xp = array_api_compat.array_namespace(q)
    nw = window_bias.shape[0]
    bias = grid_relative_bias(table, window, window) + window_bias[:, None]
    windows = [xp.reshape(x, (-1, nw, *x.shape[1:])) for x in (q, k, v)]
    out = scaled_dot_product_attention(*windows, bias=bias)
    return xp.reshape(out, (*q.shape[:-1], v.shape[-1]))


#: ``(relattn's function, its arguments, the native function, its arguments)``.
Sides = tuple[Callable[..., Any], tuple, Callable[..., Any], tuple]


def functions(case: str, backend: Target, arrays: dict) -> Sides:
    """``(ours, its arguments, theirs, its arguments)``, each function through
    ``backend.default_jit`` (``jax.jit`` on JAX), the sizes read from ``arrays``."""
    if case == "sam":
        length = arrays["q"].shape[-2]
        side = math.isqrt(length)
        grid = (side, side)
        ours = backend.default_jit(functools.partial(sam_attention, grid=grid))
        theirs = native.native("decomposed_relative_attention", backend, grid=grid)
        args = tuple(arrays[n] for n in ("q", "k", "v", "rel_pos_h", "rel_pos_w"))
        return ours, args, theirs, args
    window = math.isqrt(arrays["q"].shape[-2])
    ours = backend.default_jit(functools.partial(swin_attention, window=window))
    theirs = native.native("swin_window_attention", backend)
    qkv = tuple(arrays[n] for n in ("q", "k", "v"))
    return (ours, (*qkv, arrays["table"], arrays["window_bias"]), theirs,
            (*qkv, arrays["table_t"], arrays["index"], arrays["attn_mask"]))  # fmt: skip


def calls(case: str, backend: Target, arrays: dict) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """relattn's call and the native call of ``case`` on ``arrays``, without arguments."""
    ours, ours_args, theirs, theirs_args = functions(case, backend, arrays)
    return functools.partial(ours, *ours_args), functools.partial(theirs, *theirs_args)


def require() -> None:
    """``NotImplementedError`` (a skip) where this relattn has no ``relattn.decomposed`` or
    ``relattn.grid`` (an older commit, in ``asv continuous``)."""
    import relattn

    try:
        import relattn.decomposed
        import relattn.grid
    except ImportError:
        raise NotImplementedError(
            f"relattn {relattn.__version__} has no relattn.decomposed or relattn.grid"
        ) from None


@functools.cache
def check(backend_name: str) -> None:
    """Assert relattn and the native code agree on both cases at small sizes (float32):
    SAM on an 8×8 grid, B = 2, H = 2; Swin on a 12×12 grid in windows of 4 shifted by 2.
    Cached, once per process. ``NotImplementedError`` where there is no native code
    (Dask)."""
    backend = common.get_backend(backend_name)
    if native.family(backend) is None:
        raise NotImplementedError(f"no native vision baselines for {backend_name}")
    require()
    small = {
        "sam": sam_inputs(grid=(8, 8), heads=2, batch=2, d=16),
        "swin": swin_inputs(grid=12, window=4, shift=2, heads=2, batch=2, d=8),
    }
    for case, host in small.items():
        ours, theirs = calls(case, backend, common.on(backend, host))
        np.testing.assert_allclose(
            backend.to_host(theirs()), backend.to_host(ours()), rtol=2e-4, atol=2e-5,
            err_msg=f"native {case} attention on {backend_name} differs from relattn",
        )  # fmt: skip


# -- asv -----------------------------------------------------------------------------------
class _Vision:
    params = [common.BACKENDS, CASES]
    param_names = ["backend", "case"]
    timeout = 600
    #: The sides :meth:`setup` calls once (compile under ``jax.jit``, touch the memory): a
    #: ``peakmem_*`` benchmark counts its setup's peak, so each side's class warms only its own.
    warm = ("ours", "theirs")

    def setup(self, backend: str, case: str) -> None:
        require()
        check(backend)
        self.backend = common.get_backend(backend)
        self.arrays = inputs(case, self.backend)
        self.ours, self.theirs = calls(case, self.backend, self.arrays)
        for side in self.warm:
            common.ready(self.backend, getattr(self, side)())


class VisionRelattn(_Vision):
    """relattn's call alone: time and host peak memory."""

    warm = ("ours",)

    def time_relattn(self, backend: str, case: str) -> None:
        common.ready(self.backend, self.ours())

    def peakmem_relattn(self, backend: str, case: str) -> None:
        common.ready(self.backend, self.ours())


class VisionNative(_Vision):
    """The native call alone: time and host peak memory."""

    warm = ("theirs",)

    def time_native(self, backend: str, case: str) -> None:
        common.ready(self.backend, self.theirs())

    def peakmem_native(self, backend: str, case: str) -> None:
        common.ready(self.backend, self.theirs())


class VisionOverNative(_Vision):
    """relattn's median time over the native code's, alternating in one process."""

    unit = "relattn/native"

    def track_relattn_over_native(self, backend: str, case: str) -> float:
        return common.median_ratio(self.ours, self.theirs, self.backend)[0]


class VisionGPUMemory(_Vision):
    """Peak device bytes of each side (GPU backends only)."""

    params = [common.GPU_BACKENDS, CASES]

    def track_gpu_peak_bytes_relattn(self, backend: str, case: str) -> int:
        return common.peak_device_bytes(self.backend, self.ours)

    def track_gpu_peak_bytes_native(self, backend: str, case: str) -> int:
        return common.peak_device_bytes(self.backend, self.theirs)

    track_gpu_peak_bytes_relattn.unit = "bytes"
    track_gpu_peak_bytes_native.unit = "bytes"
