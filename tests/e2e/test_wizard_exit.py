"""The wizard process ends cleanly when its terminal goes away.

Closing a tmux pane or terminal sends SIGHUP; `kill` sends SIGTERM. Both must end the wizard like
q does, so the demo's relay and private DHT stop with it and the throwaway sandbox and its saved
progress are removed. Run as a real process on a pty: the signal path is the operating system's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cosmictui.ops import progress as progress_mod
from cosmictui.ops.jobs.recover import recovery_dir
from cosmictui.ops.relayproc import pid_alive, read_runtime
from tests.e2e._pty import on_pty

# The demo as `cosmictui --demo` runs it, with the sandbox in a known place and its relay already
# started (as step 2 would), so the test knows which processes must be gone afterwards.
SCRIPT = r"""
import asyncio, sys
from pathlib import Path
import cosmictui.ops.demo.sandbox as sandbox_mod
from cosmictui.app import main_wizard
from cosmictui.ops import progress, relayproc

root = Path(sys.argv[1])
sb = sandbox_mod.create_sandbox(root)
s = sb.settings
asyncio.run(relayproc.start_relay(s.relay_storage, s.relay_port, s.relay_host, s.relay_bootstrap, s.relay_metrics))
progress.save_progress(progress.WizardProgress(deployment=s.deployment, current_step="relay"))
# step 6 saved a demo job's record; another deployment's record sits beside it in the same folder
from cosmictui.ops.jobs.model import Job
from cosmictui.ops.jobs.recover import plan_recovery, save_record
save_record(plan_recovery(Job("job-001", "Creating", fields={"id": "job-001", "name": "stuck"}), s), s)
real = s.with_overrides(deployment="/srv/cosmicac")
save_record(plan_recovery(Job("job-900", "Creating", fields={"id": "job-900", "name": "keep"}), real), real)
sandbox_mod.create_sandbox = lambda *a, **k: sb
sys.exit(main_wizard(None, True, None))
"""


@pytest.fixture
def wizard_on_pty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[subprocess.Popen[bytes], Path, list[bytes]]]:
    """The demo wizard in its own process on a pseudo-terminal; whatever it leaves is killed after."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    root = tmp_path / "demo"
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="80", LINES="24")
    with on_pty([sys.executable, "-c", SCRIPT, str(root)], env) as (proc, screen):
        pids: list[int] = []
        try:
            yield proc, root, screen
        finally:
            for f in (root / "relay-storage" / "relay-runtime.json", root / "dht.json"):
                with contextlib.suppress(OSError, ValueError):
                    pids.append(int(json.loads(f.read_text())["pid"]))
            for pid in [proc.pid, *pids]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _wait(cond, what: str, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGHUP])
def test_wizard_exit_on_sighup_stops_demo_relay_and_dht_and_removes_sandbox(
    wizard_on_pty: tuple[subprocess.Popen[bytes], Path, list[bytes]], sig: int
) -> None:
    proc, root, screen = wizard_on_pty
    storage = root / "relay-storage"
    # The step list is drawn once the app is mounted (its signal handlers are in place by then).
    _wait(lambda: b"Prerequisites" in b"".join(screen), "the wizard on screen")
    rt = read_runtime(str(storage))
    assert rt is not None and pid_alive(rt.pid)
    dht_pid = int(json.loads((root / "dht.json").read_text())["pid"])
    assert pid_alive(dht_pid)
    deployment = str(root / "deployment")
    assert progress_mod.progress_path(deployment).exists()

    os.kill(proc.pid, sig)
    assert proc.wait(timeout=60) == 128 + sig

    _wait(lambda: not pid_alive(rt.pid) and not pid_alive(dht_pid), "relay and DHT to be gone", 10)
    assert not root.exists(), sorted(p.name for p in root.iterdir())
    assert not progress_mod.progress_path(deployment).exists()
    # the demo's job records went with it (their deployment is gone); a real deployment's stayed
    records = [json.loads(p.read_text()) for p in sorted(recovery_dir(deployment).glob("*.json"))]
    assert [r["deployment"] for r in records] == ["/srv/cosmicac"], records
    _wait(lambda: b"job record" in b"".join(screen), "the goodbye naming the removed record", 10)
    said = " ".join(b"".join(screen).decode(errors="replace").split())
    assert f"was removed, with the 1 job record it saved in {recovery_dir(deployment)}." in said, said[-400:]
