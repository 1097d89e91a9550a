"""Backends, sizes and inputs shared by the benchmarks.

Every benchmark class is parameterised over ``backend`` (the names in
:data:`BACKENDS`) and the query length ``Lq``; keys and values cover a memory
as long again (``Lk = 2·Lq``, Transformer-XL with ``M = Lq``). Shapes follow
relattn's convention ``(B, H, L, d_head)`` with ``B = 2``, ``H = 8``,
``d_head = 64``, float32. A backend that is not installed or has no device
raises ``NotImplementedError`` in ``setup``, which asv reports as skipped.

``RELATTN_BENCH_QUICK=1`` keeps ``Lq = 128`` only and runs fewer repeats in
the ``track_*`` ratios: the CI smoke run (see ``asv_bench/README.md``).

A topic module's classes subclass :class:`_Speed` (``time_relattn``,
``peakmem_relattn``), :class:`_VsNative` (``time_native``,
``track_ratio_to_native``) and :class:`_GPUMemory` (``track_gpu_peak_bytes``,
``track_native_gpu_peak_bytes``), giving only their ``params`` and a
``calls`` method that builds the relattn call and the native one.

The array libraries are imported here, once, when asv's forkserver imports the
benchmark suite, so that the forked benchmark processes do not each pay for
``import torch`` and ``import jax``; importing JAX does not start its runtime
(that happens on the first array), so forking afterwards is safe.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# JAX would otherwise take 75 % of a GPU's memory when it first starts, which
# the CuPy and PyTorch benchmarks and the GPU memory counters would then miss.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

try:
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None
try:
    import jax
    import jax.numpy as jnp
except ImportError:  # pragma: no cover
    jax = jnp = None
try:
    import dask.array as da
except ImportError:  # pragma: no cover
    da = None

QUICK = os.environ.get("RELATTN_BENCH_QUICK", "") not in ("", "0")

BATCH = 2
HEADS = 8
D_HEAD = 64
#: Shaw et al.'s clipping radius K.
RADIUS = 16

CPU_BACKENDS = ("numpy", "torch", "jax", "dask")
GPU_BACKENDS = ("cupy", "torch_cuda", "jax_gpu")
BACKENDS = CPU_BACKENDS + GPU_BACKENDS
QUERY_LENGTHS = (128,) if QUICK else (128, 512, 2048)
#: Sizes of the ``track_ratio_*`` benchmarks, which run both sides several
#: times in one call: the target (SPEC §5, issue 4) is stated at Lq = 512.
RATIO_LENGTHS = (128,) if QUICK else (128, 512)

#: Feature size of DiSAN's tokens ``h (B, L, d)``. Its feature-wise logits are
#: ``O(B·L²·d)``: at L = 2048 that is 2^29 elements, 16 times L = 512's 0.3-1.4 s
#: per call on two CPU cores, so :mod:`disan` stops at L = 512 on CPU backends.
DISAN_FEATURES = 64


def key_length(query_length: int) -> int:
    """``Lk = 2·Lq``: the segment and a memory as long as it."""
    return 2 * query_length


def skip_on_cpu_from(backend: str, query_length: int, largest: int) -> None:
    """``NotImplementedError`` when a CPU ``backend`` gets ``Lq >= largest``."""
    if backend in CPU_BACKENDS and query_length >= largest:
        raise NotImplementedError(f"Lq = {query_length} is too slow for {backend} on a CPU")


@dataclass
class Backend:
    """One array library on one device, as the benchmarks use it."""

    name: str
    #: The module a user passes as ``xp=`` (``numpy``, ``torch``, ``jax.numpy`` …).
    lib: Any
    device: Any = None
    gpu: bool = False

    def asarray(self, a: np.ndarray, batched: bool = False) -> Any:
        """NumPy data ``a`` as this backend's array on its device.

        Dask: one chunk per batch element when ``batched`` (the leading axis is
        the batch), so that the two cores each get one; one chunk otherwise.
        """
        if self.name == "numpy":
            return np.ascontiguousarray(a)
        if self.name == "dask":
            return da.from_array(a, chunks=(1, *a.shape[1:]) if batched else a.shape)
        if self.name == "cupy":
            return self.lib.asarray(a)
        if self.name.startswith("torch"):
            return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)
        if self.name.startswith("jax"):
            return jax.device_put(a, self.device)
        raise AssertionError(self.name)

    def ready(self, x: Any) -> Any:
        """``x`` finished: wait for the device, or compute a Dask graph."""
        if self.name == "dask":
            return x.compute()
        if self.name.startswith("jax"):
            return jax.block_until_ready(x)
        if self.name == "torch_cuda":
            torch.cuda.synchronize()
        elif self.name == "cupy":
            self.lib.cuda.get_current_stream().synchronize()
        return x

    def to_numpy(self, x: Any) -> np.ndarray:
        if self.name == "dask":
            x = x.compute()
        if self.name.startswith("torch"):
            return x.detach().cpu().numpy()
        if self.name == "cupy":
            return self.lib.asnumpy(x)
        return np.asarray(x)

    def jit(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` compiled with ``jax.jit`` on JAX; itself elsewhere."""
        return jax.jit(fn) if self.name.startswith("jax") else fn

    # -- GPU memory ----------------------------------------------------
    def reset_gpu_peak(self) -> None:
        if self.name == "torch_cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        elif self.name == "cupy":
            self.lib.get_default_memory_pool().free_all_blocks()

    def gpu_peak_bytes(self, fn: Callable[[], Any]) -> int:
        """Peak device bytes allocated while ``fn()`` runs, over what was allocated before."""
        if self.name == "torch_cuda":
            self.reset_gpu_peak()
            before = torch.cuda.memory_allocated()
            self.ready(fn())
            return torch.cuda.max_memory_allocated() - before
        if self.name == "cupy":
            # CuPy's pool keeps freed blocks: its total after a run bounds the peak.
            pool = self.lib.get_default_memory_pool()
            self.reset_gpu_peak()
            before = pool.total_bytes()
            self.ready(fn())
            return pool.total_bytes() - before
        if self.name == "jax_gpu":
            stats = self.device.memory_stats() or {}
            before = stats.get("bytes_in_use", 0)
            self.ready(fn())
            # XLA keeps a process-wide peak that cannot be reset: the largest
            # benchmark run before this one in the same process would show.
            peak = (self.device.memory_stats() or {}).get("peak_bytes_in_use", 0)
            return max(peak - before, 0)
        raise NotImplementedError(f"{self.name} has no GPU memory counter")


def _cuda_torch() -> Backend:
    if not torch.cuda.is_available():
        raise NotImplementedError("torch has no CUDA device")
    return Backend("torch_cuda", torch, torch.device("cuda"), gpu=True)


def _jax_gpu() -> Backend:
    try:
        device = jax.devices("gpu")[0]
    except RuntimeError:
        raise NotImplementedError("jax has no GPU device") from None
    return Backend("jax_gpu", jnp, device, gpu=True)


def _cupy() -> Backend:
    try:
        import cupy
    except ImportError:
        raise NotImplementedError("cupy is not installed") from None
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            raise NotImplementedError("cupy finds no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError as e:
        raise NotImplementedError(f"cupy finds no CUDA device ({e})") from None
    return Backend("cupy", cupy, gpu=True)


@functools.cache
def get_backend(name: str) -> Backend:
    """The :class:`Backend` called ``name``, or ``NotImplementedError`` saying why not."""
    needs = {"torch": torch, "torch_cuda": torch, "jax": jax, "jax_gpu": jax, "dask": da}
    if name in needs and needs[name] is None:
        raise NotImplementedError(f"{name}: its library is not installed")
    if name == "numpy":
        return Backend("numpy", np)
    if name == "torch":
        return Backend("torch", torch, torch.device("cpu"))
    if name == "jax":
        return Backend("jax", jnp, jax.devices("cpu")[0])
    if name == "dask":
        return Backend("dask", da)
    if name == "torch_cuda":
        return _cuda_torch()
    if name == "jax_gpu":
        return _jax_gpu()
    if name == "cupy":
        return _cupy()
    raise NotImplementedError(f"unknown backend {name!r}")


# -- inputs ------------------------------------------------------------
def normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def attention_inputs(query_length: int, key_len: int | None = None, seed: int = 0) -> dict:
    """NumPy float32 ``q (B, H, Lq, d)``, ``k``, ``v (B, H, Lk, d)``."""
    lk = key_length(query_length) if key_len is None else key_len
    rng = np.random.default_rng(seed)
    return {
        "q": normal(rng, BATCH, HEADS, query_length, D_HEAD),
        "k": normal(rng, BATCH, HEADS, lk, D_HEAD),
        "v": normal(rng, BATCH, HEADS, lk, D_HEAD),
    }


def relative_inputs(query_length: int, layout: str, key_len: int | None = None) -> dict:
    """:func:`attention_inputs` plus Transformer-XL's per-head table ``(H, W, d)`` and biases.

    ``layout="causal"``: ``W = Lk`` (distances ``δ <= 0``, keys with ``δ > 0``
    masked); ``"full"``: ``W = Lq + Lk - 1`` (XLNet, Conformer), no mask. The
    biases ``u``, ``v`` are per head, ``(H, 1, d)``.
    """
    arrays = attention_inputs(query_length, key_len)
    lq, lk = query_length, arrays["k"].shape[-2]
    width = {"causal": lk, "full": lq + lk - 1}[layout]
    rng = np.random.default_rng(1)
    arrays["position_table"] = normal(rng, HEADS, width, D_HEAD)
    arrays["content_bias"] = normal(rng, HEADS, 1, D_HEAD)
    arrays["position_bias"] = normal(rng, HEADS, 1, D_HEAD)
    return arrays


def shaw_inputs(query_length: int, key_len: int | None = None) -> dict:
    """:func:`attention_inputs` plus Shaw's tables ``(2K+1, d)``, shared by the heads."""
    arrays = attention_inputs(query_length, key_len)
    rng = np.random.default_rng(2)
    arrays["key_table"] = normal(rng, 2 * RADIUS + 1, D_HEAD)
    arrays["value_table"] = normal(rng, 2 * RADIUS + 1, D_HEAD)
    return arrays


def bias_inputs(query_length: int, key_len: int | None = None) -> dict:
    """:func:`attention_inputs` plus an additive bias ``(Lq, Lk)`` (a precomputed position term)."""
    arrays = attention_inputs(query_length, key_len)
    rng = np.random.default_rng(3)
    arrays["bias"] = normal(rng, query_length, arrays["k"].shape[-2])
    return arrays


#: Arrays whose leading axis is the batch (Dask chunks them along it).
BATCHED = ("q", "k", "v", "h")


def on(backend: Backend, arrays: dict) -> dict:
    """Every array of ``arrays`` converted to ``backend``."""
    return {name: backend.asarray(a, batched=name in BATCHED) for name, a in arrays.items()}


# -- side-by-side timing ----------------------------------------------
def repeats() -> int:
    return 3 if QUICK else 7


def timed(fn: Callable[[], Any], backend: Backend) -> float:
    """Seconds for one call of ``fn``, waiting for its result."""
    start = time.perf_counter()
    backend.ready(fn())
    return time.perf_counter() - start


def median_ratio(
    fn: Callable[[], Any], baseline: Callable[[], Any], backend: Backend, n: int | None = None
) -> tuple[float, float, float]:
    """``(median time of fn / median time of baseline, median fn, median baseline)``.

    The two run alternately, ``n`` times each, in this process after one warm-up
    call each (compilation, caches), so that drifts in clock speed and memory
    state hit both alike.
    """
    n = repeats() if n is None else n
    backend.ready(fn())
    backend.ready(baseline())
    ours, theirs = [], []
    for _ in range(n):
        ours.append(timed(fn, backend))
        theirs.append(timed(baseline, backend))
    a, b = statistics.median(ours), statistics.median(theirs)
    return a / b, a, b


# -- the benchmark classes every topic shares ----------------------------
# Their names start with "_": asv's discovery skips such module attributes, so
# these are collected only through the public topic classes that subclass them
# (asv lists a class's benchmarks with ``inspect.getmembers``, inherited
# methods included, and names them after the subclass).


class _Topic:
    """One relattn function and, where there is one, its native baseline, on one backend.

    A topic class gives ``params`` and ``param_names`` (the first parameter
    is always ``backend``, a name in :data:`BACKENDS`) and :meth:`calls`; the
    base classes below add ``setup`` and the measurements.
    """

    params = [BACKENDS, QUERY_LENGTHS]
    param_names = ["backend", "query_length"]
    timeout = 300

    def calls(
        self, backend: Backend, *params: Any, with_native: bool
    ) -> tuple[Callable[[], Any], Callable[[], Any] | None]:
        """``(relattn call, native call or None)``, both without arguments, on ``backend``.

        ``params`` are the benchmark's parameters after ``backend``. The native
        call is ``None`` unless ``with_native``; ``NotImplementedError`` where
        the backend or the function is missing, which asv reports as skipped.
        """
        # TypeError, not NotImplementedError: asv would report the latter as a skip.
        raise TypeError(f"{type(self).__name__} does not define calls()")


class _Speed(_Topic):
    """Speed and host peak memory of relattn on every backend."""

    def setup(self, backend: str, *params: Any) -> None:
        self.backend = get_backend(backend)
        self.ours, _ = self.calls(self.backend, *params, with_native=False)
        self.backend.ready(self.ours())  # compile (jax.jit) and touch the memory once

    def time_relattn(self, *params: Any) -> None:
        self.backend.ready(self.ours())

    def peakmem_relattn(self, *params: Any) -> None:
        self.backend.ready(self.ours())


class _VsNative(_Topic):
    """relattn against the same algorithm written in the library's own API (:mod:`native`).

    ``setup`` first asserts that the two agree on small inputs
    (:func:`native.check`); Dask has no native code and is skipped.
    """

    params = [BACKENDS, RATIO_LENGTHS]
    #: The unit of ``track_ratio_to_native``: asv looks for ``unit`` on the
    #: method and then on the class, so a topic can name its baseline here
    #: (``time_*`` benchmarks are in seconds whatever this says).
    unit = "relattn/native"

    def setup(self, backend: str, *params: Any) -> None:
        # native.py imports this module at its top: import it only when needed.
        from . import native

        self.backend = get_backend(backend)
        native.check(backend)
        self.ours, self.theirs = self.calls(self.backend, *params, with_native=True)
        self.backend.ready(self.theirs())

    def time_native(self, *params: Any) -> None:
        self.backend.ready(self.theirs())

    def track_ratio_to_native(self, *params: Any) -> float:
        """Median time of relattn over median time of the native code, side by side."""
        return median_ratio(self.ours, self.theirs, self.backend)[0]


class _GPUMemory(_Topic):
    """Peak device memory of one call, relattn and native (GPU backends only)."""

    params = [GPU_BACKENDS, QUERY_LENGTHS]

    def setup(self, backend: str, *params: Any) -> None:
        self.backend = get_backend(backend)
        self.ours, self.theirs = self.calls(self.backend, *params, with_native=True)
        self.backend.ready(self.ours())
        self.backend.ready(self.theirs())

    def track_gpu_peak_bytes(self, *params: Any) -> int:
        """Bytes relattn's call allocates on the device at its peak."""
        return self.backend.gpu_peak_bytes(self.ours)

    track_gpu_peak_bytes.unit = "bytes"

    def track_native_gpu_peak_bytes(self, *params: Any) -> int:
        """Bytes the native call allocates on the device at its peak."""
        return self.backend.gpu_peak_bytes(self.theirs)

    track_native_gpu_peak_bytes.unit = "bytes"
