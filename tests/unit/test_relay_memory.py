"""The memory budget's parts: the caps it derives, the admission verdict from RSS, the blind-relay
core behaving at a full budget as at its caps (a newcomer only in place of something idle, a
carrying pair never shed), the RSS reader, and the trim after a burst. The end-to-end check (a
real relay under a real attack mix at a small budget, its peak RSS against the budget) is
tests/interop/test_interop_relay_memory.py.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from relay.blindrelay import BlindRelayServer
from relay.keys import key_pair
from relay.service.app import RelayApp, RelayConfig
from relay.service.limits import Limits
from relay.service.memory import (
    COLLECT_STEP,
    DEFAULT_BUDGET,
    IDLE_RSS,
    MB,
    MIN_BUDGET,
    EmbeddedResidentSet,
    MemoryBudget,
    MemoryWatch,
    ResidentSet,
    allocator_environment,
    caps_for_budget,
    connection_bytes,
    fixed_bytes,
)
from relay.udx import UDXStream
from tests.unit.test_blindrelay import _carry, make, tok
from tests.unit.test_blindrelay import counter as ids


def test_the_200_mb_budget_derives_the_default_caps_and_smaller_budgets_smaller_ones() -> None:
    d = Limits()
    caps = caps_for_budget(DEFAULT_BUDGET)
    assert (caps.max_sessions, caps.max_active_pairs, caps.max_pending_total) == (
        d.max_sessions,
        d.max_active_pairs,
        d.max_pending_total,
    )
    assert Limits.for_budget(DEFAULT_BUDGET) == d
    small, big = caps_for_budget(100 * MB), caps_for_budget(400 * MB)
    assert small.max_active_pairs < d.max_active_pairs < big.max_active_pairs
    for budget in (MIN_BUDGET, 100 * MB, DEFAULT_BUDGET, 400 * MB):
        c = caps_for_budget(budget)
        assert c.max_sessions == 2 * c.max_active_pairs and c.max_active_pairs >= 16
        # the caps' worst case fits the budget (beyond the minimum, where 16 connections are kept)
        if budget > MIN_BUDGET:
            assert fixed_bytes() + c.max_active_pairs * connection_bytes() < budget
    assert Limits.for_budget(100 * MB, max_sessions=5).max_sessions == 5  # a given cap stays


def test_full_is_rss_plus_what_held_sessions_may_still_grow_by() -> None:
    b = MemoryBudget(100 * MB)
    assert b.limit(0) > b.limit(1000) > b.limit(4000)  # each session may still fill its buffers
    assert not b.full(b.limit(1000), 1000) and b.full(b.limit(1000) + 1, 1000)
    assert b.limit(0) < 100 * MB


def test_at_a_full_budget_a_newcomer_takes_an_idle_sessions_place_never_a_carrying_one() -> None:
    server = BlindRelayServer(allocate_stream_id=ids(), max_sessions=1000)
    a, b, idle = make(server, 3, owners=["w", "j", "hoard"])
    _carry(server, a, b, tok(1), (1, 2))
    assert server.room_for_session(1.0) and server.shed["sessions"] == 0  # under the budget
    server.memory_full = True
    assert server.room_for_session(2.0)  # the idle hoard's session goes for it
    assert idle.session.closed and server.shed["sessions"] == 1
    assert not server.room_for_session(3.0)  # only carrying sessions are left: refused
    s = server.stats
    assert (s.sessions_refused_full, s.sessions_refused_memory) == (1, 1)
    assert not a.session.closed and not b.session.closed and server.stats.pairings_active == 1
    server.memory_full = False
    assert server.room_for_session(4.0)


def test_at_a_full_budget_a_match_replaces_a_silent_pair_or_is_refused() -> None:
    server = BlindRelayServer(allocate_stream_id=ids(), max_active_pairs=1000)
    a, b, hog, c, d, e, f = make(server, 7, owners=["w", "j", "hog", "w", "j", "w", "j"])
    _carry(server, a, b, tok(1), (1, 2))
    hog.pair(True, tok(2), 3)
    hog.pair(False, tok(2), 4)  # matched, never carried
    server.memory_full = True
    _carry(server, c, d, tok(3), (5, 6))  # matches in place of the hog's silent pair
    assert server.stats.pairings_matched == 3 and server.shed["active_pairs"] == 1
    assert not hog.session._links
    e.pair(True, tok(4), 7)
    f.pair(False, tok(4), 8)  # nothing silent is left: refused, counted
    s = server.stats
    assert (s.pairings_matched, s.pairings_refused_full, s.pairings_refused_memory) == (3, 1, 1)
    assert s.pairings_active == 2 and not any(x.session.closed for x in (a, b, c, d))


def test_at_a_full_budget_a_new_pending_token_takes_an_old_ones_place() -> None:
    server = BlindRelayServer(allocate_stream_id=ids(), max_pending_total=1000)
    hog, new = make(server, 2, owners=["hog", "new"])
    for i in range(10):
        hog.pair(True, tok(100 + i), i + 1)
    assert server.stats.pairings_pending == 10
    server.memory_full = True
    new.pair(True, tok(1), 50)
    assert server.stats.pairings_pending == 10 and server.shed["pending_total"] == 1
    assert tok(1) in server._pairing and tok(100) not in server._pairing  # the hog's oldest went


def test_resident_set_reads_what_psutil_reads() -> None:
    rss = ResidentSet()
    try:
        mine, theirs = rss(), psutil.Process().memory_info().rss
        assert abs(mine - theirs) < 4 * MB, (mine, theirs)
    finally:
        rss.close()


class Scheduled:
    def __init__(self) -> None:
        self.calls: list[tuple[float, Any]] = []

    def __call__(self, delay: float, fn: Any) -> Any:
        me = self

        class Handle:
            def cancel(self) -> None:
                me.calls.remove(entry)

        entry = (delay, fn)
        self.calls.append(entry)
        return Handle()


def test_a_large_fall_from_the_high_water_mark_schedules_one_trim_and_it_hands_memory_back() -> None:
    readings = iter([100 * MB, 100 * MB, 60 * MB])
    watch = MemoryWatch(MemoryBudget(200 * MB), rss=lambda: next(readings))
    sched = Scheduled()

    def trims() -> list[Any]:
        return [c for c in sched.calls if c[1] == watch._trim_now]

    for n in (10, 500, 1000):
        watch.held(n, sched)
    watch.held(600, sched)  # a relay still holding much is not trimmed yet
    assert trims() == []
    watch.held(250, sched)
    watch.held(100, sched)  # the fall goes on: the trim is pushed back, still one
    assert len(trims()) == 1
    garbage: list[Any] = []
    garbage.append(garbage)  # a cycle only a collection frees
    del garbage
    assert watch.check(0.0, 100) is False
    trims()[0][1]()
    assert watch.trims == 1 and watch.trimmed_bytes == 40 * MB
    assert watch.last_trim is not None and watch.last_trim["collected_objects"] >= 1
    assert watch.high_sessions == 100 and gc.garbage == []  # the next fall is measured from here
    assert watch.last_trim["collect_seconds"] >= 0 and watch.last_trim["malloc_trim_seconds"] >= 0
    watch.close()


def test_while_sessions_fall_garbage_is_collected_a_step_at_a_time_once_the_relay_holds_little() -> None:
    """Below a quarter of the high-water mark each collection frees what closed since the last
    one, a COLLECT_STEP at a time, so the trim after the fall frees only the rest; above it no
    collection is made (each walks every live object: ~1 s with 6,000 sessions held)."""
    watch = MemoryWatch(MemoryBudget(200 * MB), rss=lambda: 50 * MB)
    sched = Scheduled()
    watch.held(4000, sched)
    steps = []
    for n in range(3999, -1, -1):
        watch.held(n, sched)
        for call in [c for c in sched.calls if c[1] == watch._step]:
            sched.calls.remove(call)
            call[1]()  # the step runs when due (its delay is COLLECT_STEP_DELAY)
            steps.append(n)
    assert steps[0] == 1000 and len(steps) == 1 + 1000 // COLLECT_STEP == watch.step_collections
    assert watch.snapshot(0)["collections_while_falling"] == len(steps)
    watch.held(1200, sched)  # growing again: no step, whatever the earlier fall left
    assert not [c for c in sched.calls if c[1] == watch._step]
    watch.close()


def test_a_trim_first_releases_what_points_at_closed_streams() -> None:
    released: list[int] = []
    watch = MemoryWatch(MemoryBudget(200 * MB), rss=lambda: 50 * MB, release=lambda: released.append(1))
    watch.trim()
    assert released == [1]
    watch.close()


def test_the_relay_runs_on_malloc_unless_an_allocator_was_chosen() -> None:
    """CPython's small-object allocator keeps a 1 MiB arena for one object that outlives a burst;
    on glibc's malloc a trim hands back every free page. An operator's PYTHONMALLOC is kept, and
    the re-run does not re-run again."""
    env = allocator_environment({"PATH": "/bin"})
    assert env == {"PATH": "/bin", "PYTHONMALLOC": "malloc"}
    assert allocator_environment(env) is None
    assert allocator_environment({"PYTHONMALLOC": "pymalloc"}) is None
    code = "import os; from relay.service import memory; memory.run_on_malloc(); print(os.environ['PYTHONMALLOC'])"
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONMALLOC"}
    out = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["malloc"]  # re-run once, on malloc


def test_full_is_said_once_per_episode_and_counted() -> None:
    levels = iter([10 * MB, 199 * MB, 199 * MB, 10 * MB, 199 * MB])
    watch = MemoryWatch(MemoryBudget(200 * MB), rss=lambda: next(levels))
    assert [watch.check(float(t), 100) for t in range(5)] == [False, True, True, False, True]
    assert watch.times_full == 2 and watch.peak_rss == 199 * MB
    snap = watch.snapshot(100)
    assert snap["full"] is True and snap["budget_bytes"] == 200 * MB
    assert snap["admission_limit_bytes"] == MemoryBudget(200 * MB).limit(100)


def test_over_the_limit_newcomers_reuse_what_was_freed_until_rss_grows_again() -> None:
    """RSS rarely falls once the allocator holds memory: past the limit the relay marks what it
    held; holding less (sessions shed or gone), it admits again into the freed memory, and as
    soon as RSS grows past the mark's reading it is full at what it holds then."""
    b = MemoryBudget(200 * MB)
    over = b.limit(100) + 1
    levels = iter([over, over, over + 2 * MB, over + 2 * MB])
    watch = MemoryWatch(b, rss=lambda: next(levels))
    assert watch.check(0.0, 100, held=1000.0) is True  # the mark: 1,000
    assert watch.check(0.1, 100, held=500.0) is False  # half of it gone: room inside
    assert watch.check(0.2, 100, held=600.0) is True  # RSS grew anyway: the mark comes down to 600
    assert watch.check(0.3, 100, held=599.0) is False
    assert watch.times_full == 1 and watch.collections >= 1  # one episode, garbage collected in it
    watch.close()


def test_caps_set_beyond_the_budget_get_the_wider_margin() -> None:
    """With the caps the budget derives, their modelled worst case already fits it and RSS is the
    backstop; with a cap above them, RSS alone holds the budget and keeps room for churn."""
    from relay.service.memory import caps_beyond

    assert not caps_beyond(DEFAULT_BUDGET, 8192, 4096, 8192, 1024)
    assert caps_beyond(100 * MB, 8192, 4096, 8192, 1024) and caps_beyond(DEFAULT_BUDGET, 8193, 4096, 8192, 1024)
    assert MemoryBudget(100 * MB, caps_beyond_budget=True).limit(0) < MemoryBudget(100 * MB).limit(0)


def test_a_relay_inside_a_bigger_process_counts_only_what_it_grew_by() -> None:
    """A test run or a benchmark that embeds a relay may already hold more than the relay's budget;
    the embedded reading starts at an idle relay's RSS and adds what the process grew by since."""
    ballast = bytearray(64 * MB)
    ballast[::4096] = b"\1" * len(ballast[::4096])  # touch every page: resident
    whole, embedded = ResidentSet(), EmbeddedResidentSet()
    assert whole() > 64 * MB
    assert embedded() < IDLE_RSS + 8 * MB
    more = bytearray(32 * MB)
    more[::4096] = b"\1" * len(more[::4096])
    assert embedded() >= IDLE_RSS + 28 * MB
    del ballast, more
    whole.close()
    embedded.close()


async def test_after_a_trim_no_closed_stream_is_kept_and_the_tables_a_burst_grew_shrink(tmp_path: Path) -> None:
    """A closed relay stream left in the send vector's slots kept its whole object graph, and every
    table that held a burst kept the size it grew to: the trim drops the one and rebuilds the others."""
    app = RelayApp(
        RelayConfig(storage=tmp_path, key_pair=key_pair(), host="127.0.0.1", port=0, bootstrap=[], metrics=None),
        rss=EmbeddedResidentSet(),
    )
    await app.bind()
    try:
        sock = app.socket
        assert sock is not None and sock.batching
        stream = app.udx.create_stream(0x5EED)
        sock._mmsg.targets[3] = stream  # type: ignore[union-attr]  # as the send path leaves it
        stream.destroy()
        del stream

        def kept() -> list[UDXStream]:
            return [o for o in gc.get_objects() if isinstance(o, UDXStream) and o.id == 0x5EED]

        assert len(kept()) == 1
        for i in range(8192):
            app._streams[i] = None  # type: ignore[assignment]
            app.blind._by_stream[i] = None  # type: ignore[assignment]
        for i in range(8192):  # closed one by one, as streams and links go (clear() would shrink them)
            del app._streams[i], app.blind._by_stream[i]
        grown = sys.getsizeof(app._streams)
        app.memory.trim()
        assert kept() == []
        assert sys.getsizeof(app._streams) < grown / 100 and sys.getsizeof(app.blind._by_stream) < grown / 100
    finally:
        await app.close()
