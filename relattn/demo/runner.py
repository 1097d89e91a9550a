"""Running the demo: text to tokens, every scheme on every backend, the table."""

from __future__ import annotations

import codecs
import contextlib
import io
import math
import re
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import array_api_compat
import numpy as np
from tqdm import tqdm

from .. import testing
from ..backends import MODULES, backend_for
from .models import SCHEMES, Config, Encoder, MemoryEncoder

#: The release tolerances, per dtype, on unit-scale data: (rtol, atol).
TOLERANCES = {"float64": (1e-10, 1e-12), "float32": (1e-4, 1e-5)}

#: Which checks :func:`demo` runs: both, the NumPy float64 run only, the naive twin only, none.
CHECKS = ("all", "reference", "naive", "none")

#: Wraps the segment starts of one run, e.g. in a progress bar.
Progress = Callable[[Iterable[int]], Iterable[int]]


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


def run(
    encoder: Encoder,
    tokens: np.ndarray,
    naive: bool = False,
    progress: Progress | None = None,
    target: testing.Target | None = None,
) -> tuple[np.ndarray, list]:
    """Encode ``tokens`` segment by segment; the host output and seconds per segment.

    ``progress``, if given, wraps the iterable of segment starts (a progress
    bar); it is not timed. ``target``: the library and device the encoder runs
    on (its jit, its host copies); NumPy's by default.
    """
    target = target or testing.target("numpy")
    backend = backend_for(encoder.xp)
    # ``start`` is an argument, so that a jit traces it rather than compiling each value in
    step = target.default_jit(lambda h, mems, start: encoder.step(h, mems, naive, start))
    memories: list = [None] * len(encoder.layers)
    outputs, times = [], []
    starts = range(0, len(tokens), encoder.config.segment)
    for start in starts if progress is None else progress(starts):
        h = encoder.embed(tokens[start : start + encoder.config.segment])
        tic = time.perf_counter()
        # Checked at the release tolerances: float32 products in full precision, for this
        # block only (JAX's default on GPUs is TF32, about 1e-3; Target.full_precision).
        with target.full_precision():
            out, memories = step(h, memories, start)
        memories = [m if m is None else backend.materialize(m) for m in memories]
        outputs.append(target.to_host(out))
        times.append(time.perf_counter() - tic)
    return np.concatenate(outputs), times


#: The demo's backends (the keys of :data:`relattn.backends.MODULES`) -> the
#: :mod:`relattn.testing` targets each runs on, its GPU first.
TARGETS = {
    "numpy": ("numpy",),
    "array_api_strict": ("array_api_strict",),
    "torch": ("torch_cuda", "torch"),
    "jax": ("jax_gpu", "jax"),
    "cupy": ("cupy",),
    "dask": ("dask",),
}


def demo_target(name: str) -> testing.Target:
    """The target backend ``name`` runs on: its GPU where it has one, else its CPU.

    Raises ``ImportError`` where the library does not import and ``LookupError``
    with the reason where none of its targets can run (CuPy without a CUDA
    device).
    """
    import importlib

    importlib.import_module(MODULES[name])
    reasons = []
    for found in map(testing.target, TARGETS[name]):
        if found.unavailable is None:
            return found
        reasons.append(found.unavailable)
    raise LookupError("; ".join(reasons))


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def find_backends(names: list[str]) -> tuple[list[str], dict[str, str]]:
    """The backends of ``names`` the demo can run, and why it cannot run the others.

    A backend is usable when its library imports and :func:`demo_target`
    finds it a target; the reasons read as
    ``"not installed (No module named 'cupy')"`` or ``"no usable device (…)"``.
    """
    found, skipped = [], {}
    for name in names:
        try:
            demo_target(name)
        except ModuleNotFoundError as e:
            skipped[name] = f"not installed ({_one_line(e)})"
            continue
        except ImportError as e:
            skipped[name] = f"cannot be imported ({_one_line(e)})"
            continue
        except LookupError as e:
            skipped[name] = f"no usable device ({_one_line(e)})"
            continue
        found.append(name)
    return found, skipped


#: What each scheme's encoder needs of ``d_model`` and ``heads``: the heads split
#: ``d_model`` evenly; a sinusoid over ``d_model``, or over one head, pairs sines
#: and cosines, and RoPE rotates pairs of a head's features, so that width must be even.
SPLITS_HEADS = (
    "absolute", "shaw", "xl", "tener", "complex", "t5", "alibi", "rope", "deberta", "swin",
    "sam",
)  # fmt: skip
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


def progress_bar(description: str) -> Progress:
    """A :data:`Progress` that draws a bar over segments on ``sys.stderr``, erased when done."""

    def bar(starts: Iterable[int]) -> Iterable[int]:
        return tqdm(starts, desc=description, unit="segment", leave=False, file=sys.stderr)

    return bar


def _checks_line(check: str, checked: int, segments: int, dtype: str) -> str:
    """The header line that says what :func:`demo` compares, over which segments."""
    if check == "none":
        return "checks: skipped (--check none): the table gives the times only"
    against = {
        "all": "a NumPy float64 run and the naive twin",
        "reference": "a NumPy float64 run (naive twins skipped, --check reference)",
        "naive": "the naive twin (NumPy float64 runs skipped, --check naive)",
    }[check]
    if checked == segments:
        which = f"all {segments} segments"
    else:
        which = f"the first {checked} of {segments} segments"
    rtol, atol = TOLERANCES[dtype]
    return f"checks: {which} against {against}; {dtype}: rtol {rtol:.0e}, atol {atol:.0e}"


def demo(
    backends: list[str],
    text: str,
    text_name: str,
    config: Config | None = None,
    dtype: str = "float32",
    schemes: list[str] | None = None,
    out: Any = print,
    *,
    check: str = "all",
    check_segments: int | None = None,
    progress: bool = False,
) -> bool:
    """Run the demo: one report row per scheme and backend; whether every check passed.

    Parameters
    ----------
    backends : list of str
        Names of :data:`relattn.backends.MODULES` to run on, each usable
        (:func:`find_backends`).
    text : str
        The text, encoded as UTF-8 byte tokens.
    text_name : str
        What the header calls the text.
    config : Config, optional
        Sizes and seed of the encoders; default ``Config()``.
    dtype : {"float32", "float64"}, optional
        Dtype of the runs on ``backends``.
    schemes : list of str, optional
        Names of :data:`SCHEMES`; default all of them.
    out : callable, optional
        Called with each line of the report (default ``print``).
    check : {"all", "reference", "naive", "none"}, optional
        The comparisons: each run against a NumPy float64 run of the same
        scheme and against its naive twin on the same backend (``"all"``),
        one of the two, or none (the times only).
    check_segments : int, optional
        Compare the first ``check_segments`` segments only; every backend
        still encodes, and is timed over, the whole text. Default: all.
    progress : bool, optional
        Draw a progress bar per run on ``sys.stderr`` (:func:`progress_bar`).

    Returns
    -------
    bool
        Whether every comparison run is within :data:`TOLERANCES`; ``True``
        when none runs.

    Raises
    ------
    ValueError
        If ``check`` is not one of :data:`CHECKS` or ``check_segments`` is
        below 1.

    Examples
    --------
    >>> from relattn.demo import Config, demo
    >>> lines = []
    >>> config = Config(segment=4, memory=4, d_model=8, layers=1)
    >>> demo(["numpy"], "relative", "a word", config, schemes=["t5"], out=lines.append)
    True
    >>> print(lines[0])  # t5 keeps no memory: the header names none
    relattn demo: 1-layer encoders, d_model 8, 4 heads, segment 4
    >>> print(lines[2])  # doctest: +NORMALIZE_WHITESPACE
    checks: all 2 segments against a NumPy float64 run and the naive twin;
    float32: rtol 1e-04, atol 1e-05
    >>> print(lines[-1])
    all checks passed
    """
    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, got {check!r}")
    if check_segments is not None and check_segments < 1:
        raise ValueError(f"check_segments must be at least 1, got {check_segments}")
    config = Config() if config is None else config
    schemes = list(SCHEMES) if schemes is None else schemes
    tokens = byte_tokens(text)
    numpy_xp = testing.target("numpy").xp
    segments = math.ceil(len(tokens) / config.segment)
    checked = segments if check_segments is None else min(check_segments, segments)
    checked_tokens = tokens[: checked * config.segment]
    with_reference, with_naive = check in ("all", "reference"), check in ("all", "naive")

    def bar(description: str) -> Progress | None:
        return progress_bar(description) if progress else None

    with_memory = [s for s in schemes if s in WITH_MEMORY]
    memory = f", memory {config.memory} ({', '.join(with_memory)})" if with_memory else ""
    out(
        f"relattn demo: {config.layers}-layer encoders, d_model {config.d_model}, "
        f"{config.heads} heads, segment {config.segment}{memory}"
    )
    out(f"text: {text_name}, {len(tokens)} byte tokens, {segments} segments")
    out(_checks_line(check, checked, segments, dtype))
    out("")
    out(
        f"{'scheme':<10}{'backend':<17}{'device':<12}{'dtype':<9}"
        f"{'max|Δ| vs numpy f64':>21}{'max|fast - naive|':>19}{'ms/segment':>12}  check"
    )
    ok = True
    for scheme in schemes:
        model = SCHEMES[scheme]
        if with_reference:
            reference, _ = run(
                model(config, numpy_xp, numpy_xp.float64),
                checked_tokens,
                progress=bar(f"{scheme} on numpy: float64 reference"),
            )
        for name in backends:
            target = demo_target(name)
            xp = target.xp
            encoder = model(config, xp, getattr(xp, dtype), target.device)
            # warm up: imports, jit compilation
            run(
                encoder, tokens[: config.segment], progress=bar(f"{scheme} on {name}: warm-up"),
                target=target,
            )  # fmt: skip
            result, times = run(
                encoder, tokens, progress=bar(f"{scheme} on {name}: relattn"), target=target
            )
            result = result[: len(checked_tokens)]
            columns, passed = [], True
            if with_reference:
                columns.append(f"{float(np.max(np.abs(result - reference))):>21.2e}")
                passed &= exceeds(result, reference, dtype) <= 0
            else:
                columns.append(f"{'skipped':>21}")
            if with_naive:
                naive, _ = run(
                    encoder,
                    checked_tokens,
                    naive=True,
                    progress=bar(f"{scheme} on {name}: naive twin"),
                    target=target,
                )
                columns.append(f"{float(np.max(np.abs(result - naive))):>19.2e}")
                passed &= exceeds(result, naive, dtype) <= 0
            else:
                columns.append(f"{'skipped':>19}")
            ok &= passed
            verdict = "skipped" if check == "none" else "ok" if passed else "FAIL"
            # "Device('CPU_DEVICE')" -> "CPU_DEVICE"
            device = str(array_api_compat.device(encoder.embedding))
            where = re.sub(r"^.*\('(.*)'\)$", r"\1", device)
            out(
                f"{scheme:<10}{name:<17}{where:<12}{dtype:<9}{''.join(columns)}"
                f"{1e3 * float(np.median(times)):>12.2f}  {verdict}"
            )
    out("")
    if check == "none":
        out("checks skipped (--check none)")
    else:
        out("all checks passed" if ok else "SOME CHECKS FAILED")
    return ok
