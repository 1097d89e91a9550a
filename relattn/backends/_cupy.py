"""CuPy: arrays on a CUDA device; host copies wait for the device."""

from __future__ import annotations

from typing import Any

from ._base import Backend


def _from_host(a: Any, device: Any = None, chunks: Any = None) -> Any:
    import cupy

    if device is None:
        return cupy.asarray(a)
    with device:
        return cupy.asarray(a)


def _to_host(x: Any) -> Any:
    return x.get()


def _ready(x: Any) -> Any:
    import cupy

    cupy.cuda.get_current_stream().synchronize()
    return x


def _device(kind: str) -> Any:
    import cupy

    if kind != "gpu":
        raise LookupError(f"cupy has no {kind} device: its arrays live on a CUDA GPU")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as e:
        raise LookupError(f"cupy finds no CUDA device ({e})") from None
    if not count:
        raise LookupError("cupy finds no CUDA device")
    return cupy.cuda.Device(0)


def _peak_device_bytes(fn: Any, device: Any) -> int:
    """Growth of CuPy's default memory pool while ``fn()`` runs, emptied of free blocks before.

    The pool keeps the blocks freed during the run, so its size afterwards
    bounds the peak from above (by the blocks it could not reuse).
    """
    import cupy

    with cupy.cuda.Device() if device is None else device:
        pool = cupy.get_default_memory_pool()
        cupy.cuda.get_current_stream().synchronize()
        pool.free_all_blocks()
        before = pool.total_bytes()
        _ready(fn())
        return pool.total_bytes() - before


BACKEND = Backend(
    name="cupy",
    library="cupy",
    module="cupy",
    from_host=_from_host,
    to_host=_to_host,
    ready=_ready,
    device=_device,
    peak_device_bytes=_peak_device_bytes,
)
