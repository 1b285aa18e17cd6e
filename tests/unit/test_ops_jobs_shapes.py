"""Jobs are rows that are jobs: real-world table shapes with titles, totals, paging hints and
empty lists; unknown statuses; and the new-job verdict derived again on every list."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from cosmictui.ops.jobs.model import Job, StatusSets, parse_jobs, shown_status
from cosmictui.ops.setup.steps import JobWatch

NOW = datetime(2026, 11, 29, 15, 0, 0, tzinfo=UTC)

SHAPES: dict[str, str] = {
    "whitespace, title, total and paging hint": (
        "Jobs for ops@example.com\n"
        "\n"
        "ID         NAME          STATUS     CREATED\n"
        "job-001    llama-train   Creating   2026-11-29T10:00:00Z\n"
        "job-002    notebook      Running    2026-11-29T11:00:00Z\n"
        "\n"
        "2 jobs\n"
        "Showing 2 of 2 jobs. Use --page 2 --page-size 20 for more.\n"
    ),
    "whitespace, a total aligned into the columns": (
        "ID         STATUS     GPUS\njob-001    Creating   4\njob-002    Running    1\nTotal      2\nPage 1/1\n"
    ),
    "whitespace, a hint that runs across the columns": (
        "ID       STATUS    NAME\n"
        "job-001  Creating  a\n"
        "job-002  Running   b\n"
        "(use cosmicac jobs list --page 2 to see more)\n"
    ),
    "unicode box, a title row spanning the table and a footer row": (
        "┌──────────────────────────────┐\n"
        "│ Jobs (page 1 of 1)           │\n"
        "├──────────┬──────────┬────────┤\n"
        "│ ID       │ Status   │ GPUs   │\n"
        "├──────────┼──────────┼────────┤\n"
        "│ job-001  │ Creating │ 4      │\n"
        "│ job-002  │ Running  │ 1      │\n"
        "├──────────┴──────────┴────────┤\n"
        "│ 2 jobs                       │\n"
        "└──────────────────────────────┘\n"
    ),
    "unicode box, total inside the columns": (
        "╭──────────┬──────────╮\n"
        "│ ID       │ Status   │\n"
        "├──────────┼──────────┤\n"
        "│ job-001  │ Creating │\n"
        "│ job-002  │ Running  │\n"
        "├──────────┼──────────┤\n"
        "│ Total:   │ 2        │\n"
        "╰──────────┴──────────╯\n"
        "Showing 2 of 2 jobs\n"
    ),
    "markdown pipe table and a psql-style count": (
        "| ID | STATUS | NAME |\n"
        "|----|--------|------|\n"
        "| job-001 | Creating | a |\n"
        "| job-002 | Running | b |\n"
        "(2 rows)\n"
    ),
    "ascii box with a count row": (
        "+---------+----------+\n"
        "| id      | state    |\n"
        "+---------+----------+\n"
        "| job-001 | Creating |\n"
        "| job-002 | Running  |\n"
        "+---------+----------+\n"
        "| 2 items | …        |\n"
        "+---------+----------+\n"
    ),
    "JSON with paging keys": json.dumps(
        {
            "jobs": [{"id": "job-001", "status": "Creating"}, {"id": "job-002", "status": "Running"}],
            "total": 2,
            "page": 1,
            "pageSize": 20,
        }
    ),
    "JSON Lines": '{"id": "job-001", "status": "Creating"}\n{"id": "job-002", "status": "Running"}\n',
    "JSON with a summary object among the jobs": json.dumps(
        [{"id": "job-001", "status": "Creating"}, {"id": "job-002", "status": "Running"}, {"total": 2}]
    ),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_only_rows_that_are_jobs_become_jobs(shape: str) -> None:
    jobs = parse_jobs(SHAPES[shape], NOW)
    assert [(j.id, j.status) for j in jobs] == [("job-001", "Creating"), ("job-002", "Running")]


@pytest.mark.parametrize(
    "out",
    [
        "No jobs found.\n",
        "You have no jobs.\n",
        "No resources found in cosmicac namespace.\n",
        "ID   STATUS   NAME\n(no jobs)\n",
        "ID   STATUS   NAME\n0 jobs\n",
        "┌────┬────────┐\n│ ID │ Status │\n├────┼────────┤\n│ No jobs     │\n└─────────────┘\n",
        '{"jobs": [], "total": 0}',
    ],
)
def test_empty_lists_have_no_jobs(out: str) -> None:
    assert parse_jobs(out, NOW) == []


def test_ids_that_start_like_footer_words_are_still_jobs() -> None:
    out = "ID            STATUS\npage-1        Running\nnext-gen-7    Creating\ntotal-3       Running\n"
    assert [j.id for j in parse_jobs(out, NOW)] == ["page-1", "next-gen-7", "total-3"]


def test_unknown_and_empty_status_are_shown_as_unknown() -> None:
    out = "ID        STATUS     NAME\njob-001   Pulling    a\njob-002              b\n"
    jobs = parse_jobs(out, NOW)
    assert [(j.id, shown_status(j.status)) for j in jobs] == [("job-001", "Pulling"), ("job-002", "unknown")]
    sets = StatusSets()
    assert [sets.classify(j.status) for j in jobs] == ["unknown", "unknown"]
    custom = StatusSets.of(["Creating"], ["Pulling", "Running"], ["Failed"])
    assert custom.classify("pulling") == "done" and custom.classify("Starting") == "unknown"


# -- the verdict ---------------------------------------------------------------------------------

RESTART = NOW - timedelta(minutes=5)


def _job(jid: str, status: str, *, updated: int | None = None, created: datetime | None = None) -> Job:
    return Job(jid, status, created or NOW, updated=None if updated is None else NOW + timedelta(seconds=updated))


def test_the_issue_phantom_count_line_never_confirms() -> None:
    """'4 jobs' under the table changed to '5 jobs' when a job was created: it was taken for a
    new job that left Creating while the real one was still Creating."""
    watch = JobWatch(RESTART)
    table = "ID        STATUS     CREATED\n{rows}\n{n} jobs\nShowing {n} of {n} jobs…\n"
    old = "\n".join(f"job-00{i}   Running    2026-11-29T10:00:00Z" for i in range(1, 5))
    states = [watch.observe(parse_jobs(table.format(rows=old, n=4), NOW)).state]
    new = old + "\njob-100   Creating   2026-11-29T14:59:00Z"
    for _ in range(3):
        jobs = parse_jobs(table.format(rows=new, n=5), NOW)
        assert [j.id for j in jobs][-1] == "job-100" and len(jobs) == 5
        states.append(watch.observe(jobs).state)
    assert states == ["waiting", "creating", "creating", "creating"]


def test_unknown_status_never_counts_as_left_creating() -> None:
    watch = JobWatch(RESTART, statuses=StatusSets())
    for i in range(4):
        v = watch.observe([_job("job-100", "Provisioning", updated=i)])
        assert v.state == "unknown" and "[jobs] done_statuses" in v.message
    v = watch.observe([_job("job-100", "", updated=9)])
    assert v.state == "unknown" and "no status" in v.message


def test_confirmed_needs_two_lists_and_updates_and_is_withdrawn_when_the_job_goes_back() -> None:
    watch = JobWatch(RESTART)
    assert watch.observe([_job("a", "Creating", updated=0)]).state == "creating"
    assert watch.observe([_job("a", "Running", updated=1)]).state == "left"
    assert watch.observe([_job("a", "Running", updated=1)]).state == "left"  # no update: not yet
    assert watch.observe([_job("a", "Running", updated=2)]).state == "confirmed"
    # Once confirmed, a list showing it unchanged (same second, same status) keeps the verdict:
    # it was withdrawn ("is Running now: … no longer holds") and confirmed again a list later.
    v = watch.observe([_job("a", "Running", updated=2)])
    assert v.state == "confirmed" and watch.confirmed is not None and watch.withdrawn is None, v
    v = watch.observe([_job("a", "Creating", updated=3)])
    assert v.state == "withdrawn" and "went back to Creating" in v.message and watch.confirmed is None


@pytest.mark.parametrize(
    ("then", "words"),
    [([], "is no longer in the jobs list"), ([_job("a", "Failed", updated=9)], "is Failed now")],
)
def test_a_confirmed_job_that_disappears_or_fails_withdraws_the_verdict(then: list[Job], words: str) -> None:
    watch = JobWatch(RESTART)
    watch.observe([_job("a", "Running", updated=1)])
    assert watch.observe([_job("a", "Running", updated=2)]).state == "confirmed"
    v = watch.observe(then)
    assert v.state == "withdrawn" and words in v.message
    # … and a later list that holds again confirms again (derived anew every time).
    watch.observe([_job("a", "Running", updated=10)])
    assert watch.observe([_job("a", "Running", updated=11)]).state == "confirmed"
