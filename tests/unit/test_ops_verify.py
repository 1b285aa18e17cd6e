"""Step 5's use case without a screen: the test job is created, the list tells it apart, and the
verdict needs both halves (left Creating and keeps updating; the relay's record holds its pairing).

The jobs CLI is a scripted `run` (the list's text per call); the relay's record is the relay's own
`PairingLog`, read back through its JSON.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

from cosmictui.ops.config import Settings
from cosmictui.ops.jobs.verify import Judged, TestJobCreated, VerifyInputs, VerifySession, VerifyState
from cosmictui.ops.metrics.pairings import PairingRecord, parse_pairings
from cosmictui.ops.runner import CommandResult
from relay.service.pairings import PairingLog

RELAY = "r" * 52


class Deployment:
    """A jobs CLI in a dict: `create` adds a Creating job; every list moves each job one step on."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.jobs: dict[str, list[str]] = {"job-old": ["Running"]}
        self.created: dict[str, float] = {"job-old": clock[0] - 3600}
        self.n = 0

    async def run(self, cmd: str) -> CommandResult:
        self.clock[0] += 1
        if cmd.startswith("cosmicac jobs create"):
            self.n += 1
            self.jobs[f"job-{self.n:03d}"] = ["Creating", "Running"]
            self.created[f"job-{self.n:03d}"] = self.clock[0]
            return CommandResult(cmd, 0, f"created job-{self.n:03d}\n")
        rows = ["ID        STATUS     CREATED                   UPDATED"]
        for jid, script in self.jobs.items():
            if len(script) > 1:
                script.pop(0)
            made = datetime.fromtimestamp(self.created[jid], UTC).isoformat(timespec="milliseconds")
            upd = datetime.fromtimestamp(self.clock[0], UTC).isoformat(timespec="milliseconds")
            rows.append(f"{jid:<9} {script[0]:<10} {made}  {upd}")
        return CommandResult(cmd, 0, "\n".join(rows) + "\n")


def session(
    dep: Deployment, log: PairingLog, clock: list[float], restart: float, probe: frozenset[str] = frozenset()
) -> VerifySession:
    settings = Settings(test_job_command="cosmicac jobs create --name relay-check", poll_interval=0.01)

    async def record(_url: str) -> PairingRecord:
        return parse_pairings(json.dumps(log.as_json()))

    async def env() -> tuple[str, ...]:
        return (RELAY,)

    inputs = VerifyInputs(
        settings,
        dep.run,
        RELAY,
        lambda: "http://127.0.0.1:1",
        lambda: restart,
        lambda: probe,
        env,
        clock=lambda: clock[0],
        read_record=record,
    )
    return VerifySession(inputs)


async def drive(s: VerifySession) -> list[object]:
    events: list[object] = []
    async for ev in s.create_test_job():
        events.append(ev)
    async for ev in s.run(until_settled=True, timeout=30):
        events.append(ev)
    return events


def pairing(log: PairingLog, at: list[float], a: str, b: str) -> None:
    log._clock = lambda: at[0]  # type: ignore[method-assign]
    sa, sb = log.saw_key(a), log.saw_key(b)
    log.open(((sa, None), (sb, None)))


async def test_the_new_jobs_own_pairing_proves_it() -> None:
    t0 = time.time()
    clock = [t0]
    log = PairingLog(RELAY, clock=lambda: t0 - 100)
    dep = Deployment(clock)
    s = session(dep, log, clock, restart=t0 - 50)
    events: list[object] = []
    async for ev in s.create_test_job():
        events.append(ev)
    assert any(isinstance(e, TestJobCreated) for e in events)
    pairing(log, [clock[0] + 0.5], "agent1", "worker1")  # the new job's agent meets the worker
    async for ev in s.run(until_settled=True, timeout=30):
        events.append(ev)
    v = s.verdict
    assert v is not None and v.proven, v
    assert v.job is not None and v.job.id == "job-001"
    assert "the relay works" in v.message and "relayed" in v.lines[0]
    assert [e.verdict.kind for e in events if isinstance(e, Judged)][-1] == "proven"


async def test_a_probe_after_the_job_is_not_proof() -> None:
    t0 = time.time()
    clock = [t0]
    log = PairingLog(RELAY, clock=lambda: t0 - 100)
    s = session(Deployment(clock), log, clock, restart=t0 - 50, probe=frozenset({"probeA", "probeB"}))
    async for _ in s.create_test_job():
        pass
    pairing(log, [clock[0] + 0.5], "probeA", "probeB")
    async for _ in s.run(until_settled=True, timeout=30):
        pass
    assert s.verdict is not None and s.verdict.kind == "probe-only" and not s.verdict.proven
    assert "left Creating, not through this relay" in s.verdict.message
    assert "carried only the wizard's probe" in s.verdict.lines[0]


async def test_an_older_job_re_pairing_is_not_proof() -> None:
    t0 = time.time()
    clock = [t0]
    log = PairingLog(RELAY, clock=lambda: t0 - 100)
    pairing(log, [t0 - 90], "oldagent", "worker1")
    s = session(Deployment(clock), log, clock, restart=t0 - 50)
    async for _ in s.create_test_job():
        pass
    pairing(log, [clock[0] + 0.5], "oldagent", "worker1")  # reconnects after the restart
    async for _ in s.run(until_settled=True, timeout=30):
        pass
    assert s.verdict is not None and s.verdict.kind == "older-only"


async def test_a_restart_after_the_job_was_created_makes_it_stale() -> None:
    t0 = time.time()
    clock = [t0]
    restart = [t0 - 50]
    log = PairingLog(RELAY, clock=lambda: t0 - 100)
    dep = Deployment(clock)
    s = session(dep, log, clock, restart=t0 - 50)
    s.inputs.restarted_at = lambda: restart[0]
    async for _ in s.create_test_job():
        pass
    pairing(log, [clock[0] + 0.5], "agent1", "worker1")
    async for _ in s.run(until_settled=True, timeout=30):
        pass
    assert s.verdict is not None and s.verdict.proven
    restart[0] = clock[0] + 1  # step 4 ran again
    async for _ in s.poll():
        pass
    assert s.verdict.kind == "stale" and "Create a new test job" in s.verdict.message


async def test_state_survives_a_save_so_a_resume_judges_the_same_job() -> None:
    t0 = time.time()
    clock = [t0]
    log = PairingLog(RELAY, clock=lambda: t0 - 100)
    dep = Deployment(clock)
    s = session(dep, log, clock, restart=t0 - 50)
    async for _ in s.create_test_job():
        pass
    async for _ in s.poll():
        pass
    saved = json.loads(json.dumps(s.state.as_json()))
    pairing(log, [clock[0] + 0.5], "agent1", "worker1")
    again = session(dep, log, clock, restart=t0 - 50)
    again.state = VerifyState.from_json(saved)
    async for _ in again.run(until_settled=True, timeout=30):
        pass
    assert again.verdict is not None and again.verdict.proven and again.verdict.job.id == "job-001"  # type: ignore[union-attr]
    assert VerifyState.from_json("garbage") == VerifyState()


async def test_a_named_job_already_listed_opens_its_window_a_minute_before_its_printed_time() -> None:
    """`verify --job ID` of a job the operator made: a probe after it is never its proof, and the
    window is not the time the watch began (a pairing between the job's creation and the first
    list is the job's)."""
    t0 = time.time()
    clock = [t0]
    log = PairingLog(RELAY, clock=lambda: t0 - 100)
    dep = Deployment(clock)
    dep.jobs["job-mine"] = ["Running"]
    dep.created["job-mine"] = t0 - 10
    pairing(log, [t0 - 5], "agent1", "worker1")  # the job's own pairing, before the watch began
    s = session(dep, log, clock, restart=t0 - 50)
    s.state = VerifyState(job_id="job-mine")
    async for _ in s.run(until_settled=True, timeout=30):
        pass
    assert s.verdict is not None and s.verdict.proven and s.verdict.window_opened_at == t0 - 50


async def test_one_list_names_the_newest_job_that_left_creating_and_its_pairing() -> None:
    """`cosmictui jobs`: one list, no watch; proven only with the job's own pairing in the record."""
    from cosmictui.ops.jobs.model import parse_jobs
    from cosmictui.ops.jobs.verify import one_list_verdict

    t0 = time.time()
    clock = [t0]
    log = PairingLog(RELAY, clock=lambda: t0 - 100)
    dep = Deployment(clock)
    dep.jobs["job-new"] = ["Running"]
    dep.created["job-new"] = t0 - 5
    s = session(dep, log, clock, restart=t0 - 50)
    jobs = parse_jobs((await dep.run("cosmicac jobs list")).output)
    kind, text, _ = await one_list_verdict(s.inputs, jobs)
    assert kind == "not-relayed" and text.startswith("Job job-new is Running, not through this relay")
    pairing(log, [t0 - 4], "agent1", "worker1")
    kind, text, a = await one_list_verdict(s.inputs, jobs)
    assert kind == "proven" and a is not None and a.pairing is not None and "verify --job job-new" in text
    s.inputs.restarted_at = lambda: None
    assert (await one_list_verdict(s.inputs, jobs))[0] == "unknown"
