"""The one recover loop (`ops.jobs.recover.recover_jobs`) that wizard step 6 and `jobs recover`
both consume: a record (mode 0600) before every delete, and the first failure stops it."""

from __future__ import annotations

import json
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cosmictui.ops.config import Settings
from cosmictui.ops.jobs.model import Job
from cosmictui.ops.jobs.recover import (
    JobRecovered,
    RecordSaved,
    RecoveryEvent,
    RecoveryStopped,
    RecreatedWatch,
    new_job_made,
    plan_recovery,
    recover_jobs,
)
from cosmictui.ops.runner import CommandResult

TEMPLATE = "cosmicac jobs create --name {name}"


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


class Deployment:
    """Runs commands against a list of jobs; `fail` maps a command prefix to an exit code."""

    def __init__(self, fail: dict[str, int] | None = None) -> None:
        self.calls: list[str] = []
        self.fail = fail or {}

    async def run(self, cmd: str) -> CommandResult:
        self.calls.append(cmd)
        code = next((c for prefix, c in self.fail.items() if cmd.startswith(prefix)), 0)
        return CommandResult(cmd, code, "error: boom" if code else "ok")


def _job(jid: str) -> Job:
    return Job(jid, "Creating", fields={"id": jid, "name": f"train {jid}"})


async def _events(dep: Deployment, ids: list[str], settings: Settings) -> list[RecoveryEvent]:
    plans = [plan_recovery(_job(i), settings) for i in ids]
    return [e async for e in recover_jobs(dep.run, plans, settings)]


async def test_each_record_is_saved_0600_before_its_delete_and_every_job_recovered() -> None:
    dep = Deployment()
    settings = Settings(create_command=TEMPLATE)
    seen: list[tuple[str, int]] = []
    plans = [plan_recovery(_job(i), settings) for i in ("a", "b")]
    async for e in recover_jobs(dep.run, plans, settings):
        if isinstance(e, RecordSaved):  # on disk, private, and nothing of this job ran yet
            assert stat.S_IMODE(os.stat(e.record).st_mode) == 0o600
            assert not any(c.startswith(f"cosmicac jobs delete {e.job_id}") for c in dep.calls)
        seen.append((type(e).__name__, len(dep.calls)))
    assert [n for n, _ in seen] == ["RecordSaved", "JobRecovered", "RecordSaved", "JobRecovered"]
    assert dep.calls == [
        "cosmicac jobs delete a",
        "cosmicac jobs create --name 'train a'",
        "cosmicac jobs delete b",
        "cosmicac jobs create --name 'train b'",
    ]


async def test_a_record_that_cannot_be_saved_deletes_nothing_and_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker))
    dep = Deployment()
    events = await _events(dep, ["a", "b"], Settings(create_command=TEMPLATE))
    assert len(events) == 1 and isinstance(events[0], RecoveryStopped)
    assert events[0].result is None and "not deleted" in events[0].message
    assert "XDG_STATE_HOME" in events[0].fix
    assert dep.calls == []


async def test_a_failing_delete_stops_before_the_next_job() -> None:
    dep = Deployment(fail={"cosmicac jobs delete a": 1})
    events = await _events(dep, ["a", "b"], Settings(create_command=TEMPLATE))
    assert [type(e) for e in events] == [RecordSaved, RecoveryStopped]
    stop = events[-1]
    assert isinstance(stop, RecoveryStopped) and not stop.lost and stop.fix
    assert dep.calls == ["cosmicac jobs delete a"]


async def test_a_create_failing_after_its_delete_is_lost_and_names_its_recreate_command() -> None:
    dep = Deployment(fail={"cosmicac jobs create": 64})
    events = await _events(dep, ["a", "b"], Settings(create_command=TEMPLATE))
    stop = events[-1]
    assert isinstance(stop, RecoveryStopped) and stop.lost
    assert "cosmicac jobs create --name 'train a'" in stop.fix
    assert stop.result is not None and str(stop.result.record) in stop.fix
    assert dep.calls == ["cosmicac jobs delete a", "cosmicac jobs create --name 'train a'"]  # b untouched


async def test_delete_only_goes_on_to_the_next_job() -> None:
    dep = Deployment()
    events = await _events(dep, ["a", "b"], Settings())  # no create template: delete only
    done = [e for e in events if isinstance(e, JobRecovered)]
    assert [e.result.outcome for e in done] == ["deleted-only", "deleted-only"]
    assert dep.calls == ["cosmicac jobs delete a", "cosmicac jobs delete b"]


def test_the_new_job_is_the_one_that_appeared_or_the_one_the_create_named() -> None:
    old = _job("j-1")
    made, other = Job("j-9", "Creating", fields={"name": "train j-1"}), Job("x-5", "Creating", fields={"name": "x"})
    assert new_job_made(old, "", [made]) == "j-9"
    # someone else created a job meanwhile: the create's own output, else the old job's name, tells
    assert new_job_made(old, "created j-9\n", [other, made]) == "j-9"
    assert new_job_made(old, "ok", [other, made]) == "j-9"
    # two alike and nothing printed: not a guess
    twin = Job("j-10", "Creating", fields={"name": "train j-1"})
    assert new_job_made(old, "ok", [made, twin]) is None
    assert new_job_made(old, "created j-90", [made, twin]) is None  # j-9 only as a part of another id


class Listing(Deployment):
    """A deployment whose `jobs list` shows the jobs, and each create adds one (`n-1`, `n-2`, ...)."""

    def __init__(self, jobs: list[str]) -> None:
        super().__init__()
        self.jobs = list(jobs)

    async def run(self, cmd: str) -> CommandResult:
        self.calls.append(cmd)
        if cmd.startswith("cosmicac jobs delete "):
            self.jobs.remove(cmd.split()[-1])
        elif cmd.startswith("cosmicac jobs create"):
            self.jobs.append(f"n-{len(self.calls)}")
            return CommandResult(cmd, 0, "accepted")
        elif cmd == Settings().list_command:
            rows = "".join(f"{j}  Creating\n" for j in self.jobs)
            return CommandResult(cmd, 0, "ID  STATUS\n" + rows)
        return CommandResult(cmd, 0, "ok")


async def test_each_recreated_job_names_the_new_job_that_replaces_it_in_result_and_record() -> None:
    dep = Listing(["a", "b", "c"])
    settings = Settings(create_command=TEMPLATE, poll_interval=0.01)
    plans = [plan_recovery(_job(i), settings) for i in ("a", "b")]
    events = [e async for e in recover_jobs(dep.run, plans, settings, listed=["a", "b", "c"])]
    done = [e.result for e in events if isinstance(e, JobRecovered)]
    assert [(r.job_id, r.new_job_id) for r in done] == [("a", "n-2"), ("b", "n-5")]
    assert done[0].message == "Job a deleted and created again: new job n-2 replaces it."
    for r in done:
        assert json.loads(r.record.read_text())["new_job_id"] == r.new_job_id
        assert stat.S_IMODE(os.stat(r.record).st_mode) == 0o600  # still private after the update


async def test_without_a_new_job_in_the_list_the_result_says_it_is_not_known() -> None:
    dep = Deployment()  # its `jobs list` prints "ok": no job ever shows up
    settings = Settings(create_command=TEMPLATE, poll_interval=0.01)
    (plan,) = [plan_recovery(_job("a"), settings)]
    events = [e async for e in recover_jobs(dep.run, [plan], settings, listed=["a"])]
    (result,) = [e.result for e in events if isinstance(e, JobRecovered)]
    assert result.new_job_id is None and "which new job replaces it is not known" in result.message
    assert "new_job_id_unknown" in json.loads(result.record.read_text())


def _listed(*rows: tuple[str, str, int]) -> list[Job]:
    """Jobs as a list shows them: (id, status, minute of the last update)."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return [Job(jid, st, at, {"id": jid}, at + timedelta(minutes=m)) for jid, st, m in rows]


def test_the_recreated_watch_names_every_recreated_job_and_waits_for_each() -> None:
    """Two jobs recreated: the verdict is about both, confirmed only when each left Creating."""
    since = datetime(2026, 1, 1, tzinfo=UTC)
    watch = RecreatedWatch(since, {"job-001", "job-002", "job-009"}, [("job-001", "job-100"), ("job-002", "job-101")])
    v = watch.observe(_listed(("job-009", "Running", 0), ("job-100", "Running", 1), ("job-101", "Creating", 1)))
    assert v.state == "waiting" and "job-100" in v.message and "job-101" in v.message, v
    v = watch.observe(_listed(("job-009", "Running", 0), ("job-100", "Running", 2), ("job-101", "Running", 2)))
    assert v.state == "waiting" and "job-100 left Creating" in v.message and "job-101 is Running" in v.message, v
    v = watch.observe(_listed(("job-009", "Running", 0), ("job-100", "Running", 3), ("job-101", "Running", 3)))
    assert v.state == "confirmed", v
    assert "Job job-100 left Creating (Running)" in v.message and "Job job-101 left Creating (Running)" in v.message


def test_the_recreated_watch_fails_when_one_fails_and_says_which() -> None:
    since = datetime(2026, 1, 1, tzinfo=UTC)
    watch = RecreatedWatch(since, {"job-001", "job-002"}, [("job-001", "job-100"), ("job-002", "job-101")])
    watch.observe(_listed(("job-100", "Running", 1), ("job-101", "Failed", 1)))
    v = watch.observe(_listed(("job-100", "Running", 2), ("job-101", "Failed", 1)))
    assert v.state == "failed" and "job-101 is Failed" in v.message and "job-100 left Creating" in v.message, v


def test_the_recreated_watch_watches_a_job_whose_new_id_is_not_known_among_the_new_ones() -> None:
    """A create whose new job was not told apart: any other new job stands for it, and the verdict
    says its ID was not known; the known one is watched by its ID alone."""
    since = datetime(2026, 1, 1, tzinfo=UTC)
    watch = RecreatedWatch(since, {"job-001", "job-002"}, [("job-001", "job-100"), ("job-002", None)])
    for m in (1, 2):
        v = watch.observe(_listed(("job-100", "Running", m), ("job-555", "Running", m)))
    assert v.state == "confirmed", v
    assert "job-100 left Creating" in v.message and "job-555 left Creating" in v.message
    assert "job-002" in v.message, v  # the job it was made for is named
