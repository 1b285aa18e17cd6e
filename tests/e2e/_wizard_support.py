"""Helpers for the wizard's Pilot tests: a deployment directory, tools on PATH, waits on state."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from cosmictui.app import WizardApp
from cosmictui.ops import progress as progress_mod
from cosmictui.ops.config import Settings
from cosmictui.ops.session import STEP_IDS, WizardContext
from cosmictui.screens.step import Step, StepStatus
from relay.keys import encode_id, key_pair

KEY = encode_id(key_pair(b"\x01" * 32).public_key)
OTHER_KEY = encode_id(key_pair(b"\x02" * 32).public_key)
ENV_VAR = "K8S_COMMON_CONFIG__interconnect__relays"
# Screens are looked at in a default tmux pane and a small one: a case run at one is resized to the other
OTHER_SIZE = {(80, 24): (60, 20), (60, 20): (80, 24)}


def make_bin(root: Path, scripts: dict[str, str]) -> Path:
    """A directory of executable shell scripts standing in for the deployment's tools."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        p = bin_dir / name
        p.write_text("#!/bin/sh\n" + body)
        p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


def path_with(bin_dir: Path | None, *, keep_system: bool = True) -> str:
    parts = [str(bin_dir)] if bin_dir else []
    if keep_system:
        parts += ["/usr/local/bin", "/usr/bin", "/bin"]
    return ":".join(parts)


def resume_at(deployment: str, step: str, **fields: object) -> None:
    """Save progress as if the operator had stopped before `step`: the wizard resumes there."""
    p = progress_mod.WizardProgress(deployment=deployment, current_step=step, **fields)  # type: ignore[arg-type]
    for sid in STEP_IDS[: STEP_IDS.index(step)]:
        p.complete(sid)
    if p.is_done("verify") and p.relay_key and p.restarted_at is not None:
        # as an earlier run that proved it: step 5's tick stands on this record (ops.session)
        p.data.setdefault("verified", {"relay_key": p.relay_key, "restart": p.restarted_at})
    progress_mod.save_progress(p)


def relay_running(storage: str, key: str) -> str | None:
    """Relay check for tests of steps that do not need a relay process: "it runs".

    Tests resume with a made-up key and no relay; the real check (a live runtime file) is
    exercised where it matters, in test_wizard_jobs.py's dead-relay test and the demo test.
    """
    return None


def relay_carried(monkeypatch: pytest.MonkeyPatch, carried: bool = True) -> None:
    """For steps tested with a stand-in jobs CLI and no relay: the relay's record of its pairings
    holds (`carried`) or lacks a pairing of two keys it first saw just now, i.e. the new job's.
    The record comes from the relay's own PairingLog, as `/pairings` serves it."""
    import json
    import time

    from cosmictui.ops.metrics import pairings
    from cosmictui.ops.session import WizardContext
    from relay.service.pairings import PairingLog

    async def record(_url: str, timeout: float = 3.0) -> pairings.PairingRecord:
        now = time.time()
        log = PairingLog(KEY, clock=lambda: now - 3600)
        if carried:
            log._clock = lambda: now  # type: ignore[method-assign]
            a, b = encode_id(key_pair().public_key), encode_id(key_pair().public_key)
            log.open(((log.saw_key(a), None), (log.saw_key(b), None)))
        return pairings.parse_pairings(json.dumps(log.as_json()))

    monkeypatch.setattr(pairings, "read_pairings", record)
    monkeypatch.setattr(WizardContext, "relay_metrics_url", lambda _self: "http://127.0.0.1:9")


def make_app(settings: Settings, **ctx_kwargs: object) -> WizardApp:
    ctx_kwargs.setdefault("relay_check", relay_running)
    return WizardApp(WizardContext(settings, **ctx_kwargs))  # type: ignore[arg-type]


def step(app: WizardApp, step_id: str) -> Step:
    return app.screen.query_one(f"#step-{step_id}", Step)


def status(app: WizardApp, step_id: str) -> str:
    return str(step(app, step_id).query_one(StepStatus).render())


def status_kind(app: WizardApp, step_id: str) -> str:
    st = step(app, step_id).query_one(StepStatus)
    return next((k for k in ("ok", "warn", "error", "busy", "info") if st.has_class(f"-{k}")), "")


async def wait_until(pilot: Pilot[object], cond: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Wait on the app's state (not on a fixed sleep); the timeout is only a safety net."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await pilot.pause(0.02)


async def still(pilot: Pilot[object], tries: int = 20) -> str:
    """The screen once it stands still: two screenshots in a row alike (a table sizes its columns,
    a dialog its scroll area, a blur redraws, each on a later refresh; seen in CI under load),
    else the test fails. Returns the last screenshot."""
    last = ""
    for _ in range(tries):
        await pilot.pause()
        now = pilot.app.export_screenshot()
        if now == last:
            return now
        last = now
    raise AssertionError("the screen never stood still")


async def at_the_other_size(pilot: Pilot[object], app: WizardApp, size: tuple[int, int], step_id: str) -> None:
    """The verdict as the other size shows it: the same kind, its status line whole on screen."""
    await wait_until(pilot, lambda: not step(app, step_id).busy, f"step {step_id} done with its work")
    await still(pilot)
    kind = status_kind(app, step_id)
    await pilot.resize_terminal(*OTHER_SIZE[size])
    await still(pilot)
    line = step(app, step_id).query_one(StepStatus)
    assert app.screen.region.contains_region(line.region), (line.region, OTHER_SIZE[size])
    assert status_kind(app, step_id) == kind, (kind, status(app, step_id))
    await pilot.resize_terminal(*size)


async def wait_status(
    pilot: Pilot[object], app: WizardApp, step_id: str, kinds: tuple[str, ...], timeout: float = 20.0
) -> str:
    await wait_until(
        pilot,
        lambda: status_kind(app, step_id) in kinds and not step(app, step_id).busy,
        f"step {step_id} status in {kinds} (now {status_kind(app, step_id)!r}: {status(app, step_id)!r})",
        timeout,
    )
    return status(app, step_id)


def snapshot_tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes: compared before/after to prove nothing changed."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


async def settle(pilot: Pilot[object]) -> None:
    await pilot.pause()
    await asyncio.sleep(0)


__all__ = ["ENV_VAR", "KEY", "OTHER_KEY", "make_app", "make_bin", "os", "path_with", "resume_at", "status", "step"]


# A scripted `cosmicac` for the verify/recover steps' own tests (the demo sandbox's is in ops):
# jobs live in jobs.json in the deployment; each `jobs list` advances every job one step along
# its `script` of statuses, bumping `updated`, so "leaves Creating and keeps updating" is real
# behaviour of the program the wizard runs, not something the test pokes into the UI.
FAKE_COSMICAC = r"""#!/usr/bin/env python3
import json, sys, time, os, fcntl
from datetime import datetime, timezone
STATE = "jobs.json"
lock = open("jobs.lock", "w"); fcntl.flock(lock, fcntl.LOCK_EX)  # the wizard lists while it creates
state = json.load(open(STATE)) if os.path.exists(STATE) else {"jobs": [], "next": 1, "create_script": ["Running"]}
def iso(t): return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
args = sys.argv[1:]
with open("cosmicac.log", "a") as log: log.write(" ".join(args) + "\n")
if args[:2] == ["jobs", "list"]:
    rows = []
    for j in state["jobs"]:
        if len(j["script"]) > 1:
            j["script"].pop(0); j["updated"] = time.time()
        elif j["script"][0] != "Creating":
            j["updated"] = time.time()
        rows.append((j["id"], j["script"][0], iso(j["created"]), iso(j["updated"]), j["name"], j["gpu"]))
    head = ("ID", "STATUS", "CREATED", "UPDATED", "NAME", "GPU")
    w = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)).rstrip())
elif args[:2] == ["jobs", "delete"]:
    before = len(state["jobs"])
    state["jobs"] = [j for j in state["jobs"] if j["id"] != args[2]]
    if len(state["jobs"]) == before:
        print(f"job {args[2]} not found", file=sys.stderr); sys.exit(1)
    print(f"deleted {args[2]}")
elif args[:2] == ["jobs", "create"]:
    opts = dict(zip(args[2::2], args[3::2]))
    jid = f"job-{state['next']:03d}"; state["next"] += 1
    now = time.time()
    state["jobs"].append({"id": jid, "name": opts.get("--name", "unnamed"), "gpu": opts.get("--gpu", "none"),
                          "created": now, "updated": now, "script": list(state["create_script"])})
    print(f"created {jid}")
else:
    print("usage: cosmicac jobs list|delete ID|create --name N --gpu G", file=sys.stderr); sys.exit(2)
with open(STATE + ".tmp", "w") as f:
    json.dump(state, f)
os.replace(STATE + ".tmp", STATE)
"""


def seed_jobs(deploy: Path, jobs: list[dict[str, object]], create_script: list[str] | None = None) -> None:
    state = {"jobs": jobs, "next": 100, "create_script": create_script or ["Creating", "Running"]}
    (deploy / "jobs.json").write_text(__import__("json").dumps(state))


def install_cosmicac(root: Path) -> Path:
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    p = bin_dir / "cosmicac"
    p.write_text(FAKE_COSMICAC)
    p.chmod(0o755)
    return bin_dir
