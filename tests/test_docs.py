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
  ``getting_started.md`` names every install requirement and tells CPU-only
  Linux users to install torch from the PyTorch CPU index first;
- every ``python`` block of the guide runs on NumPy, PyTorch and JAX arrays
  (given the arrays its page describes) and returns arrays of the same library;
- ``names.md`` is in the toctree and lists every attention function;
- no page cites internal notes a reader cannot open.

One check reads the built site (build it with ``python -m sphinx -W --keep-going -b
html docs docs/_build/html``):

- no link of the built pages holds a literal ``$``.

It reads the site that ``RELATTN_DOCS_BUILT`` names (a path, relative to the repository
root or absolute) and fails where that site is missing: ``.ci/run`` sets it for a second
run of this file after its Sphinx build, so that CI checks the site it built. Without the
variable it reads ``docs/_build/html`` where one is built, and skips otherwise (the test
run before any build, CI's included).
"""

from __future__ import annotations

import ast
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import array_api_compat
import numpy as np
import pytest

import relattn

DOCS = Path(__file__).resolve().parents[1] / "docs"
API = DOCS / "api" / "index.rst"
BUILT_HTML = DOCS / "_build" / "html"
#: The environment variable naming a built site that must be there (see the docstring).
BUILT_SITE_VARIABLE = "RELATTN_DOCS_BUILT"

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
    assert len([p for p in pages if p.stem != "index"]) == 16
    for page in pages:
        for name in re.findall(r"\.\./\.\./examples/(\w+)\.py", page.read_text(encoding="utf-8")):
            assert (examples / f"{name}.py").exists(), f"{page.name} includes a missing {name}.py"


def test_every_plotted_figure_exists():
    """Each ``.. plot:: <file>.py <function>`` names a function of that figures file."""
    drawn = {}
    for path in (DOCS / "figures").glob("*figures.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        drawn[path.name] = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    asked = set()
    for page in DOCS.rglob("*.md"):
        if "_build" in page.parts:
            continue
        asked |= set(re.findall(r"\.\. plot:: (\w+\.py) (\w+)", page.read_text(encoding="utf-8")))
    assert asked, "no page draws a figure"
    missing = sorted(f"{file} {name}" for file, name in asked if name not in drawn.get(file, ()))
    assert not missing, f"figures files lack {missing}"


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


def built_site() -> Path:
    """The built site to check: the one ``RELATTN_DOCS_BUILT`` names, which must exist (the
    test fails where it does not), else ``docs/_build/html`` where built (skips if not)."""
    named = os.environ.get(BUILT_SITE_VARIABLE, "")
    if not named:
        if not (BUILT_HTML / "index.html").exists():
            pytest.skip(
                f"no built site at {BUILT_HTML} (run the Sphinx build first) and "
                f"{BUILT_SITE_VARIABLE} unset"
            )
        return BUILT_HTML
    site = DOCS.parent / named  # an absolute path stays as it is
    if not (site / "index.html").is_file():
        pytest.fail(f"{BUILT_SITE_VARIABLE}={named}: no built site there ({site / 'index.html'})")
    return site


def test_built_pages_link_to_no_address_with_a_dollar():
    site = built_site()
    wrong, pages, links = [], 0, 0
    for page in sorted(site.rglob("*.html")):
        if "_static" in page.relative_to(site).parts:
            continue
        parser = _Hrefs()
        parser.feed(page.read_text(encoding="utf-8", errors="replace"))
        pages, links = pages + 1, links + len(parser.hrefs)
        wrong += [f"{page.relative_to(site)}: {href}" for href in parser.hrefs if "$" in href]
    assert pages > 1 and links > 0, f"{site}: {pages} pages and {links} links: not a built site"
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


def test_getting_started_tells_cpu_linux_users_where_torch_comes_from():
    """The constraints file pins torch's version, not its build (PyPI's Linux wheel is CUDA's)."""
    text = (DOCS / "getting_started.md").read_text(encoding="utf-8")
    install = " ".join(
        text[text.index("## Install") : text.index("\n## ", text.index("## Install") + 1)].split()
    )
    assert "https://download.pytorch.org/whl/cpu" in install
    assert "pulls the CUDA build" not in install and "pins the CPU build" not in install
    assert "version only" in install


# ----------------------------------------------------------------------------------------
# the guide's code runs on every library
# ----------------------------------------------------------------------------------------

#: NumPy arrays each guide page's ``python`` block is written for, as its text names them.
GUIDE_INPUTS = {
    "multimodal_rope": """
IMAGE, VIDEO, B, H, d = 9, 10, 2, 2, 16
input_ids = np.array([[1, 2, 8] + [IMAGE] * 6 + [8, 3, 4]] * B)  # text, a 4x6-patch image, text
grid_thw = np.array([[1, 4, 6]] * B)
mask = np.ones_like(input_ids)
L = input_ids.shape[1]
q, k, v = rng.normal(size=(3, B, H, L, d))
q_next = rng.normal(size=(B, H, 1, d))
""",
    "decomposed": """
B, H, d = 2, 2, 8
q, k, v = rng.normal(size=(3, B, H, 14 * 14, d))
k_pooled, v_pooled = rng.normal(size=(2, B, H, 7 * 7, d))
rel_pos_h, rel_pos_w = rng.normal(size=(2, 27, d))
""",
    "alibi": """
B, H, Lq, Lk, d = 2, 4, 3, 7, 8  # 3 new queries after a cache of 4
q = rng.normal(size=(B, H, Lq, d))
k, v = rng.normal(size=(2, B, H, Lk, d))
""",
    "conformer_xlnet": """
Lq, Lk, d_model = 5, 9, 16
w_r = rng.normal(size=(d_model, d_model))
""",
    "deberta": """
B, H, L, d, max_position = 2, 2, 12, 4, 16
P = rng.normal(size=(8, H * d))  # 2k rows, k = 4
W_k, W_q = rng.normal(size=(2, H * d, H * d))
b_k, b_q = rng.normal(size=(2, H * d))
q, k, v = rng.normal(size=(3, B, H, L, d))
mask = np.arange(L) < np.array([L, L - 3])[:, None, None, None]  # padding: (B, 1, 1, L)
""",
    "positions": """
B, H, Lmax, d = 2, 4, 16, 8
q = rng.normal(size=(B, H, 1, d))  # one decode step
k, v = rng.normal(size=(2, B, H, Lmax, d))  # the cache; unfilled slots hold NaN
filled = np.array([9, 12])
k[0, :, 9:] = v[0, :, 9:] = k[1, :, 12:] = v[1, :, 12:] = np.nan
table = rng.normal(size=(Lmax, d))
q_packed, k_packed, v_packed = rng.normal(size=(3, 1, H, 7, d))
""",
    "relative_sinusoid": """
Lq, Lk, d = 4, 6, 8
""",
    "rope": """
B, H, offset, Lq, d = 2, 2, 5, 3, 8
q, k = rng.normal(size=(2, B, H, Lq, d))
cached_k = rng.normal(size=(B, H, offset, d))
v = rng.normal(size=(B, H, offset + Lq, d))
""",
    "t5": """
B, H, Lq, Lk, is_encoder = 2, 4, 3, 7, False  # a decoder with a cache of 4
table = rng.normal(size=(32, H))
q = rng.normal(size=(B, H, Lq, 8))
k, v = rng.normal(size=(2, B, H, Lk, 8))
""",
    "tener": """
B, H, L, d_head = 2, 2, 6, 8
q, k, v = rng.normal(size=(3, B, H, L, d_head))
u, w = rng.normal(size=(2, H, 1, d_head))
""",
    "tener_released": """
B, H, L, d_head, s = 2, 2, 6, 8, 1.0
q, k, v = rng.normal(size=(3, B, H, L, d_head))
u, v_bias = rng.normal(size=(2, H, d_head))
mask = np.arange(L) < np.array([L, L - 2])[:, None, None, None]
""",
}
#: Guide pages whose ``python`` block is shown, not run here, and why.
GUIDE_NOT_RUN = {
    "devices": "a torch.distributed process group over CUDA devices",
    "huggingface": "a transformers model: tests/test_huggingface.py runs the same calls",
    "huggingface_patch": "transformers models: tests/test_hf_alibi.py and "
    "tests/test_hf_deberta_sam.py run the same calls",
}


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_every_guide_snippet_has_its_inputs():
    pages = {page.stem for page in (DOCS / "guide").glob("*.md") if _python_blocks(page)}
    assert pages == set(GUIDE_INPUTS) | set(GUIDE_NOT_RUN)


def _library_arrays(library: str):
    """``to(a)``: a NumPy array as an array of ``library``; skips where it is not installed."""
    if library == "numpy":
        return lambda a: a
    if library == "torch":
        torch = pytest.importorskip("torch")
        return torch.asarray
    jnp = pytest.importorskip("jax.numpy")
    return jnp.asarray


@pytest.mark.parametrize("library", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("page", sorted(GUIDE_INPUTS))
def test_guide_snippets_run_on_every_library(page, library):
    """Each block runs as written: ``xp`` is the namespace of its inputs, never assumed."""
    to = _library_arrays(library)
    namespace: dict = {"rng": np.random.default_rng(0), "np": np}
    exec(GUIDE_INPUTS[page], namespace)
    inputs = {n: to(a) for n, a in namespace.items() if isinstance(a, np.ndarray)}
    namespace = {**namespace, **inputs, "relattn": relattn}
    del namespace["rng"], namespace["np"]
    (block,) = _python_blocks(DOCS / "guide" / f"{page}.md")
    exec(compile(block, f"docs/guide/{page}.md", "exec"), namespace)
    results = {n: a for n, a in namespace.items() if array_api_compat.is_array_api_obj(a)}
    expected = {type(a) for a in inputs.values()} or {np.ndarray}
    assert {n: type(a) for n, a in results.items() if type(a) not in expected} == {}
    if "out" in results:
        assert results["out"].shape == (*inputs["q"].shape[:-1], inputs["v"].shape[-1])


# ----------------------------------------------------------------------------------------
# the names table
# ----------------------------------------------------------------------------------------

ATTENTION_FUNCTIONS = (
    "scaled_dot_product_attention",
    "relative_attention",
    "shaw_attention",
    "disentangled_attention",
    "attention_block",
    "ring_attention",
)

#: The names ``names.md`` must give, one per concept.
NAMES = (
    "position_table",
    "query_position_table",
    "value_table",
    "key_embeddings",
    "value_embeddings",
    "relative_bias",
    "relative_bias_matrix",
    "content_bias",
    "position_bias",
)


def test_names_page_is_linked_and_covers_every_attention_function():
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    toctree = index[index.index("```{toctree}") :]
    assert "\nnames\n" in toctree
    names = (DOCS / "names.md").read_text(encoding="utf-8")
    for function in ATTENTION_FUNCTIONS:
        assert re.search(rf"`(relattn\.)?{function}`", names), function
    for name in NAMES:
        assert f"`{name}`" in names, name


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
