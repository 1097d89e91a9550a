"""The documentation's sources cover the public API (no Sphinx build here: see docs/conf.py).

Building the site takes minutes (it runs the recipes and probes every backend);
these checks read the sources only:

- every name in ``relattn.__all__`` is listed in the API reference's autosummary;
- the API reference lists no name that relattn lacks;
- every recipe page includes an example script that exists, and every figure a
  page asks for is drawn by a function of ``docs/figures/figures.py``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import relattn

DOCS = Path(__file__).resolve().parents[1] / "docs"
API = DOCS / "api" / "index.rst"


def _autosummary_names(text: str) -> set[str]:
    """Names listed in the ``.. autosummary::`` blocks of an rst file."""
    names: set[str] = set()
    inside = False
    for line in text.splitlines():
        if line.startswith(".. autosummary::"):
            inside = True
            continue
        if inside:
            stripped = line.strip()
            if not stripped or stripped.startswith(":"):
                continue
            if not line.startswith("   "):
                inside = False
                continue
            names.add(stripped)
    return names


def test_every_public_name_is_in_the_api_reference():
    listed = _autosummary_names(API.read_text(encoding="utf-8"))
    missing = sorted(set(relattn.__all__) - listed)
    assert not missing, f"docs/api/index.rst lacks {missing}"


def test_api_reference_lists_only_public_names():
    listed = _autosummary_names(API.read_text(encoding="utf-8"))
    unknown = sorted(listed - set(relattn.__all__))
    assert not unknown, f"docs/api/index.rst lists names not in relattn.__all__: {unknown}"


def test_recipe_pages_include_existing_examples():
    examples = DOCS.parent / "examples"
    pages = sorted((DOCS / "recipes").glob("*.md"))
    assert len([p for p in pages if p.stem != "index"]) == 7
    for page in pages:
        for name in re.findall(r"\.\./\.\./examples/(\w+)\.py", page.read_text(encoding="utf-8")):
            assert (examples / f"{name}.py").exists(), f"{page.name} includes a missing {name}.py"


def test_every_plotted_figure_exists():
    tree = ast.parse((DOCS / "figures" / "figures.py").read_text(encoding="utf-8"))
    drawn = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    asked = set()
    for page in DOCS.rglob("*.md"):
        if "_build" in page.parts:
            continue
        asked |= set(re.findall(r"\.\. plot:: figures\.py (\w+)", page.read_text(encoding="utf-8")))
    assert asked, "no page draws a figure"
    assert asked <= drawn, f"figures.py lacks {sorted(asked - drawn)}"
