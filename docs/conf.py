"""Sphinx configuration of relattn's documentation.

Build (warnings are errors)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

# The backend table probes float64 on JAX; JAX reads this when it is first imported.
os.environ.setdefault("JAX_ENABLE_X64", "1")
# autodoc imports relattn.keras: Keras's JAX backend (its default, TensorFlow, is absent).
os.environ.setdefault("KERAS_BACKEND", "jax")

import relattn_docs  # noqa: E402

import relattn  # noqa: E402

project = "relattn"
author = "relattn developers"
copyright = "relattn developers"
release = version = relattn.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "numpydoc",
    "matplotlib.sphinxext.plot_directive",
    "myst_nb",  # MyST Markdown pages and executed text notebooks (loads myst_parser)
    "relattn_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb"}
root_doc = "index"
exclude_patterns = ["_build", "figures", "intersphinx", "**/README.md"]
templates_path = ["_templates"]

# -- MyST and myst-nb --------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = "force"  # every recipe runs on every build
nb_execution_raise_on_error = True  # a failing recipe fails the build
nb_execution_timeout = 300
nb_execution_show_tb = True
nb_merge_streams = True

# -- API reference -----------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = True
autodoc_typehints = "none"  # the numpydoc sections carry the types
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
# Every public docstring is checked; these checks are relaxed on purpose:
#   GL08 (no docstring) cannot fire for public names, SA01 (See Also) and ES01
#   (extended summary) are optional for small functions, RT02 (return name) is
#   numpydoc's "name : type" form, which relattn replaces by "array of shape ...".
numpydoc_validation_checks = {"all", "SA01", "ES01", "RT02"}
# Two numpydoc false positives, silenced for the matching docstrings only:
#   SS05 ("summary must start with an infinitive verb") fires on any first word
#   ending in "s", here possessives such as "DiSAN's", "Luong's", "T5's",
#   "ALiBi's" and "DeBERTa-v2's";
#   PR06 ("use int instead of integer") fires on the dtype kind in "integer dtype"
#   and "integer or real floating", which name array dtypes, not Python types.
numpydoc_validation_overrides = {
    "SS05": [r"\A\s*[\w.-]+'s "],
    "PR06": [r"integer dtype", r"integer or real floating", r"0-d integer array"],
}

# -- intersphinx: inventories written from docs/intersphinx/*.txt -----------------------
# The build machines reach no documentation site, so each inventory is kept as
# plain text (the names these pages and docstrings refer to, with their real
# URLs) and compressed here; see docs/intersphinx/README.md.
_INVENTORIES = relattn_docs.write_inventories(DOCS / "intersphinx", DOCS / "_build" / "inventories")
intersphinx_mapping = {
    "numpy": ("https://numpy.org/doc/stable/", str(_INVENTORIES["numpy"])),
    "torch": ("https://docs.pytorch.org/docs/stable/", str(_INVENTORIES["torch"])),
    "jax": ("https://docs.jax.dev/en/latest/", str(_INVENTORIES["jax"])),
    "array-api": ("https://data-apis.org/array-api/latest/", str(_INVENTORIES["array-api"])),
}

# -- plots -------------------------------------------------------------------------------
plot_basedir = str(DOCS / "figures")
plot_working_directory = str(DOCS / "figures")
plot_formats = [("png", 110)]
plot_html_show_formats = False
plot_html_show_source_link = False
plot_include_source = False
plot_rcparams = {"font.size": 10}

# -- HTML --------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"relattn {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "primary_sidebar_end": [],
}
# No primary (left) sidebar: the toctree sits in the top navbar, and the empty
# "Section Navigation" column would squeeze the wide tables and code blocks.
html_sidebars: dict[str, list[str]] = {"**": []}
html_static_path = ["_static"]
html_css_files = ["relattn.css"]
mathjax3_config = {"tex": {"macros": {"T": "{\\top}"}}}
