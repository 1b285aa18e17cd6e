"""Understand `cosmicac jobs list` output, whatever shape it comes in.

The CLI's format is not documented publicly, so we read JSON when it gives JSON and
otherwise aligned-column, pipe or box-drawn tables, finding columns by header names. Only a
row that is a job becomes a `Job`: it has an id token in the id column and sits in the table's
columns. Titles, totals (`4 jobs`), paging hints (`Showing 2 of 2 jobs`, `Page 1/3`) and "no
jobs" lines are never jobs, whatever the shape. Output we cannot read raises `JobsFormatError`
carrying the raw text, never anything else.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

# the status words are shared with the settings: a foundation
from cosmictui.ops.vocabulary import (
    DONE_STATUSES,
    FAILED_STATUSES,
    FINISHED_STATUSES,
    STUCK_STATUSES,
    StatusClass,
    StatusSets,
    _norm_status,
)

__all__ = ["DONE_STATUSES", "FAILED_STATUSES", "FINISHED_STATUSES", "STUCK_STATUSES", "StatusClass", "StatusSets"]


class JobsFormatError(ValueError):
    """`cosmicac jobs list` printed something we cannot read; `raw` is what it printed."""

    def __init__(self, reason: str, raw: str) -> None:
        self.reason = reason
        self.raw = raw
        super().__init__(f"cannot read the jobs list: {reason}")


@dataclass(frozen=True)
class Job:
    """One job; `fields` keeps every column/key as printed (lower-cased names)."""

    id: str
    status: str
    created: datetime | None = None
    fields: dict[str, str] = field(default_factory=dict)
    updated: datetime | None = None


@dataclass(frozen=True)
class JobView:
    """A job as the wizard shows it: age, whether it predates the restart, why it is stuck."""

    job: Job
    age: float | None
    before_restart: bool
    stuck: str | None


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_BOX_RULE = re.compile(r"^[\s+\-=─━═┌┐└┘├┤┬┴┼╔╗╚╝╠╣╦╩╬╒╕╘╛╞╡╤╧╪╓╖╙╜╟╢╥╨╫┏┓┗┛┣┫┳┻╋:|]*$")
_CELL_SEP = re.compile(r"[│┃║|]")

ID_NAMES = ("id", "job id", "jobid", "job", "uuid", "job uuid")
STATUS_NAMES = ("status", "state", "phase", "job status")
CREATED_NAMES = ("created", "created at", "creation time", "creation timestamp", "submitted", "started", "age")
UPDATED_NAMES = (
    "updated",
    "updated at",
    "last update",
    "last updated",
    "last seen",
    "last communication",
    "last heartbeat",
    "heartbeat",
    "last contact",
)


def shown_status(status: str) -> str:
    """The status as printed, or `unknown` for an empty cell."""
    return status.strip() or "unknown"


def _norm(name: str) -> str:
    """Header/key name as compared: camelCase split, lower, `_`/`-` as spaces."""
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name.strip())
    return re.sub(r"[\s_\-.]+", " ", name).strip().lower()


# Lines around a table that are not jobs: counts, totals, paging hints, "no jobs" messages.
_NOT_A_JOB = re.compile(
    r"""(?ix)^\W*(
        (total|count|sum|summary|showing|displaying|listing|listed|found|page|pages|results?|rows?|
         more|next|previous|prev|use|hint|note|tip|warning|info|no|none|nothing|end)(?![\w.-])
      | \d+\s*/\s*\d+(?![\w./-]) | \d+\s+of\s+\d+(?![\w./-])
      | \d+\s+(jobs?|items?|rows?|results?|entries|records|total|more)\b
      | \(\d+\s+\w+\)
      | \.\.\.|…
    )"""
)
_NO_JOBS = re.compile(r"(?i)\b(no|0|zero)\s+(\w+\s+)?(jobs?|resources?|items?|results?|entries)\b")
_ID_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/@+#-]*")


def parse_jobs(output: str, now: datetime | None = None) -> list[Job]:
    """Jobs from JSON (array, {"jobs": [...]} or one object a line) or a table of any shape."""
    now = now or datetime.now(UTC)
    if not isinstance(output, str):
        raise JobsFormatError(f"expected text, got {type(output).__name__}", repr(output))
    text = _ANSI.sub("", output).replace("\r\n", "\n").replace("\r", "\n")
    stripped = text.strip()
    if not stripped:
        return []
    if stripped[0] in "[{":
        return _parse_json(stripped, output, now)
    rows = _table_rows(text, output)
    if rows is None:
        return []  # only a "no jobs" message
    return _jobs_from_rows(rows, output, now)


def _parse_json(text: str, raw: str, now: datetime) -> list[Job]:
    try:
        data = json.loads(text)
    except ValueError as e:
        lines = [line for line in text.splitlines() if line.strip()]
        try:  # JSON Lines: one job object per line
            data = [json.loads(line) for line in lines] if len(lines) > 1 else None
        except ValueError:
            data = None
        if data is None:
            raise JobsFormatError(f"looks like JSON but is not valid ({e})", raw) from None
    if isinstance(data, dict):
        for key in ("jobs", "items", "data", "results"):
            if isinstance(data.get(key), list):
                data = data[key]
                break
        else:
            raise JobsFormatError('JSON object without a jobs array (expected {"jobs": [...]})', raw)
    if not isinstance(data, list):
        raise JobsFormatError('JSON is neither an array of jobs nor {"jobs": [...]}', raw)
    rows: list[dict[str, str]] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise JobsFormatError(f"job {i} is not a JSON object", raw)
        row: dict[str, str] = {}
        for key, value in item.items():
            if isinstance(value, dict) and _norm(str(key)) in STATUS_NAMES:
                value = next((value[k] for k in ("phase", "state", "status") if k in value), json.dumps(value))
            if value is None:
                value = ""
            row[_norm(str(key))] = value if isinstance(value, str) else json.dumps(value)
        rows.append(row)
    return _jobs_from_rows(rows, raw, now, from_json=True)


def _table_rows(text: str, raw: str) -> list[dict[str, str]] | None:
    """The table's body rows as {column: cell}; lines outside the columns are dropped.

    None when there is no table but a "no jobs" message.
    """
    lines = [line for line in text.split("\n") if line.strip()]
    boxed = any(_CELL_SEP.search(line) for line in lines) and any(
        _BOX_RULE.match(line) and re.search(r"[─━═+\-]{3}", line) for line in lines
    )
    if boxed or sum(1 for line in lines if _CELL_SEP.search(line)) >= 2:
        cells = [
            [c.strip() for c in _strip_outer(_CELL_SEP.split(line))]
            for line in lines
            if not _BOX_RULE.match(line) and _CELL_SEP.search(line)
        ]
        header_at = next((i for i, row in enumerate(cells) if _has_header("", row)), None)
        if header_at is None:
            if any(_NO_JOBS.search(line) for line in lines):
                return None
            raise JobsFormatError("a table without a header naming an id and a status column", raw)
        header = [_norm(h) for h in cells[header_at]]
        # A row with another number of cells spans the table (a title, a total): not a job.
        return [dict(zip(header, row, strict=True)) for row in cells[header_at + 1 :] if len(row) == len(header)]
    header_at = next((i for i, line in enumerate(lines) if _has_header(line)), None)
    if header_at is None:
        if any(_NO_JOBS.search(line) for line in lines):
            return None
        raise JobsFormatError("no table header with an id and a status column, and not JSON", raw)
    header_line = lines[header_at]
    spans = [(m.start(), m.group()) for m in re.finditer(r"\S+(?: \S+)*", header_line)]
    aligned = len(spans) > 1 and _has_header(header_line, [n for _, n in spans])
    if not aligned:
        spans = [(m.start(), m.group()) for m in re.finditer(r"\S+", header_line)]
    names = [_norm(n) for _, n in spans]
    starts = [p for p, _ in spans]
    rows = []
    for line in lines[header_at + 1 :]:
        if _BOX_RULE.match(line):
            continue
        if not aligned:  # single-space separated: only the last column may hold spaces
            parts = line.split(None, len(names) - 1)
        else:
            parts = re.split(r"\s{2,}", line.strip())
            if len(parts) != len(names):  # empty cells: cut at the header's column starts
                if not _fits_columns(line, starts):
                    continue  # a line that runs across the columns: a note or a hint, not a row
                bounds = [*starts[1:], None]
                parts = [line[starts[i] : bounds[i]].strip() for i in range(len(names))]
        rows.append(dict(zip(names, parts, strict=False)))
    return rows


def _fits_columns(line: str, starts: list[int]) -> bool:
    """Whether cutting `line` at the column starts cuts no word in two."""
    return all(p >= len(line) or line[p - 1] == " " or line[p] == " " for p in starts[1:])


def _strip_outer(parts: list[str]) -> list[str]:
    if parts and not parts[0].strip():
        parts = parts[1:]
    if parts and not parts[-1].strip():
        parts = parts[:-1]
    return parts


def _has_header(line: str, names: list[str] | None = None) -> bool:
    if names is None:
        names = re.split(r"\s{2,}", line.strip())
        if len(names) == 1:
            names = line.split()
    normed = {_norm(n) for n in names}
    return bool(normed & set(ID_NAMES)) and bool(normed & set(STATUS_NAMES))


def _pick(row: dict[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        if name in row:
            return row[name]
    return None


def is_job_row(row: dict[str, str]) -> bool:
    """A row is a job when its id cell is one id token and it is not a total, hint or title."""
    job_id = (_pick(row, ID_NAMES) or "").strip()
    if not _ID_TOKEN.fullmatch(job_id):
        return False
    others = [v for k, v in row.items() if k not in ID_NAMES and str(v).strip()]
    if not others:
        return False  # a lone word under the id column ("Total", "more") says nothing about a job
    line = " ".join(str(v) for v in row.values() if str(v).strip())
    return not _NOT_A_JOB.match(line)


def _jobs_from_rows(rows: list[dict[str, str]], raw: str, now: datetime, from_json: bool = False) -> list[Job]:
    jobs: list[Job] = []
    for row in rows:
        job_id = _pick(row, ID_NAMES)
        status = _pick(row, STATUS_NAMES)
        if job_id is None or status is None:
            if from_json and any(_pick(r, ID_NAMES) is not None and _pick(r, STATUS_NAMES) is not None for r in rows):
                continue  # one odd object among jobs (a summary entry): not a job
            what = "object" if from_json else "table"
            raise JobsFormatError(f"the {what} has no id and status (found: {', '.join(row) or 'nothing'})", raw)
        if not job_id.strip():
            continue  # a wrapped continuation line of a box-drawn cell
        if not (from_json or is_job_row(row)):
            continue
        created_raw = _pick(row, CREATED_NAMES)
        updated_raw = _pick(row, UPDATED_NAMES)
        jobs.append(
            Job(
                id=job_id.strip(),
                status=status.strip(),
                created=parse_when(created_raw, now) if created_raw else None,
                fields=dict(row),
                updated=parse_when(updated_raw, now) if updated_raw else None,
            )
        )
    return jobs


_UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hr": 3600, "hour": 3600}
_UNITS |= {"d": 86400, "day": 86400, "w": 604800, "week": 604800, "y": 31536000, "year": 31536000}


def parse_when(value: str, now: datetime) -> datetime | None:
    """A timestamp (ISO 8601, unix seconds/ms) or an age (`5m`, `3d4h`, `5 minutes ago`); None if unreadable."""
    try:
        return _parse_when(value, now)
    except (OverflowError, OSError, ValueError):  # absurd numbers: out of datetime's range
        return None


def _parse_when(value: str, now: datetime) -> datetime | None:
    v = value.strip().strip('"')
    low = v.lower()
    if not v or low in ("-", "<none>", "n/a", "none", "never", "null", "unknown"):
        return None
    if low in ("just now", "now"):
        return now
    if re.fullmatch(r"\d{9,}(\.\d+)?", v):
        ts = float(v)
        return datetime.fromtimestamp(ts / 1000 if ts > 1e12 else ts, UTC)
    try:
        when = datetime.fromisoformat(v.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        pass
    else:
        return when if when.tzinfo else when.replace(tzinfo=UTC)
    rel = re.sub(r"\s+ago$", "", low)
    rel = re.sub(r"^(an?|one)\s+", "1 ", rel)
    if not re.fullmatch(r"(?:\d+(?:\.\d+)?\s*[a-z]+[\s,]*)+", rel):
        return None
    total = 0.0
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]+)", rel):
        factor = _UNITS.get(unit) or (_UNITS.get(unit[:-1]) if unit.endswith("s") else None)
        if factor is None:
            return None
        total += float(amount) * factor
    return now - timedelta(seconds=total)


def format_age(seconds: float | None) -> str:
    """Compact age like kubectl: `45s`, `12m`, `3h5m`, `2d4h`."""
    if seconds is None:
        return "?"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60}m" if s % 3600 >= 60 else f"{s // 3600}h"
    return f"{s // 86400}d{(s % 86400) // 3600}h" if s % 86400 >= 3600 else f"{s // 86400}d"


def stuck_reason(
    job: Job, now: datetime, stuck_after: float = 300.0, stale_after: float = 300.0, statuses: StatusSets | None = None
) -> str | None:
    """Why the job looks stuck (long in Creating/Starting, stale last update), else None."""
    sets = statuses or StatusSets()
    kind = sets.classify(job.status)
    if kind == "failed" or _norm_status(job.status) in FINISHED_STATUSES:
        return None
    if kind == "stuck" and job.created is not None:
        age = (now - job.created).total_seconds()
        if age >= stuck_after:
            return f"{job.status} for {format_age(age)}"
    if job.updated is not None:
        quiet = (now - job.updated).total_seconds()
        if quiet >= stale_after:
            return f"no status update for {format_age(quiet)}"
    return None


def view_jobs(
    jobs: list[Job],
    now: datetime,
    restart_at: datetime | None = None,
    stuck_after: float = 300.0,
    stale_after: float = 300.0,
    statuses: StatusSets | None = None,
) -> list[JobView]:
    """Each job with its age, whether it predates the worker restart, and why it is stuck."""
    views = []
    for job in jobs:
        age = (now - job.created).total_seconds() if job.created else None
        before = restart_at is not None and job.created is not None and job.created < restart_at
        views.append(JobView(job, age, before, stuck_reason(job, now, stuck_after, stale_after, statuses)))
    return views
