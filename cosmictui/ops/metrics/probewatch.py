"""Probe round trip over time, for a relay the monitor cannot scrape (metrics off, or known by key only).

`ProbeWatch` follows one relay with `watch_probe` (one full probe, then an echo every interval
over the same relayed connection) and keeps what the monitor shows: the round trips as a time
series, the latest one, the relay address the echo went through, and the last failure split
into its stage and reason. It is UI-free: `observe(sample)` is the whole state machine, and
`follow()` is the loop a screen runs in its own task. A failed probe, or a bug in the probe,
becomes a failure sample; nothing here raises into the screen except cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from cosmictui.ops.metrics.probe import PROBE_TIMEOUT, STAGES, ProbeSample, ProbeUsageError, watch_probe

PROBE_INTERVAL = 5.0
"""Seconds between echoes: a few bytes each, so cheap, but a relay is not a ping target."""
ECHO_TIMEOUT = 10.0
"""An echo not back within this is lost (then the relay is probed again from scratch); a
faster interval shortens it (never below 3 s), so a dead relay shows within a few echoes."""


def echo_timeout_for(interval: float) -> float:
    return max(3.0, min(ECHO_TIMEOUT, 5 * interval))


ProbeFn = Callable[..., AsyncIterator[ProbeSample]]


@dataclass(frozen=True)
class ProbeFailure:
    """A failed sample, as the operator needs it: when, at which stage, and why."""

    at: float
    stage: str
    reason: str

    @property
    def text(self) -> str:
        return f"{self.stage}: {self.reason}"


def split_failure(detail: str) -> tuple[str, str]:
    """(stage, reason) of a failed sample's detail: a probe stage named by `run_probe`, or the
    echo over the kept connection."""
    for stage in STAGES:
        if detail.startswith(stage + ": "):
            return stage, detail[len(stage) + 2 :]
    if detail.startswith("echo lost: "):
        return "echo", f"not back ({detail[len('echo lost: ') :]})"
    if detail.startswith("echo "):
        return "echo", detail[len("echo ") :]
    if detail == "not relayed":
        return "bytes and round trip", "the connection did not go through the relay"
    return "probe", detail


@dataclass
class ProbeWatch:
    """One relay's probe samples over time."""

    relay_key: str
    bootstrap: list[str] | None = None
    interval: float = PROBE_INTERVAL
    timeout: float = PROBE_TIMEOUT
    echo_timeout: float | None = None
    """default: `echo_timeout_for(interval)`"""
    history_len: int = 720
    rtt: deque[tuple[float, float]] = field(default_factory=deque)
    """(wall time, round trip in ms) of each good sample"""
    failed_at: deque[float] = field(default_factory=deque)
    """wall time of each failed sample, so the graph marks the gaps"""
    last: ProbeSample | None = None
    last_ok: ProbeSample | None = None
    last_failure: ProbeFailure | None = None
    ok_count: int = 0
    failed_count: int = 0
    started: float | None = None
    """wall time `follow` began (the first probe is under way until a sample lands)"""
    stopped: str | None = None
    """why probing stopped for good (a key or bootstrap address that can never work)"""

    def __post_init__(self) -> None:
        self.rtt = deque(self.rtt, maxlen=self.history_len)
        self.failed_at = deque(self.failed_at, maxlen=self.history_len)
        if self.echo_timeout is None:
            self.echo_timeout = echo_timeout_for(self.interval)

    # -- sans-IO core -------------------------------------------------------------------------
    def observe(self, s: ProbeSample) -> bool:
        """Take one sample; True when the row changed in a way worth a redraw (always: each
        sample is a new point or a new failure)."""
        self.last = s
        if s.ok:
            self.ok_count += 1
            self.last_ok = s
            if s.rtt_ms is not None:
                self.rtt.append((s.at, float(s.rtt_ms)))
        else:
            self.failed_count += 1
            self.failed_at.append(s.at)
            stage, reason = split_failure(s.detail)
            self.last_failure = ProbeFailure(s.at, stage, reason)
        return True

    @property
    def ok(self) -> bool | None:
        """Did the latest sample come back through the relay (None: no sample yet)."""
        return None if self.last is None else self.last.ok

    @property
    def latest_rtt_ms(self) -> float | None:
        return self.rtt[-1][1] if self.rtt else None

    @property
    def relay_address(self) -> str | None:
        """Where the last relayed connection went (the relay's host:port as the DHT gave it)."""
        for s in (self.last, self.last_ok):
            if s is not None and s.relay_address:
                return s.relay_address
        return None

    def summary(self) -> str:
        """A table cell (10 columns): `3.2 ms`, `probing…`, or `✖ FAILED` (the stage is in the
        relay's details)."""
        if self.stopped:
            return "probe stopped"
        if self.last is None:
            return "probing…"
        if self.last.ok:
            rtt = self.latest_rtt_ms
            return f"{rtt:.1f} ms" if rtt is not None else "ok"
        return "✖ FAILED"

    # -- the loop a screen runs in its own task -------------------------------------------------
    async def follow(self, on_sample: Callable[[ProbeWatch], None], probe: ProbeFn = watch_probe) -> None:
        """Probe until cancelled, calling `on_sample` after each sample. A probe that raises
        (a bug, an OS error) is a failure sample and a fresh start after `interval`; only a
        key or bootstrap that can never work stops it (said in `stopped`)."""
        self.started = time.time()
        while True:
            try:
                async for s in probe(
                    self.relay_key, self.bootstrap, self.interval, self.timeout, echo_timeout=self.echo_timeout
                ):
                    self.observe(s)
                    on_sample(self)
            except ProbeUsageError as e:
                self.stopped = str(e)
                self._fail(str(e), on_sample)
                return
            except Exception as e:  # never into the screen: a failed probe is shown, not raised
                self._fail(f"probe error: {e!r}"[:300], on_sample)
            await asyncio.sleep(self.interval)

    def _fail(self, detail: str, on_sample: Callable[[ProbeWatch], None]) -> None:
        self.observe(ProbeSample(time.time(), False, None, None, detail))
        with contextlib.suppress(Exception):  # a second failure in the redraw: the loop goes on
            on_sample(self)
