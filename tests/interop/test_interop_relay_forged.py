"""Issue #13: forged packets for a live relayed pair's stream ids, sent from another address.

A real Node hyperdht pair (`js/relay_echo_pair.js`) relays through the relay and keeps echoing;
its peers report the relay-side ids of their relayed raw streams (`rawStream.remoteId`). A plain
UDP socket on 127.0.0.9 then sends the relay, with those ids, forged DATA, END and DESTROY, and
a few thousand garbage datagrams. Our relay pins each relayed stream to its peer's address: the
pair keeps echoing, byte-exact, and every forged packet is counted as `dropped{wrong_address}`.
The same packets against the Node relay (npm blind-relay, `benchmarks/js/relay_node_server.js`)
are the control that shows the attack is real: libudx forwards them, forged in-window DATA
stalls the pair and the forged DESTROY tears it down. (With the address check taken out of
our relay, it fails the same way: the forged DATA stalls the pair.)

Waits are on events (the relay's counters, the pair's answers), never on time.
"""

from __future__ import annotations

import json
import os
import queue
import random
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from relay.udx.packet import DATA, DESTROY, END, encode
from tests.interop._client_peers import NodeRelay
from tests.interop._relay_net import INTEROP, Testnet
from tests.interop.test_interop_relay_attacks import RSS_BUDGET, start_relay, wait_until

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

FORGER = "127.0.0.9"  # the attacker's address: not the pair's (127.0.0.1)
FORGED_DATA_PER_ID = 2000  # seqs 0..1999 for each relayed id
CHUNK = 250
GARBAGE = 3000
ROUND_BYTES = 65_536
NODE_ECHO_TIMEOUT_MS = 12_000  # a stalled pair: no round back in 12 s (a round takes ms)
ECHO_DURING = 100  # echo rounds that go on after each forged phase was sent


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[Testnet]:
    with Testnet(node, size=4) as tn:
        yield tn


class EchoPair:
    """`js/relay_echo_pair.js` for one relayed pair: `ready` has both ends' relay-side stream ids,
    `call()` sends one command and returns its answer; `closed` collects the ends that closed."""

    def __init__(self, node: str, testnet: Testnet, relay_key: str, echo_timeout_ms: int = 20_000) -> None:
        opts = {"bootstrap": testnet.bootstrap.split(","), "relay": relay_key, "timeout": echo_timeout_ms}
        self.proc = subprocess.Popen(
            [node, "js/relay_echo_pair.js", json.dumps(opts)],
            cwd=INTEROP,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.closed: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()
        self.ready = self._answer(60)
        assert self.ready.get("ready"), (self.ready, self.err)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if "closed" in msg:
                self.closed.append(msg)
            else:
                self.answers.put(msg)
        self.answers.put(None)

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    @property
    def err(self) -> str:
        return "".join(self.stderr)[-2000:]

    def _answer(self, timeout: float) -> dict[str, Any]:
        msg = self.answers.get(timeout=timeout)
        if msg is None:
            raise RuntimeError(f"relay_echo_pair.js exited with {self.proc.wait(10)}: {self.err}")
        return msg

    def call(self, cmd: str, timeout: float = 60, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
        self.proc.stdin.flush()
        return self._answer(timeout)

    def targets(self) -> list[tuple[str, int, int]]:
        """(relay host, relay port, relay-side stream id) of both relayed streams."""
        return [
            (e["remoteHost"], int(e["remotePort"]), int(e["remoteId"]))
            for e in (self.ready["client"], self.ready["server"])
        ]

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> EchoPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Forger:
    """A plain UDP socket on another loopback host, sending what an off-path attacker can."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((FORGER, 0))

    def data(self, host: str, port: int, sid: int, seqs: range) -> int:
        """DATA packets for `sid`, one per seq, 64 bytes each that the pair never sent. libudx
        streams start at seq 0 and a receiver takes seqs up to its window (~3,600 packets) past
        what it has: seqs 0..1,999 cover that window when sent, so passed on, some are taken."""
        for seq in seqs:
            self.sock.sendto(encode(DATA, sid, 1 << 22, seq, 0, self.rng.randbytes(64)), (host, port))
        return len(seqs)

    def control(self, host: str, port: int, sid: int, type_: int) -> int:
        self.sock.sendto(encode(type_, sid, 1 << 22, self.rng.getrandbits(32), 0), (host, port))
        return 1

    def garbage(self, host: str, port: int, n: int) -> tuple[int, int]:
        """n datagrams, half random bytes that are neither UDX nor dht-rpc (first byte not 0xff,
        0x03 or 0x13), then half UDX-shaped with random ids and flags. A socket reads in order:
        once the shaped ones are counted, the others before them were read too."""
        firsts = [b for b in range(256) if b not in (0xFF, 0x03, 0x13)]
        other = n // 2
        for _ in range(other):
            body = self.rng.randbytes(self.rng.randrange(1, 200))
            self.sock.sendto(bytes([self.rng.choice(firsts)]) + body, (host, port))
        for _ in range(n - other):
            sid = self.rng.getrandbits(32)
            datagram = encode(self.rng.getrandbits(6), sid, 0, self.rng.getrandbits(32), 0, self.rng.randbytes(32))
            self.sock.sendto(datagram, (host, port))
        return n - other, other

    def marker(self, host: str, port: int) -> int:
        """One UDX-shaped datagram with a random id: the relay counts it `unknown_stream` whether it
        pins addresses or not, and reads in order, so once it is counted all sent before was read."""
        self.sock.sendto(encode(0, self.rng.getrandbits(32), 0, 0, 0), (host, port))
        return 1

    def close(self) -> None:
        self.sock.close()


def echo_again(pair: EchoPair, rounds: int = 5) -> dict[str, Any]:
    return pair.call("echo", rounds=rounds, bytes=ROUND_BYTES)


Wait = Callable[[str, int], None]  # (phase, random-id UDX datagrams sent so far: markers, garbage)


def forged_attack(pair: EchoPair, forger: Forger, phases: list[str], seen: Wait, record: dict[str, Any]) -> None:
    """Each phase ("data": forged DATA, "end", "destroy") for both relayed ids while the pair
    echoes (at least ECHO_DURING rounds after it was sent), then 5 more rounds; then garbage in
    chunks (the relay's queue drops, never blocks, a burst). `seen` waits until the relay has read
    what was sent (ours: its counters)."""
    targets = pair.targets()
    forged = unknown = 0
    for name in phases:
        assert pair.call("start", bytes=ROUND_BYTES).get("started")
        if name == "data":  # in chunks, each read before the next: a burst could overflow the queue
            for first in range(0, FORGED_DATA_PER_ID, CHUNK):
                for host, port, sid in targets:
                    forged += forger.data(host, port, sid, range(first, min(first + CHUNK, FORGED_DATA_PER_ID)))
                unknown += forger.marker(*targets[0][:2])
                seen(name, unknown)
        else:
            for host, port, sid in targets:
                forged += forger.control(host, port, sid, {"end": END, "destroy": DESTROY}[name])
            unknown += forger.marker(*targets[0][:2])
            seen(name, unknown)
        record[f"during_{name}"] = during = pair.call("stop", atLeast=ECHO_DURING)
        if during["failed"]:
            record["closed"] = list(pair.closed)
            return  # the pair is gone (or stalled): nothing more to echo
        record[f"after_{name}"] = echo_again(pair)
    record["forged"] = forged
    host, port, _ = targets[0]
    shaped = other = 0
    while shaped + other < GARBAGE:
        s, o = forger.garbage(host, port, CHUNK)
        shaped, other = shaped + s, other + o
        seen("garbage", unknown + shaped)
    record["garbage"] = {"udx_shaped": shaped, "other": other}
    record["after_garbage"] = echo_again(pair)
    record["closed"] = list(pair.closed)


def test_forged_packets_from_another_address_leave_a_relayed_pair_alone(
    node: str, testnet: Testnet, tmp_path: Path
) -> None:
    """Forged DATA (2 x 2,000), END and DESTROY for both relayed stream ids, then 3,000 garbage
    datagrams, from 127.0.0.9 while the pair echoes: every echo round is exact before, during and
    after, every forged packet is `dropped{wrong_address}`, the UDX-shaped garbage is counted as
    `dropped{unknown_stream}` and the garbage that is neither UDX nor dht-rpc as `dropped{garbage}`
    (the DHT node used to drop it without a count)."""
    rec: dict[str, Any] = {}
    forger = Forger(seed=os.getpid())
    with start_relay(tmp_path, testnet) as r, EchoPair(node, testnet, r.key or "") as pair:
        try:
            assert {t[1] for t in pair.targets()} == {r.port}, pair.ready  # both ends on our relay
            before = pair.call("echo", rounds=3, bytes=ROUND_BYTES)
            assert before["rounds"] == 3 and before["failed"] == 0, (before, pair.err)
            base = r.stats()["dropped"]
            base_traffic = r.stats()["traffic"]

            def seen(phase: str, unknown: int) -> None:
                def done() -> bool:
                    return r.stats()["dropped"].get("unknown_stream", 0) - base.get("unknown_stream", 0) >= unknown

                wait_until(done, timeout=30, what=f"the relay read the forged {phase} packets")

            forged_attack(pair, forger, ["data", "end", "destroy"], seen, rec)
        finally:
            forger.close()
        s = r.stats()
        rec["dropped"] = {k: v - base.get(k, 0) for k, v in s["dropped"].items()}
        rec["traffic"] = {k: v - base_traffic[k] for k, v in s["traffic"].items()}
        print("forged-packet attack on our relay:", json.dumps(rec))
        for phase in ("data", "end", "destroy"):
            d = rec[f"during_{phase}"]
            assert d["failed"] == 0 and d["rounds"] >= ECHO_DURING and d["open"], (phase, rec, pair.err)
        for phase in ("after_data", "after_end", "after_destroy", "after_garbage"):
            a = rec[phase]
            assert (a["rounds"], a["failed"], a["error"], a["open"]) == (5, 0, None, True), (phase, rec, pair.err)
        assert rec["closed"] == [], rec
        assert rec["forged"] == 2 * FORGED_DATA_PER_ID + 4
        assert rec["dropped"].get("wrong_address", 0) >= rec["forged"], rec
        markers = FORGED_DATA_PER_ID // CHUNK + 2
        assert rec["dropped"].get("unknown_stream", 0) >= rec["garbage"]["udx_shaped"] + markers, rec
        assert rec["dropped"].get("garbage", 0) >= rec["garbage"]["other"], rec
        every = rec["forged"] + rec["garbage"]["udx_shaped"] + rec["garbage"]["other"]
        assert rec["traffic"]["dropped_packets"] >= every, rec  # the total tells the truth too
        assert r.proc is not None and r.proc.poll() is None, r.stderr[-3000:]
        assert s["memory"]["rss_bytes"] < RSS_BUDGET
        assert "Traceback" not in r.stderr, r.stderr[-3000:]


def test_forged_packets_from_another_address_take_down_a_pair_on_the_node_relay(node: str, testnet: Testnet) -> None:
    """The control, which shows the forged packets are real attacks: the same packets against npm
    blind-relay (libudx), which forwards a packet with a known id from any address. Two pairs at
    once: forged DATA (seqs 0..1,999) for one, forged END then DESTROY for the other. END does
    nothing; in-window DATA stalls its pair (the peers' secretstreams get bytes nobody sent) and
    DESTROY kills its pair (the peer it is passed to closes at once, the other one when UDX gives
    up, ~13 s): no echo round comes back after either."""
    recs: dict[str, dict[str, Any]] = {"data": {}, "end-destroy": {}}
    phases = {"data": ["data"], "end-destroy": ["end", "destroy"]}
    relay = NodeRelay(node, testnet.bootstrap)
    try:
        with (
            EchoPair(node, testnet, relay.key, NODE_ECHO_TIMEOUT_MS) as p1,
            EchoPair(node, testnet, relay.key, NODE_ECHO_TIMEOUT_MS) as p2,
        ):
            pairs = {"data": p1, "end-destroy": p2}
            for pair in pairs.values():
                assert {t[1] for t in pair.targets()} <= relay.ports, (pair.ready, relay.ports)
                before = pair.call("echo", rounds=3, bytes=ROUND_BYTES)
                assert before["rounds"] == 3 and before["failed"] == 0, (before, pair.err)

            def attack(case: str) -> None:
                forger = Forger(seed=os.getpid())
                try:
                    forged_attack(pairs[case], forger, phases[case], lambda *_: None, recs[case])
                finally:
                    forger.close()

            threads = [threading.Thread(target=attack, args=(case,)) for case in recs]
            for t in threads:
                t.start()
            for t in threads:
                t.join(90)
            print("forged-packet attack on the Node relay:", json.dumps(recs))
            assert recs["end-destroy"]["after_end"]["failed"] == 0, recs  # a forged END alone: harmless
            for case, phase in (("data", "data"), ("end-destroy", "destroy")):
                during = recs[case][f"during_{phase}"]
                assert during["failed"] == 1 and during["rounds"] < ECHO_DURING, (case, recs)
    finally:
        relay.stop()
