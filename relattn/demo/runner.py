"""Running the demo: text to tokens, every scheme on every backend, the table."""

from __future__ import annotations

import codecs
import contextlib
import importlib
import io
import math
import re
import time
from pathlib import Path
from typing import Any

import array_api_compat
import numpy as np

from ..backends import backend_for, namespace_of_module
from .models import SCHEMES, Config, Encoder

#: Backends the demo knows, by the module a user passes as ``xp``.
BACKENDS = {
    "numpy": "numpy",
    "array_api_strict": "array_api_strict",
    "torch": "torch",
    "jax": "jax.numpy",
    "cupy": "cupy",
    "dask": "dask.array",
}

#: SPEC §5 tolerances, per dtype, on unit-scale data: (rtol, atol).
TOLERANCES = {"float64": (1e-10, 1e-12), "float32": (1e-4, 1e-5)}


def zen_of_python() -> str:
    """The Zen of Python, from CPython's ``this`` module (which prints it on import)."""
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return codecs.decode(this.s, "rot13")


def read_text(path: str | None) -> tuple[str, str]:
    if path is None:
        return zen_of_python(), "the Zen of Python (CPython's `this`)"
    return Path(path).read_text(encoding="utf-8"), path


def byte_tokens(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def run(encoder: Encoder, tokens: np.ndarray, naive: bool = False) -> tuple[np.ndarray, list]:
    """Encode ``tokens`` segment by segment; the host output and seconds per segment."""
    backend = backend_for(encoder.xp)
    step = backend.jit(lambda h, mems: encoder.step(h, mems, naive))
    memories: list = [None] * len(encoder.layers)
    outputs, times = [], []
    for start in range(0, len(tokens), encoder.config.segment):
        h = encoder.embed(tokens[start : start + encoder.config.segment])
        tic = time.perf_counter()
        out, memories = step(h, memories)
        memories = [m if m is None else backend.materialize(m) for m in memories]
        outputs.append(backend.to_host(out))
        times.append(time.perf_counter() - tic)
    return np.concatenate(outputs), times


def default_device(name: str, lib: Any) -> Any:
    """The accelerator where the library has one, else its CPU."""
    if name == "torch":
        return lib.device("cuda" if lib.cuda.is_available() else "cpu")
    return None


def available(names: list[str]) -> list[str]:
    found = []
    for name in names:
        try:
            importlib.import_module(BACKENDS[name])
        except ImportError:
            continue
        found.append(name)
    return found


def exceeds(got: np.ndarray, want: np.ndarray, dtype: str) -> float:
    """Largest violation of ``|got - want| <= atol + rtol·|want|`` (> 0 means failure)."""
    rtol, atol = TOLERANCES[dtype]
    return float(np.max(np.abs(got - want) - (atol + rtol * np.abs(want))))


def demo(
    backends: list[str],
    text: str,
    text_name: str,
    config: Config | None = None,
    dtype: str = "float32",
    schemes: list[str] | None = None,
    out: Any = print,
) -> bool:
    """Run the demo; print one row per scheme and backend; return whether all checks passed."""
    config = Config() if config is None else config
    tokens = byte_tokens(text)
    numpy_xp = namespace_of_module(None)
    segments = math.ceil(len(tokens) / config.segment)
    out(
        f"relattn demo: {config.layers}-layer encoders, d_model {config.d_model}, "
        f"{config.heads} heads, segment {config.segment} (Transformer-XL memory {config.memory})"
    )
    out(f"text: {text_name}, {len(tokens)} byte tokens, {segments} segments")
    out("")
    out(
        f"{'scheme':<10}{'backend':<17}{'device':<12}{'dtype':<9}"
        f"{'max|Δ| vs numpy f64':>21}{'max|fast - naive|':>19}{'ms/segment':>12}  check"
    )
    ok = True
    for scheme in schemes or list(SCHEMES):
        model = SCHEMES[scheme]
        reference, _ = run(model(config, numpy_xp, numpy_xp.float64), tokens)
        for name in backends:
            lib = importlib.import_module(BACKENDS[name])
            xp = namespace_of_module(lib)
            encoder = model(config, xp, getattr(xp, dtype), default_device(name, lib))
            run(encoder, tokens[: config.segment])  # warm up: imports, jit compilation
            result, times = run(encoder, tokens)
            naive, _ = run(encoder, tokens, naive=True)
            vs_reference = float(np.max(np.abs(result - reference)))
            vs_naive = float(np.max(np.abs(result - naive)))
            passed = exceeds(result, reference, dtype) <= 0 and exceeds(result, naive, dtype) <= 0
            ok &= passed
            # "Device('CPU_DEVICE')" -> "CPU_DEVICE"
            device = str(array_api_compat.device(encoder.embedding))
            where = re.sub(r"^.*\('(.*)'\)$", r"\1", device)
            out(
                f"{scheme:<10}{name:<17}{where:<12}{dtype:<9}{vs_reference:>21.2e}{vs_naive:>19.2e}"
                f"{1e3 * float(np.median(times)):>12.2f}  {'ok' if passed else 'FAIL'}"
            )
    return ok
