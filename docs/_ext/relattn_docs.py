"""Sphinx helpers for relattn's documentation.

- ``write_inventories``: intersphinx inventories for NumPy, PyTorch, JAX and the
  array API standard, written from the plain-text sources in ``docs/intersphinx/``
  (the build machines reach no documentation site; see ``docs/intersphinx/README.md``).
- ``backend-support`` directive: the array libraries relattn runs on, and what
  every public function supports there, read from the declarations of
  :mod:`relattn.capabilities` (the same that decide the test suite's skips).
- ``asv-report`` directive and a ``build-finished`` hook: link to, and copy, the
  asv HTML report ``asv_bench/html`` into ``<outdir>/asv`` when it exists.
"""

from __future__ import annotations

import shutil
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

YES, NO, NA = "✓", "✗", "–"


def library_rows() -> list[list[str]]:
    """One row per array library: its ``xp=`` module, devices, dtypes, compiler, autograd."""
    from relattn.capabilities import LIBRARIES

    return [
        [name, lib.module, ", ".join(lib.devices), " ".join(lib.dtypes),
         lib.compiler or NA, lib.autograd or NA]
        for name, lib in LIBRARIES.items()
    ]  # fmt: skip


def function_rows() -> list[list[str]]:
    """One row per public name, from its declaration in :mod:`relattn.capabilities`."""
    from relattn.capabilities import CAPABILITIES, DTYPE_KINDS, LIBRARIES

    rows = []
    for name, declared in sorted(CAPABILITIES.items(), key=lambda item: item[0].lower()):
        runs_on = [lib for lib in LIBRARIES if lib not in declared.skip_backends]
        notes = sorted(set(declared.skip_backends.values()))
        if declared.grad is False:
            grad = f"{NO} (by design)"
            notes.append(declared.why["grad"])
        else:
            grad = NA if declared.grad is None else YES
        rows.append(
            [
                name,
                "every library" if len(runs_on) == len(LIBRARIES) else ", ".join(runs_on),
                "any" if set(declared.dtypes) == set(DTYPE_KINDS) else ", ".join(declared.dtypes),
                YES if declared.jit else f"{NO} ({declared.why['jit']})",
                grad,
                YES if declared.blockwise else NA,
                YES if declared.ring else NA,
                "; ".join(notes),
            ]
        )
    return rows


def _table(header: list[str], rows: list[list[str]], widths: list[int]) -> nodes.table:
    """A docutils table; the first column's cells are set as code."""
    table = nodes.table(classes=["backend-support"])
    group = nodes.tgroup(cols=len(header))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)

    def row(cells: list[str], code: bool) -> nodes.row:
        out = nodes.row()
        for c, text in enumerate(cells):
            entry = nodes.entry()
            if code and c == 0:
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
    """The libraries, and what every public function supports, from relattn's declarations."""

    def run(self) -> list[nodes.Node]:
        intro = (
            "Generated from relattn.capabilities, the declarations that also decide the "
            "test suite's skips: the suite runs every function on every CPU library (and "
            "on CuPy, PyTorch CUDA and JAX on a GPU where one is present) against NumPy "
            "float64 references, and compiles and differentiates it where the table says so."
        )
        return [
            nodes.paragraph(intro, intro),
            _table(
                ["library", "xp=", "devices", "dtypes", "compiler", "autograd"],
                library_rows(),
                [14, 14, 10, 30, 14, 14],
            ),
            _table(
                ["function", "runs on", "dtypes", "jit", "gradient", "blockwise", "ring", "notes"],
                function_rows(),
                [24, 12, 16, 6, 10, 8, 6, 22],
            ),
        ]


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
