"""The verify verdict's rule: a pairing in the relay's record that is the job's own, else which case.

The record is built by the relay's own `PairingLog` (relay/service/pairings.py) and read back
through `/pairings`' JSON, so the client and the relay agree on the shape; hostile answers come
from a loopback endpoint that misbehaves on purpose.
"""

from __future__ import annotations

import json
import math

import pytest

from cosmictui.ops import progress
from cosmictui.ops.jobs.evidence import Window, attribute
from cosmictui.ops.metrics.client import MetricsError
from cosmictui.ops.metrics.pairings import NoPairingRecord, PairingRecord, parse_pairings, read_pairings
from relay.service.pairings import PairingLog, RelayedCounts
from tests.unit._hostile_http import HostileHTTP, answer, big, drip, json_answer

RELAY = "r" * 52
OTHER_RELAY = "o" * 52


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Counts(RelayedCounts):
    def __init__(self, b: int) -> None:
        self._b = b

    @property
    def relayed_bytes(self) -> int:
        return self._b

    @property
    def relayed_packets(self) -> int:
        return self._b // 1000


def pair(log: PairingLog, clock: Clock, a: str, b: str, at: float, sent: int = 4000) -> None:
    clock.t = at
    sa, sb = log.saw_key(a), log.saw_key(b)
    log.open(((sa, Counts(sent)), (sb, Counts(sent // 2))))


def record(log: PairingLog) -> PairingRecord:
    return parse_pairings(json.dumps(log.as_json()))


def relay_log(**kw: int) -> tuple[PairingLog, Clock]:
    clock = Clock(1_000_000.0)
    return PairingLog(RELAY, clock=clock, **kw), clock


# The window: the restart at 1000100, the test job's create started at 1000200.
WINDOW = Window(
    opened_at=1_000_200.0, job_since=1_000_200.0, relay_key=RELAY, probe_keys=frozenset({"probeA", "probeB"})
)


def test_the_jobs_own_pairing_is_proven_with_when_and_bytes() -> None:
    log, clock = relay_log()
    pair(log, clock, "oldjob", "worker", 1_000_050.0)  # before the window: never the job's
    pair(log, clock, "newagent", "worker", 1_000_230.0, sent=6000)
    a = attribute(record(log), WINDOW, env_keys=(RELAY,))
    assert a.kind == "proven" and a.pairing is not None and a.pairing.keys == {"newagent", "worker"}
    assert a.pairing.bytes == 9000
    assert "30 s after the window opened" in a.lines[0] and "9.0 KB relayed" in a.lines[0]
    assert "still open" in a.lines[0]


def test_the_probes_pairing_is_never_the_jobs() -> None:
    """Case (a) of the issue: the probe ran after the job was created; its keys are new too."""
    log, clock = relay_log()
    pair(log, clock, "probeA", "probeB", 1_000_240.0)
    a = attribute(record(log), WINDOW, env_keys=(RELAY,))
    assert a.kind == "probe-only" and "only the wizard's probe" in a.reason and a.pairing is None
    assert "1 of them the wizard's probe" in a.lines[1]


def test_older_jobs_re_pairing_after_a_restart_are_not_the_jobs() -> None:
    """Case (b): keys the relay knew before the job was created re-pair in the window."""
    log, clock = relay_log()
    pair(log, clock, "oldjob", "worker", 1_000_050.0)
    pair(log, clock, "oldjob", "worker", 1_000_210.0)  # reconnects after the second restart
    a = attribute(record(log), WINDOW, env_keys=(RELAY,))
    assert a.kind == "older-only" and "Only older jobs re-paired" in a.reason


def test_nothing_paired_is_not_through_this_relay() -> None:
    log, clock = relay_log()
    pair(log, clock, "oldjob", "worker", 1_000_050.0)
    a = attribute(record(log), WINDOW, env_keys=(RELAY,))
    assert a.kind == "not-relayed" and a.reason.startswith("Not through this relay")
    assert "What to check" in a.check


def test_the_env_no_longer_listing_the_relay_is_named_and_never_proven() -> None:
    log, clock = relay_log()
    pair(log, clock, "newagent", "worker", 1_000_230.0)
    a = attribute(record(log), WINDOW, env_keys=(OTHER_RELAY,))
    assert a.kind == "env-dropped" and a.pairing is not None and OTHER_RELAY[:12] in a.reason
    empty, _ = relay_log()
    b = attribute(record(empty), WINDOW, env_keys=(OTHER_RELAY,))
    assert b.kind == "env-dropped" and b.reason.startswith("Not through this relay: the .env no longer lists it")


def test_a_relay_restarted_in_the_window_cannot_tell() -> None:
    clock = Clock(1_000_220.0)
    log = PairingLog(RELAY, clock=clock)  # started after the window opened
    pair(log, clock, "newagent", "worker", 1_000_230.0)
    a = attribute(record(log), WINDOW, env_keys=(RELAY,))
    assert a.kind == "cannot-tell" and "restarted" in a.reason and not a.proven


def test_another_relays_record_cannot_tell() -> None:
    log = PairingLog(OTHER_RELAY, clock=Clock())
    a = attribute(record(log), WINDOW)
    assert a.kind == "cannot-tell" and "not this relay" in a.reason


def test_forgotten_keys_make_a_new_looking_key_cannot_tell() -> None:
    log, clock = relay_log(keys_capacity=2)
    pair(log, clock, "oldjob", "worker", 1_000_050.0)
    pair(log, clock, "x", "y", 1_000_060.0)  # pushes oldjob and worker out of the key table
    pair(log, clock, "oldjob", "worker", 1_000_230.0)  # now looks first seen in the window
    rec = record(log)
    assert rec.keys_evicted and rec.keys_evicted > 0
    a = attribute(rec, WINDOW, env_keys=(RELAY,))
    assert a.kind == "cannot-tell" and "forgot" in a.reason and not a.proven


def test_evicted_pairings_that_may_be_the_jobs_cannot_tell() -> None:
    log, clock = relay_log(capacity=2)
    for i in range(4):
        pair(log, clock, "probeA", "probeB", 1_000_210.0 + i)
    a = attribute(record(log), WINDOW, env_keys=(RELAY,))
    assert a.kind == "cannot-tell" and "dropped 2 older ones" in a.reason
    # Evicted records all older than the window hide nothing: the verdict names the case.
    log2, clock2 = relay_log(capacity=2)
    for i in range(4):
        pair(log2, clock2, f"old{i}", "worker", 1_000_010.0 + i)
    assert attribute(record(log2), WINDOW, env_keys=(RELAY,)).kind == "not-relayed"


def test_unreadable_records_cannot_tell_and_are_never_proof() -> None:
    log, _clock = relay_log()
    doc = log.as_json()
    doc["pairings"] = [
        {"id": 1, "opened_at": "soon", "peers": []},
        {"id": 2, "opened_at": 1_000_230.0, "closed_at": None, "peers": [{"key": "a b"}, {"key": "c"}]},
    ]
    rec = parse_pairings(json.dumps(doc))
    assert rec.unreadable == 2 and not rec.pairings
    a = attribute(rec, WINDOW, env_keys=(RELAY,))
    assert a.kind == "cannot-tell" and "could not be read" in a.reason


def test_bad_values_are_missing_not_guessed() -> None:
    log, clock = relay_log()
    pair(log, clock, "newagent", "worker", 1_000_230.0)
    doc = log.as_json()
    peer = doc["pairings"][0]["peers"][0]
    peer["first_seen_at"] = math.nan
    peer["bytes"] = -5
    doc["pairings"][0]["peers"][1]["first_seen_at"] = True  # a bool is not a time
    doc["keys_evicted"] = "0"
    rec = parse_pairings(json.dumps(doc, allow_nan=True))
    seen = rec.pairings[0]
    assert seen.peers[0].first_seen_at is None and seen.peers[0].bytes is None and seen.bytes is None
    assert rec.keys_evicted is None and rec.problems
    # no first sighting is known and the key table's state is not: never proven
    assert attribute(rec, WINDOW, env_keys=(RELAY,)).kind != "proven"
    doc["started_at"] = -1
    assert attribute(parse_pairings(json.dumps(doc)), WINDOW).kind == "cannot-tell"


@pytest.mark.parametrize("body", ["[]", "not json", "[" * 100_000, '"x"', "null"])
def test_a_body_that_is_no_record_raises_metrics_error(body: str) -> None:
    with pytest.raises(MetricsError):
        parse_pairings(body)


def test_no_record_and_unreadable_record_cannot_tell() -> None:
    assert attribute(None, WINDOW).kind == "cannot-tell"
    err = MetricsError("http://127.0.0.1:9", "connection refused by 127.0.0.1:9", "is the relay running?")
    a = attribute(err, WINDOW)
    assert a.kind == "cannot-tell" and "connection refused" in a.reason


async def test_read_pairings_from_hostile_endpoints_is_bounded_and_never_crashes() -> None:
    log, clock = relay_log()
    pair(log, clock, "newagent", "worker", 1_000_230.0)
    good = HostileHTTP(pairings=json_answer(log.as_json()))
    missing = HostileHTTP()  # no /pairings: 404, as the Node relay and older versions
    dripping = HostileHTTP(pairings=drip(0.05))
    huge = HostileHTTP(pairings=big(8 * 1024 * 1024))
    garbage = HostileHTTP(pairings=answer("<html>hi</html>", "text/html"))
    try:
        rec = await read_pairings(good.url, timeout=5)
        assert rec.relay_key == RELAY and len(rec.pairings) == 1
        with pytest.raises(NoPairingRecord, match="keeps no record"):
            await read_pairings(missing.url, timeout=5)
        with pytest.raises(MetricsError, match=r"timed out after 0\.5 s"):
            await read_pairings(dripping.url, timeout=0.5)
        with pytest.raises(MetricsError, match="not a relay"):
            await read_pairings(huge.url, timeout=10)
        with pytest.raises(MetricsError, match="not JSON"):
            await read_pairings(garbage.url, timeout=5)
    finally:
        for s in (good, missing, dripping, huge, garbage):
            s.close()


def test_probe_keys_are_remembered_across_processes_and_bounded(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.setattr(progress, "PROBE_KEYS_KEPT", 3)
    progress.remember_probe_keys(["a1", "a2"], at=100.0)
    progress.remember_probe_keys(["b1", "b2"], at=200.0)
    assert progress.probe_keys() == {"b1", "b2", "a2"} or progress.probe_keys() == {"b1", "b2", "a1"}
    progress.probe_keys_path().write_text("{ not json")
    assert progress.probe_keys() == frozenset()  # a broken file is no keys, never a crash
    progress.remember_probe_keys(["c1"])
    assert progress.probe_keys() == {"c1"}
