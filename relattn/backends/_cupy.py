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


BACKEND = Backend(
    name="cupy",
    library="cupy",
    module="cupy",
    from_host=_from_host,
    to_host=_to_host,
    ready=_ready,
    device=_device,
)
