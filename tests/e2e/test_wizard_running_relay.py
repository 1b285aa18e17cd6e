"""No dead end with a relay already running with other flags: step 1 names it (pid, flags) as not
joined instead of blaming this host's network, and step 2 restarts it with the wizard's settings
after a confirm, on the same storage and so with the same key.

The relay is a real `python -m relay` process; the DHT around it is not needed for what is tested
(its flags, its pid, its key), so the checks that need a DHT are stood in for.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from cosmictui.ops import relayproc
from cosmictui.ops.config import Settings
from cosmictui.ops.metrics import probe as probe_mod
from cosmictui.ops.metrics.probe import ProbeResult
from cosmictui.ops.setup import relayup
from cosmictui.ops.setup.checks import CheckResult
from cosmictui.screens import step_prereqs, step_relay
from cosmictui.screens.confirm import ConfirmScreen
from tests.e2e._wizard_support import at_the_other_size, make_app, resume_at, status, step, wait_status, wait_until


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[Path]:
    s = tmp_path / "relay-storage"
    yield s
    rt = relayproc.attach(str(s))
    if rt is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rt.pid, signal.SIGKILL)


@pytest.mark.parametrize("size", [(60, 20)])
async def test_a_relay_with_other_flags_is_named_and_restarted_with_the_same_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, storage: Path, size: tuple[int, int]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    # Started by hand earlier, with another bootstrap than the wizard's: it runs, but is not joined.
    old = await relayproc.start_relay(str(storage), 0, "127.0.0.1", ("127.0.0.1:9",), None)

    async def checks(*_a: object, **_k: object) -> list[CheckResult]:
        return [
            CheckResult("DHT reachable, port open", "fail", "not bootstrapped: the relay has not reached the DHT", "x"),
            CheckResult("Bootstrap node answers", "ok", "1 of 1 answered (127.0.0.1:10)"),
        ]

    async def reach(*_a: object, **_k: object) -> list[CheckResult]:
        return [CheckResult("Relay answers from localhost", "ok", "answered a PING")]

    async def probe(key: str, *_a: object, **_k: object) -> ProbeResult:
        return ProbeResult(relay_key=key, ok=True, relayed=True, relay_address="127.0.0.1", rtt_ms=1.0)

    monkeypatch.setattr(step_prereqs, "gather_checks", checks)
    monkeypatch.setattr(relayup, "relay_reach_checks", reach)
    monkeypatch.setattr(probe_mod, "run_probe", probe)
    monkeypatch.setattr(step_relay.relayproc, "running_relays", lambda: [])
    d = tmp_path / "deploy"
    d.mkdir()
    resume_at(str(d), "prereqs", relay_storage=str(storage))
    settings = Settings(
        deployment=str(d),
        relay_storage=str(storage),
        relay_port=old.port,
        relay_host="127.0.0.1",
        relay_bootstrap=("127.0.0.1:10",),
        relay_metrics="off",
        relay_kernel_forwarding=False,
    )
    app = make_app(settings)
    async with app.run_test(size=size) as pilot:
        text = await wait_status(pilot, app, "prereqs", ("ok", "warn", "error"), timeout=30)
        assert "All prerequisites met" in text  # not a dead end: this host reaches the DHT
        dht = next(r for r in step(app, "prereqs").query("CheckRow") if r.result.name.startswith("DHT"))
        assert dht.result.status == "warn"
        assert f"pid {old.pid}" in dht.result.detail and "--bootstrap 127.0.0.1:9" in dht.result.detail
        assert "not joined" in dht.result.detail and "restart it with the wizard's settings" in dht.result.fix
        await pilot.press("n")
        await wait_until(pilot, lambda: "other flags" in status(app, "relay"), "step 2 names the relay")
        assert f"pid {old.pid}" in status(app, "relay") and "same key" in status(app, "relay")
        await at_the_other_size(pilot, app, size, "relay")
        await pilot.press("s")
        await wait_until(
            pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen.shown_commands(), "the restart question"
        )
        dialog = app.screen
        assert isinstance(dialog, ConfirmScreen)
        assert dialog.shown_commands()[0] == f"kill {old.pid}"
        assert "--bootstrap 127.0.0.1:10" in dialog.shown_commands()[1] and "same key" in dialog.body
        await pilot.press("y")
        text = await wait_status(pilot, app, "relay", ("ok",), timeout=60)
        new = relayproc.attach(str(storage))
        assert new is not None and new.pid != old.pid and new.key == old.key  # same storage, same key
        assert not relayproc.pid_alive(old.pid)
        assert "Restarted the relay" in text
        await pilot.press("s")  # again: it runs with the wizard's settings now, nothing to start
        await wait_until(pilot, lambda: "Already running" in status(app, "relay"), "already running")
        text = await wait_status(pilot, app, "relay", ("ok",), timeout=60)
        assert "Started" not in text and relayproc.attach(str(storage)).pid == new.pid  # type: ignore[union-attr]
