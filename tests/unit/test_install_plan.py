"""Finish's install plan: a venv under /opt from a Python the unit can see, this project in it, the
unit for that executable, and a storage the unit can see holding the same key."""

from __future__ import annotations

from pathlib import Path

from cosmictui.ops.config import Settings
from cosmictui.ops.setup.install import install_plan, project_source, unit_python
from relay.service.systemd import hidden_by_sandbox


def test_the_plan_makes_a_venv_under_opt_and_installs_this_project() -> None:
    plan = install_plan(Settings(deployment="/srv/x"), "/var/lib/blind-relay", 49737, relay_pid=4242)
    python = unit_python()
    assert hidden_by_sandbox(python) is None  # a venv's python links to it: the unit must see it
    assert plan.install == [
        f"{python} -m venv /opt/blind-relay",
        f"/opt/blind-relay/bin/pip install {project_source()}",
    ]
    assert plan.moved_from is None and plan.storage == "/var/lib/blind-relay"
    assert "ExecStart=/opt/blind-relay/bin/blind-relay --storage /var/lib/blind-relay --port 49737" in plan.unit
    assert plan.enable[-2:] == ["kill 4242", "systemctl daemon-reload && systemctl enable --now blind-relay"]
    assert plan.enable[0].startswith("/opt/blind-relay/bin/blind-relay --systemd-unit --storage /var/lib/blind-relay")


def test_a_storage_the_unit_cannot_see_is_copied_not_made_anew(tmp_path: Path) -> None:
    plan = install_plan(Settings(deployment="/srv/x"), str(tmp_path / "store"), 49737)
    assert plan.moved_from == str(tmp_path / "store") and plan.storage == "/var/lib/blind-relay"
    assert (
        plan.enable[0] == f"install -d -m 0700 /var/lib/blind-relay && cp -a {tmp_path}/store/. /var/lib/blind-relay/"
    )


def test_the_source_is_this_checkout_when_run_from_one() -> None:
    assert (Path(project_source()) / "pyproject.toml").is_file()
