"""The demo sandbox: real `.env`, simulated `task`/`cosmicac`, jobs that leave Creating only when
their agent reached the worker through a real relay (a relay that merely answers PING is not enough)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cosmictui.ops.config import CREATE_FIELDS
from cosmictui.ops.demo.sandbox import DEMO_CREATE_COMMAND, Sandbox, create_sandbox, sandbox_state, set_failure
from cosmictui.ops.jobs.model import parse_jobs, view_jobs
from cosmictui.ops.jobs.recover import JobRecovered, RecordSaved, plan_jobs, recover_jobs
from cosmictui.ops.relayproc import RelayRuntime, start_relay, stop_relay
from cosmictui.ops.runner import LocalRunner, RunnerError
from cosmictui.ops.setup.checks import dht_ping, run_checks
from cosmictui.ops.setup.envfile import decode_text, encode_text, plan_relays
from relay.keys import encode_id, key_pair

# A stand-in relay process: answers dht-rpc PING (docs/wire/dht.md §1, §2) and writes the runtime file the
# real relay writes: the sandbox's rules tested without a DHT (the real relay is tested below).
STAND_IN = r"""
import json, os, socket, sys
storage, key = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
os.makedirs(storage, exist_ok=True)
tmp = os.path.join(storage, ".rt.tmp")
with open(tmp, "w") as f:
    json.dump({"pid": os.getpid(), "key": key, "host": "127.0.0.1", "port": port, "metrics": None,
               "started_at": 0, "version": "stand-in"}, f)
os.replace(tmp, os.path.join(storage, "relay-runtime.json"))
print("ready", flush=True)
while True:
    d, a = s.recvfrom(2048)
    if len(d) >= 11 and d[0] == 3 and d[1] == 4:
        s.sendto(b"\x13\x00" + d[2:4] + socket.inet_aton(a[0]) + a[1].to_bytes(2, "little"), a)
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    sb = create_sandbox(tmp_path / "demo", bootstrap=(f"127.0.0.1:{free_port()}",))
    try:
        yield sb
    finally:
        sb.close()  # the worker that `task restart` started


@pytest.fixture
def dht_sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    """A sandbox on its private DHT: the worker's peers find (or fail to find) relays at once."""
    sb = create_sandbox(tmp_path / "dht-demo")
    try:
        yield sb
    finally:
        sb.close()


async def wait_job(runner: LocalRunner, name: str, ok: Any, timeout: float = 60.0) -> Any:
    """List jobs until the job named `name` satisfies `ok` (bounded; the worker moves jobs on)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        jobs = parse_jobs((await runner.run("cosmicac jobs list --json")).output)
        job = next((j for j in jobs if j.fields.get("name") == name), None)
        if job is not None and ok(job):
            return job
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"job {name!r} never got there: {job and job.fields}")
        await asyncio.sleep(0.2)


def create(name: str, **fields: str) -> str:
    """A `cosmicac jobs create` with every documented flag (small defaults; `fields` override)."""
    values = {"tags": "t", "location": "eu-1", "gpu_model": "L4", "gpu_count": "1", "image": "ubuntu-22.04"}
    return DEMO_CREATE_COMMAND.format(**({"name": name, "disk_gb": "20"} | values | fields))


def runner_for(sb: Sandbox) -> LocalRunner:
    return LocalRunner(sb.settings.deployment, env=sb.settings.command_env)


@pytest.fixture
def stand_in(dht_sandbox: Sandbox) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    sandbox = dht_sandbox
    key = encode_id(key_pair(b"\x07" * 32).public_key)
    proc = subprocess.Popen(
        [sys.executable, "-c", STAND_IN, str(sandbox.relay_storage), key, "relay-stand-in"], stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield key, proc
    finally:
        proc.kill()
        proc.wait()


async def set_relay_in_env(runner: LocalRunner, key: str) -> str | None:
    text = decode_text(await runner.read_file(".env"))
    plan = plan_relays(text, key)
    return await runner.write_file_atomic(".env", encode_text(plan.new))


async def test_layout_and_seeded_stuck_jobs(sandbox: Sandbox) -> None:
    env = sandbox.env_path.read_text()
    assert "K8S_COMMON_CONFIG__interconnect__relays" not in env and "K8S_NAMESPACE=cosmicac" in env
    for name in ("task", "cosmicac"):
        script = sandbox.bin_dir / name
        assert os.access(script, os.X_OK) and script.read_text().startswith(f"#!{sys.executable}\n")
    s = sandbox.settings
    assert s.deployment == str(sandbox.deployment) and s.relay_storage == str(sandbox.relay_storage)
    assert s.command_env["PATH"].startswith(str(sandbox.bin_dir) + os.pathsep)
    result = await runner_for(sandbox).run(s.list_command)
    now = datetime.now(UTC)
    jobs = parse_jobs(result.output, now)
    views = {v.job.id: v for v in view_jobs(jobs, now)}
    assert views["job-7f3a21"].job.status == "Creating" and views["job-7f3a21"].stuck
    assert views["job-19c0de"].job.status == "Starting" and views["job-19c0de"].stuck
    assert views["job-03be77"].stuck is None
    again = create_sandbox(sandbox.root)  # reuse keeps the state and the .env
    assert again.settings.relay_port == s.relay_port and again.env_path.read_text() == env


def test_demo_commands_are_the_documented_ones(sandbox: Sandbox) -> None:
    """The demo teaches the create/test_job shape docs/configuration.md's example configures."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text("utf-8")
    example = tomllib.loads(re.findall(r"```toml\n(.*?)```", doc, re.S)[0])["commands"]
    assert sandbox.settings.create_command == example["create"]
    assert sandbox.settings.test_job_command == example["test_job"]


async def test_cosmicac_create_takes_exactly_the_documented_flags(sandbox: Sandbox) -> None:
    """Like a real CLI: an unknown or missing flag is an error on stderr, exit 2, and no job."""
    cosmicac = str(sandbox.bin_dir / "cosmicac")
    before = sandbox_state(sandbox)["jobs"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([cosmicac, "jobs", "create", *args], capture_output=True, text=True, timeout=60)

    old_shape = run("--name", "relay-check", "--type", "inference", "--gpus", "1")
    assert old_shape.returncode == 2 and old_shape.stdout == ""
    assert "unknown flag --type" in old_shape.stderr and "--gpu-model GPU_MODEL" in old_shape.stderr
    full = shlex.split(create("x"))[3:]
    gpus = run(*full, "--gpus", "1")
    assert gpus.returncode == 2 and "unknown flag --gpus" in gpus.stderr
    short = run("--name", "x", "--tags", "a,b")
    assert short.returncode == 2
    assert "missing required flags --location, --gpu-model, --gpu-count, --image, --disk-gb" in short.stderr
    no_value = run(*full[:-1])
    assert no_value.returncode == 2 and "--disk-gb needs a value" in no_value.stderr
    zero = run(*shlex.split(create("x", gpu_count="0"))[3:])
    assert zero.returncode == 2 and "--gpu-count must be a whole number above 0" in zero.stderr
    assert sandbox_state(sandbox)["jobs"] == before  # nothing refused was created
    # the test job step 5 creates is accepted, and the job carries every field it was given
    made = await runner_for(sandbox).run(sandbox.settings.test_job_command)
    assert made.ok, made.output
    job = sandbox_state(sandbox)["jobs"][-1]
    assert {f: job[f] for f in CREATE_FIELDS} == {
        "name": "relay-check",
        "tags": "relay-check",
        "location": "eu-1",
        "gpu_model": "L4",
        "gpu_count": "1",
        "image": "ubuntu-22.04",
        "disk_gb": "20",
    }


async def test_demo_recovery_recreates_a_stuck_job_with_every_documented_field(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 6's recover loop on the demo: the list shows every create field, so the documented
    template is known and the recreated job is the stuck one again, field for field."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    s = sandbox.settings
    runner = runner_for(sandbox)
    stuck = {
        "name": "llama-3-70b-serve",
        "tags": "llm,serve",
        "location": "eu-1",
        "gpu_model": "A100",
        "gpu_count": "4",
        "image": "ubuntu-22.04",
        "disk_gb": "200",
    }
    seeded = next(j for j in sandbox_state(sandbox)["jobs"] if j["id"] == "job-7f3a21")
    assert {f: seeded.get(f) for f in CREATE_FIELDS} == stuck
    listing = await runner.run(s.list_command)
    jobs = parse_jobs(listing.output)
    plans = plan_jobs(jobs, ["job-7f3a21"], s)
    assert plans[0].create_source == "config" and plans[0].create is not None
    events = [e async for e in recover_jobs(runner.run, plans, s, listed=[j.id for j in jobs])]
    saved, done = events
    assert isinstance(saved, RecordSaved) and isinstance(done, JobRecovered), events
    assert done.result.outcome == "recreated" and done.result.new_job_id, done.result
    after = {j["id"]: j for j in sandbox_state(sandbox)["jobs"]}
    assert "job-7f3a21" not in after
    new = after[done.result.new_job_id]
    assert {f: new.get(f) for f in CREATE_FIELDS} == stuck
    assert json.loads(saved.record.read_text())["create_fields"] == stuck


async def test_whole_flow_a_relay_that_only_answers_ping_moves_no_job(
    dht_sandbox: Sandbox, stand_in: tuple[str, subprocess.Popen[bytes]]
) -> None:
    sandbox = dht_sandbox
    key, _proc = stand_in
    runner = runner_for(sandbox)
    s = sandbox.settings
    # a job created before the worker knows the relay never gets it
    assert (await runner.run(create("early"))).ok
    backup = await set_relay_in_env(runner, key)
    assert backup is not None
    lines: list[str] = []
    apply = await runner.run(s.apply_command, on_output=lines.append)
    assert apply.ok and f'interconnect.relays = ["{key}"]' in lines
    assert (await runner.run(s.restart_command)).ok
    state = sandbox_state(sandbox)
    assert state["worker"]["running_relays"] == [key] and state["worker"]["restarted_at"]
    created = await runner.run(create("llama", gpu_count="2"))
    assert created.ok
    new_id = created.output.split()[2]
    # the stand-in answers PING but carries nothing: the job waits, and says why
    waiting = await wait_job(runner, "llama", lambda j: j.fields["message"].startswith("waiting: no connection"))
    assert waiting.status == "Creating" and f"relay {key[:8]}…" in waiting.fields["message"]
    listing = await runner.run(s.list_command + " --json")
    jobs = {j.id: j for j in parse_jobs(listing.output)}
    assert jobs[new_id].status == "Creating"
    early = next(j for j in jobs.values() if j.fields["name"] == "early")
    assert early.status == "Creating" and "no relay key" in early.fields["message"]
    assert jobs["job-7f3a21"].status == "Creating"
    restart = datetime.fromtimestamp(state["worker"]["restarted_at"], UTC)
    views = {v.job.id: v for v in view_jobs(list(jobs.values()), datetime.now(UTC), restart)}
    assert views["job-7f3a21"].before_restart and not views[new_id].before_restart
    assert (await runner.run(f"cosmicac jobs delete {early.id}")).ok
    gone = await runner.run(f"cosmicac jobs delete {early.id}")
    assert gone.exit_code == 1 and "not found" in gone.output


async def test_job_waits_when_no_relay_answers(dht_sandbox: Sandbox) -> None:
    sandbox = dht_sandbox
    runner = runner_for(sandbox)
    key = encode_id(key_pair(b"\x08" * 32).public_key)
    await set_relay_in_env(runner, key)
    assert (await runner.run(sandbox.settings.apply_command)).ok
    assert (await runner.run(sandbox.settings.restart_command)).ok
    assert (await runner.run(create("x"))).ok
    waiting = await wait_job(runner, "x", lambda j: j.fields["message"].startswith("waiting: no connection"))
    assert waiting.status == "Creating"
    assert f"through relay {key[:8]}…" in waiting.fields["message"]
    assert sandbox_state(sandbox)["worker"]["pid"]  # the worker the restart started tried it


async def test_task_failures(sandbox: Sandbox) -> None:
    runner = runner_for(sandbox)
    s = sandbox.settings
    with sandbox.env_path.open("a") as f:
        f.write("K8S_COMMON_CONFIG__interconnect__relays='[broken'\n")
    bad = await runner.run(s.apply_command)
    assert bad.exit_code == 1 and "invalid JSON" in bad.output
    sandbox.env_path.unlink()
    missing = await runner.run(s.apply_command)
    assert missing.exit_code == 1 and "no such file" in missing.output
    set_failure(sandbox, "restart", "Error from server (Forbidden): deployments.apps is forbidden")
    failed = await runner.run(s.restart_command)
    assert failed.exit_code == 1 and "Forbidden" in failed.output
    set_failure(sandbox, "restart", None)
    assert (await runner.run(s.restart_command)).ok
    unknown = await runner.run("task restart-everything")
    assert unknown.exit_code == 200 and "does not exist" in unknown.output
    # step 1 reads the sandbox's task list as go-task prints it, so the demo logs no fallback
    from cosmictui.ops.setup.checks import check_tasks

    listed = await check_tasks(runner, s)
    assert listed.status == "ok" and "(task --list-all on" in listed.detail, listed


async def test_cosmicac_missing(sandbox: Sandbox) -> None:
    runner = LocalRunner(sandbox.settings.deployment, env={"PATH": "/usr/bin:/bin"})
    if any(os.access(os.path.join(d, "cosmicac"), os.X_OK) for d in ("/usr/bin", "/bin")):
        pytest.fail("a real cosmicac is installed here; this test needs it absent")
    with pytest.raises(RunnerError) as err:
        await runner.run(sandbox.settings.list_command)
    assert err.value.kind == "missing-command" and "`cosmicac` is not installed" in err.value.what


@pytest.fixture
async def live_sandbox(tmp_path: Path) -> AsyncIterator[tuple[Sandbox, RelayRuntime]]:
    """A sandbox with its private DHT and the real Python relay started from its settings."""
    sb = create_sandbox(tmp_path / "live")
    try:
        s = sb.settings
        assert sb.stop_dht()  # gone (e.g. killed): starting the relay brings it back first
        rt = await start_relay(
            s.relay_storage, s.relay_port, s.relay_host, s.relay_bootstrap, s.relay_metrics, timeout=60
        )
        try:
            yield sb, rt
        finally:
            await stop_relay(s.relay_storage)
            with contextlib.suppress(ProcessLookupError):
                os.kill(rt.pid, signal.SIGKILL)
    finally:
        dht = json.loads(sb.dht_ready_path.read_text())["pid"] if sb.dht_ready_path.exists() else None
        sb.close()
        if dht is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(dht, signal.SIGKILL)


async def test_sandbox_with_the_real_python_relay(live_sandbox: tuple[Sandbox, RelayRuntime]) -> None:
    """The full demo path: private DHT, real relay, .env, apply, restart, new job leaves Creating."""
    sandbox, relay = live_sandbox
    s = sandbox.settings
    runner = runner_for(sandbox)
    assert relay.port == s.relay_port
    checks = {r.name: r for r in await run_checks(s, runner)}
    # joined the sandbox's private DHT (its own NAT probe may still call it firewalled under load)
    assert checks["DHT reachable, port open"].detail.startswith("bootstrapped"), checks
    assert checks["Relay answers from localhost"].status == "ok", checks
    assert checks[f"UDP port {relay.port}"].detail.startswith("held by our relay")
    # the private DHT stores announces, so the demo relay is findable and the monitor does not
    # say "announced never" (its first announce round finishes before it listens)
    assert relay.metrics is not None
    stats = await asyncio.to_thread(_get_json, relay.metrics + "/stats")
    assert stats["dht"]["last_announce"] is not None, stats["dht"]
    await set_relay_in_env(runner, relay.key)
    assert (await runner.run(s.apply_command)).ok
    assert (await runner.run(s.restart_command)).ok
    matched = stats["pairings"]["matched"]
    assert (await runner.run(create("real"))).ok
    job = await wait_job(runner, "real", lambda j: j.status == "Running")
    assert "connected through relay" in job.fields["message"], job.fields
    assert f"relayed at 127.0.0.1:{relay.port}" in job.fields["message"]  # the agent's raw stream ends at the relay
    # the relay itself saw the job's agent and worker meet: a real pairing, real relayed bytes
    after = await asyncio.to_thread(_get_json, relay.metrics + "/stats")
    assert after["pairings"]["matched"] >= matched + 1 and after["traffic"]["relayed_bytes"] > 0, after
    jobs = parse_jobs((await runner.run("cosmicac jobs list --json")).output)
    assert next(j for j in jobs if j.id == "job-7f3a21").status == "Creating"  # from before the restart: stuck
    # it keeps updating over its connection
    first = job.updated
    assert first is not None
    await wait_job(runner, "real", lambda j: j.updated is not None and j.updated > first)
    # the relay goes away: a new job waits and says why
    await stop_relay(s.relay_storage)
    assert (await runner.run(create("later"))).ok
    later = await wait_job(runner, "later", lambda j: j.fields["message"].startswith("waiting: no connection"))
    assert later.status == "Creating" and f"relay {relay.key[:8]}…" in later.fields["message"]


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_private_dht_stops(tmp_path: Path) -> None:
    sb = create_sandbox(tmp_path / "d")
    info = json.loads(sb.dht_ready_path.read_text())
    assert sb.settings.relay_bootstrap == (info["bootstrap"],)
    answered, _ = dht_ping("127.0.0.1", int(info["bootstrap"].rsplit(":", 1)[1]), 5.0)
    try:
        assert answered
        assert create_sandbox(sb.root).settings.relay_bootstrap == (info["bootstrap"],)  # reused, not restarted
    finally:
        assert sb.stop_dht() is True
    assert not sb.dht_ready_path.exists() or json.loads(sb.dht_ready_path.read_text())["pid"] != info["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(info["pid"], 0)
    assert sb.stop_dht() is False


def test_close_removes_a_temp_sandbox_but_not_a_callers_root(tmp_path: Path) -> None:
    kept = create_sandbox(tmp_path / "kept", start_dht=False)
    kept.close()
    assert kept.env_path.exists()  # the caller's root is the caller's to remove
    throwaway = create_sandbox(start_dht=False)
    assert throwaway.temporary and throwaway.env_path.exists()
    throwaway.close()
    assert not throwaway.root.exists()
