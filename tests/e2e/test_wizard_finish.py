"""Finish installs the relay where a hardened systemd unit can run it, and prints that unit.

The unit `blind-relay --systemd-unit` prints hides /home, /root and /tmp, so the relay the wizard
runs from a checkout there could not be its command. Finish offers a virtual environment under
/opt (commands shown and confirmed), runs them, and shows the unit for that executable with the
commands to put it in place; `systemd-analyze verify` accepts the unit.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cosmictui.ops.config import Settings
from cosmictui.ops.setup import install as install_mod
from cosmictui.screens import wizard as wizard_mod
from cosmictui.screens.confirm import ConfirmScreen
from tests.e2e._wizard_support import ENV_VAR, KEY, make_app, make_bin, path_with, resume_at, wait_until


@pytest.fixture
def prefix() -> Iterator[str]:
    """A venv prefix under /opt (outside what the unit's sandbox hides), removed afterwards."""
    p = f"/opt/cosmictui-test-{uuid.uuid4().hex[:8]}"
    yield p
    shutil.rmtree(p, ignore_errors=True)


async def test_finish_installs_under_opt_and_prints_a_unit_systemd_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: str
) -> None:
    assert shutil.which("systemd-analyze"), "systemd-analyze missing: install Debian's systemd (.ci/run does)"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    d = tmp_path / "deploy"
    d.mkdir()
    (d / ".env").write_text(f"{ENV_VAR}='[\"{KEY}\"]'\n")
    bin_dir = make_bin(tmp_path, {"cosmicac": "echo 'ID  STATUS'\n"})
    storage = tmp_path / "relay-storage"  # under /tmp: the unit cannot see it, so the key is copied
    resume_at(str(d), "recover", relay_key=KEY, relay_storage=str(storage), restarted_at=time.time() - 60)
    real_plan = install_mod.install_plan

    def plan(*a: object, **k: object) -> install_mod.InstallPlan:
        # The real plan, but the install runs offline: a venv without pip and this checkout's
        # blind-relay script in it, where `pip install` would put it.
        p = real_plan(*a, **k)  # type: ignore[arg-type]
        script = Path(sys.executable).parent / "blind-relay"
        return dataclasses.replace(
            p, install=[f"{sys.executable} -m venv --without-pip {p.prefix}", f"cp {script} {p.exe}"]
        )

    monkeypatch.setattr(wizard_mod, "install_plan", plan)
    settings = Settings(deployment=str(d), command_env={"PATH": path_with(bin_dir)}, relay_metrics="off")
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        app.screen.install_prefix = prefix  # type: ignore[attr-defined]
        await wait_until(pilot, lambda: app.screen.index == 5, "resumed at step 6")
        await pilot.press("n")
        await wait_until(
            pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen.shown_commands(), "the install offer"
        )
        offer = app.screen
        assert isinstance(offer, ConfirmScreen)
        assert offer.shown_commands()[0].endswith(f"-m venv --without-pip {prefix}")
        assert "/home, /root and /tmp" in offer.body and prefix in offer.body
        await pilot.press("y")
        await wait_until(
            pilot,
            lambda: (
                isinstance(app.screen, ConfirmScreen)
                and app.screen.title_text.startswith("The unit for")
                and bool(app.screen.shown_commands())
            ),  # composed, not only pushed
            "the unit",
            timeout=60,
        )
        shown = app.screen
        assert isinstance(shown, ConfirmScreen)
        commands = shown.shown_commands()
        assert commands[0] == f"install -d -m 0700 /var/lib/blind-relay && cp -a {storage}/. /var/lib/blind-relay/"
        assert commands[-1] == "systemctl daemon-reload && systemctl enable --now blind-relay"
        assert f"ExecStart={prefix}/bin/blind-relay --storage /var/lib/blind-relay" in shown.body
        assert "same key" in shown.body
    units = list((tmp_path / "state").rglob("*.blind-relay.service"))
    assert len(units) == 1
    unit = tmp_path / "blind-relay.service"
    unit.write_text(units[0].read_text())
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120)
    problems = [ln for ln in (res.stdout + res.stderr).splitlines() if "blind-relay.service" in ln]
    assert res.returncode == 0 and not problems, res.stdout + res.stderr
