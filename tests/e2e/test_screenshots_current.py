"""Every screenshot README and docs/ show is what the demo shows today.

`screenshots/make_screenshots.py --check` renders every shot from a fresh demo sandbox (the wizard
driven step by step, the monitor on a demo relay with real Node peers relaying through it) into a
temporary directory and compares the words each picture shows with the committed one; clocks,
keys, paths, pids and numbers are made alike first, charts are not compared
(screenshots/text_layer.py). A screen whose words changed without its picture fails here, and so does a picture in
screenshots/ that the script no longer makes (README and docs link only to files that exist:
tests/unit/test_docs_links.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from screenshots.text_layer import differences, rows, words

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "screenshots"


def test_the_text_layer_tells_a_stale_picture_from_a_fresh_one(tmp_path: Path) -> None:
    """The comparison itself: a changed word is a difference; another key or clock is not."""
    svg = (SHOTS / "wizard-3-env.svg").read_text("utf-8")
    assert any("Configure .env" in line for line in rows(svg))
    assert words(svg)[0]["written"] >= 1
    stale = tmp_path / "stale.svg"
    stale.write_text(svg.replace("(written)", "(new)"), "utf-8")
    assert differences(SHOTS / "wizard-3-env.svg", stale) != []
    moved = tmp_path / "moved.svg"
    monitor = (SHOTS / "monitor-80x24-dark.svg").read_text("utf-8")
    key = re.search(r"Server&#160;listening&#160;on&#160;([a-z0-9]{52})", monitor)
    assert key is not None
    other = monitor.replace(key.group(1), "y" * 52)
    moved.write_text(re.sub(r"\d\d:\d\d:\d\d", "23:59:59", other), "utf-8")
    assert differences(SHOTS / "monitor-80x24-dark.svg", moved) == []


def _svg(*lines: str) -> str:
    """Rows as Textual's export draws them: one `<text>` per row, clipped to it."""
    texts = (
        f'<text class="r1" x="0" y="{20 * i}" textLength="{12.2 * len(t)}" '
        f'clip-path="url(#terminal-1-line-{i})">{t.replace(" ", "&#160;")}</text>'
        for i, t in enumerate(lines)
    )
    return "<svg>" + "".join(texts) + "</svg>"


def test_a_value_cut_at_another_word_is_not_a_stale_picture(tmp_path: Path) -> None:
    """How much of a cut value shows depends on the numbers before it; a word lost elsewhere is
    still a difference."""
    old, new, changed = tmp_path / "old.svg", tmp_path / "new.svg", tmp_path / "changed.svg"
    old.write_text(_svg("path  kernel 100% · Python 0%", "      of relayed bytes · 2 …", "dropped none"), "utf-8")
    new.write_text(_svg("path  kernel 99% · Python 1% of", "      relayed bytes · 2 ways …", "dropped none"), "utf-8")
    changed.write_text(_svg("path  kernel 99% · Python 1% of", "      relayed bytes · 2 ways …", "shed none"), "utf-8")
    assert differences(old, new) == []
    assert differences(old, changed) != []


@pytest.mark.interop
def test_every_screenshot_shows_what_the_demo_shows_now() -> None:
    res = subprocess.run(
        [sys.executable, str(SHOTS / "make_screenshots.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert res.returncode == 0, f"{res.stdout[-4000:]}\n{res.stderr[-3000:]}"
