"""JSON that docs/headless.md shows as real output is what the commands print today: a field
added to a command (`exit_code` once was) must reach the page too."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from cosmictui import cli

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "headless.md").read_text("utf-8")


def _example_after(heading: str) -> dict[str, object]:
    """The first ```json block after the paragraph that starts with `heading`."""
    start = PAGE.index(heading)
    found = re.compile(r"```json\n(.*?)```", re.S).search(PAGE, start)
    assert found is not None, heading
    return json.loads(found.group(1))


@pytest.fixture(autouse=True)
def _no_operator_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def _run(*argv: str) -> dict[str, object]:
    out = io.StringIO()
    with contextlib.suppress(SystemExit):  # a usage error exits 2 after printing its JSON
        cli.main([*argv], out=out)
    return json.loads(out.getvalue())


def test_the_relay_status_example_is_what_relay_status_prints(tmp_path: Path) -> None:
    shown = _example_after("**`cosmictui relay status --json`**")
    where = str(shown["storage"])
    real = _run("relay", "status", "--json", "--storage", str(tmp_path / "blind-relay"))
    as_shown = json.loads(json.dumps(real).replace(str(tmp_path / "blind-relay"), where))
    assert as_shown == shown


def test_the_error_example_is_what_a_bad_flag_prints() -> None:
    shown = _example_after("**An error**")
    assert _run("check", "--bogus", "--json") == shown
