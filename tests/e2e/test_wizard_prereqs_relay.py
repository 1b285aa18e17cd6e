"""Pilot tests for step 1 (prerequisites) and step 2 (relay) failure paths."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from textual.widgets import Input

from cosmictui.ops.config import Settings
from cosmictui.screens.confirm import ConfirmScreen
from cosmictui.widgets.command_log import CommandLog
from tests.e2e._wizard_support import (
    ENV_VAR,
    OTHER_KEY,
    make_app,
    make_bin,
    path_with,
    resume_at,
    status,
    step,
    wait_status,
    wait_until,
)
from tests.e2e.test_wizard_contract import TASK_BIN, TASKFILE


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


async def test_wizard_prereqs_port_taken_fails_with_fix_and_rerun_passes(tmp_path: Path) -> None:
    d = tmp_path / "deploy"
    d.mkdir()
    squatter = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    squatter.bind(("127.0.0.1", 0))
    port = squatter.getsockname()[1]
    # The deployment contract holds (a Taskfile with both tasks, the real go-task, a cosmicac):
    # the one failure is the port.
    (d / "Taskfile.yml").write_text(TASKFILE)
    tools = make_bin(tmp_path / "tools", {"cosmicac": "echo 'ID  STATUS'\n"})
    (tools / "task").symlink_to(TASK_BIN)
    settings = Settings(
        deployment=str(d),
        relay_storage=str(tmp_path / "store"),
        relay_port=port,
        relay_host="127.0.0.1",
        command_env={"PATH": path_with(tools)},
    )
    app = make_app(settings)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            text = await wait_status(pilot, app, "prereqs", ("error",))
            assert "1 check(s) failed" in text
            # The PING to a relay that does not run yet fails as expected: no FAILED in the log.
            log = app.screen.query_one(CommandLog).transcript()
            assert "exit 1 (expected: the relay is not running yet)" in log and "FAILED" not in log, log
            rows = {r.result.name: r for r in step(app, "prereqs").query("CheckRow")}
            udp = next(r for name, r in rows.items() if name.startswith("UDP port"))
            assert udp.result.status == "fail" and udp.result.fix and f"{port}" in udp.text
            await pilot.press("n")
            assert app.screen.index == 0 and "Fix the failed checks first: UDP port" in status(app, "prereqs")
            squatter.close()  # the operator frees the port and checks again
            await pilot.press("r")
            await wait_status(pilot, app, "prereqs", ("ok", "warn"))
            await pilot.press("n")
            assert app.screen.index == 1
    finally:
        squatter.close()


async def test_wizard_relay_attach_needs_a_relay_and_key_change_is_warned(tmp_path: Path) -> None:
    d = tmp_path / "deploy"
    d.mkdir()
    (d / ".env").write_text(f"{ENV_VAR}='[\"{OTHER_KEY}\"]'\n")  # the deployment already uses a relay
    new_storage = tmp_path / "new-store"
    resume_at(str(d), "relay", relay_storage=str(tmp_path / "old-store"))
    app = make_app(Settings(deployment=str(d), relay_storage=str(new_storage)))  # nothing binds its port
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: "Press s to start it" in status(app, "relay"), "the relay step")
        storage_input = step(app, "relay").query_one("#relay-storage", Input)
        assert storage_input.value == str(tmp_path / "old-store")  # remembered from last time
        storage_input.value = str(new_storage)  # the operator types another directory
        await pilot.pause()
        await pilot.press("c")
        assert "No key yet" in status(app, "relay") and app.clipboard == ""
        await pilot.press("a")
        text = await wait_status(pilot, app, "relay", ("error",))
        assert f"No relay is running with storage {new_storage}" in text
        await pilot.press("s")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the key-change warning")
        modal = app.screen
        assert modal.has_class("-danger") and modal.query_one("#confirm-no").has_focus  # a stray Enter is safe
        body = str(modal.query_one("#confirm-body").render())
        assert "NEW key" in body and "not in the .env" in body
        await pilot.press("enter")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), "the warning to close")
        assert "relay key is unchanged" in status(app, "relay")
        await pilot.press("n")
        assert app.screen.index == 1
    assert not new_storage.exists() or not any(new_storage.iterdir())  # nothing started, no key made


async def test_wizard_relay_start_failure_shows_why_and_how_to_fix(tmp_path: Path) -> None:
    d = tmp_path / "deploy"
    d.mkdir()
    squatter = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    squatter.bind(("127.0.0.1", 0))
    port = squatter.getsockname()[1]
    storage = tmp_path / "store"
    resume_at(str(d), "relay", relay_storage=str(tmp_path / "old-store"))  # so a warning always comes first
    settings = Settings(deployment=str(d), relay_host="127.0.0.1", relay_port=port, relay_metrics="off")
    app = make_app(settings.with_overrides(relay_bootstrap=("127.0.0.1:9",)))
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: "Press s to start it" in status(app, "relay"), "the relay step")
            step(app, "relay").query_one("#relay-storage", Input).value = str(storage)
            step(app, "relay").query_one("#relay-port", Input).value = str(port)
            await pilot.press("s")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the key-change warning")
            await pilot.press("y")
            text = await wait_status(pilot, app, "relay", ("error",), timeout=30)
            assert "The relay did not start" in text and f"UDP port {port} on 127.0.0.1 is already in use" in text
            assert "Fix: the UDP port is taken" in text
            await pilot.press("n")
            assert app.screen.index == 1
            log = app.screen.query_one("#command-log-text").plain_lines
            assert any(line.startswith("$ ") and "-m relay --storage" in line for line in log)
    finally:
        squatter.close()
    assert not (storage / "relay-runtime.json").exists()
