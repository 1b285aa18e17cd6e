"""`cosmictui export prometheus|grafana`: prints the pack, installs it without losing an operator's edits."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from cosmictui.cli import main

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        code = main(list(argv), out)
    except SystemExit as e:
        code = int(e.code or 0)
    return code, out.getvalue()


def test_prints_the_shipped_rules_and_dashboard() -> None:
    assert run("export", "prometheus") == (0, (DEPLOY / "prometheus" / "blind-relay.rules.yml").read_text())
    code, text = run("export", "grafana")
    assert code == 0 and json.loads(text)["uid"] == "blind-relay"
    assert (
        run("export", "prometheus", "--file", "prometheus.yml")[1] == (DEPLOY / "prometheus/prometheus.yml").read_text()
    )


def test_install_writes_then_keeps_an_edited_file_unless_forced(tmp_path: Path) -> None:
    target = tmp_path / "rules"
    code, text = run("export", "prometheus", "--install", str(target))
    assert code == 0 and text.count("wrote ") == 3
    for f in (DEPLOY / "prometheus").iterdir():
        assert (target / f.name).read_text() == f.read_text()
    (target / "prometheus.yml").write_text("# mine\n")
    code, text = run("export", "prometheus", "--install", str(target))
    assert code == 0 and "kept" in text and "--force" in text and text.count("unchanged ") == 2
    assert (target / "prometheus.yml").read_text() == "# mine\n"  # the operator's edit is not lost
    code, text = run("export", "prometheus", "--install", str(target), "--force", "--json")
    doc = json.loads(text)
    assert code == 0 and doc["written"] == ["prometheus.yml"] and doc["kept"] == []
    assert (target / "prometheus.yml").read_text() == (DEPLOY / "prometheus/prometheus.yml").read_text()


@pytest.mark.parametrize(
    ("argv", "fix"),
    [
        (["export", "prometheus", "--file", "nope.yml"], "--file blind-relay.rules.yml"),
        (["export", "grafana", "--force"], "--install DIR"),
    ],
)
def test_bad_input_exits_2_with_a_fix(argv: list[str], fix: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(*argv)[0] == 2
    assert fix in capsys.readouterr().err


def test_install_onto_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    assert run("export", "grafana", "--install", str(f))[0] == 2
    assert "not a directory" in capsys.readouterr().err and f.read_text() == "x"
