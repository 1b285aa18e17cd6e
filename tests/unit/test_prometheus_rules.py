"""deploy/prometheus: the rules pass `promtool check rules` and `promtool test rules`, every alert
has a unit test and runbook text, and the unit tests bite (a weakened rule fails them)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

PACK = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = PACK / "blind-relay.rules.yml"
TESTS = PACK / "blind-relay.rules.test.yml"


@pytest.fixture(scope="module")
def promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is missing: `apt-get install prometheus` (.ci/run installs it)")
    return exe


def run(promtool: str, *args: str, cwd: Path = PACK) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def alerts(text: str) -> list[str]:
    return re.findall(r"^\s+- alert: (\w+)$", text, re.M)


def test_rules_check_and_unit_tests_pass(promtool: str) -> None:
    r = run(promtool, "check", "rules", RULES.name)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    r = run(promtool, "test", "rules", TESTS.name)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_every_alert_has_a_unit_test_and_a_runbook() -> None:
    text = RULES.read_text()
    names = alerts(text)
    assert len(names) >= 7
    tested = set(re.findall(r"alertname: (\w+)", TESTS.read_text()))
    assert set(names) <= tested, set(names) - tested
    for name in names:
        block = text.split(f"- alert: {name}\n", 1)[1].split("- alert:", 1)[0]
        for key in ("summary:", "description:", "runbook:", "severity:"):
            assert key in block, (name, key)


def test_a_weakened_rule_fails_its_unit_test(promtool: str, tmp_path: Path) -> None:
    """The tests pin behaviour: the relay-down alert waiting 10 minutes instead of 2 is caught."""
    weak = RULES.read_text().replace(
        'up{job=~"blind-relay|blind-relay-dht"} == 0\n        for: 2m',
        'up{job=~"blind-relay|blind-relay-dht"} == 0\n        for: 10m',
    )
    assert weak != RULES.read_text()
    (tmp_path / RULES.name).write_text(weak)
    shutil.copy(TESTS, tmp_path / TESTS.name)
    r = run(promtool, "test", "rules", TESTS.name, cwd=tmp_path)
    assert r.returncode != 0 and "BlindRelayDown" in r.stdout + r.stderr


def test_example_config_is_valid(promtool: str, tmp_path: Path) -> None:
    for f in ("prometheus.yml", RULES.name):
        shutil.copy(PACK / f, tmp_path / f)
    (tmp_path / "targets.json").write_text("[]")
    r = run(promtool, "check", "config", "prometheus.yml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
