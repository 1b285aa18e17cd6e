"""`GET /pairings` on a real `blind-relay` process carrying real Node hyperdht connections: one
pairing per relayed connection, naming the keys the peers' nodes connect to the relay with (the
client, hyperdht's pairing initiator, first), with what each side sent; on the default path and
with `--kernel-forwarding`, where nftables carries the established pair and its per-direction
counters are what the record shows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.interop._relay_net import Testnet, run_peers
from tests.interop._relay_proc import RelayProcess
from tests.interop.test_interop_relay import assert_relayed, wait_until

pytestmark = [pytest.mark.interop, pytest.mark.timeout(240)]

PAYLOAD = 1_000_000


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[Testnet]:
    with Testnet(node, size=5) as tn:
        yield tn


def pairings(relay: RelayProcess) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(relay.get("/pairings"))
    return doc


@pytest.mark.parametrize("kernel", [False, True], ids=["default", "kernel"])
def test_interop_pairings_name_both_peers_and_what_each_sent(
    node: str, testnet: Testnet, tmp_path: Path, kernel: bool
) -> None:
    flags = ["--kernel-forwarding"] if kernel else []
    with RelayProcess(tmp_path / "store", *flags, bootstrap=testnet.bootstrap) as relay:
        relay.start()
        assert relay.key is not None, relay.stderr
        assert relay.stats()["kernel"]["enabled"] is kernel, relay.stats()["kernel"]
        before = pairings(relay)
        assert before["relay_key"] == relay.key and before["pairings"] == [] and before["recorded"] == 0
        res = run_peers(node, testnet.bootstrap, relay.key, relay.port, "client", pairs=1, size=PAYLOAD)
        assert_relayed(res, relay, pairs=1)
        client, server = res.summary["clientKey"], res.summary["serverKey"]
        assert client != server
        wait_until(lambda: pairings(relay)["pairings"][-1]["closed_at"] is not None)  # the peers left
        doc = pairings(relay)
        (p,) = doc["pairings"]
        assert doc["recorded"] == 1 and p["opened_at"] <= p["closed_at"]
        assert [x["key"] for x in p["peers"]] == [client, server]
        for side in p["peers"]:
            # the client sent PAYLOAD and the server echoed it: each side its own share, plus
            # UDX headers, secret-stream framing and acks
            assert PAYLOAD < side["bytes"] < 1.2 * PAYLOAD, p
            assert side["packets"] > PAYLOAD // 1500, p
            assert side["seen_before"] is False and side["first_seen_at"] <= p["opened_at"]
        traffic = relay.stats()["traffic"]
        recorded = sum(x["bytes"] for x in p["peers"])
        if kernel:
            # nftables carried nearly all of it, and the record has it: beyond what Python saw,
            # the pairing holds what the kernel forwarded (a packet forwarded in the loop turn in
            # which the pair left the kernel is in the socket's totals only)
            python_only = traffic["relayed_bytes"] - traffic["kernel_bytes"]
            assert traffic["kernel_bytes"] >= 2 * PAYLOAD > 10 * python_only, traffic
            assert 0.99 * traffic["kernel_bytes"] <= recorded - python_only <= traffic["kernel_bytes"], (p, traffic)
        else:
            assert traffic["kernel_bytes"] == 0 and recorded == traffic["relayed_bytes"], (p, traffic)

        # two more pairs from one run's nodes: each pair opens its own relay sessions from the same
        # two node keys, so of each key's two sessions exactly one is its first sighting
        res = run_peers(node, testnet.bootstrap, relay.key, relay.port, "client", pairs=2, size=50_000)
        assert_relayed(res, relay, pairs=2)
        wait_until(lambda: all(x["closed_at"] is not None for x in pairings(relay)["pairings"]))
        doc = pairings(relay)
        assert doc["recorded"] == 3 and [x["id"] for x in doc["pairings"]] == [1, 2, 3]
        later = doc["pairings"][1:]
        for q in later:
            assert [x["key"] for x in q["peers"]] == [res.summary["clientKey"], res.summary["serverKey"]]
            assert all(50_000 < x["bytes"] < 1.2 * 50_000 for x in q["peers"]), q
        for side in (0, 1):
            assert sorted(q["peers"][side]["seen_before"] for q in later) == [False, True], later
