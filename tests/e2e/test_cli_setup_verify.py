"""The headless steps through the real entry point (`python -m cosmictui`), against the demo
sandbox's real relay, DHT and job peers: `setup --yes --json` reaches a proven verify, and
`verify` exits non-zero when the relay's record does not hold the new job's own pairing.

(a) the .env switched to another relay (a second blind-relay on the demo's DHT), and a probe
    through the first relay after the job was created;
(b) an older job re-pairs after a second restart while the new test job goes direct.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cosmictui.ops import relayproc
from cosmictui.ops.demo.sandbox import Sandbox, create_sandbox, sandbox_state, set_direct_jobs
from tests.interop._relay_proc import free_udp_port


@pytest.fixture
def demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    sb = create_sandbox(tmp_path / "demo")
    try:
        yield sb
    finally:
        sb.close()


def cosmictui(sb: Sandbox, *args: str, timeout: float = 240) -> tuple[int, str]:
    p = subprocess.run(
        [sys.executable, "-m", "cosmictui", "--config", str(sb.config_path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ.copy(),
    )
    return p.returncode, p.stdout + ("" if p.returncode == 0 else p.stderr)


def setup(sb: Sandbox) -> list[dict[str, object]]:
    rc, out = cosmictui(sb, "setup", "--yes", "--json", "--timeout", "120")
    docs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert rc == 0, out
    return docs


def create_job(sb: Sandbox) -> str:
    """A job made the way the operator makes one (the sandbox's `cosmicac`), not by the wizard."""
    env = dict(os.environ, **sb.settings.command_env)
    p = subprocess.run(
        sb.settings.test_job_command, shell=True, cwd=sb.deployment, env=env, capture_output=True, text=True, check=True
    )
    return p.stdout.split()[2]  # "Created job job-xxxxxx (...)"


def wait_running(sb: Sandbox, job_id: str, timeout: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = next(j for j in sandbox_state(sb)["jobs"] if j["id"] == job_id)
        if job["status"] == "Running":
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never left Creating: {job}")


def test_setup_yes_json_reaches_a_proven_verify(demo: Sandbox) -> None:
    docs = setup(demo)
    assert [d["step"] for d in docs] == ["check", "relay", "env", "apply", "verify"]
    assert all(d["exit_code"] == 0 for d in docs)
    verify = docs[-1]
    assert verify["verdict"] == "proven" and verify["proven"] is True, verify
    relay = verify["relay"]
    assert isinstance(relay, dict) and relay["pairing"]["bytes"] > 0 and "after the window opened" in relay["lines"][0]
    key = docs[1]["key"]
    job = verify["job"]
    assert isinstance(job, dict)
    made = next(j for j in sandbox_state(demo)["jobs"] if j["id"] == job["id"])
    assert made["relays"] == [key] and made["status"] == "Running"


def test_verify_fails_when_the_env_lists_another_relay_and_a_probe_ran_after_the_job(
    demo: Sandbox, tmp_path: Path
) -> None:
    first = setup(demo)[1]["key"]
    other = tmp_path / "other-relay"
    rt = None
    try:
        s = demo.settings
        rt = asyncio.run(relayproc.start_relay(str(other), free_udp_port(), "127.0.0.1", s.relay_bootstrap))
        assert cosmictui(demo, "env", "set-relay", rt.key, "--replace")[0] == 0
        rc, out = cosmictui(demo, "apply")
        assert rc == 1 and rt.key in out and str(first) in out  # refused, naming both keys
        assert cosmictui(demo, "apply", "--force")[0] == 0
        job = create_job(demo)
        assert "relay " + rt.key[:8] in str(wait_running(demo, job)["message"])  # through the other relay
        rc, out = cosmictui(demo, "relay", "probe", str(first))  # the probe, after the job, through the first
        assert rc == 0, out
        rc, out = cosmictui(demo, "verify", "--job", job, "--json", "--timeout", "60")
        doc = json.loads(out[out.index("{") :])
        assert rc == 1 and doc["proven"] is False and doc["verdict"] == "env-dropped", doc
        assert "the wizard's probe" in " ".join(doc["relay"]["lines"]), doc
    finally:
        if rt is not None:
            asyncio.run(relayproc.stop_relay(str(other)))


def test_verify_fails_when_only_an_older_job_re_paired_and_the_new_job_went_direct(demo: Sandbox) -> None:
    docs = setup(demo)
    older = docs[-1]["job"]
    assert isinstance(older, dict)
    set_direct_jobs(demo, True)  # the new job's network does not block it
    assert cosmictui(demo, "apply")[0] == 0  # a second restart: the older job re-pairs through the relay
    rc, out = cosmictui(demo, "verify", "--json", "--timeout", "90")
    doc = json.loads(out[out.index("{") :])
    assert rc == 1 and doc["proven"] is False and doc["verdict"] in ("not-relayed", "older-only"), doc
    new = next(j for j in sandbox_state(demo)["jobs"] if j["id"] == doc["job"]["id"])
    assert new["direct"] and "directly" in new["message"]
    assert older["id"] != new["id"]


def test_without_yes_setup_and_a_key_changing_relay_start_print_the_plan_and_do_nothing(
    demo: Sandbox, tmp_path: Path
) -> None:
    rc, out = cosmictui(demo, "setup")
    assert rc == 3 and "not confirmed: nothing ran" in out and "relay    start the relay" in out
    from cosmictui.ops import progress as progress_mod

    # last time the relay used another storage: starting on this one makes a NEW key
    p = progress_mod.WizardProgress(deployment=demo.settings.deployment, relay_storage=str(tmp_path / "elsewhere"))
    (tmp_path / "elsewhere").mkdir()
    progress_mod.save_progress(p)
    try:
        rc, out = cosmictui(demo, "relay", "start", "--storage", str(demo.relay_storage), "--json")
        doc = json.loads(out[out.index("{") :])
        assert rc == 3 and doc["exit_code"] == 3 and "NEW key" in doc["key_warning"], doc
        assert doc["fix"] == "run again with --yes to do it"
        assert relayproc.attach(str(demo.relay_storage)) is None  # nothing started
    finally:
        for storage in (demo.relay_storage, tmp_path / "elsewhere"):
            asyncio.run(relayproc.stop_relay(str(storage)))
