"""The pairing record's bounds and its first-sighting rule (the seam the wizard's verdict reads)."""

from __future__ import annotations

from dataclasses import dataclass

from relay.service.pairings import PairingLog


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


@dataclass
class Stream:
    relayed_bytes: int = 0
    relayed_packets: int = 0


def test_first_session_of_a_key_is_not_seen_before_and_a_later_one_is() -> None:
    log = PairingLog("relay", clock=Clock())
    a1 = log.saw_key("a")
    b1 = log.saw_key("b")
    rec = log.open(((a1, None), (b1, None)))
    assert [p.seen_before for p in rec.peers] == [False, False]
    a2 = log.saw_key("a")
    c1 = log.saw_key("c")
    rec2 = log.open(((a2, None), (c1, None)))
    assert rec2.peers[0].seen_before and rec2.peers[0].first_seen_at == a1.first_seen_at
    assert not rec2.peers[1].seen_before


def test_open_pairing_reads_bytes_live_and_keeps_them_when_closed() -> None:
    log = PairingLog("relay", clock=Clock())
    sa, sb = Stream(), Stream()
    rec = log.open(((log.saw_key("a"), sa), (log.saw_key("b"), sb)))
    sa.relayed_bytes, sa.relayed_packets = 500, 3
    assert log.as_json()["pairings"][0]["peers"][0]["bytes"] == 500
    log.close(rec)
    sa.relayed_bytes = 9999
    doc = log.as_json()["pairings"][0]
    assert doc["closed_at"] is not None and doc["peers"][0]["bytes"] == 500 and doc["peers"][0]["packets"] == 3
    assert rec.peers[0].stream is None


def test_records_and_keys_are_bounded_and_say_what_they_dropped() -> None:
    log = PairingLog("relay", capacity=3, keys_capacity=4, clock=Clock())
    for i in range(5):
        log.open(((log.saw_key(f"k{i}a"), None), (log.saw_key(f"k{i}b"), None)))
    doc = log.as_json()
    assert [r["id"] for r in doc["pairings"]] == [3, 4, 5]
    assert doc["recorded"] == 5 and doc["evicted"] == 2
    assert doc["keys_evicted"] == 6 and doc["keys_evicted_at"] is not None
    assert log.first_seen("k0a") is None and log.first_seen("k4b") is not None
