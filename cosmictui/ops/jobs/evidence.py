"""What the relay saw since the worker restart, beside the jobs: evidence for the verdict.

A job leaving Creating says the job works; the relay's own counters say whether it went
through the relay. Counters are cumulative since the relay started, so the wizard keeps a
reading taken at the worker restart (`baseline`) and shows the difference; without one it says
the numbers are since the relay started. Every remote value is untrusted: a counter that is
not a finite number >= 0 is treated as missing.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Literal

from cosmictui.ops.jobs.model import JobView, StatusSets
from cosmictui.ops.metrics.client import MetricsError, Scrape, scrape

COUNTERS = {
    "sessions_opened": "blind_relay_sessions_opened",
    "pairings_matched": "blind_relay_pairings_matched",
    "relayed_bytes": "blind_relay_relayed_bytes_total",
}


def counters(s: Scrape) -> dict[str, float]:
    """The counters that make the evidence, plus the relay's start time (to notice a restart)."""
    out = {name: v for name, metric in COUNTERS.items() if (v := _finite(s.get(metric))) is not None}
    start = _finite(s.get("process_start_time_seconds"))
    if start is not None:
        out["relay_started_at"] = start
    return out


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        return None
    return float(v)


@dataclass(frozen=True)
class RelayEvidence:
    """Sessions, pairings and bytes the relay counted over `since` (None: not known)."""

    reachable: bool
    since: str
    sessions_opened: int | None = None
    pairings_matched: int | None = None
    relayed_bytes: int | None = None
    detail: str = ""

    @property
    def carried(self) -> bool:
        return bool(self.pairings_matched) or bool(self.relayed_bytes)

    @property
    def saw_session(self) -> bool:
        return bool(self.sessions_opened)

    def line(self) -> str:
        """One line for the screen."""
        if not self.reachable:
            return f"Relay: no numbers ({self.detail})."
        from cosmictui.ops.metrics.client import human_bytes

        def n(v: int | None) -> str:
            return "?" if v is None else str(v)

        moved = "?" if self.relayed_bytes is None else human_bytes(self.relayed_bytes)
        return (
            f"Relay {self.since}: {n(self.sessions_opened)} session(s) opened, "
            f"{n(self.pairings_matched)} pairing(s) matched, {moved} relayed."
        )

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def evidence_from(
    now: dict[str, float], baseline: dict[str, float] | None, restart_at: datetime | None
) -> RelayEvidence:
    """Counters now minus the reading at the restart (same relay process), else the raw totals."""
    started = now.get("relay_started_at")
    restart_ts = restart_at.timestamp() if restart_at is not None else None
    same_process = baseline is not None and baseline.get("relay_started_at") == started
    if restart_ts is not None and started is not None and started >= restart_ts:
        base: dict[str, float] = {}
        since = "since the worker restart (it started after it)"
    elif same_process and baseline is not None:
        base = baseline
        since = "since the worker restart"
    else:
        base = {}
        since = "since it started (no reading from the restart)"

    def delta(name: str) -> int | None:
        v = now.get(name)
        return None if v is None else int(max(0.0, v - base.get(name, 0.0)))

    return RelayEvidence(True, since, delta("sessions_opened"), delta("pairings_matched"), delta("relayed_bytes"))


async def relay_evidence(
    metrics_url: str | None, baseline: dict[str, float] | None, restart_at: datetime | None, timeout: float = 2.0
) -> RelayEvidence:
    """Read the relay's metrics now; an unreachable relay is evidence too ("no numbers")."""
    if not metrics_url:
        return RelayEvidence(False, "", detail="the relay's metrics are off: [relay] metrics")
    try:
        s = await scrape(metrics_url, timeout)
    except MetricsError as e:
        return RelayEvidence(False, "", detail=f"{e.url}: {e.reason}")
    return evidence_from(counters(s), baseline, restart_at)


def new_jobs(views: list[JobView], restart_at: datetime | None) -> list[JobView]:
    """Jobs created after the worker restart (none when the restart time is not known)."""
    if restart_at is None:
        return []
    return [v for v in views if v.job.created is not None and v.job.created > restart_at]


def new_job_left_creating(views: list[JobView], restart_at: datetime | None, statuses: StatusSets) -> bool:
    """From one list: a job created after the restart is in a done status (the CLI's one-shot view)."""
    if restart_at is None:
        return False
    return any(
        v.job.created is not None and v.job.created > restart_at and statuses.classify(v.job.status) == "done"
        for v in views
    )


CaseKind = Literal["relayed", "direct", "no-session", "waiting", "unknown"]


def name_case(left_creating: bool, evidence: RelayEvidence, new_job: bool = True) -> tuple[CaseKind, str]:
    """Which of the cases the operator page cares about this is, and what to check.

    `new_job`: a job created after the worker restart is in the list at all.
    """
    if not new_job and not left_creating:
        return "waiting", "No job created after the restart yet: the relay's numbers above tell once there is one."
    if not evidence.reachable:
        return "unknown", "Cannot tell whether the relay carried it: " + evidence.detail + "."
    if left_creating and evidence.carried:
        return "relayed", "A new job left Creating and the relay carried its connections: the relay works."
    if left_creating:
        return (
            "direct",
            "A new job left Creating but the relay saw no pairing: the job connected directly, or the relay "
            "key never reached it (check the relays variable the worker runs with).",
        )
    if evidence.saw_session:
        return "waiting", "The relay saw a session: a job is reaching it. Waiting for the job to leave Creating."
    return (
        "no-session",
        "Still Creating and the relay saw no session: the key did not reach the job (check the .env and that "
        "step 4 ran), or the job VMs cannot reach the relay's UDP port (check the relay host's firewall and "
        "[relay] address).",
    )
