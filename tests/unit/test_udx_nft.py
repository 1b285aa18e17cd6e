"""relay.udx.nft against the real kernel: the libnftables binding, and named counters read over
netlink equal what nft itself lists (the relay reads them once a second; tests run as root)."""

from __future__ import annotations

import os
import socket

import pytest

from relay.udx.kernel import IPV4, IPV6, KernelTable
from relay.udx.nft import NFPROTO_INET, Nft, NftError, read_counters


def test_counters_read_over_netlink_are_nfts_own() -> None:
    nft = Nft()
    name = f"t_counters_{os.getpid()}"
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    port = sink.getsockname()[1]
    try:
        nft.run(
            f"table ip {name} {{\n flags owner\n counter hits {{ }}\n counter idle {{ }}\n"
            " chain out {\n  type filter hook output priority 0; policy accept;\n"
            f'  udp dport {port} counter name "hits"\n }}\n}}'
        )
        assert read_counters(name) == {"hits": (0, 0), "idle": (0, 0)}
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _ in range(3):
                s.sendto(b"x" * 100, ("127.0.0.1", port))
        got = read_counters(name)
        assert got["hits"] == (3, 3 * (28 + 100)) and got["idle"] == (0, 0)
        listed = {
            c["counter"]["name"]: (c["counter"]["packets"], c["counter"]["bytes"])
            for c in nft.query(f"list counters table ip {name}")["nftables"]
            if "counter" in c
        }
        assert listed == got
    finally:
        sink.close()
        nft.close()  # the owner table goes with the context
    assert read_counters(name) == {}  # gone: nothing to list, no error


def test_nft_errors_are_nfts_own_words() -> None:
    nft = Nft()
    try:
        with pytest.raises(NftError, match=r"syntax error|No such file"):
            nft.run("add element ip no_such_table_here s { 1.2.3.4 }")
    finally:
        nft.close()
    with pytest.raises(NftError, match="closed"):
        nft.run("list tables")


def test_the_dual_stack_table_loads_and_counts_ipv6_with_its_headers() -> None:
    """The relay's `inet` table as the kernel takes it: IPv6 packets count into the `6` counters,
    read over netlink with the inet family, 48 header bytes each (IPv6 + UDP)."""
    nft = Nft()
    table = KernelTable(1, None, (IPV4, IPV6))
    table.name = f"t_dual_{os.getpid()}"
    sink = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sink.bind(("::1", 0))
    port = sink.getsockname()[1]
    try:
        nft.run(table.setup_script())
        assert read_counters(table.name, NFPROTO_INET) == {n: (0, 0) for n in table.counter_names()}
        nft.run(
            f"add chain inet {table.name} out {{ type filter hook output priority 0; policy accept; }}\n"
            f'add rule inet {table.name} out ip6 daddr ::1 udp dport {port} counter name "local6"'
        )
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            for _ in range(3):
                s.sendto(b"x" * 100, ("::1", port))
        got = read_counters(table.name, NFPROTO_INET)
        assert got["local6"] == (3, 3 * (IPV6.headers + 100)) and got["local"] == (0, 0)
        assert table.totals(got) == (3, 300)
    finally:
        sink.close()
        nft.close()
    assert read_counters(table.name, NFPROTO_INET) == {}
