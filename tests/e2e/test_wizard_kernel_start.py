"""Step 2 starts the relay with kernel forwarding where this host allows it, and otherwise says
in one line why and starts it forwarding in Python. A real `python -m relay` process; whether the
host allows it is found out apart from the code under test (the nft tool), and the same test runs
again without CAP_NET_ADMIN (setpriv), where it must say why."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cosmictui.ops import relayproc
from cosmictui.ops.config import Settings
from cosmictui.ops.metrics import probe as probe_mod
from cosmictui.ops.metrics.probe import ProbeResult
from cosmictui.ops.setup import relayup
from cosmictui.ops.setup.checks import CheckResult
from cosmictui.screens import step_relay
from cosmictui.widgets.command_log import CommandLog
from tests.e2e._wizard_support import make_app, resume_at, status, status_kind, step, wait_until

ROOT = Path(__file__).resolve().parents[2]
NO_NET_ADMIN = ["setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin", "--"]


def host_can_manage_nftables() -> bool:
    try:
        res = subprocess.run(
            ["nft", "-f", "-"],
            input="add table inet wizardstart\ndelete table inet wizardstart\n",
            capture_output=True,
            text=True,
        )
    except OSError:
        return False
    return res.returncode == 0


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[Path]:
    s = tmp_path / "relay-storage"
    yield s
    rt = relayproc.attach(str(s))
    if rt is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rt.pid, signal.SIGKILL)


async def test_step_2_starts_the_relay_on_the_kernel_path_where_the_host_allows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, storage: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    async def reach(*_a: object, **_k: object) -> list[CheckResult]:
        return [CheckResult("Relay answers from localhost", "ok", "answered a PING")]

    async def probe(key: str, *_a: object, **_k: object) -> ProbeResult:
        return ProbeResult(relay_key=key, ok=True, relayed=True, relay_address="127.0.0.1", rtt_ms=1.0)

    # what is tested is the relay's start (its flags, the line why); the DHT around it is not
    monkeypatch.setattr(relayup, "relay_reach_checks", reach)
    monkeypatch.setattr(probe_mod, "run_probe", probe)
    monkeypatch.setattr(step_relay.relayproc, "running_relays", lambda: [])
    d = tmp_path / "deploy"
    d.mkdir()
    resume_at(str(d), "relay", relay_storage=str(storage))
    settings = Settings(  # [relay] kernel_forwarding not set: the default
        deployment=str(d),
        relay_storage=str(storage),
        relay_port=free_udp_port(),
        relay_host="127.0.0.1",
        relay_bootstrap=("127.0.0.1:9",),
        relay_metrics="off",
    )
    can = host_can_manage_nftables()
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.screen.index == 1, "step 2")  # type: ignore[attr-defined]
        await pilot.press("s")
        await wait_until(
            pilot,
            lambda: relayproc.attach(str(storage)) is not None or status_kind(app, "relay") == "error",
            "the relay started",
            timeout=60,
        )
        log = step(app, "relay").screen.query_one(CommandLog).transcript()
        shown = status(app, "relay")
    rt = relayproc.attach(str(storage))
    assert rt is not None, (shown, log)
    args = psutil.Process(rt.pid).cmdline()
    assert ("--kernel-forwarding" in args) is can, (args, log)
    if can:
        assert "Kernel forwarding is on" in log
    else:
        line = next((x for x in log.splitlines() if "Kernel forwarding is off" in x), "")
        assert "CAP_NET_ADMIN" in line and "forwards in Python" in line


def test_without_cap_net_admin_step_2_says_why_and_starts_the_relay_in_python(tmp_path: Path) -> None:
    """The test above, in a process without CAP_NET_ADMIN (where the host has nftables, the
    reason must be the capability)."""
    test = (
        f"{Path(__file__).relative_to(ROOT)}::test_step_2_starts_the_relay_on_the_kernel_path_where_the_host_allows_it"
    )
    res = subprocess.run(
        [*NO_NET_ADMIN, sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", test],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "1 passed" in res.stdout
