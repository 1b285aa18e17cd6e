"""The words every use case shares: a check's result, and what a job's printed status means.

A foundation (it imports nothing of cosmictui): the settings (`config`) need the status sets,
and the prerequisite checks, step 2's use case, the probe and the screens all speak in
`CheckResult`s, so neither may live inside one use case.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class CheckResult:
    """One check: what it is, ok/warn/fail, what was seen, and how to fix it."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "fail"


STUCK_STATUSES = frozenset({"creating", "starting", "pending"})
#: Statuses that say the job got past Creating and is healthy (running, or finished well).
DONE_STATUSES = frozenset({"running", "ready", "active", "completed", "succeeded", "stopped"})
#: Statuses that say the job got past Creating but failed or is gone.
FAILED_STATUSES = frozenset(
    {"failed", "error", "errored", "crashloopbackoff", "deleted", "terminated", "cancelled", "canceled"}
)

#: Done or failed for good: a quiet job in one of these is finished, not stale.
FINISHED_STATUSES = frozenset({"completed", "succeeded", "stopped"}) | FAILED_STATUSES

StatusClass = Literal["stuck", "done", "failed", "unknown"]


@dataclass(frozen=True)
class StatusSets:
    """Which printed statuses mean stuck, done (left Creating) or failed; any other is unknown.

    Only "Creating" and "Starting" are documented for CosmicAC, so the sets are configurable
    (`[jobs] stuck_statuses`, `done_statuses`, `failed_statuses`) and an unknown status never
    counts as having left Creating.
    """

    stuck: frozenset[str] = STUCK_STATUSES
    done: frozenset[str] = DONE_STATUSES
    failed: frozenset[str] = FAILED_STATUSES

    @classmethod
    def of(cls, stuck: Iterable[str], done: Iterable[str], failed: Iterable[str]) -> StatusSets:
        return cls(*(frozenset(_norm_status(x) for x in names) for names in (stuck, done, failed)))

    def classify(self, status: str) -> StatusClass:
        st = _norm_status(status)
        if not st:
            return "unknown"
        if st in self.stuck:
            return "stuck"
        if st in self.failed:
            return "failed"
        if st in self.done:
            return "done"
        return "unknown"


def _norm_status(status: str) -> str:
    return re.sub(r"\s+", " ", status.strip().lower())
