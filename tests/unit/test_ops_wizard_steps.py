"""The wizard's UI-free decisions: when a new job counts as confirmed, how a job is recreated."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from cosmictui.ops.config import Settings
from cosmictui.ops.jobs.model import Job, view_jobs
from cosmictui.ops.jobs.recover import delete_command, draft_create, plan_recovery
from cosmictui.ops.setup.steps import JobWatch, command_failure_hint, recoverable, sentences

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def job(jid: str, status: str, created: datetime | None = None, updated: datetime | None = None, **fields: str) -> Job:
    return Job(jid, status, created, {"id": jid, "status": status, **fields}, updated)


def test_old_jobs_never_count_and_new_one_must_leave_creating_then_keep_updating() -> None:
    w = JobWatch(T0)
    old = job("old", "Running", T0 - timedelta(hours=1))
    assert w.observe([old]).state == "waiting"
    new = lambda st, up: job("new", st, T0 + timedelta(seconds=5), T0 + timedelta(seconds=up))  # noqa: E731
    assert w.observe([old, new("Creating", 5)]).state == "creating"
    assert w.observe([old, new("Running", 10)]).state == "left"
    # Same status and the same update time: not "keeps updating" yet.
    assert w.observe([old, new("Running", 10)]).state == "left"
    v = w.observe([old, new("Running", 15)])
    assert v.state == "confirmed" and v.job is not None and v.job.id == "new"
    # Derived again from every list: the confirmed job gone from the list withdraws the verdict.
    assert w.observe([old]).state == "withdrawn"


def test_without_times_new_means_absent_from_first_snapshot() -> None:
    w = JobWatch(None)
    assert w.observe([job("a", "Creating")]).state == "waiting"
    assert w.observe([job("a", "Creating"), job("b", "Creating")]).state == "creating"
    assert w.observe([job("a", "Creating"), job("b", "Running")]).state == "left"
    assert w.observe([job("a", "Creating"), job("b", "Running")]).state == "confirmed"


def test_failed_new_job_is_reported_not_confirmed() -> None:
    w = JobWatch(T0)
    v = w.observe([job("n", "Failed", T0 + timedelta(seconds=1))])
    assert v.state == "failed" and "failed" in v.message


def test_exclude_ignores_jobs_that_existed_before_recreation() -> None:
    w = JobWatch(T0, exclude={"x"})
    assert w.observe([job("x", "Running", T0 + timedelta(seconds=1))]).state == "waiting"


def test_recovery_commands_from_the_template_and_the_job_fields() -> None:
    fields = {"id": "j-1", "name": "my job", "gpu": "a100", "created": "x", "age": "5m"}
    j = Job("j-1", "Creating", T0, fields)
    s = Settings(create_command="cosmicac jobs create --name {name} --gpu-model {gpu_model}")
    assert delete_command(j, s) == "cosmicac jobs delete j-1"
    plan = plan_recovery(j, s)  # gpu_model found under its alias "gpu"
    assert plan.create == "cosmicac jobs create --name 'my job' --gpu-model a100" and plan.create_source == "config"
    # A field the list does not show makes the command unknown: delete only.
    missing = plan_recovery(j, s.with_overrides(create_command="cosmicac jobs create --image {image}"))
    assert missing.create is None and missing.create_source is None
    # No template: a draft with every documented field, never run unreviewed.
    draft = draft_create(j, Settings())
    assert not draft.known and "{tags}" in draft.command and "--name 'my job'" in draft.command
    reviewed = plan_recovery(j, Settings(), "cosmicac jobs create --name x --tags a")
    assert reviewed.create == "cosmicac jobs create --name x --tags a" and reviewed.create_source == "operator"
    assert plan_recovery(j, Settings(), "cosmicac jobs create --tags {tags}").create is None  # still a gap


def test_failure_hints() -> None:
    assert "not found" in command_failure_hint("task x", 127, "sh: task: not found")
    assert "permission denied" in command_failure_hint("task x", 126, "")
    assert "no such task" in command_failure_hint("task x", 200, 'task: Task "x" does not exist')
    assert "fix the cause" in command_failure_hint("task x", 1, "boom")


def test_recoverable_jobs_are_stuck_or_old_and_starting() -> None:
    now = T0 + timedelta(hours=2)
    restart = now - timedelta(seconds=60)
    jobs = [
        job("stuck", "Creating", T0),  # 2 h in Creating
        job("young-old", "Starting", now - timedelta(seconds=90), now),  # before restart: never gets the key
        job("young-new", "Creating", now - timedelta(seconds=30), now),  # after restart: give it time
        job("done", "Completed", T0, T0),
        job("running", "Running", T0, now),
    ]
    assert [v.job.id for v in recoverable(view_jobs(jobs, now, restart))] == ["stuck", "young-old"]


def test_sentences_are_separated_even_when_a_part_ends_in_a_parenthesis() -> None:
    assert sentences("Cannot edit .env line 3: bad key", "Fix: use the key (52 characters)", "Nothing was changed") == (
        "Cannot edit .env line 3: bad key. Fix: use the key (52 characters). Nothing was changed."
    )
    assert sentences("Done!", None, "  ", "Next?") == "Done! Next?"


def test_env_problem_message_reads_as_sentences() -> None:
    from cosmictui.ops.setup.envfile import EnvFileError
    from cosmictui.screens.step_env import _env_problem

    e = EnvFileError("the relay key is malformed", 3, "use the printed key (52 z-base-32 characters)", "/d/.env")
    assert _env_problem(e) == (
        "Cannot edit /d/.env line 3: the relay key is malformed. "
        "Fix: use the printed key (52 z-base-32 characters). Nothing was changed."
    )


async def test_step_2s_reach_checks_never_call_a_running_relay_not_running(tmp_path: Path) -> None:
    """The relay runs but its metrics do not answer (a closed port here): step 2's DHT row says it runs,
    with its pid and port, and why its DHT view is unknown — not 'the relay is not running'."""
    import socket

    from cosmictui.ops.relayproc import RelayRuntime
    from cosmictui.ops.runner import LocalRunner
    from cosmictui.ops.setup.steps import relay_reach_checks

    with socket.socket() as s:  # a loopback TCP port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rt = RelayRuntime(4242, "k" * 52, "127.0.0.1", 49737, f"http://127.0.0.1:{port}", 0.0, "0.1.0", str(tmp_path))
    settings = Settings(deployment=str(tmp_path), relay_address="127.0.0.1")
    results = await relay_reach_checks(settings, LocalRunner(str(tmp_path)), rt)
    dht = results[0]
    assert "not running" not in dht.detail, dht.detail
    assert "pid 4242" in dht.detail and "UDP port 49737" in dht.detail, dht.detail
