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
from tests.interop._relay_proc import free_udp_port


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


@pytest.mark.parametrize("size", [(80, 24), (60, 20)])
async def test_wizard_prereqs_a_taken_port_is_chosen_again_in_step_2(tmp_path: Path, size: tuple[int, int]) -> None:
    """A port another process holds (here: another relay's socket) warns in step 1 and names the way
    out; Next goes on, and step 2's port field takes another port. It was a dead end: Next refused."""
    d = tmp_path / "deploy"
    d.mkdir()
    squatter = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    squatter.bind(("127.0.0.1", 0))
    port = squatter.getsockname()[1]
    # The deployment contract holds (a Taskfile with both tasks, the real go-task, a cosmicac):
    # the one problem is the port.
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
        async with app.run_test(size=size) as pilot:
            await wait_status(pilot, app, "prereqs", ("ok", "warn"))
            # The PING to a relay that does not run yet fails as expected: no FAILED in the log.
            log = app.screen.query_one(CommandLog).transcript()
            assert "exit 1 (expected: the relay is not running yet)" in log and "FAILED" not in log, log
            rows = {r.result.name: r for r in step(app, "prereqs").query("CheckRow")}
            udp = next(r for name, r in rows.items() if name.startswith("UDP port"))
            assert udp.result.status == "warn" and "already in use" in udp.result.detail and f"{port}" in udp.text
            assert "another port in step 2" in udp.result.fix
            await pilot.press("n")
            await wait_until(pilot, lambda: app.screen.index == 1, "on to step 2")
            # s on the taken port says so before anything starts
            await wait_until(pilot, lambda: "Press s to start it" in status(app, "relay"), "the relay step")
            await pilot.press("s")
            text = await wait_status(pilot, app, "relay", ("error",))
            assert f"UDP port {port} is already in use" in text and "choose another port" in text, text
            # the port field is reached with the keyboard alone (Tab), and takes another port
            field = step(app, "relay").query_one("#relay-port", Input)
            for _ in range(6):
                if field.has_focus:
                    break
                await pilot.press("tab")
            assert field.has_focus
            await pilot.press("ctrl+u", *str(free_udp_port()))
            await pilot.press("escape")
            assert field.value != str(port) and field.value.isdigit()
    finally:
        squatter.close()


async def test_wizard_relay_attach_needs_a_relay_and_key_change_is_warned(tmp_path: Path) -> None:
    d = tmp_path / "deploy"
    d.mkdir()
    (d / ".env").write_text(f"{ENV_VAR}='[\"{OTHER_KEY}\"]'\n")  # the deployment already uses a relay
    new_storage = tmp_path / "new-store"
    resume_at(str(d), "relay", relay_storage=str(tmp_path / "old-store"))
    # nothing binds its port (a free one: another relay on this host may hold the default)
    app = make_app(Settings(deployment=str(d), relay_storage=str(new_storage), relay_port=free_udp_port()))
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


async def test_wizard_relay_start_on_a_taken_port_says_why_before_anything_starts(tmp_path: Path) -> None:
    d = tmp_path / "deploy"
    d.mkdir()
    squatter = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    squatter.bind(("127.0.0.1", 0))
    port = squatter.getsockname()[1]
    storage = tmp_path / "store"
    resume_at(str(d), "relay", relay_storage=str(tmp_path / "old-store"))
    settings = Settings(deployment=str(d), relay_host="127.0.0.1", relay_port=port, relay_metrics="off")
    app = make_app(settings.with_overrides(relay_bootstrap=("127.0.0.1:9",)))
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: "Press s to start it" in status(app, "relay"), "the relay step")
            step(app, "relay").query_one("#relay-storage", Input).value = str(storage)
            step(app, "relay").query_one("#relay-port", Input).value = str(port)
            await pilot.press("s")
            text = await wait_status(pilot, app, "relay", ("error",), timeout=30)
            assert f"UDP port {port} is already in use" in text and "Fix: choose another port" in text, text
            assert not isinstance(app.screen, ConfirmScreen)  # no question about a start that cannot happen
            await pilot.press("n")
            assert app.screen.index == 1
            log = app.screen.query_one("#command-log-text").plain_lines
            assert not any(line.startswith("$ ") and "-m relay --storage" in line for line in log)
    finally:
        squatter.close()
    assert not (storage / "relay-runtime.json").exists()
