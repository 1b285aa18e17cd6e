"""The pages read as reference, not as a lab notebook: no table cell too long to read in a row
(the detail goes below the table), and a commit hash only where a table says which code it
measured, once, on the table's own `Run:` line (and in its command, the `--baseline` it ran beside)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted(ROOT.glob("*.md")), *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
MAX_CELL = 300
#: 7 to 40 hex digits with a digit and a letter: a commit as people cite one
HASH = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


def _text(page: Path) -> str:
    return FENCE.sub("", page.read_text("utf-8"))


def test_no_table_cell_is_longer_than_a_row_can_hold() -> None:
    long = []
    for page in PAGES:
        for n, line in enumerate(_text(page).splitlines(), 1):
            if line.startswith("|"):
                for cell in re.split(r"(?<!\\)\|", line)[1:-1]:
                    if len(cell.strip()) > MAX_CELL:
                        long.append(f"{page.relative_to(ROOT)}:{n}: {len(cell.strip())} characters")
    assert long == []


def test_a_commit_hash_appears_only_on_a_tables_run_line() -> None:
    stray = []
    for page in PAGES:
        lines = _text(page).splitlines()
        for n, line in enumerate(lines):
            # the revision a `--baseline REV` command ran beside the one measured is part of the command
            found = HASH.findall(re.sub(r"--baseline [0-9a-f]{7,40}\b", "--baseline REV", line))
            if not found:
                continue
            following = next((x for x in lines[n + 1 :] if x.strip()), "")
            if not (line.startswith("Run: ") and len(found) == 1 and following.startswith("|")):
                stray.append(f"{page.relative_to(ROOT)}:{n + 1}: {found}")
    assert stray == []


def test_the_hash_rule_knows_a_hash_from_a_word() -> None:
    assert HASH.findall("code at 70ec2d3, key 4j6xbc7b, the word deadbeef or 1234567 alone") == ["70ec2d3"]
