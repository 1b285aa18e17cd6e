"""The kernel forwarding table (relay.udx.kernel.KernelTable): nft commands and counters, no kernel."""

from __future__ import annotations

from typing import Any

from relay.udx.kernel import HEADERS, UNDELIVERED_MIN, Direction, KernelTable, raw_id

A = ("10.0.1.2", 40001)
D = ("10.0.2.2", 40002)


def doc(name: str, elems: list[tuple[list[Any], int, int]]) -> dict[str, Any]:
    """A `list set` JSON document as nft prints it."""
    return {
        "nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {
                "set": {
                    "name": name,
                    "elem": [
                        {"elem": {"val": {"concat": k}, "counter": {"packets": p, "bytes": b}}} for k, p, b in elems
                    ],
                }
            },
        ]
    }


def test_raw_id_is_the_little_endian_stream_id_read_big_endian() -> None:
    assert raw_id(0x11223344) == 0x44332211
    assert raw_id(raw_id(0xDEADBEEF)) == 0xDEADBEEF


def test_setup_script_matches_udx_without_destroy_and_rewrites_headers_only() -> None:
    script = KernelTable(49737).setup_script()
    assert "flags owner" in script  # the kernel drops it with the relay's netlink socket
    pre = next(line for line in script.splitlines() if "@pairs" in line)
    assert "udp dport 49737 @th,64,16 0xff01 @th,80,8 & 0x10 == 0" in pre  # magic+version, DESTROY clear
    assert "notrack" in pre and "udp sport set 49737" in pre
    assert "@th,96,32 set" not in pre  # the stream id is never rewritten (checksums stay the kernel's)
    assert "ip daddr 0.0.0.0" not in script
    assert "ip daddr 192.0.2.1 udp dport 7" in KernelTable(7, "192.0.2.1").setup_script()


def test_offer_and_withdraw_commands_share_the_delivery_elements() -> None:
    t = KernelTable(5000)
    d1 = Direction(A, 0x01020304, D, "10.0.2.1")
    d2 = Direction((A[0], 40003), 0x05060708, D, "10.0.2.1")  # same host to the same peer port
    assert t.offer(d1) and not t.offer(d1) and t.offer(d2)
    c1, c2 = t.take_changes()
    assert "add element ip blind_relay_5000 pairs { 10.0.1.2 . 40001 . 0x4030201 }" in c1.script
    assert c1.script.splitlines()[-1].startswith("add element ip blind_relay_5000 pairs")  # maps first
    assert "delivery_saddr { 10.0.1.2 . 10.0.2.2 . 40002 : 10.0.2.1 }" in c1.script
    assert "delivered" not in c2.script  # shared: added once
    t.withdraw(d1.key)
    (w1,) = t.take_changes()
    assert w1.script.splitlines()[0].startswith("delete element ip blind_relay_5000 pairs")
    assert "delivered" not in w1.script  # d2 still uses it
    t.withdraw(d2.key)
    (w2,) = t.take_changes()
    assert "delete element ip blind_relay_5000 delivered { 10.0.1.2 . 10.0.2.2 . 40002 }" in w2.script
    assert t.withdraw(d2.key) is None and t.take_changes() == []


def test_loopback_directions_need_no_source_rewrite() -> None:
    t = KernelTable(5000)
    d = Direction(("127.0.0.1", 1), 7, ("127.0.0.1", 2), "127.0.0.1")
    assert d.delivery is None
    t.offer(d)
    (c,) = t.take_changes()
    assert "delivery" not in c.script and "delivered" not in c.script


def test_counts_are_deltas_of_payload_bytes() -> None:
    t = KernelTable(5000)
    d = Direction(A, 0x01020304, D, "10.0.2.1")
    t.offer(d)
    key = [A[0], A[1], raw_id(d.stream_id)]
    dk = [A[0], D[0], D[1]]
    packets, payload, lost = t.count(doc("pairs", [(key, 10, 10 * (HEADERS + 1000))]), doc("delivered", [(dk, 10, 0)]))
    assert (packets, payload, lost) == (10, 10_000, [])
    packets, payload, _ = t.count(doc("pairs", [(key, 15, 15 * (HEADERS + 1000))]), doc("delivered", [(dk, 15, 0)]))
    assert (packets, payload) == (5, 5_000)
    # an element we do not hold (another relay's leftovers are not ours) counts nothing
    other = [A[0], 1, 99]
    assert t.count(doc("pairs", [(other, 500, 500_000)]), doc("delivered", []))[:2] == (0, 0)


def test_directions_whose_packets_do_not_leave_are_reported_lost() -> None:
    t = KernelTable(5000)
    d = Direction(A, 0x01020304, D, "10.0.2.1")
    t.offer(d)
    key = [A[0], A[1], raw_id(d.stream_id)]
    dk = [A[0], D[0], D[1]]
    n = UNDELIVERED_MIN - 1
    assert t.count(doc("pairs", [(key, n, n * 100)]), doc("delivered", [(dk, 0, 0)]))[2] == []  # too few to tell
    _, _, lost = t.count(doc("pairs", [(key, n + 20, 0)]), doc("delivered", [(dk, 0, 0)]))
    assert lost == [d]
    t2 = KernelTable(5000)
    t2.offer(d)
    assert t2.count(doc("pairs", [(key, 50, 0)]), doc("delivered", [(dk, 50, 0)]))[2] == []


def test_a_refused_offer_is_forgotten() -> None:
    t = KernelTable(5000)
    d = Direction(A, 1, D, "10.0.2.1")
    t.offer(d)
    (c,) = t.take_changes()
    t.forget(c)
    assert t.directions == {}
    assert t.offer(d)  # offered again later: the shared elements are added again
    (c2,) = t.take_changes()
    assert "delivered" in c2.script


def test_a_withdrawn_direction_is_counted_until_its_elements_go() -> None:
    t = KernelTable(5000)
    d = Direction(A, 3, D, "10.0.2.1")
    t.offer(d)
    t.take_changes()
    key = [A[0], A[1], raw_id(3)]
    assert t.count(doc("pairs", [(key, 4, 4 * (HEADERS + 10))]), doc("delivered", []))[:2] == (4, 40)
    t.withdraw(d.key)
    # read before the delete runs: the packets since the last reading still count
    assert t.count(doc("pairs", [(key, 6, 6 * (HEADERS + 10))]), doc("delivered", []))[:2] == (2, 20)
    t.take_changes()
    assert t.count(doc("pairs", [(key, 9, 9 * (HEADERS + 10))]), doc("delivered", []))[:2] == (0, 0)


def test_a_stalled_sender_is_reported_lost_over_several_readings() -> None:
    """A sender whose packets vanish retransmits on its backed-off timer: one per reading or fewer."""
    t = KernelTable(5000)
    d = Direction(A, 3, D, "10.0.2.1")
    t.offer(d)
    key = [A[0], A[1], raw_id(3)]
    dk = [A[0], D[0], D[1]]
    for sent in range(1, UNDELIVERED_MIN):
        assert t.count(doc("pairs", [(key, sent, 0)]), doc("delivered", [(dk, 0, 0)]))[2] == []
        assert t.count(doc("pairs", [(key, sent, 0)]), doc("delivered", [(dk, 0, 0)]))[2] == []  # quiet
    lost = t.count(doc("pairs", [(key, UNDELIVERED_MIN, 0)]), doc("delivered", [(dk, 0, 0)]))[2]
    assert lost == [d]
    # one that left in between starts the count again
    t2 = KernelTable(5000)
    t2.offer(d)
    got = []
    for i, delivered in enumerate((0, 1, 1, 1, 1)):
        got.append(t2.count(doc("pairs", [(key, i + 1, 0)]), doc("delivered", [(dk, delivered, 0)]))[2])
    assert got == [[], [], [], [], [d]]
