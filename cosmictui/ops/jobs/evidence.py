"""Whether the relay carried *this* job's connection: the verdict rule.

The relay's totals (sessions, pairings, bytes) move for any traffic: the wizard's own probe, an
older job re-pairing after a restart. So the verdict stands on the relay's record of its
pairings (`/pairings`, `ops.metrics.pairings`) and names the pairing that is the job's.

The rule (`attribute`, the same words in docs/operator-guide.md): the relay carried the job's
connection only when its record holds a pairing that

  1. opened after the window opened: after the test job's create command started and after the
     last worker restart;
  2. has neither peer among the keys this machine's probes used (the wizard's, `relay probe`'s,
     the monitor's: `progress.probe_keys`);
  3. has at least one peer whose key the relay first saw after the job was created.

A relay restarted after the window opened (its record starts later), a record that cannot be
read or comes from another relay, and a record that overflowed where it matters (pairings of the
window evicted, or peer keys forgotten so an old key could look new) are "cannot tell", never
proven. Every other outcome is named with what to check: nothing paired (not through this
relay), only the probe paired, only keys the relay knew before paired (older jobs re-pairing),
and the `.env` no longer listing the relay. Whether the job left Creating is the job watch's
part (`ops.setup.steps.JobWatch`); the verify use case (`ops.jobs.verify`) needs both.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from cosmictui.ops.metrics.client import MetricsError
from cosmictui.ops.metrics.pairings import PairingRecord, PairingSeen

# -- the verdict rule: the job's own pairing ----------------------------------------------------

AttributionKind = Literal["proven", "cannot-tell", "not-relayed", "probe-only", "older-only", "env-dropped"]

#: What to check, per outcome (said under the verdict).
CHECKS: dict[str, str] = {
    "not-relayed": "What to check: the relays variable the worker runs with (did step 4 apply this .env?), "
    "that the job got the key, and that the job VMs reach the relay's UDP port; or the job connected directly.",
    "probe-only": "What to check: the relays variable the worker runs with (did step 4 apply this .env?); "
    "the probe's own pairings prove the relay works, not that the job used it.",
    "older-only": "What to check: the relays variable the worker runs with (did step 4 apply this .env?) and "
    "whether the job connected directly; the pairings since were older jobs reconnecting.",
    "env-dropped": "What to check: the .env's relays variable (step 3 puts this relay's key back), then apply "
    "and restart (step 4) and verify with a new job.",
}


@dataclass(frozen=True)
class Window:
    """Which pairings can be the job's: opened after `opened_at`, with a peer first seen after
    `job_since`, and no peer in `probe_keys`. `relay_key`: the relay the record must come from."""

    opened_at: float
    job_since: float
    relay_key: str | None
    probe_keys: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Attribution:
    """What the relay's record says about the job's connection."""

    kind: AttributionKind
    #: one sentence: what the record shows (the status line builds on it)
    reason: str
    #: what to check ("" when proven)
    check: str = ""
    #: the job's pairing (proven, or relayed while the .env no longer lists the relay)
    pairing: PairingSeen | None = None
    #: evidence lines: the job's pairing (when, bytes) or what the window held
    lines: tuple[str, ...] = ()
    #: the case in a few words, to follow "Job X left Creating (Running), " on a status line
    short: str = ""

    def __post_init__(self) -> None:
        if self.kind == "cannot-tell" and not self.lines:
            object.__setattr__(self, "lines", (self.reason,))  # shown under the jobs while the job is watched

    @property
    def proven(self) -> bool:
        return self.kind == "proven"

    def as_json(self) -> dict[str, Any]:
        p = self.pairing
        return {
            "kind": self.kind,
            "reason": self.reason,
            "check": self.check or None,
            "lines": list(self.lines),
            "pairing": None
            if p is None
            else {
                "id": p.id,
                "opened_at": p.opened_at,
                "closed_at": p.closed_at,
                "bytes": p.bytes,
                "peers": [{"key": s.key, "first_seen_at": s.first_seen_at, "bytes": s.bytes} for s in p.peers],
            },
        }


def clock(ts: float | None) -> str:
    """HH:MM:SS in local time (the operator's clock, as the rest of the screens show times)."""
    return "?" if ts is None else datetime.fromtimestamp(ts).strftime("%H:%M:%S")


def pairing_line(p: PairingSeen, since: float) -> str:
    """The job's pairing in one line: when it opened (and relative to the window), bytes, open or closed."""
    from cosmictui.ops.metrics.client import human_bytes

    sent = [human_bytes(s.bytes) if s.bytes is not None else "? B" for s in p.peers]
    total = human_bytes(p.bytes) if p.bytes is not None else "? B"
    state = (
        "still open"
        if p.closed_at is None and not p.closed_unknown
        else ("closed at " + clock(p.closed_at) if p.closed_at is not None else "open or closed: not known")
    )
    ref = f"#{p.id} " if p.id is not None else ""
    return (
        f"Pairing {ref}opened {clock(p.opened_at)} ({p.opened_at - since:.0f} s after the window opened): "
        f"{total} relayed ({sent[0]} one way, {sent[1]} the other), {state}."
    )


def attribute(
    record: PairingRecord | MetricsError | None, window: Window, env_keys: tuple[str, ...] | None = None
) -> Attribution:
    """Apply the verdict rule (module docstring) to the relay's record: proven, cannot tell, or
    which other case it is. `record` is the MetricsError when it could not be read, None when
    the relay has no metrics address. `env_keys`: what the .env lists now (None: not read)."""
    if record is None:
        return Attribution(
            "cannot-tell",
            "Cannot tell whether the job's connection went through the relay: its metrics are off "
            "([relay] metrics), so its record of pairings cannot be read.",
        )
    if isinstance(record, MetricsError):
        fix = f" ({record.fix})" if record.fix else ""
        return Attribution(
            "cannot-tell",
            f"Cannot tell whether the job's connection went through the relay: its record of pairings "
            f"could not be read: {record.reason}{fix}.",
        )
    if record.relay_key is None or record.started_at is None:
        missing = "its key" if record.relay_key is None else "when it started"
        return Attribution(
            "cannot-tell", f"Cannot tell: the relay's record of pairings does not say {missing} (bad data)."
        )
    if window.relay_key is not None and record.relay_key != window.relay_key:
        return Attribution(
            "cannot-tell",
            f"Cannot tell: the metrics address answers for relay {record.relay_key[:12]}…, not this relay "
            f"{window.relay_key[:12]}… (check [relay] metrics and which relay runs there).",
        )
    if record.started_at > window.opened_at:
        return Attribution(
            "cannot-tell",
            f"Cannot tell: the relay restarted at {clock(record.started_at)}, after the window opened at "
            f"{clock(window.opened_at)}, so its record of the job's first connection is gone. Verify with a new job.",
        )
    in_window = [p for p in record.pairings if p.opened_at > window.opened_at]
    not_probe = [p for p in in_window if not (p.keys & window.probe_keys)]
    new_key = [
        p for p in not_probe if any(s.first_seen_at is not None and s.first_seen_at > window.job_since for s in p.peers)
    ]
    env_dropped = env_keys is not None and window.relay_key is not None and window.relay_key not in env_keys
    listed = ", ".join(k[:12] + "…" for k in (env_keys or ())) or "no relay"
    if new_key:
        job = min(new_key, key=lambda p: p.opened_at)  # the job's first connection
        line = pairing_line(job, window.opened_at)
        if record.keys_evicted is None or record.keys_evicted > 0:
            forgot = "an unknown number of" if record.keys_evicted is None else f"{record.keys_evicted}"
            return Attribution(
                "cannot-tell",
                f"Cannot tell: a pairing with a key the relay first saw after the job was created opened at "
                f"{clock(job.opened_at)}, but the relay forgot {forgot} peer keys since it started (its key "
                "table is full), so an older job's key can look new.",
                lines=(line,),
            )
        if env_dropped:
            why = (
                f"The job's connection went through this relay, but the .env no longer lists it (it lists "
                f"{listed}): the next apply and restart drops it."
            )
            return Attribution(
                "env-dropped", why, CHECKS["env-dropped"], job, (why, line), "but the .env no longer lists this relay"
            )
        return Attribution(
            "proven", "The relay carried the job's own connection (its pairing below).", pairing=job, lines=(line,)
        )
    hidden = _hidden(record, window)
    if hidden:
        return Attribution("cannot-tell", f"Cannot tell: {hidden}")
    probe = len(in_window) - len(not_probe)
    older = len(not_probe)
    since = clock(window.opened_at)
    seen = (
        f"Since {since}: {len(in_window)} pairing(s) opened through the relay"
        + (f", {probe} of them the wizard's probe" if probe else "")
        + (f", {older} between peers the relay knew before the job was created" if older else "")
        + "."
    )
    if env_dropped:
        why = f"Not through this relay: the .env no longer lists it (it lists {listed})."
        return Attribution(
            "env-dropped", why, CHECKS["env-dropped"], None, (why, seen), "not through this relay (.env dropped it)"
        )
    if older:
        why = (
            "Only older jobs re-paired through the relay since the job was created (keys it knew before), "
            "not the job's own connection."
        )
        return Attribution(
            "older-only",
            why,
            CHECKS["older-only"],
            None,
            (why, seen),
            "not through this relay (only older jobs re-paired)",
        )
    if probe:
        why = "The relay carried only the wizard's probe since the job was created, not the job's connection."
        return Attribution(
            "probe-only", why, CHECKS["probe-only"], None, (why, seen), "not through this relay (only the probe paired)"
        )
    why = "Not through this relay: it saw no pairing since the job was created."
    return Attribution(
        "not-relayed", why, CHECKS["not-relayed"], None, (why, seen), "not through this relay (no pairing)"
    )


def _hidden(record: PairingRecord, window: Window) -> str | None:
    """Why the job's pairing could be in the record without being readable here (None: it could not)."""
    if record.unreadable:
        return f"{record.unreadable} of the relay's pairing records could not be read (bad data); the job's may be one."
    if record.evicted is None:
        return "the relay's record does not say whether it dropped older pairings (bad data)."
    if record.evicted > 0:
        oldest = min((p.opened_at for p in record.pairings), default=None)
        if oldest is None or oldest > window.opened_at:
            kept = record.capacity if record.capacity is not None else len(record.pairings)
            return (
                f"the relay keeps its last {kept} pairings and dropped {record.evicted} older ones, some opened "
                f"after {clock(window.opened_at)}: the job's may be among them."
            )
    return None
