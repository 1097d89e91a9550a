"""The NumPy inference example on a GPU with CuPy, checked against NumPy.

``examples/numpy_inference.py`` is written against the array API (every
function takes the namespace ``xp``), so running it on CuPy needs no new model
code: the weights are copied to the GPU with ``cupy.asarray`` and the same
functions run there, relattn's included. This script reads the same text
segment by segment (Transformer-XL memory) on CuPy and on NumPy, in float32,
and reports the largest difference between the two sets of logits.

Needs CuPy and a CUDA device. Run with ``python examples/cupy_inference.py``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np


def load_numpy_inference():
    """``examples/numpy_inference.py`` as a module, wherever this file is run from."""
    path = Path(__file__).with_name("numpy_inference.py")
    spec = importlib.util.spec_from_file_location("relattn_examples_numpy_inference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(lib: Any = None, *, seed: int = 0, segment: int = 4, memory_length: int = 8) -> dict:
    """Logits on ``lib`` (CuPy by default) and on NumPy, both as NumPy arrays.

    Returns ``{"device": {...}, "numpy": {...}, "max_abs_difference": float}``,
    where each inner dict holds the ``"segmented"`` and ``"whole"`` logits of
    :func:`numpy_inference.run`.
    """
    if lib is None:
        import cupy as lib
    to_host = getattr(lib, "asnumpy", np.from_dlpack)  # CuPy copies device arrays to the host
    example = load_numpy_inference()
    options = {"seed": seed, "segment": segment, "memory_length": memory_length}
    on_device = {name: to_host(a) for name, a in example.run(lib, **options).items()}
    on_host = example.run(np, **options)
    gap = max(float(np.max(np.abs(on_device[name] - on_host[name]))) for name in on_host)
    return {"device": on_device, "numpy": on_host, "max_abs_difference": gap}


if __name__ == "__main__":
    import cupy

    result = run(cupy)
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    logits = result["device"]["segmented"]
    print(f"CuPy on {name}: logits {logits.dtype} {logits.shape}")
    print(f"max |CuPy - NumPy| over the logits: {result['max_abs_difference']:.1e}")
