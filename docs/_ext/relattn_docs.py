"""Sphinx helpers for relattn's documentation.

- ``write_inventories``: intersphinx inventories for NumPy, PyTorch, JAX and the
  array API standard, written from the plain-text sources in ``docs/intersphinx/``
  (the build machines reach no documentation site; see ``docs/intersphinx/README.md``).
- ``backend-support`` directive: the support table of every public function on
  every backend, probed when the page is built with the call table of
  ``tests/test_transforms.py`` (``CASES``, every public name) and the backends
  of ``tests/conftest.py``.
- ``asv-report`` directive and a ``build-finished`` hook: link to, and copy, the
  asv HTML report ``asv_bench/html`` into ``<outdir>/asv`` when it exists.
"""

from __future__ import annotations

import shutil
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

DOCS = Path(__file__).resolve().parent.parent
ROOT = DOCS.parent
ASV_HTML = ROOT / "asv_bench" / "html"


# ----------------------------------------------------------------------------------------
# intersphinx inventories
# ----------------------------------------------------------------------------------------


def write_inventories(source: Path, target: Path) -> dict[str, Path]:
    """Compress each ``source/<name>.txt`` (sphobjinv plain text) to ``target/<name>.inv``."""
    import sphobjinv

    target.mkdir(parents=True, exist_ok=True)
    written = {}
    for text in sorted(source.glob("*.txt")):
        inventory = sphobjinv.Inventory(plaintext=text.read_bytes())
        path = target / f"{text.stem}.inv"
        sphobjinv.writebytes(str(path), sphobjinv.compress(inventory.data_file()))
        written[text.stem] = path
    return written


# ----------------------------------------------------------------------------------------
# backend support table
# ----------------------------------------------------------------------------------------

#: Columns of the table: the backends of ``tests/conftest.py`` that run on one device each.
PROBED_BACKENDS = ("numpy", "array_api_strict", "torch", "jax", "dask", "cupy")
FLOATS = ("float16", "bfloat16", "float32", "float64")
#: Loose agreement with the NumPy float64 result, per dtype (unit-scale data).
TOLERANCE = {"float16": 2e-2, "bfloat16": 8e-2, "float32": 1e-4, "float64": 1e-10}
YES, NO, NA = "✓", "✗", "–"


def _test_modules() -> tuple[Any, Any]:
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import conftest
    import test_transforms

    return conftest, test_transforms


#: Cases restricted to one library: ``name -> (module, note there, note elsewhere)``.
#: On the other libraries the row is not probed and shows the second note.
ONLY = {
    "ring_attention": (
        "jax.numpy",
        "inside jax.shard_map, probed on a one-device mesh",
        "JAX only, inside jax.shard_map (the ring is lax.ppermute): TypeError here",
    ),
}


def all_cases(transforms: Any) -> dict[str, Any]:
    """The test suite's call table, by name."""
    return dict(transforms.CASES)


def _outcome(fn) -> tuple[Any, str | None]:
    """``fn()`` and ``None``, or ``None`` and a short reason it failed or was skipped."""
    import pytest

    try:
        return fn(), None
    except pytest.skip.Exception as e:
        return None, str(e.msg if hasattr(e, "msg") else e)
    except Exception as e:  # the table reports the failure instead of raising it
        first = str(e).splitlines()[0] if str(e) else ""
        return None, f"{type(e).__name__}: {first}"[:120]


def _dtype_name(dt: Any) -> str:
    return str(dt).rsplit(".", 1)[-1].replace("'>", "").replace("Device(", "")


def _probe_dtypes(backend, case, numpy, transforms, rng_seed) -> tuple[str, dict[str, str]]:
    """The dtypes cell (``f32``, ``f16→f32`` for a promoted result) and failures by dtype.

    Each dtype is checked against NumPy float64 run on the same inputs *as rounded
    to that dtype*, so input rounding is not counted as an error.
    """
    import numpy as np

    short = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}
    cells, why = [], {}
    for name in FLOATS:

        def run(name=name):
            backend.dtype(name)  # skips if the library lacks it
            inputs = case.inputs(np.random.default_rng(rng_seed))
            arrays = [backend.asarray(a, name if a.dtype.kind == "f" else None) for a in inputs]
            rounded = [
                np.asarray(backend.to_numpy(x), dtype=np.float64) if a.dtype.kind == "f" else a
                for a, x in zip(inputs, arrays, strict=True)
            ]
            want = np.asarray(numpy.to_numpy(case.call(numpy, "float64", *rounded)))
            if backend.is_jax:  # compiled: JAX's op-by-op eager mode is slow to probe
                import jax

                out = jax.jit(lambda *a: case.call(backend, name, *a))(*arrays)
            else:
                out = case.call(backend, name, *arrays)
            got = np.asarray(backend.to_numpy(out))
            if got.dtype.name == "bfloat16":  # JAX's bfloat16 NumPy arrays (ml_dtypes)
                got = got.astype(np.float32)
            if got.dtype.kind not in "fc":
                if not np.array_equal(got, want):
                    raise ValueError("differs from NumPy")
                return _dtype_name(out.dtype)
            got = got.astype(np.float64)
            huge = np.abs(want) > 1e30  # "large finite negative" biases: dtype-dependent
            if not (np.all(np.isfinite(got)) and np.all(np.sign(got[huge]) == np.sign(want[huge]))):
                raise ValueError("not finite, or a large bias lost its sign")
            scale = max(1.0, float(np.max(np.abs(want[~huge]), initial=0.0)))
            err = float(np.max(np.abs(got[~huge] - want[~huge]), initial=0.0))
            if not err <= TOLERANCE[name] * scale:
                raise ValueError(f"max |Δ| {err:.1e} from NumPy float64")
            result = _dtype_name(out.dtype)
            if not any(a.dtype.kind == "f" for a in inputs) or result == name:
                return short[name]
            return f"{short[name]}→{short.get(result, result)}"

        cell, reason = _outcome(run)
        if reason is None:
            cells.append(cell)
        elif "has no" not in reason:
            why[name] = reason
            cells.append(f"{short[name]} {NO}")
    # Calls without floating results (masks, distances) give their dtype once.
    if cells and all(c == cells[0] and c not in short.values() for c in cells):
        return cells[0], why
    return " ".join(cells) or NO, why


def _probe_jit(backend, case, rng_seed) -> str:
    import numpy as np

    rng = np.random.default_rng(rng_seed)
    arrays = [
        backend.asarray(a, "float32" if a.dtype.kind == "f" else None) for a in case.inputs(rng)
    ]

    def fn(*a):
        return case.call(backend, "float32", *a)

    if backend.is_jax:
        import jax

        out, reason = _outcome(lambda: jax.jit(fn)(*arrays))
    elif backend.is_torch:
        import torch

        def compiled():
            torch._dynamo.reset()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # dynamo's notes on lru_cache
                return torch.compile(fn, backend="eager", fullgraph=True)(*arrays)

        out, reason = _outcome(compiled)
    else:
        return NA
    if reason is not None:
        return f"{NO} ({reason.split(':')[0]})"
    eager = np.asarray(backend.to_numpy(fn(*arrays)))
    got = np.asarray(backend.to_numpy(out))
    return YES if np.allclose(got, eager, rtol=1e-5, atol=1e-5) else f"{NO} (differs)"


def _probe_grad(backend, case, rng_seed) -> str:
    import numpy as np

    if not (backend.is_jax or backend.is_torch):
        return NA
    if not any(a.dtype.kind == "f" for a in case.inputs(np.random.default_rng(rng_seed))):
        return NA  # no floating input: nothing to differentiate
    if not case.differentiable:
        return "stops (by design)"
    rng = np.random.default_rng(rng_seed)
    inputs = case.inputs(rng)
    arrays = [backend.asarray(a, "float64" if a.dtype.kind == "f" else None) for a in inputs]
    floating = [i for i, a in enumerate(inputs) if a.dtype.kind == "f"]

    if backend.is_torch:

        def grads():
            for i in floating:
                arrays[i].requires_grad_(True)
            out = case.call(backend, "float64", *arrays)
            out.sum().backward()
            return [arrays[i].grad for i in floating]

    else:
        import jax
        import jax.numpy as jnp

        def grads():
            def loss(*fl):
                a = list(arrays)
                for i, x in zip(floating, fl, strict=True):
                    a[i] = x
                return jnp.sum(case.call(backend, "float64", *a))

            # Compiled: JAX's op-by-op eager autodiff is ~10x slower to probe.
            return jax.jit(jax.grad(loss, argnums=tuple(range(len(floating)))))(
                *(arrays[i] for i in floating)
            )

    got, reason = _outcome(grads)
    if reason is not None:
        return f"{NO} ({reason.split(':')[0]})"
    finite = all(
        g is not None and bool(np.isfinite(np.asarray(backend.to_numpy(g))).all()) for g in got
    )
    return YES if finite else f"{NO} (missing or non-finite)"


def _cache_key(name: str) -> str:
    """Hash of everything a backend's probe depends on: relattn, the call table, versions."""
    import hashlib
    from importlib import metadata

    digest = hashlib.sha256(name.encode())
    files = sorted((ROOT / "relattn").rglob("*.py"))
    files += [ROOT / "tests" / "test_transforms.py", ROOT / "tests" / "conftest.py", Path(__file__)]
    for path in files:
        digest.update(path.read_bytes())
    for dist in ("numpy", "array-api-compat", "array-api-strict", "torch", "jax", "dask", "cupy"):
        try:
            digest.update(f"{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{dist}=none".encode())
    return digest.hexdigest()


def cached_probe(name: str, cache_dir: Path) -> tuple[str | None, list[dict[str, str]], bool]:
    """:func:`probe_backend`, reused from ``cache_dir`` when nothing it depends on changed."""
    import json

    path = cache_dir / f"backend-support-{name}.json"
    key = _cache_key(name)
    if path.exists():
        stored = json.loads(path.read_text(encoding="utf-8"))
        if stored.get("key") == key:
            return stored["skipped"], stored["rows"], True
    skipped, rows = probe_backend(name)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "skipped": skipped, "rows": rows}), encoding="utf-8")
    return skipped, rows, False


def probe_backend(name: str) -> tuple[str | None, list[dict[str, str]]]:
    """Why ``name`` was not probed (or None), and one row per case of the call table."""
    import array_api_compat
    import numpy as np

    conftest, transforms = _test_modules()
    # The test suite's backends: ``TARGETS`` (one library on one device), formerly ``BACKENDS``.
    targets = getattr(conftest, "TARGETS", None) or conftest.BACKENDS
    backend = next(b for b in targets if b.name == name)
    if backend.unavailable:
        return backend.unavailable, []
    numpy = next(b for b in targets if b.name == "numpy")
    rows = []
    for seed, (case_name, case) in enumerate(sorted(all_cases(transforms).items())):
        only = ONLY.get(case_name.partition("[")[0])
        if only is not None and backend.module != only[0]:
            rows.append({"case": case_name, "dtypes": NA, "why": only[2], "device": NA,
                         "jit": NA, "grad": NA})  # fmt: skip
            continue
        dtypes, why = _probe_dtypes(backend, case, numpy, transforms, seed)
        if only is not None:
            why = {"note": only[1], **why}
        arrays = [
            backend.asarray(a, "float32" if a.dtype.kind == "f" else None)
            for a in case.inputs(np.random.default_rng(seed))
        ]
        out, reason = _outcome(lambda c=case, a=arrays: c.call(backend, "float32", *a))
        device = NA if reason else str(array_api_compat.device(out))
        if out is not None and arrays:
            if array_api_compat.device(out) != array_api_compat.device(arrays[0]):
                device += f" {NO} (input on {array_api_compat.device(arrays[0])})"
        elif out is not None and backend.device is not None:
            device = str(array_api_compat.device(out))
        rows.append(
            {
                "case": case_name,
                "dtypes": dtypes,
                "why": "; ".join(r if d == "note" else f"{d}: {r}" for d, r in why.items()),
                "device": device.replace("array_api_strict.Device(", "").replace(")", ""),
                "jit": _probe_jit(backend, case, seed),
                "grad": _probe_grad(backend, case, seed),
            }
        )
    return None, rows


def _table(header: list[str], rows: list[list[str]], widths: list[int]) -> nodes.table:
    """A docutils table; cells in the first and third columns are set as code."""
    table = nodes.table(classes=["backend-support"])
    group = nodes.tgroup(cols=len(header))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)

    def row(cells: list[str], code: bool) -> nodes.row:
        out = nodes.row()
        for c, text in enumerate(cells):
            entry = nodes.entry()
            if code and c in (0, 2) and text:
                entry += nodes.paragraph("", "", nodes.literal(text, text))
            else:
                entry += nodes.paragraph(text, text)
            out += entry
        return out

    head = nodes.thead()
    head += row(header, code=False)
    body = nodes.tbody()
    for cells in rows:
        body += row(cells, code=True)
    group += head
    group += body
    return table


class BackendSupport(SphinxDirective):
    """One table per backend: dtypes, device, jit and gradient of every public function."""

    def run(self) -> list[nodes.Node]:
        out: list[nodes.Node] = []
        for name in PROBED_BACKENDS:
            tic = time.perf_counter()
            try:
                skipped, rows, cached = cached_probe(name, Path(self.env.app.doctreedir))
            except Exception:
                logger.warning(
                    "backend-support: probing %s failed:\n%s", name, traceback.format_exc()
                )
                continue
            section = nodes.section(ids=[f"backend-{name.replace('_', '-')}"])
            section += nodes.title(name, name)
            out.append(section)
            if skipped:
                reason = "no GPU" if name == "cupy" else skipped
                section += nodes.paragraph("", f"Not probed: {reason} ({skipped}).")
                continue
            seconds = time.perf_counter() - tic
            when = (
                "Probed on an earlier build of the same code and libraries (cached)."
                if cached
                else f"Probed in {seconds:.1f} s when this page was built."
            )
            section += nodes.paragraph("", when)
            section += _table(
                ["call", "dtypes", "device", "jit", "gradient", "notes"],
                [
                    [r["case"], r["dtypes"], r["device"], r["jit"], r["grad"], r["why"]]
                    for r in rows
                ],
                [26, 18, 12, 12, 12, 20],
            )
        return out


# ----------------------------------------------------------------------------------------
# asv report
# ----------------------------------------------------------------------------------------


class AsvReport(SphinxDirective):
    """A link to ``asv/index.html`` when ``asv_bench/html`` exists, a note otherwise."""

    def run(self) -> list[nodes.Node]:
        para = nodes.paragraph()
        if (ASV_HTML / "index.html").exists():
            para += nodes.Text("The full asv report, with every benchmark's history: ")
            para += nodes.reference("", "asv/index.html", refuri="asv/index.html")
            para += nodes.Text(".")
        else:
            para += nodes.Text(
                "This build found no asv HTML report: run asv publish in asv_bench/ "
                "(it writes asv_bench/html/) and rebuild; the report is then copied "
                "to asv/index.html beside this page."
            )
        return [para]


def copy_asv_report(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html" or not ASV_HTML.is_dir():
        return
    target = Path(app.outdir) / "asv"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(ASV_HTML, target)
    logger.info("copied the asv report %s to %s", ASV_HTML, target)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("backend-support", BackendSupport)
    app.add_directive("asv-report", AsvReport)
    app.connect("build-finished", copy_asv_report)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
