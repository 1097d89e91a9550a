"""The documentation's sources cover the public API and link only to what readers can open.

Building the site takes minutes (it runs the recipes and probes every backend);
these checks read the sources only:

- every name in ``relattn.__all__`` is listed in the API reference's autosummary;
- the API reference lists no name that relattn lacks;
- every recipe page includes an example script that exists, and every figure a
  page asks for is drawn by a function of ``docs/figures/figures.py``;
- the intersphinx inventories of ``docs/intersphinx/`` write ``$`` (the
  object's name) only at the end of an address, where Sphinx expands it;
- the example at the top of the front page runs, and the install section of
  ``getting_started.md`` names every install requirement;
- no page cites internal notes a reader cannot open.

One check reads the built site, ``docs/_build/html``, and is skipped when there is
none (build it with ``python -m sphinx -W --keep-going -b html docs docs/_build/html``):

- no link of the built pages holds a literal ``$``.
"""

from __future__ import annotations

import ast
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

import relattn

DOCS = Path(__file__).resolve().parents[1] / "docs"
API = DOCS / "api" / "index.rst"
BUILT_HTML = DOCS / "_build" / "html"

#: One line of a plain-text inventory (Sphinx's own pattern, ``sphinx.util.inventory``):
#: ``name domain:role priority uri dispname``.
INVENTORY_LINE = re.compile(r"(.+?)\s+(\S+)\s+(-?\d+)\s+?(\S*)\s+(.*)")


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
    assert len([p for p in pages if p.stem != "index"]) == 12
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


# ----------------------------------------------------------------------------------------
# intersphinx addresses
# ----------------------------------------------------------------------------------------


def _inventory_entries() -> list[tuple[str, str, str]]:
    """``(file, name, uri)`` for every object line of ``docs/intersphinx/*.txt``."""
    entries = []
    for path in sorted((DOCS / "intersphinx").glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            match = INVENTORY_LINE.fullmatch(line.rstrip())
            assert match, f"{path.name}: not an inventory line: {line!r}"
            name, _, _, uri, _ = match.groups()
            entries.append((path.name, name, uri))
    return entries


def test_inventory_addresses_abbreviate_the_name_only_at_the_end():
    # Sphinx replaces a trailing "$" by the object's name and leaves any other "$"
    # as is: "generated/$.html#$" would link to ".../generated/$.html#torch.compile".
    entries = _inventory_entries()
    assert {file for file, _, _ in entries} >= {
        "numpy.txt",
        "torch.txt",
        "jax.txt",
        "array-api.txt",
    }
    wrong = [f"{file}: {name} {uri}" for file, name, uri in entries if "$" in uri[:-1]]
    assert not wrong, "write the full address where '$' is not at its end:\n" + "\n".join(wrong)


class _Hrefs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.hrefs.extend(value for key, value in attrs if key == "href" and value)


def test_built_pages_link_to_no_address_with_a_dollar():
    if not (BUILT_HTML / "index.html").exists():
        pytest.skip(f"no built site at {BUILT_HTML} (run the Sphinx build first)")
    wrong = []
    for page in sorted(BUILT_HTML.rglob("*.html")):
        if "_static" in page.relative_to(BUILT_HTML).parts:
            continue
        parser = _Hrefs()
        parser.feed(page.read_text(encoding="utf-8", errors="replace"))
        wrong += [f"{page.relative_to(BUILT_HTML)}: {href}" for href in parser.hrefs if "$" in href]
    assert not wrong, "links with an unexpanded '$':\n" + "\n".join(sorted(set(wrong)))


# ----------------------------------------------------------------------------------------
# front page, install section, citations
# ----------------------------------------------------------------------------------------


def test_front_page_shows_install_and_a_short_example_that_runs():
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    assert "pip install -e ." in text
    cells = re.findall(r"^```\{code-cell\} python\n(.*?)^```", text, flags=re.S | re.M)
    assert len(cells) == 1, "index.md should hold one example cell"
    code = cells[0]
    assert len(code.strip().splitlines()) <= 12, "the front-page example should stay short"
    namespace: dict = {}
    exec(compile(code, str(DOCS / "index.md"), "exec"), namespace)
    out, q, v = namespace["out"], namespace["q"], namespace["v"]
    assert type(out) is type(q)
    assert out.shape == (*q.shape[:-1], v.shape[-1])


def _install_requirements() -> list[str]:
    """Distribution names of ``[project] dependencies`` in ``pyproject.toml``."""
    text = (DOCS.parent / "pyproject.toml").read_text(encoding="utf-8")
    block = re.search(r"^dependencies\s*=\s*\[(.*?)\]", text, flags=re.S | re.M)
    assert block, "pyproject.toml has no [project] dependencies"
    return [
        re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0]
        for req in re.findall(r'"([^"]+)"', block.group(1))
    ]


def test_getting_started_names_every_install_requirement():
    text = (DOCS / "getting_started.md").read_text(encoding="utf-8")
    install = text[text.index("## Install") :]
    install = install[: install.index("\n## ", 1)].lower()
    requirements = _install_requirements()
    assert "array-api-extra" in requirements
    missing = [req for req in requirements if req.lower() not in install]
    assert not missing, f"getting_started.md's Install section does not name {missing}"


def test_pages_cite_no_internal_notes():
    # Readers cannot open the project's seed notes or SPEC: pages cite the papers.
    internal = re.compile(r"(?i:\bseed notes?\b)|\bSPEC\b")
    sources = [
        *DOCS.rglob("*.md"),
        *DOCS.rglob("*.rst"),
        *(DOCS / "figures").rglob("*.py"),
        *(DOCS / "_ext").rglob("*.py"),
    ]
    found = []
    for path in sorted(sources):
        if "_build" in path.relative_to(DOCS).parts:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if internal.search(line):
                found.append(f"{path.relative_to(DOCS)}:{number}: {line.strip()}")
    assert not found, "pages cite internal notes:\n" + "\n".join(found)
