"""Copy ``asv_bench/compare-results.md`` (from ``compare.py --markdown``) into README.md.

The README's Performance section holds the generated table between two
markers; ``tests/test_readme.py`` checks that the two agree. Run from anywhere::

    python asv_bench/compare.py --markdown asv_bench/compare-results.md
    python asv_bench/sync_readme.py
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- compare-results: start -->\n", "<!-- compare-results: end -->"


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    table = (ROOT / "asv_bench" / "compare-results.md").read_text().strip()
    head, rest = text.split(START)
    _, tail = rest.split(END)
    readme.write_text(f"{head}{START}{table}\n{END}{tail}")


if __name__ == "__main__":
    main()
