"""Understand `cosmicac jobs list` output, whatever shape it comes in.

The CLI's format is not documented publicly, so we read JSON when it gives JSON and
otherwise aligned-column or box-drawn tables, finding columns by header names. Output we
cannot read raises `JobsFormatError` carrying the raw text, never anything else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


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


def parse_jobs(output: str, now: datetime | None = None) -> list[Job]:
    """Jobs from JSON (array or {"jobs": [...]}) or an aligned / box-drawn table."""
    raise NotImplementedError


def stuck_reason(job: Job, now: datetime, stuck_after: float = 300.0, stale_after: float = 300.0) -> str | None:
    """Why the job looks stuck (long in Creating/Starting, stale last update), else None."""
    raise NotImplementedError


def view_jobs(
    jobs: list[Job],
    now: datetime,
    restart_at: datetime | None = None,
    stuck_after: float = 300.0,
    stale_after: float = 300.0,
) -> list[JobView]:
    raise NotImplementedError
