"""Running the demo: text to tokens, every scheme on every backend, the table."""

from __future__ import annotations

import codecs
import contextlib
import io
import math
import re
import time
from pathlib import Path
from typing import Any

import array_api_compat
import numpy as np

from ..backends import Backend, backend_for, load, namespace_of_module
from .models import SCHEMES, Config, Encoder, MemoryEncoder

#: The release tolerances, per dtype, on unit-scale data: (rtol, atol).
TOLERANCES = {"float64": (1e-10, 1e-12), "float32": (1e-4, 1e-5)}


def zen_of_python() -> str:
    """The Zen of Python, from CPython's ``this`` module (which prints it on import)."""
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return codecs.decode(this.s, "rot13")


def read_text(path: str | None) -> tuple[str, str]:
    """The text at ``path`` (UTF-8) and its name; the Zen of Python for ``None``.

    Raises ``OSError`` (no such file, a directory, no permission) and
    ``UnicodeDecodeError`` (not UTF-8) as :meth:`pathlib.Path.read_text` does.
    """
    if path is None:
        return zen_of_python(), "the Zen of Python (CPython's `this`)"
    return Path(path).read_text(encoding="utf-8"), path


def byte_tokens(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def run(encoder: Encoder, tokens: np.ndarray, naive: bool = False) -> tuple[np.ndarray, list]:
    """Encode ``tokens`` segment by segment; the host output and seconds per segment."""
    backend = backend_for(encoder.xp)
    # ``start`` is an argument, so that a jit traces it rather than compiling each value in
    step = backend.jit(lambda h, mems, start: encoder.step(h, mems, naive, start))
    memories: list = [None] * len(encoder.layers)
    outputs, times = [], []
    for start in range(0, len(tokens), encoder.config.segment):
        h = encoder.embed(tokens[start : start + encoder.config.segment])
        tic = time.perf_counter()
        out, memories = step(h, memories, start)
        memories = [m if m is None else backend.materialize(m) for m in memories]
        outputs.append(backend.to_host(out))
        times.append(time.perf_counter() - tic)
    return np.concatenate(outputs), times


def default_device(backend: Backend) -> Any:
    """The backend's GPU where it has one, else its CPU.

    Raises ``LookupError`` with the reason when it has neither (CuPy without a
    CUDA device).
    """
    try:
        return backend.device("gpu")
    except LookupError as no_gpu:
        try:
            return backend.device("cpu")
        except LookupError:
            raise no_gpu from None


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def find_backends(names: list[str]) -> tuple[list[str], dict[str, str]]:
    """The backends of ``names`` the demo can run, and why it cannot run the others.

    A backend is usable when its library imports (:func:`relattn.backends.load`)
    and :func:`default_device` finds it a device; the reasons read as
    ``"not installed (No module named 'cupy')"`` or ``"no usable device (…)"``.
    """
    found, skipped = [], {}
    for name in names:
        try:
            _, backend = load(name)
        except ModuleNotFoundError as e:
            skipped[name] = f"not installed ({_one_line(e)})"
            continue
        except ImportError as e:
            skipped[name] = f"cannot be imported ({_one_line(e)})"
            continue
        try:
            default_device(backend)
        except LookupError as e:
            skipped[name] = f"no usable device ({_one_line(e)})"
            continue
        found.append(name)
    return found, skipped


#: What each scheme's encoder needs of ``d_model`` and ``heads``: the heads split
#: ``d_model`` evenly; a sinusoid over ``d_model``, or over one head, pairs sines
#: and cosines, and RoPE rotates pairs of a head's features, so that width must be even.
SPLITS_HEADS = ("absolute", "shaw", "xl", "tener", "complex", "t5", "alibi", "rope", "deberta")
SINUSOID_OVER_D_MODEL = ("absolute", "xl")
PAIRS_OVER_HEAD = ("tener", "rope")
#: The schemes whose layers also attend to past segments (``--memory``).
WITH_MEMORY = tuple(name for name, model in SCHEMES.items() if issubclass(model, MemoryEncoder))


def config_problem(config: Config, schemes: list[str]) -> str | None:
    """Why ``config`` cannot run ``schemes``, worded with the demo's flags; ``None`` if it can.

    Covers the constraints between flags; each flag's own range (``--segment``
    at least 1, ``--memory`` at least 0 …) is the command line's to check.
    """
    d, h = config.d_model, config.heads

    def needed_by(needing: tuple[str, ...]) -> str | None:
        names = [s for s in SCHEMES if s in schemes and s in needing]
        return f"needed by --scheme {', '.join(names)}" if names else None

    split = needed_by(SPLITS_HEADS)
    if split and d % h:
        return f"--d-model {d} is not a multiple of --heads {h} (equal heads, {split})"
    over_d_model = needed_by(SINUSOID_OVER_D_MODEL)
    if over_d_model and d % 2:
        return (
            f"--d-model {d} is odd; it must be even "
            f"(sine and cosine pairs of a sinusoid over d_model, {over_d_model})"
        )
    over_head = needed_by(PAIRS_OVER_HEAD)
    if over_head and (d // h) % 2:
        return (
            f"--d-model {d} / --heads {h} gives a head size of {d // h}; it must be even "
            f"(pairs of features in one head: a sinusoid's sines and cosines, "
            f"RoPE's rotated pairs; {over_head})"
        )
    return None


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
        f"{config.heads} heads, segment {config.segment}, memory {config.memory} "
        f"({', '.join(WITH_MEMORY)})"
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
            lib, backend = load(name)
            xp = namespace_of_module(lib)
            encoder = model(config, xp, getattr(xp, dtype), default_device(backend))
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
