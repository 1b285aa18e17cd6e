"""One clock: the relay's glue feeds the blind-relay core and the handshake gate the loop's time
and fires each expiry at the core's own deadline, never on a fixed grid. Virtual time: the
real `RelayApp` (`benchmarks/relay_costs.Relay`: real secret-stream sessions, no DHT) with a
loop clock that moves only when the test moves it."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.relay_costs import Client, Relay
from relay.keys import key_pair
from relay.service.app import RelayApp, RelayConfig
from relay.service.limits import Limits
from relay.service.memory import EmbeddedResidentSet


class _Timer:
    def __init__(self, when: float, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._when, self.callback, self.args, self.cancelled = when, callback, args, False

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """The loop as the app's clock and timers see it: `time()` and `call_at`, moved by `advance`."""

    def __init__(self, now: float) -> None:
        self.now = now
        self._heap: list[tuple[float, int, _Timer]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> _Timer:
        t = _Timer(when, callback, args)
        heapq.heappush(self._heap, (when, next(self._seq), t))
        return t

    def armed(self) -> list[float]:
        return sorted(t.when() for _, _, t in self._heap if not t.cancelled)

    def advance(self, to: float) -> None:
        """Fire every timer due by `to`, each at its own time, in order."""
        while self._heap and self._heap[0][0] <= to:
            when, _, t = heapq.heappop(self._heap)
            if t.cancelled:
                continue
            self.now = max(self.now, when)
            t.callback(*t.args)
        self.now = max(self.now, to)


LIMITS = Limits(session_idle_timeout=30.0, pending_timeout=12.5, silent_pair_timeout=20.0)


def _relay(tmp_path: Path, clock: VirtualClock, limits: Limits = LIMITS) -> Relay:
    relay = Relay(tmp_path)
    relay.app = RelayApp(
        RelayConfig(storage=tmp_path, key_pair=key_pair(), metrics=None, limits=limits), rss=EmbeddedResidentSet()
    )
    relay.app.loop = clock  # type: ignore[assignment]
    return relay


def _session(relay: Relay) -> tuple[Client, Any]:
    before = set(relay.app._sessions)
    client = relay.session()
    (new,) = [s for s in relay.app._sessions if s not in before]
    return client, relay.app._sessions[new].conn.secret_stream


def _run(tmp_path: Path, clock: VirtualClock, body: Callable[[Relay], None], limits: Limits = LIMITS) -> None:
    async def run() -> None:
        relay = _relay(tmp_path, clock, limits)
        await relay.bind()
        try:
            body(relay)
        finally:
            relay.app.udx.close()

    asyncio.run(run())


def test_an_idle_session_closes_at_its_deadline_not_on_a_grid(tmp_path: Path) -> None:
    clock = VirtualClock(1000.4)

    def body(relay: Relay) -> None:
        app = relay.app
        _session(relay)
        assert clock.armed() == [1030.4]  # accepted at 1000.4, idle for 30 s
        clock.advance(1030.399)
        assert len(app._sessions) == 1 and app.blind.shed["idle_session"] == 0
        clock.advance(1030.4)
        assert app._sessions == {} and app.blind.shed["idle_session"] == 1
        assert clock.armed() == []  # nothing left to time: no timer at all

    _run(tmp_path, clock, body)


def test_a_pending_pairing_times_out_at_its_deadline(tmp_path: Path) -> None:
    clock = VirtualClock(1000.0)

    def body(relay: Relay) -> None:
        app = relay.app
        a, pa = _session(relay)
        clock.advance(1000.25)
        a.pair(True, b"\x07" * 32, 1)
        pa.data_received(a.flush())
        assert app.blind.stats.pairings_pending == 1
        assert clock.armed() == [1012.75]  # the earlier deadline replaced the idle one (1030)
        clock.advance(1012.749)
        assert app.blind.stats.pairings_timed_out == 0
        clock.advance(1012.75)
        assert app.blind.stats.pairings_timed_out == 1 and app.blind.stats.pairings_pending == 0
        assert clock.armed() == [1030.0]  # then the session's idle deadline, from its accept

    _run(tmp_path, clock, body)


def test_a_silent_pair_is_reaped_at_its_deadline_and_a_carrying_pair_needs_no_timer(tmp_path: Path) -> None:
    clock = VirtualClock(1000.0)

    def body(relay: Relay) -> None:
        app = relay.app
        (a, pa), (b, pb) = _session(relay), _session(relay)
        (c, pc), (d, pd) = _session(relay), _session(relay)
        clock.advance(1001.5)
        for (x, px), (y, py), token in (((a, pa), (b, pb), b"\x01" * 32), ((c, pc), (d, pd), b"\x02" * 32)):
            x.pair(True, token, 1)
            px.data_received(x.flush())
            y.pair(False, token, 2)
            py.data_received(y.flush())
        assert app.blind.stats.pairings_active == 2 and len(app._streams) == 4
        streams = list(app._streams)  # in match order: a/b's two, then c/d's two
        for sid in streams[2:]:
            app.blind.stream_carried(sid)  # c/d's pair carried both ways
        app.blind.stream_carried(streams[0])  # a/b's only one way: still silent
        # matched at 1001.5, and no session is idle (all linked); the timer armed for the first
        # pair message's timeout (1014.0) fires, finds nothing due and re-arms for the pair
        assert app.blind.get_timer() == 1021.5
        clock.advance(1021.499)
        assert app.blind.shed["silent_pair"] == 0 and len(app._streams) == 4
        assert clock.armed() == [1021.5]
        clock.advance(1021.5)
        assert app.blind.shed["silent_pair"] == 1 and app.blind.stats.pairings_active == 1
        assert set(app._streams) == set(streams[2:])
        # a and b are idle from 1021.5; the carrying pair adds no deadline of its own
        assert clock.armed() == [1051.5]

    _run(tmp_path, clock, body)


def test_the_handshake_gate_runs_on_the_loop_clock(tmp_path: Path) -> None:
    clock = VirtualClock(5000.0)
    limits = Limits(handshakes_per_address=2, handshake_refill_per_second=4.0)

    def body(relay: Relay) -> None:
        app = relay.app
        waits = [app._admit_handshake(("10.9.9.9", 4000 + i)) for i in range(4)]
        assert waits == [0.0, 0.0, 0.25, 0.5]  # over the burst: its next token, at 4 a second
        clock.advance(5010.0)  # ten loop seconds later the bucket is full again
        assert app._admit_handshake(("10.9.9.9", 4100)) == 0.0

    _run(tmp_path, clock, body, limits)
