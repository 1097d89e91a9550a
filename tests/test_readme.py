"""The README's quickstart runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_a_quickstart():
    assert python_blocks(), "README.md has no python code block"


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_block_runs(index):
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    exec(compile(python_blocks()[index], f"README.md python block {index}", "exec"), {})


def test_readme_performance_table_is_the_generated_one():
    """README's Performance table is ``asv_bench/compare-results.md`` as compare.py wrote it."""
    generated = (README.parent / "asv_bench" / "compare-results.md").read_text()
    text = README.read_text()
    start, end = "<!-- compare-results: start -->\n", "<!-- compare-results: end -->"
    embedded = text[text.index(start) + len(start) : text.index(end)]
    assert embedded.strip() == generated.strip(), "run: python asv_bench/sync_readme.py"
