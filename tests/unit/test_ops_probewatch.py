"""ProbeWatch: the monitor's probe state for a relay without metrics (no sockets, no Textual)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cosmictui.ops.metrics.client import RelayState, RelayWatch, Target
from cosmictui.ops.metrics.probe import STAGES, ProbeSample, ProbeUsageError
from cosmictui.ops.metrics.probewatch import ProbeWatch, split_failure

KEY = "a" * 52


def test_split_failure_names_the_stage_and_the_reason() -> None:
    assert split_failure(f"{STAGES[0]}: no DHT node holds an announce") == (STAGES[0], "no DHT node holds an announce")
    assert split_failure(f"{STAGES[2]}: the relay did not join: x: y") == (STAGES[2], "the relay did not join: x: y")
    assert split_failure("echo lost: TimeoutError") == ("echo", "not back (TimeoutError)")
    assert split_failure("echo came back wrong") == ("echo", "came back wrong")
    assert split_failure("something odd") == ("probe", "something odd")


def test_samples_make_a_series_the_latest_rtt_and_the_last_failure() -> None:
    p = ProbeWatch(KEY)
    assert p.ok is None and p.summary() == "probing…"
    p.observe(ProbeSample(10.0, True, 3.25, "127.0.0.1:4000", "probed"))
    p.observe(ProbeSample(15.0, True, 2.0, "127.0.0.1:4000", "echo"))
    assert list(p.rtt) == [(10.0, 3.25), (15.0, 2.0)]
    assert p.latest_rtt_ms == 2.0 and p.ok and p.summary() == "2.0 ms"
    p.observe(ProbeSample(20.0, False, None, "127.0.0.1:4000", "echo lost: TimeoutError"))
    p.observe(ProbeSample(25.0, False, None, None, f"{STAGES[1]}: RELAY_ABORTED"))
    assert p.ok is False and p.summary() == "✖ FAILED"
    assert p.last_failure is not None and p.last_failure.stage == STAGES[1] and p.last_failure.at == 25.0
    assert (p.ok_count, p.failed_count, list(p.failed_at)) == (2, 2, [20.0, 25.0])
    assert p.relay_address == "127.0.0.1:4000"  # the last relayed connection's, when the failure had none
    assert list(p.rtt) == [(10.0, 3.25), (15.0, 2.0)]  # failures are no round trips


def test_a_key_only_watch_takes_its_state_from_the_probe() -> None:
    w = RelayWatch(Target(relay_key=KEY))
    assert w.target.key_only and w.key == KEY and w.target.label.startswith("key aaaaaaaa")
    assert w.target.identity == ("key", KEY)
    w.probe = ProbeWatch(KEY)
    w.observe_probe(1.0)
    assert w.state is RelayState.CONNECTING
    w.probe.observe(ProbeSample(2.0, True, 1.0, "127.0.0.1:1", "probed"))
    assert w.observe_probe(2.0) and w.state is RelayState.RELAYING and w.error is None
    w.probe.observe(ProbeSample(3.0, False, None, None, f"{STAGES[0]}: nobody holds it"))
    assert w.observe_probe(3.0) and w.state is RelayState.DOWN
    assert w.error == f"probe failed at {STAGES[0]}: nobody holds it" and w.fix


async def test_follow_turns_a_crashing_probe_into_failure_samples_and_goes_on() -> None:
    calls = 0

    async def probe(*_a: Any, **_k: Any) -> AsyncIterator[ProbeSample]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("no route")
        yield ProbeSample(1.0, True, 4.0, "127.0.0.1:1", "probed")
        await asyncio.Event().wait()  # then hang: only cancellation ends it

    seen: list[bool | None] = []
    p = ProbeWatch(KEY, interval=0.01)
    task = asyncio.ensure_future(p.follow(lambda pw: seen.append(pw.ok), probe))
    for _ in range(2000):
        if len(seen) >= 2:
            break
        await asyncio.sleep(0.005)
    assert seen == [False, True]
    assert p.last_failure is not None and "no route" in p.last_failure.reason
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_follow_stops_for_good_on_a_bad_key_and_says_why() -> None:
    async def probe(*_a: Any, **_k: Any) -> AsyncIterator[ProbeSample]:
        raise ProbeUsageError("not a relay key: 'x'")
        yield  # pragma: no cover (makes this an async generator)

    p = ProbeWatch("x")
    await asyncio.wait_for(p.follow(lambda _p: None, probe), 30)
    assert p.stopped == "not a relay key: 'x'" and p.summary() == "probe stopped" and p.failed_count == 1


def test_probe_rows_are_drawn_after_a_redraw_that_raises_too() -> None:
    """A redraw that raises after a failure must not end the probe task (it would take the
    monitor's task group, and every relay's row, with it)."""
    p = ProbeWatch(KEY)

    def boom(_p: ProbeWatch) -> None:
        raise RuntimeError("redraw bug")

    p._fail("probe error: x", boom)
    assert p.failed_count == 1


def test_the_echo_deadline_follows_the_interval_within_bounds() -> None:
    assert ProbeWatch(KEY, interval=0.3).echo_timeout == 3.0
    assert ProbeWatch(KEY, interval=1.0).echo_timeout == 5.0
    assert ProbeWatch(KEY).echo_timeout == 10.0
    assert ProbeWatch(KEY, interval=60, echo_timeout=2).echo_timeout == 2


def test_a_relaying_key_only_relay_counts_as_up_in_the_summary() -> None:
    from cosmictui.ops.metrics.client import summarize

    w = RelayWatch(Target(relay_key=KEY))
    w.probe = ProbeWatch(KEY)
    w.probe.observe(ProbeSample(2.0, True, 1.0, "127.0.0.1:1", "probed"))
    w.observe_probe(2.0)
    assert summarize([w])["up"] == 1
    w.probe.observe(ProbeSample(3.0, False, None, None, "echo lost: TimeoutError"))
    w.observe_probe(3.0)
    assert summarize([w])["up"] == 0
