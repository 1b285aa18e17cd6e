"""The handshake backlog (relay/dht/backlog.py): who is answered first, what is shed, in virtual time."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.dht.backlog import HandshakeBacklog


def drain(b: HandshakeBacklog[str], now: float) -> list[str]:
    out = []
    while (item := b.pop(now)) is not None:
        out.append(item)
    return out


def test_a_new_address_is_answered_before_the_backlog_of_busy_ones() -> None:
    b: HandshakeBacklog[str] = HandshakeBacklog()
    for i in range(20):  # two busy hosts, already served a lot
        b.push(b"a%d" % i, "10.0.0.1", f"a{i}", 0.0)
        b.push(b"b%d" % i, "10.0.0.2", f"b{i}", 0.0)
    served = [b.pop(0.1) for _ in range(10)]
    assert set(served) <= {f"a{i}" for i in range(20)} | {f"b{i}" for i in range(20)}
    b.push(b"new", "192.0.2.7", "new", 0.2)  # queued last, behind 30 others
    assert b.pop(0.2) == "new"
    assert b.score("192.0.2.7", 0.2) == 1.0


def test_busy_hosts_share_what_is_left_and_each_host_keeps_its_order() -> None:
    b: HandshakeBacklog[str] = HandshakeBacklog()
    for i in range(6):
        b.push(b"a%d" % i, "10.0.0.1", f"a{i}", 0.0)
    for i in range(3):
        b.push(b"b%d" % i, "10.0.0.2", f"b{i}", 0.0)
    order = drain(b, 0.5)
    # alternate while both wait (scores stay within one of each other), then a's rest, in order
    assert order[:6] in (["a0", "b0", "a1", "b1", "a2", "b2"], ["b0", "a0", "b1", "a1", "b2", "a2"])
    assert order[6:] == ["a3", "a4", "a5"]
    assert b.stats["served"] == 9 and len(b) == 0


def test_handshakes_that_waited_longer_than_their_client_do_are_shed() -> None:
    b: HandshakeBacklog[str] = HandshakeBacklog(max_age=2.0)
    b.push(b"old", "10.0.0.1", "old", 0.0)
    b.push(b"fresh", "10.0.0.1", "fresh", 1.5)
    assert b.pop(2.5) == "fresh"  # "old" waited 2.5 s: its client's request gave up
    assert b.stats["shed_stale"] == 1 and b.stats["served"] == 1 and len(b) == 0
    # a shed handshake costs its host nothing: the score counts answers only
    assert b.score("10.0.0.1", 2.5) == 1.0
    b.push(b"x", "10.0.0.3", "x", 3.0)
    b.push(b"y", "10.0.0.4", "y", 4.5)
    assert b.oldest() == 3.0
    assert b.expire(5.5) == 1 and b.get(b"y") == "y" and b.get(b"x") is None
    assert b.stats["shed_stale"] == 2


def test_copies_of_one_handshake_queue_once() -> None:
    b: HandshakeBacklog[str] = HandshakeBacklog()
    assert b.push(b"m1", "10.0.0.1", "first", 0.0)
    assert not b.push(b"m1", "10.0.0.1", "second copy", 0.1)  # relayed by another announce holder
    assert b.stats["duplicates"] == 1 and len(b) == 1 and b"m1" in b
    assert drain(b, 0.2) == ["first"]
    assert b.push(b"m1", "10.0.0.1", "again", 0.3)  # answered: the runtime dedups it from now on


def test_when_full_the_heaviest_host_loses_its_newest_never_a_lighter_newcomer() -> None:
    b: HandshakeBacklog[str] = HandshakeBacklog(max_items=4)
    for i in range(3):  # make 10.0.0.1 heavy: served 3 times
        b.push(b"s%d" % i, "10.0.0.1", "s", 0.0)
    drain(b, 0.0)
    for i in range(3):
        assert b.push(b"h%d" % i, "10.0.0.1", f"h{i}", 0.1)
    assert b.push(b"l0", "10.0.0.2", "l0", 0.1)
    assert len(b) == 4
    assert b.push(b"n0", "192.0.2.9", "n0", 0.2)  # full: the heavy host's newest goes
    assert b.get(b"h2") is None and b.get(b"n0") == "n0" and b.stats["shed_full"] == 1
    # the heavy host itself is refused when it is the heaviest waiting
    assert not b.push(b"h9", "10.0.0.1", "h9", 0.3)
    assert b.stats["shed_full"] == 2 and len(b) == 4
    assert drain(b, 0.4)[:2] in (["l0", "n0"], ["n0", "l0"])


def test_a_handshake_held_for_its_rate_is_answered_when_due_and_ages_from_arrival() -> None:
    b: HandshakeBacklog[str] = HandshakeBacklog(max_items=2, max_waiting=2, max_age=2.0)
    assert b.push(b"w1", "nat", "w1", 0.0, wait=0.5)
    assert b.push(b"w2", "nat", "w2", 0.0, wait=1.0)
    assert not b.push(b"w3", "nat", "w3", 0.0, wait=1.0)  # the waiting room is full
    assert not b.push(b"w1", "nat", "copy", 0.1)  # a retransmission of a held one: a duplicate
    assert b.get_timer() == 0.5 and not b.ready(0.4) and b.pop(0.4) is None
    assert b.push(b"now", "other", "now", 0.4)  # held ones do not take the queue's room
    assert b.pop(0.4) == "now"
    assert b.ready(0.5) and b.pop(0.6) == "w1" and b.pop(0.6) is None
    assert b.get_timer() == 1.0
    assert b.pop(3.0) is None  # w2 arrived at 0.0: by 3.0 it is stale, shed on release
    assert b.stats["waited"] == 2 and b.stats["shed_stale"] == 1 and b.stats["shed_full"] == 1
    assert len(b) == 0 and b.get_timer() is None


def test_a_held_handshake_released_into_a_full_queue_is_shed_when_its_host_is_heaviest() -> None:
    b: HandshakeBacklog[str] = HandshakeBacklog(max_items=1)
    for i in range(3):  # the NAT was served a lot
        b.push(b"s%d" % i, "nat", "s", 0.0)
        drain(b, 0.0)
    assert b.push(b"w", "nat", "w", 0.0, wait=0.5)
    assert b.push(b"new", "192.0.2.1", "new", 0.1)  # the queue is full now
    assert b.pop(0.6) == "new" and b.pop(0.6) is None
    assert b.stats["shed_full"] == 1 and len(b) == 0


def test_scores_decay_so_a_host_busy_long_ago_is_no_longer_behind() -> None:
    b: HandshakeBacklog[str] = HandshakeBacklog(half_life=10.0)
    for i in range(8):
        b.push(b"o%d" % i, "10.0.0.1", "o", 0.0)
    drain(b, 0.0)
    assert b.score("10.0.0.1", 0.0) == pytest.approx(8.0)
    assert b.score("10.0.0.1", 30.0) == pytest.approx(1.0)  # three half-lives
    for i in range(2):
        b.push(b"r%d" % i, "10.0.0.2", "r", 30.0)
    drain(b, 30.0)  # 10.0.0.2 now scores 2, the old busy host 1
    b.push(b"p", "10.0.0.2", "from .2", 30.0)
    b.push(b"q", "10.0.0.1", "from .1", 30.0)
    assert drain(b, 30.0) == ["from .1", "from .2"]


def test_remembered_hosts_are_bounded() -> None:
    b: HandshakeBacklog[str] = HandshakeBacklog(max_hosts=16)
    for i in range(100):
        b.push(b"k%d" % i, f"10.0.1.{i}", "x", float(i))
        assert b.pop(float(i)) == "x"
    assert len(b._scores) <= 16
    assert b.score("10.0.1.0", 100.0) == 0.0 and b.score("10.0.1.99", 99.0) == 1.0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["push", "pop", "expire"]),
            st.integers(0, 5),
            st.integers(0, 30),
            st.sampled_from([0, 0.3, 1]),
        ),
        max_size=120,
    )
)
def test_any_sequence_keeps_the_bounds_and_loses_nothing_silently(ops: list[tuple[str, int, int, float]]) -> None:
    """Whatever happens, every item pushed is served, shed or still queued (counted), the queue
    never exceeds its bound, and no item is handed out twice."""
    b: HandshakeBacklog[int] = HandshakeBacklog(max_items=8, max_waiting=4, max_age=2.0)
    now = 0.0
    pushed = 0
    seen: set[int] = set()
    for n, (op, host, key, wait) in enumerate(ops):
        now += 0.25
        if op == "push":
            pushed += b.push(b"%d" % (n * 100 + key), f"h{host}", n, now, wait)
        elif op == "pop":
            item = b.pop(now)
            if item is not None:
                assert item not in seen
                seen.add(item)
        else:
            b.expire(now)
        assert len(b) <= 8 + 4
        assert len(b._keys) - len(b._waiting) <= 8
    s = b.stats
    assert s["queued"] == pushed
    shed_queued = pushed - s["served"] - len(b) - s["shed_stale"]
    assert 0 <= shed_queued <= s["shed_full"]
    assert len(seen) == s["served"]


def test_a_held_handshake_is_released_by_the_timer_at_its_deadline() -> None:
    """The runtime arms one timer at `get_timer()`; `handle_timer` then moves what is due
    into the queues, and nothing before its time (a timer firing 1 ms early counts as due)."""
    b: HandshakeBacklog[str] = HandshakeBacklog()
    assert b.get_timer() is None
    assert b.push(b"k1", "nat", "k1", 10.0, wait=0.375)
    assert b.push(b"k2", "nat", "k2", 10.0, wait=0.625)
    assert b.get_timer() == 10.375
    b.handle_timer(10.37)
    assert b.pop(10.37) is None and b.get_timer() == 10.375
    b.handle_timer(10.375)
    assert b.pop(10.375) == "k1" and b.get_timer() == 10.625
    b.handle_timer(10.6245)  # within the loop's 1 ms timer granularity
    assert b.pop(10.6245) == "k2" and b.get_timer() is None
