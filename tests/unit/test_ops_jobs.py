"""`cosmicac jobs list` in every shape we expect: JSON, aligned columns, box-drawn tables."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cosmictui.ops.jobs.model import Job, JobsFormatError, format_age, parse_jobs, parse_when, stuck_reason, view_jobs

NOW = datetime(2026, 11, 29, 15, 0, 0, tzinfo=UTC)


def ids_statuses(jobs: list[Job]) -> list[tuple[str, str]]:
    return [(j.id, j.status) for j in jobs]


def test_json_array_and_object() -> None:
    arr = json.dumps(
        [
            {"id": "job-1", "status": "Creating", "createdAt": "2026-11-29T14:00:00Z", "gpu": 1},
            {"jobId": "job-2", "state": {"phase": "Running"}, "created_at": 1_796_000_000, "lastUpdate": "2m"},
        ]
    )
    jobs = parse_jobs(arr, NOW)
    assert ids_statuses(jobs) == [("job-1", "Creating"), ("job-2", "Running")]
    assert jobs[0].created == datetime(2026, 11, 29, 14, 0, tzinfo=UTC)
    assert jobs[0].fields["gpu"] == "1"
    assert jobs[1].created == datetime.fromtimestamp(1_796_000_000, UTC)
    assert jobs[1].updated == NOW - timedelta(minutes=2)
    obj = parse_jobs(json.dumps({"jobs": [{"ID": "a", "Status": "Running"}], "count": 1}), NOW)
    assert ids_statuses(obj) == [("a", "Running")]
    assert parse_jobs("[]", NOW) == []


def test_aligned_columns_with_spaces_in_headers_and_values() -> None:
    out = (
        "JOB ID      NAME          STATUS     CREATED AT            LAST UPDATE\n"
        "j-8f2a      llama-70b     Creating   2026-11-29 13:00:00   14 minutes ago\n"
        "j-91bc      shell box     Running    2026-11-29 14:58:00   just now\n"
    )
    jobs = parse_jobs(out, NOW)
    assert ids_statuses(jobs) == [("j-8f2a", "Creating"), ("j-91bc", "Running")]
    assert jobs[0].fields["name"] == "llama-70b" and jobs[1].fields["name"] == "shell box"
    assert jobs[0].created == datetime(2026, 11, 29, 13, 0, tzinfo=UTC)
    assert jobs[0].updated == NOW - timedelta(minutes=14)
    assert jobs[1].updated == NOW


def test_aligned_columns_with_empty_cells_and_ages() -> None:
    out = (
        "ID    TYPE       STATUS     AGE\n"
        "j1    inference  Starting   3d4h\n"
        "j2               Running    45s\n"
        "j3    batch job  Completed\n"
    )
    jobs = parse_jobs(out, NOW)
    assert ids_statuses(jobs) == [("j1", "Starting"), ("j2", "Running"), ("j3", "Completed")]
    assert jobs[2].fields["type"] == "batch job" and jobs[2].created is None
    assert jobs[1].fields["type"] == ""
    assert jobs[0].created == NOW - timedelta(days=3, hours=4)
    assert jobs[1].created == NOW - timedelta(seconds=45)


def test_single_space_separated_header_and_ansi_colour() -> None:
    out = "\x1b[1mID STATUS AGE\x1b[0m\nj1 \x1b[33mCreating\x1b[0m 10m\n"
    jobs = parse_jobs(out, NOW)
    assert ids_statuses(jobs) == [("j1", "Creating")]
    assert jobs[0].created == NOW - timedelta(minutes=10)


def test_box_drawn_unicode_table() -> None:
    out = (
        "┌────────┬──────────┬─────────┐\n"
        "│ Job ID │ Status   │ Age     │\n"
        "├────────┼──────────┼─────────┤\n"
        "│ j-1    │ Creating │ 2h      │\n"
        "│ j-2    │ Running  │ 5m      │\n"
        "└────────┴──────────┴─────────┘\n"
    )
    jobs = parse_jobs(out, NOW)
    assert ids_statuses(jobs) == [("j-1", "Creating"), ("j-2", "Running")]
    assert jobs[0].created == NOW - timedelta(hours=2)


def test_box_drawn_ascii_table() -> None:
    out = (
        "+------+-----------+---------------------+\r\n"
        "| id   | state     | created             |\r\n"
        "+======+===========+=====================+\r\n"
        "| 101  | Starting  | 2026-11-29T10:00:00 |\r\n"
        "+------+-----------+---------------------+\r\n"
        "| 102  | Completed | 2026-11-28T10:00:00 |\r\n"
        "+------+-----------+---------------------+\r\n"
    )
    jobs = parse_jobs(out, NOW)
    assert ids_statuses(jobs) == [("101", "Starting"), ("102", "Completed")]
    assert jobs[0].created == datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def test_empty_and_no_jobs_messages() -> None:
    assert parse_jobs("", NOW) == []
    assert parse_jobs("No jobs found.\n", NOW) == []
    assert parse_jobs("ID   STATUS   AGE\n", NOW) == []


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("Error: not logged in\n", "no table header"),
        ('{"jobs": 3}', "without a jobs array"),
        ('[{"id": "a"}]', "no id and status"),
        ("[1, 2]", "not a JSON object"),
        ("[{", "not valid"),
        ("NAME   GPU\nx      1\n", "no table header"),
    ],
)
def test_unknown_formats_raise_with_raw_output(raw: str, words: str) -> None:
    with pytest.raises(JobsFormatError) as err:
        parse_jobs(raw, NOW)
    assert err.value.raw == raw
    assert words in err.value.reason


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_property_any_text_gives_jobs_or_jobs_format_error(raw: str) -> None:
    try:
        jobs = parse_jobs(raw, NOW)
    except JobsFormatError as e:
        assert e.raw == raw
    else:
        assert all(isinstance(j, Job) and j.id for j in jobs)


# Real ids start with a letter or digit and carry a digit (job-001, a UUID); "-" alone is an empty cell.
job_ids = st.from_regex(r"[a-z0-9][a-z0-9-]{0,10}[0-9]", fullmatch=True)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            job_ids,
            st.sampled_from(["Creating", "Running"]),
        ),
        max_size=8,
    )
)
@example(rows=[("0of0", "Creating")])  # found by this test in a suite run: once read as an "N of M" footer
@example(rows=[("2of3-7", "Running"), ("12", "Creating")])
def test_property_aligned_tables_round_trip(rows: list[tuple[str, str]]) -> None:
    width = max([len(r[0]) for r in rows] + [6]) + 2
    out = "JOB ID".ljust(width) + "STATUS\n" + "".join(i.ljust(width) + s + "\n" for i, s in rows)
    assert ids_statuses(parse_jobs(out, NOW)) == rows


def test_parse_when_variants() -> None:
    assert parse_when("1h30m", NOW) == NOW - timedelta(minutes=90)
    assert parse_when("an hour ago", NOW) == NOW - timedelta(hours=1)
    assert parse_when("2 days, 3 hours ago", NOW) == NOW - timedelta(days=2, hours=3)
    assert parse_when("1796000000000", NOW) == datetime.fromtimestamp(1_796_000_000, UTC)
    assert parse_when("2026-11-29T14:00:00+01:00", NOW) == datetime(2026, 11, 29, 13, 0, tzinfo=UTC)
    absurd = ("99999999999999999999", "1" + "0" * 30 + " days", "9" * 400 + "s", "10000000000 years")
    for unknown in ("<none>", "-", "soon", "5 parsecs", *absurd):
        assert parse_when(unknown, NOW) is None


def test_stuck_and_before_restart() -> None:
    restart = NOW - timedelta(minutes=10)
    old = Job("old", "Creating", NOW - timedelta(hours=2))
    new = Job("new", "Creating", NOW - timedelta(minutes=1))
    stale = Job("stale", "Running", NOW - timedelta(hours=1), updated=NOW - timedelta(minutes=30))
    fine = Job("fine", "Running", NOW - timedelta(hours=1), updated=NOW - timedelta(seconds=20))
    done = Job("done", "Completed", NOW - timedelta(days=1), updated=NOW - timedelta(days=1))
    assert stuck_reason(old, NOW) == "Creating for 2h"
    assert stuck_reason(new, NOW) is None
    assert stuck_reason(stale, NOW) == "no status update for 30m"
    assert stuck_reason(fine, NOW) is None and stuck_reason(done, NOW) is None
    views = {v.job.id: v for v in view_jobs([old, new, stale, fine, done], NOW, restart)}
    assert views["old"].before_restart and not views["new"].before_restart
    assert views["new"].age == 60.0
    assert views["old"].stuck and views["stale"].stuck and not views["fine"].stuck
    assert format_age(3 * 86400 + 4 * 3600) == "3d4h" and format_age(59) == "59s"


cell_text = st.text("abcdefghijklmnopqrstuvwxyz0123456789-. :", max_size=14).map(str.strip)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(job_ids, st.sampled_from(["Creating", "Starting", "Running"]), cell_text), max_size=6),
    st.sampled_from(["unicode", "ascii"]),
)
def test_property_box_tables_round_trip(rows: list[tuple[str, str, str]], style: str) -> None:
    header = ("Job ID", "Status", "Name")
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    v, h, c = ("│", "─", "┼") if style == "unicode" else ("|", "-", "+")

    def line(cells: tuple[str, ...]) -> str:
        return v + v.join(f" {x.ljust(w)} " for x, w in zip(cells, widths, strict=True)) + v

    rule = c + c.join(h * (w + 2) for w in widths) + c
    out = "\n".join([rule, line(header), rule, *(line(r) for r in rows), rule]) + "\n"
    jobs = parse_jobs(out, NOW)
    assert [(j.id, j.status, j.fields["name"]) for j in jobs] == rows


numbers_with_units = st.builds(
    lambda n, unit: f"{n}{unit}",
    st.one_of(st.integers(0, 10**40), st.floats(allow_nan=True, allow_infinity=True)),
    st.sampled_from(["", "s", "m", "h", " days", " years ago", "ms", "d4h", "Z"]),
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40), numbers_with_units))
def test_property_parse_when_never_raises(text: str) -> None:
    when = parse_when(text, NOW)
    assert when is None or when.tzinfo is not None
