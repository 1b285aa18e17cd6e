"""Every relative link in README and docs/ reaches a file that exists, and every `#anchor` a
heading in it (GitHub's slugs): a page moved or a heading renamed breaks this, not a reader."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [*sorted(ROOT.glob("*.md")), *sorted((ROOT / "docs").rglob("*.md"))]  # README, SECURITY, CHANGELOG, docs/
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    text = FENCE.sub("", doc.read_text("utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links() -> list[tuple[Path, str]]:
    return [(doc, m.group(1)) for doc in DOCS for m in LINK.finditer(FENCE.sub("", doc.read_text("utf-8")))]


def test_slugs_follow_github() -> None:
    assert slug("Kernel forwarding (`--kernel-forwarding`)") == "kernel-forwarding---kernel-forwarding"
    assert slug("What the Verify step's verdict means") == "what-the-verify-steps-verdict-means"
    assert slug("1. Packet framing") == "1-packet-framing"


def test_every_relative_link_and_anchor_resolves() -> None:
    found = links()
    assert len(found) > 20, "the link pattern found almost nothing: is it still right?"
    broken = []
    for doc, target in found:
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []
