"""`relay status` on a relay that has not joined the DHT: a real relay whose bootstrap node never
answers. While it joins it holds its storage's lock but has no runtime file yet: status says
`starting` (it said `not running`). Once it listens anyway, as blind-relay-service does, its
/stats say `bootstrapped: false`: status says `not joined`, exit 1 (it said `up`, exit 0)."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cosmictui import cli
from cosmictui.ops import relayproc

ROOT = Path(__file__).resolve().parents[2]


def _status(*argv: str) -> tuple[int, dict[str, object], str]:
    out = io.StringIO()
    rc = cli.main(["relay", "status", "--json", *argv], out=out)
    text = io.StringIO()
    assert cli.main(["relay", "status", *argv], out=text) == rc
    return rc, json.loads(out.getvalue()), text.getvalue()


def _until(what: str, cond: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"no {what} within {timeout:g}s"
        time.sleep(0.05)


def test_relay_status_says_starting_then_not_joined_for_a_relay_that_cannot_reach_the_dht(tmp_path: Path) -> None:
    storage = tmp_path / "relay"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:  # a bootstrap node that never answers
        silent.bind(("127.0.0.1", 0))
        boot = f"127.0.0.1:{silent.getsockname()[1]}"
        argv = [sys.executable, "-m", "relay", "--storage", str(storage), "--port", "0", "--host", "127.0.0.1"]
        argv += ["--bootstrap", boot, "--metrics", "127.0.0.1:0"]
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        lock, runtime = storage / relayproc.LOCK_FILE, storage / relayproc.RUNTIME_FILE
        try:
            _until("relay.lock with the relay's pid", lambda: lock.exists() and lock.read_text().strip().isdigit())
            os.kill(proc.pid, signal.SIGSTOP)  # held while joining: what status sees cannot move on
            try:
                assert not runtime.exists(), "the relay listened before it could be held (the bootstrap answered?)"
                rc, doc, text = _status("--storage", str(storage))
                assert (rc, doc["state"], doc["pid"], doc["exit_code"]) == (1, "starting", proc.pid, 1), doc
                assert "joining the DHT" in str(doc["error"]) and str(doc["log"]) in str(doc["fix"])
                assert "◌ STARTING" in text and f"pid {proc.pid}" in text and "NOT RUNNING" not in text
            finally:
                os.kill(proc.pid, signal.SIGCONT)

            _until("the relay listening without the DHT", runtime.exists)
            rc, doc, text = _status("--storage", str(storage))
            assert (rc, doc["state"], doc["exit_code"]) == (1, "not joined", 1), doc
            stats = doc["stats"]
            assert isinstance(stats, dict) and stats["dht"]["bootstrapped"] is False
            assert "bootstrap" in str(doc["fix"])
            assert "✖ NOT JOINED" in text and "bootstrapped NO" in text and "▲ UP" not in text
        finally:
            proc.kill()
            proc.wait(30)
    # gone: the lock file stays, nobody holds it
    assert relayproc.lock_holder(str(storage)) is None
    rc, doc, _ = _status("--storage", str(storage))
    assert rc == 1 and doc["state"] == "not running", doc
