"""The relay's forwarding decisions (relay.udx.forwarding), without sockets or an event loop."""

from __future__ import annotations

import socket
import struct

from hypothesis import given
from hypothesis import strategies as st

from relay.udx import DATA, DESTROY, END, SACK, encode
from relay.udx.forwarding import (
    HEAD_FORWARD,
    HEAD_MASK,
    Route,
    all_forwardable,
    cut_runs,
    forwardable,
    from_pinned,
    interleaved,
    may_route,
    plan_by_stream,
    source_key,
    stream_runs,
    takes_from,
)
from relay.udx.packet import DEFAULT_RWND


def head(datagram: bytes) -> int:
    return int(struct.unpack_from("<I", datagram)[0])


def sockaddr_in(host: str, port: int) -> bytes:
    return struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + socket.inet_aton(host) + bytes(8)


def sockaddr_in6(host: str, port: int) -> bytes:
    raw = socket.inet_pton(socket.AF_INET6, host)
    return struct.pack("=H", socket.AF_INET6) + struct.pack("!HI", port, 0) + raw + bytes(4)


def route(src: tuple[int, int, int]) -> Route:
    return Route(7, 0x1000, bytearray(16), object(), object(), src)


def test_a_udx_packet_without_destroy_is_forwardable_and_anything_else_is_not() -> None:
    data = encode(DATA, 1, DEFAULT_RWND, 0, 0, b"x" * 256)
    for d in (data, encode(SACK | DATA, 1, DEFAULT_RWND, 3, 2, b"y"), encode(END, 1, DEFAULT_RWND, 4, 0, b"")):
        assert forwardable(head(d), len(d))
    destroy = encode(DESTROY, 1, DEFAULT_RWND, 5, 0, b"")
    assert not forwardable(head(destroy), len(destroy))  # the slow path closes both streams
    assert not forwardable(head(data), 19)  # shorter than a header
    assert not forwardable(head(b"\xfe" + data[1:]), len(data))  # not the magic
    assert not forwardable(head(data[:1] + b"\x02" + data[2:]), len(data))  # another version
    assert head(data) & HEAD_MASK == HEAD_FORWARD


def test_a_run_is_forwardable_only_when_every_datagram_is() -> None:
    d1 = encode(DATA, 1, DEFAULT_RWND, 0, 0, b"a" * 100)
    d2 = encode(SACK, 1, DEFAULT_RWND, 1, 0, b"")
    destroy = encode(DESTROY, 1, DEFAULT_RWND, 2, 0, b"")
    assert all_forwardable([head(d1), head(d2), head(d1)], [len(d1), len(d2), len(d1)])
    assert not all_forwardable([head(d1), head(destroy)], [len(d1), len(destroy)])
    assert not all_forwardable([head(destroy), head(d1)], [len(destroy), len(d1)])
    assert not all_forwardable([head(d1), head(d1)], [len(d1), 12])


def test_source_key_pins_family_port_and_address() -> None:
    a = source_key(sockaddr_in("10.0.0.1", 4000))
    assert a == source_key(sockaddr_in("10.0.0.1", 4000))
    assert a != source_key(sockaddr_in("10.0.0.1", 4001))
    assert a != source_key(sockaddr_in("10.0.0.2", 4000))
    assert a[0] != 0 and a[1] == a[2] == 0  # IPv4: the first word says it all
    v6 = source_key(sockaddr_in6("2001:db8::1", 4000))
    other = source_key(sockaddr_in6("2001:db8::2", 4000))
    assert v6[0] == other[0] and v6[1:] != other[1:]  # family/port equal, the address words differ


def test_the_slow_path_takes_datagrams_only_from_the_pinned_address() -> None:
    assert takes_from(("10.0.0.1", 4000), ("10.0.0.1", 4000))
    assert not takes_from(("10.0.0.1", 4000), ("10.0.0.1", 4001))
    assert not takes_from(("10.0.0.1", 4000), ("10.0.0.9", 4000))
    assert not takes_from(None, ("10.0.0.1", 4000))  # nothing learned yet: nothing relayed


def test_the_fast_path_takes_a_run_only_when_all_of_it_came_from_the_pin() -> None:
    v4 = source_key(sockaddr_in("10.0.0.1", 4000))
    r = route(v4)
    other = source_key(sockaddr_in("10.0.0.1", 4001))[0]
    assert from_pinned(r, [v4[0]] * 5)
    assert not from_pinned(r, [v4[0], v4[0], other])
    assert r.pinned(v4[0]) and not r.pinned(other)
    v6 = source_key(sockaddr_in6("2001:db8::1", 4000))
    x = source_key(sockaddr_in6("2001:db8::2", 4000))
    r6 = route(v6)
    assert from_pinned(r6, [v6[0]] * 2, [v6[1]] * 2, [v6[2]] * 2)
    assert not from_pinned(r6, [v6[0]] * 2, [v6[1], x[1]], [v6[2], x[2]])
    assert r6.pinned(v6[0], (v6[1], v6[2])) and not r6.pinned(x[0], (x[1], x[2]))


def test_runs_are_consecutive_datagrams_of_one_stream() -> None:
    assert stream_runs([1, 1, 2, 2, 2, 1]) == [(1, 0, 2), (2, 2, 5), (1, 5, 6)]
    assert stream_runs([9]) == [(9, 0, 1)]
    assert not interleaved([4, 4, 4]) and interleaved([4, 5, 4])


def test_a_plan_by_stream_keeps_each_streams_order() -> None:
    assert plan_by_stream([5, 3, 5, 3, 5]) == [(3, [1, 3]), (5, [0, 2, 4])]
    assert plan_by_stream([2, 2, 2]) == [(2, [0, 1, 2])]


def test_cut_runs_makes_equal_size_sends_the_last_may_be_shorter() -> None:
    assert cut_runs([1000] * 5, 64, 65507) == [(0, 5)]
    assert cut_runs([1000] * 5 + [300], 64, 65507) == [(0, 6)]  # a shorter one ends the send
    assert cut_runs([1000, 300, 1000], 64, 65507) == [(0, 2), (2, 3)]
    assert cut_runs([300, 1000, 1000], 64, 65507) == [(0, 1), (1, 3)]  # a longer one starts a new send
    assert cut_runs([1200] * 130, 64, 65507) == [(0, 54), (54, 108), (108, 130)]  # 54 * 1200 <= 65507
    assert cut_runs([100] * 130, 64, 65507) == [(0, 64), (64, 128), (128, 130)]
    assert cut_runs([100, 100, 50], 1, 65507) == [(0, 1), (1, 2), (2, 3)]  # no GSO: one per send


@given(
    st.lists(st.sampled_from([20, 64, 276, 1000, 1180, 1200, 1452]), min_size=1, max_size=300),
    st.sampled_from([1, 2, 16, 64]),
)
def test_cut_runs_covers_the_run_in_order_within_the_limits(lengths: list[int], limit: int) -> None:
    cuts = cut_runs(lengths, limit, 65507)
    assert [x for x, _ in cuts] == [0] + [y for _, y in cuts[:-1]] and cuts[-1][1] == len(lengths)
    for x, y in cuts:
        part = lengths[x:y]
        assert 1 <= len(part) <= limit and sum(part) <= 65507
        assert all(n == part[0] for n in part[:-1]) and part[-1] <= part[0]


def test_a_direction_gets_a_route_only_on_one_batching_socket_without_a_queue() -> None:
    assert may_route(True, True, False)
    assert not may_route(False, True, False)  # the partner sits on another socket
    assert not may_route(True, False, False)  # the portable reader has no routes
    assert not may_route(True, True, True)  # a queue keeps order only if everything goes through it
