"""The words a screenshot shows, read from its SVG, so a check can tell a stale picture from a fresh
one without comparing pixels.

Textual's SVG (Rich's export) draws each run of text as a `<text>` element clipped to its terminal
row; `rows()` puts them back into lines. `words()` is what is compared: every word on the screen,
counted, after what differs from run to run is made alike (keys, demo paths, pids, clocks, ports,
durations, byte counts and their units, job and stream ids) and the drawing is dropped (borders,
chart dots and bars, scrollbars, and bare numbers such as axis ticks). Counting words instead of
comparing lines keeps a number that wraps a line differently (3120 MB of free memory here, 22646
there) from failing the check, while any word a screen adds, drops or changes still does.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from pathlib import Path

_TEXT = re.compile(
    r'<text class="[^"]*" x="(?P<x>[\d.]+)" y="[\d.]+" textLength="[\d.]+" '
    r'clip-path="url\(#terminal-\d+-line-(?P<row>\d+)\)">(?P<text>[^<]*)</text>'
)

Z32 = "ybndrfg8ejkmcpqxot1uwisza345h769"
#: drawing, not words: box drawing, block elements (bars, borders, scrollbars), braille (plot
#: dots), the plot's dot marker and the ellipsis a cut value ends with
_DRAWING = re.compile("[\u2500-\u259f\u2800-\u28ff•…]+")
_REPLACE = [
    (re.compile(rf"[{Z32}]{{52}}"), "KEY"),  # a relay key
    (re.compile(rf"[{Z32}]{{5,}}…[{Z32}]{{5,}}"), "KEY"),  # a key shortened in the middle
    (re.compile(r"cosmictui-demo-[a-z0-9_]{8}"), "cosmictui-demo-X"),  # the demo's temporary directory
    (re.compile(r"\.env\.bak-\d{8}T\d{6}Z"), ".env.bak-STAMP"),
    (re.compile(r"\bjob-[0-9a-f]{6}\b"), "job-ID"),
    (re.compile(r"\b[0-9a-f]{16}\b"), "HEX"),  # a discovery key in the relay's log
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"), "STAMP"),
    (re.compile(r"\b(?:\d+[dhms])+\b"), "T"),  # 3h12m, 47m, 1m18s
    (re.compile(r"\b\d+(?:[.:,]\d+)*\b"), "N"),  # 01:05:10, 127.0.0.1, 22646, 0.13
    (re.compile(r"\b(?:N ?)?[KMG]?B(?=/s\b|\b)"), "N B"),  # 562 B, 31.8 MB, (KB/s)
]
#: a word cut to fit ("cancell…"): where it is cut depends on the numbers before it, so a word
#: cut in either picture is compared in neither
_CUT = re.compile(r"([^\s…]+)…")
#: a value cut at a word ("relayed bytes · 2 ways …" here, "relayed bytes · 2 …" there): how many of
#: its words show depends on the numbers before them, so the words on a line with such a cut are
#: compared in neither picture when one shows a word the other does not
_CUT_AT_WORD = re.compile(r"(?:^|\s)…")
_BARE = re.compile(r"[-+~]?N(?:%|/s| B| B/s|x|×)?")


def rows(svg: str) -> list[str]:
    """The screen as lines of text (a cell is 12.2 px wide in Textual's export)."""
    cells: dict[int, list[tuple[int, str]]] = {}
    for m in _TEXT.finditer(svg):
        text = html.unescape(m.group("text")).replace("\xa0", " ")
        cells.setdefault(int(m.group("row")), []).append((round(float(m.group("x")) / 12.2), text))
    out = []
    for row in range(max(cells) + 1 if cells else 0):
        line = ""
        for col, text in sorted(cells.get(row, [])):
            line = line.ljust(col) + text
        out.append(line.rstrip())
    return out


def normalise(text: str) -> str:
    for pattern, replacement in _REPLACE:
        text = pattern.sub(replacement, text)
    return text


def words(svg: str) -> tuple[Counter[str], set[str], set[str]]:
    """Every word on the screen, counted, with what changes from run to run made alike; the starts
    of the words cut to fit; and the words on lines whose value is cut at a word."""
    found: Counter[str] = Counter()
    cut: set[str] = set()
    soft: set[str] = set()
    for line in rows(svg):
        line = normalise(line)
        cut.update(m.group(1).strip("()[],;:·") for m in _CUT.finditer(line))
        cut_at_word = bool(_CUT_AT_WORD.search(line))
        for word in _DRAWING.sub(" ", _CUT.sub(" ", line)).split():
            word = word.strip("()[],;:·")
            if word and not _BARE.fullmatch(word):
                found[word] += 1
                if cut_at_word:
                    soft.add(word)
    return found, {c for c in cut if len(c) >= 3}, soft


def differences(committed: Path, fresh: Path) -> list[str]:
    """What `fresh` shows that `committed` does not, and the other way round; [] when alike."""
    (old, old_cut, old_soft), (new, new_cut, new_soft) = (
        words(committed.read_text("utf-8")),
        words(fresh.read_text("utf-8")),
    )
    cut, soft = tuple(old_cut | new_cut), old_soft | new_soft
    gone = Counter({w: n for w, n in (old - new).items() if not w.startswith(cut) and w not in soft})
    added = Counter({w: n for w, n in (new - old).items() if not w.startswith(cut) and w not in soft})
    out = []
    if gone:
        out.append("only in the committed picture: " + " ".join(sorted(gone.elements())))
    if added:
        out.append("only in what the demo shows now: " + " ".join(sorted(added.elements())))
    return out
