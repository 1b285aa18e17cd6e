"""The kernel forwarding table (relay.udx.kernel.KernelTable): nft commands and counters, no kernel."""

from __future__ import annotations

from typing import Any

from relay.udx.kernel import (
    HEADERS,
    IPV4,
    IPV6,
    UNDELIVERED_MIN,
    Direction,
    KernelTable,
    raw_id,
    unavailable_reason,
)
from relay.udx.nft import NftError

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
    assert "add element inet blind_relay_5000 pairs { 10.0.1.2 . 40001 . 0x4030201 }" in c1.script
    assert c1.script.splitlines()[-1].startswith("add element inet blind_relay_5000 pairs")  # maps first
    assert "delivery_saddr { 10.0.1.2 . 10.0.2.2 . 40002 : 10.0.2.1 }" in c1.script
    assert "delivered" not in c2.script  # shared: added once
    t.withdraw(d1.key)
    (w1,) = t.take_changes()
    assert w1.script.splitlines()[0].startswith("delete element inet blind_relay_5000 pairs")
    assert "delivered" not in w1.script  # d2 still uses it
    t.withdraw(d2.key)
    (w2,) = t.take_changes()
    assert "delete element inet blind_relay_5000 delivered { 10.0.1.2 . 10.0.2.2 . 40002 }" in w2.script
    assert t.withdraw(d2.key) is None and t.take_changes() == []


def test_loopback_directions_need_no_source_rewrite() -> None:
    t = KernelTable(5000)
    d = Direction(("127.0.0.1", 1), 7, ("127.0.0.1", 2), "127.0.0.1")
    assert d.delivery is None
    t.offer(d)
    (c,) = t.take_changes()
    assert "delivery" not in c.script and "delivered" not in c.script
    assert "pairs_local {" in c.script  # counted by the `local` rule and its own element


def counters(local: tuple[int, int], remote: tuple[int, int], delivered: tuple[int, int]) -> dict[str, tuple[int, int]]:
    """The named counters as `relay.udx.nft.read_counters` returns them."""
    return {"local": local, "remote": remote, "delivered": delivered}


def test_totals_are_deltas_of_payload_bytes_over_both_rules() -> None:
    t = KernelTable(5000)
    assert t.totals(counters((4, 4 * (HEADERS + 100)), (6, 6 * (HEADERS + 1000)), (6, 0))) == (10, 6_400)
    assert t.totals(counters((5, 5 * (HEADERS + 100)), (6, 6 * (HEADERS + 1000)), (6, 0))) == (1, 100)
    assert t.missing == 0
    # a new table (the counters start again) is not a negative delta
    assert t.totals(counters((1, HEADERS + 1), (0, 0), (0, 0))) == (1, 1)


def test_missing_adds_up_what_left_the_rule_but_not_the_host() -> None:
    t = KernelTable(5000)
    t.totals(counters((0, 0), (10, 0), (10, 0)))
    t.totals(counters((0, 0), (12, 0), (10, 0)))
    t.totals(counters((0, 0), (13, 0), (10, 0)))
    assert t.missing == 3
    # a packet read by `remote` just before the listing and by `delivered` just after evens out
    t2 = KernelTable(5000)
    t2.totals(counters((0, 0), (10, 0), (12, 0)))
    t2.totals(counters((0, 0), (20, 0), (20, 0)))
    assert t2.missing == 0


def test_directions_whose_packets_do_not_leave_are_reported_lost() -> None:
    t = KernelTable(5000)
    d = Direction(A, 0x01020304, D, "10.0.2.1")
    t.offer(d)
    key = [A[0], A[1], raw_id(d.stream_id)]
    dk = [A[0], D[0], D[1]]
    n = UNDELIVERED_MIN
    assert t.lost(doc("pairs", [(key, 100 + n - 1, 0)]), doc("delivered", [(dk, 100, 0)])) == []  # too few
    assert t.lost(doc("pairs", [(key, 100 + n, 0)]), doc("delivered", [(dk, 100, 0)])) == [d]
    # an element we do not hold (not ours) or a loopback direction (no delivery check) is never lost
    other = [A[0], 1, 99]
    assert t.lost(doc("pairs", [(other, 500, 0)]), doc("delivered", [])) == []
    lo = Direction(("127.0.0.1", 1), 8, ("127.0.0.1", 2), "127.0.0.1")
    t.offer(lo)
    assert t.lost(doc("pairs", [([lo.src[0], 1, raw_id(8)], 50, 0)]), doc("delivered", [])) == []


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


# -- IPv6: the same table, in an `inet` family, with its own sets and counters -----------------

A6 = ("fd31::2", 40001)
D6 = ("fd32::2", 40002)


def test_a_dual_stack_table_has_rules_for_both_families_and_a_v4_one_none_for_ipv6() -> None:
    script = KernelTable(5000, "::", (IPV4, IPV6)).setup_script()
    assert script.startswith("table inet blind_relay_5000 {")  # "::" is every address: no suffix
    pre = [line for line in script.splitlines() if "notrack" in line]
    assert len(pre) == 4
    v6 = [line for line in pre if "ip6 saddr . udp sport . @th,96,32 @pairs" in line]
    assert len(v6) == 2 and all("ip6 daddr set" in line and "map @pair_daddr6" in line for line in v6)
    assert 'counter name "remote6"' in script and 'counter name "delivered6"' in script
    assert "ip6 saddr set ip6 saddr . ip6 daddr . udp dport map @delivery_saddr6" in script
    assert "ip6" not in KernelTable(5000).setup_script()  # an IPv4 socket: IPv4 rules only


def test_a_table_bound_to_one_ipv6_address_matches_it_and_only_ipv6() -> None:
    t = KernelTable(7, "fd00::1", (IPV4, IPV6))
    assert t.name == "blind_relay_7_fd00__1" and t.families == (IPV6,)
    script = t.setup_script()
    assert "ip6 daddr fd00::1 udp dport 7" in script and " ip saddr" not in script
    assert KernelTable(7, "::ffff:192.0.2.1", (IPV4, IPV6)).families == (IPV4,)


def test_ipv6_directions_go_to_the_ipv6_sets() -> None:
    t = KernelTable(5000, None, (IPV4, IPV6))
    d = Direction(A6, 0x01020304, D6, "fd32::1")
    assert d.family is IPV6 and d.delivery == ("fd31::2", "fd32::2", 40002)
    t.offer(d)
    (c,) = t.take_changes()
    assert "add element inet blind_relay_5000 pair_daddr6 { fd31::2 . 40001 . 0x4030201 : fd32::2 }" in c.script
    assert "delivery_saddr6 { fd31::2 . fd32::2 . 40002 : fd32::1 }" in c.script
    assert c.script.splitlines()[-1] == "add element inet blind_relay_5000 pairs6 { fd31::2 . 40001 . 0x4030201 }"
    t.withdraw(d.key)
    (w,) = t.take_changes()
    assert w.script.splitlines()[0] == "delete element inet blind_relay_5000 pairs6 { fd31::2 . 40001 . 0x4030201 }"
    lo = Direction(("::1", 1), 7, ("::1", 2), "::1")
    assert lo.delivery is None
    t.offer(lo)
    (c2,) = t.take_changes()
    assert "pairs_local6 {" in c2.script and "delivered" not in c2.script


def test_totals_count_each_family_with_its_own_headers() -> None:
    t = KernelTable(5000, None, (IPV4, IPV6))
    now = {
        **counters((2, 2 * (HEADERS + 100)), (0, 0), (0, 0)),
        "local6": (3, 3 * (48 + 100)),
        "remote6": (5, 5 * (48 + 1000)),
        "delivered6": (4, 0),
    }
    assert t.totals(now) == (10, 5_500)
    assert t.missing == 1  # one IPv6 packet left the rule but was not seen leaving the host
    assert t.counter_names() == {"local", "remote", "delivered", "local6", "remote6", "delivered6"}


def test_lost_finds_an_ipv6_direction() -> None:
    t = KernelTable(5000, None, (IPV4, IPV6))
    d = Direction(A6, 0x01020304, D6, "fd32::1")
    t.offer(d)
    key = [A6[0], A6[1], raw_id(d.stream_id)]
    assert t.lost(
        doc("pairs6", [(key, 100 + UNDELIVERED_MIN, 0)]), doc("delivered6", [([A6[0], D6[0], D6[1]], 100, 0)])
    ) == [d]


def test_why_kernel_forwarding_is_off_is_one_line_that_names_the_fix() -> None:
    no_cap = unavailable_reason(NftError("netlink: Error: cache initialization failed: Operation not permitted"))
    assert "CAP_NET_ADMIN" in no_cap and "--systemd-unit --kernel-forwarding" in no_cap
    nft_text = "Error: Could not process rule: No such file or directory\ntable inet x {\n^^^^^"
    other = unavailable_reason(NftError(nft_text))
    assert "\n" not in other and other.startswith("nftables refused the relay's table: Error: Could not process")
    missing = "libnftables is not installed (libnftables.so.1: cannot open); install the nftables package"
    assert unavailable_reason(NftError(missing)) == missing
