"""`blind-relay --kernel-forwarding` carrying real Node hyperdht connections: established pairs
are forwarded by nftables (relay.udx.kernel), the rest as before; nothing is left behind.

As tests/interop/test_interop_relay.py: a Node `hyperdht/testnet` on 127.0.0.1, our relay
process bootstrapped on it, Node peers (`js/relay_peers.js`) with `relayThrough: <our key>`.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.interop._relay_net import Testnet, run_peers
from tests.interop._relay_proc import RelayProcess
from tests.interop.test_interop_relay import assert_relayed, wait_until

pytestmark = [pytest.mark.interop, pytest.mark.timeout(240)]

PAYLOAD = 2_000_000


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[Testnet]:
    with Testnet(node, size=5) as tn:
        yield tn


def tables() -> list[str]:
    """The host's nftables table names (text, not -j: while another test's relay dies, its table
    can vanish mid-listing and nft then adds a line that is not JSON)."""
    out = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    return [line.split()[-1] for line in out.splitlines() if line.startswith("table ")]


def test_interop_relay_kernel_forwards_real_hyperdht_pairs(node: str, testnet: Testnet, tmp_path: Path) -> None:
    with RelayProcess(tmp_path / "store", "--kernel-forwarding", bootstrap=testnet.bootstrap) as relay:
        relay.start()
        assert relay.key is not None, relay.stderr
        assert relay.stats()["kernel"]["enabled"] is True, relay.stats()["kernel"]
        assert f"blind_relay_{relay.port}_127_0_0_1" in tables()
        res = run_peers(node, testnet.bootstrap, relay.key, relay.port, "client", pairs=3, size=PAYLOAD)
        assert_relayed(res, relay, pairs=3)  # every pair echoed 2 MB intact through our port
        st = relay.stats()
        traffic, kernel = st["traffic"], st["kernel"]
        # each way of each pair went into the kernel once both peers were seen ...
        assert kernel["skipped"] == {} and kernel["fallbacks"] == {} and kernel["errors"] == 0, kernel
        # ... and carried nearly all of it: Python saw only each side's first packets
        assert traffic["kernel_bytes"] >= 2 * 3 * PAYLOAD, traffic
        assert traffic["kernel_packets"] >= 0.9 * traffic["relayed_packets"], traffic
        assert traffic["relayed_bytes"] >= traffic["kernel_bytes"]
        # the peers closed: their pairs leave the kernel with their streams
        wait_until(lambda: relay.stats()["kernel"]["directions"] == 0)
        assert relay.stats()["pairings"]["active"] == 0


def test_interop_relay_killed_leaves_no_kernel_forwarding(node: str, testnet: Testnet, tmp_path: Path) -> None:
    """The table belongs to the relay's netlink socket: SIGKILL and the kernel drops it."""
    with RelayProcess(tmp_path / "store", "--kernel-forwarding", bootstrap=testnet.bootstrap) as relay:
        relay.start()
        name = f"blind_relay_{relay.port}_127_0_0_1"
        assert name in tables()
        relay.terminate(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while name in tables():
            assert time.monotonic() < deadline, "the killed relay's table is still there"
            time.sleep(0.05)


def test_interop_relay_kernel_forwarding_unavailable_still_relays(node: str, testnet: Testnet, tmp_path: Path) -> None:
    """Without CAP_NET_ADMIN the flag cannot be honoured: said on stderr and in /stats, and the
    relay forwards in Python as without it."""
    no_admin = ["setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin", "--"]
    relay = RelayProcess(tmp_path / "store", "--kernel-forwarding", bootstrap=testnet.bootstrap)
    relay.argv = no_admin + relay.argv
    with relay:
        relay.start()
        assert relay.key is not None, relay.stderr
        kernel = relay.stats()["kernel"]
        assert kernel["enabled"] is False and "nftables" in kernel["reason"], kernel
        # one plain line that names what is missing and how to get it (the wizard shows it as is)
        reason = kernel["reason"]
        assert "\n" not in reason and "CAP_NET_ADMIN" in reason and "--systemd-unit" in reason, reason
        said = [line for line in relay.stderr.splitlines() if "kernel forwarding is off" in line]
        assert len(said) == 1 and said[0].endswith(reason), relay.stderr
        assert f"blind_relay_{relay.port}_127_0_0_1" not in tables()
        res = run_peers(node, testnet.bootstrap, relay.key, relay.port, "client", size=200_000)
        assert_relayed(res, relay)
        traffic = relay.stats()["traffic"]
        assert traffic["kernel_packets"] == 0 and traffic["relayed_bytes"] >= 400_000
