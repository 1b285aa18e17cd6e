"""Every figure README quotes against the Node relay comes from docs/benchmarks.md, and each row of
README's table from one table there (one run): a re-measured benchmark that updates one page and
not the other, or a row stitched from two runs, fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text("utf-8")
BENCH = (ROOT / "docs" / "benchmarks.md").read_text("utf-8")
SECTION = "## Against the Node relay"
#: a figure: digits, thousands commas, one decimal part; not part of a longer number or a word
NUMBER = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w]|[.,]\d)|(?<![\w.,])\d+(?:\.\d+)?(?![\w]|[.,]\d)")
CODE = re.compile(r"`[^`]*`|\]\([^)]*\)")


def figures(text: str) -> list[str]:
    return NUMBER.findall(CODE.sub(" ", text))


def section() -> str:
    start = README.index(SECTION)
    end = README.find("\n## ", start + len(SECTION))
    return README[start : end if end != -1 else None]


def tables(text: str) -> list[list[str]]:
    """Each table's rows (lines starting with '|'), delimiter rows left out."""
    found: list[list[str]] = []
    rows: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            if not re.fullmatch(r"\|[-:| ]+\|", line):
                rows.append(line)
        elif rows:
            found.append(rows)
            rows = []
    return found


def test_the_number_pattern_reads_figures_as_written() -> None:
    assert figures("11.4 and 4,000 (3,998), 1.05–1.52×, ~0; 2-core") == [
        "11.4",
        "4,000",
        "3,998",
        "1.05",
        "1.52",
        "0",
        "2",
    ]
    assert figures("`--pairs 4000` [x](a1.md) 164.8 (165.1)") == ["164.8", "165.1"]
    assert "165" not in figures("165.1") and "1.1" not in figures("1.10")


def test_every_figure_readme_quotes_is_in_the_benchmarks_page() -> None:
    quoted = figures(section())
    assert len(quoted) > 20, "the README section quotes almost nothing: is the section still there?"
    known = set(figures(BENCH))
    assert sorted(set(quoted) - known, key=quoted.index) == []


def test_each_row_of_readme_table_comes_from_one_table_of_the_benchmarks_page() -> None:
    (readme_table,) = tables(section())
    bench_tables = [set(figures("\n".join(t))) for t in tables(BENCH)]
    assert len(bench_tables) > 10
    stitched = []
    for row in readme_table[1:]:
        values = [v for cell in row.strip("|").split("|")[1:] for v in figures(cell)]
        assert values, row
        if not any(set(values) <= t for t in bench_tables):
            stitched.append(row)
    assert stitched == [], "rows whose figures no single table of docs/benchmarks.md holds"
