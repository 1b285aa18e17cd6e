"""Prove a blind relay carries a connection: two Python peers on this host meet through it.

`run_probe(relay_key, bootstrap, timeout)` joins the DHT with two nodes, looks the relay's key
up, starts a hyperdht server that offers the relay (`relay_through`) and connects a client
to it through the same relay, both with punching off — the blocked cluster network, where
the relay is the only path. The echo must come back over the relay's address, or the probe
fails. Works for any blind relay (ours or npm blind-relay-service): it only speaks the wire.

Stages, in order (each with its own duration and a sentence): key found on the DHT,
handshake with the relay, pairing matched, first echo, bytes and round trip. The first
failing stage says why; the whole probe is bounded by `timeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import shlex
import statistics
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from cosmictui.ops.progress import remember_probe_keys
from relay.dht import Connection, DHTError, DHTNode, HyperDHTServer
from relay.dht.client import ConnectTrace, connect
from relay.dht.messages import BOOTSTRAP_NODES, PeerRecord
from relay.keys import KeyEncodingError, decode_id, encode_id, key_pair
from relay.udx import UDX

STAGES = (
    "key found on the DHT",
    "handshake with the relay",
    "pairing matched",
    "first echo",
    "bytes and round trip",
)
PROBE_TIMEOUT = 30.0
KeysHook = Callable[[list[str]], None]
PAYLOAD_BYTES = 64 * 1024
ROUND_TRIPS = 5


class ProbeUsageError(ValueError):
    """The key or a bootstrap address is not valid (exit 2, not a failed probe)."""


@dataclass
class ProbeStage:
    name: str
    ok: bool
    seconds: float
    detail: str


@dataclass
class ProbeResult:
    relay_key: str
    ok: bool = False
    stages: list[ProbeStage] = field(default_factory=list)
    relayed: bool = False
    relay_address: str | None = None
    bytes: int = 0
    rtt_ms: float | None = None
    seconds: float = 0.0
    #: the public keys (z32) the probe's two peers used toward the relay: the relay records them
    #: in its pairing, and a verdict about a job must not count the probe's pairing as the job's
    peer_keys: list[str] = field(default_factory=list)

    @property
    def failed(self) -> ProbeStage | None:
        return next((s for s in self.stages if not s.ok), None)

    @property
    def error(self) -> str | None:
        f = self.failed
        return f"{f.name}: {f.detail}" if f else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "relay_key": self.relay_key,
            "ok": self.ok,
            "relayed": self.relayed,
            "relay_address": self.relay_address,
            "bytes": self.bytes,
            "rtt_ms": self.rtt_ms,
            "seconds": self.seconds,
            "error": self.error,
            "stages": [s.__dict__ for s in self.stages],
            "peer_keys": list(self.peer_keys),
        }


def parse_relay_key(key: str | bytes) -> bytes:
    try:
        return decode_id(key)
    except (KeyEncodingError, ValueError, TypeError) as e:
        raise ProbeUsageError(f"not a relay key: {key!r} ({e})") from None


def parse_bootstrap(nodes: list[str] | tuple[str, ...] | None) -> list[str]:
    out = list(nodes) if nodes else list(BOOTSTRAP_NODES)
    for n in out:
        host, sep, port = str(n).rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ProbeUsageError(f"bootstrap node must be HOST:PORT, got {n!r}")
    return out


def _bind_host(bootstrap: list[str]) -> str:
    """Loopback-only DHT (tests, sandboxes): stay on 127.0.0.1; else every interface."""
    for n in bootstrap:
        host = n.rpartition(":")[0].split("@")[-1]
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return "0.0.0.0"
        except ValueError:
            return "0.0.0.0"
    return "127.0.0.1"


class _Clock:
    def __init__(self) -> None:
        self.last = time.monotonic()

    def lap(self) -> float:
        now = time.monotonic()
        d, self.last = now - self.last, now
        return round(d, 4)


async def run_probe(
    relay_key: str | bytes,
    bootstrap: list[str] | tuple[str, ...] | None = None,
    timeout: float = PROBE_TIMEOUT,
    *,
    payload_bytes: int = PAYLOAD_BYTES,
    remember: KeysHook | None = remember_probe_keys,
) -> ProbeResult:
    """Run the probe; never raises for network trouble (that is a failed stage), only
    `ProbeUsageError` for a bad key or bootstrap address. `remember` is told the probe's peer
    keys before they reach the relay (by default they go to this machine's probe-key journal,
    which the verify verdict reads)."""
    pk = parse_relay_key(relay_key)
    boot = parse_bootstrap(bootstrap)
    result = ProbeResult(relay_key=encode_id(pk))
    started = time.monotonic()
    probe = _Probe(pk, boot, result, payload_bytes, remember)
    probe.deadline = started + timeout
    try:
        await asyncio.wait_for(probe.run(), timeout)
    except TimeoutError:
        probe.fail(f"timed out after {timeout:g}s (the whole probe is bounded)")
    finally:
        await probe.close()
    result.seconds = round(time.monotonic() - started, 3)
    result.ok = len(result.stages) == len(STAGES) and all(s.ok for s in result.stages) and result.relayed
    return result


@dataclass
class ProbeSample:
    """One point of `watch_probe`: the relayed round trip at `at` (wall clock), or why not."""

    at: float
    ok: bool
    rtt_ms: float | None
    relay_address: str | None
    detail: str


async def watch_probe(
    relay_key: str | bytes,
    bootstrap: list[str] | tuple[str, ...] | None = None,
    interval: float = 5.0,
    timeout: float = PROBE_TIMEOUT,
    count: int | None = None,
    *,
    echo_timeout: float | None = None,
    remember: KeysHook | None = remember_probe_keys,
) -> AsyncIterator[ProbeSample]:
    """Probe round trip over time, for a relay without metrics: one full probe, then one echo
    every `interval` over the same relayed connection; a broken connection is probed again.
    `timeout` bounds each probe, `echo_timeout` (default: the same) each echo."""
    echo_wait = timeout if echo_timeout is None else echo_timeout
    pk = parse_relay_key(relay_key)
    boot = parse_bootstrap(bootstrap)
    n = 0
    while count is None or n < count:
        result = ProbeResult(relay_key=encode_id(pk))
        probe = _Probe(pk, boot, result, 4096, remember)
        probe.deadline = time.monotonic() + timeout
        try:
            try:
                await asyncio.wait_for(probe.run(), timeout)
            except TimeoutError:
                probe.fail(f"timed out after {timeout:g}s")
            if result.failed is not None or probe.conn is None or not result.relayed:
                n += 1
                yield ProbeSample(time.time(), False, None, result.relay_address, result.error or "not relayed")
                await asyncio.sleep(interval)
                continue
            n += 1
            yield ProbeSample(time.time(), True, result.rtt_ms, result.relay_address, "probed")
            ss = probe.conn.secret_stream
            while count is None or n < count:
                await asyncio.sleep(interval)
                ping = os.urandom(16)
                t = time.monotonic()
                ss.send(ping)
                try:
                    back = await asyncio.wait_for(ss.recv(), echo_wait)
                except Exception as e:  # a timeout or a broken stream: probe again
                    n += 1
                    why = f"echo lost: {str(e) or type(e).__name__}"
                    yield ProbeSample(time.time(), False, None, result.relay_address, why)
                    break
                n += 1
                if back != ping:
                    yield ProbeSample(time.time(), False, None, result.relay_address, "echo came back wrong")
                    break
                rtt = round((time.monotonic() - t) * 1000, 2)
                yield ProbeSample(time.time(), True, rtt, result.relay_address, "echo")
        finally:
            await probe.close()


class _Probe:
    def __init__(
        self, pk: bytes, bootstrap: list[str], result: ProbeResult, payload_bytes: int, remember: KeysHook | None
    ) -> None:
        self.pk = pk
        self.remember = remember
        self.bootstrap = bootstrap
        self.result = result
        self.payload_bytes = payload_bytes
        host = _bind_host(bootstrap)
        self.udx = UDX()
        self.server_node = DHTNode(bootstrap=list(bootstrap), host=host, udx=self.udx)
        self.client_node = DHTNode(bootstrap=list(bootstrap), host=host, udx=self.udx)
        self.server: HyperDHTServer | None = None
        self.conn: Connection | None = None
        self.trace = ConnectTrace()
        self.clock = _Clock()
        self.deadline = time.monotonic() + PROBE_TIMEOUT

    def stage(self, ok: bool, detail: str, seconds: float | None = None) -> None:
        name = STAGES[len(self.result.stages)]
        self.result.stages.append(ProbeStage(name, ok, self.clock.lap() if seconds is None else seconds, detail))

    def fail(self, detail: str) -> None:
        """The stage under way failed (used for the overall timeout): still finding the key
        with no answer from any bootstrap node is said as that, not as a slow lookup."""
        if self.result.failed is None and len(self.result.stages) < len(STAGES):
            if not self.result.stages and not self._heard_from_dht():
                names = ", ".join(self.bootstrap) or "the public bootstrap nodes"
                detail = f"{NO_BOOTSTRAP} ({names}); {detail}"
            self.stage(False, detail)

    def _heard_from_dht(self) -> bool:
        """Whether any DHT node answered either of our nodes."""
        for node in (self.server_node, self.client_node):
            with contextlib.suppress(Exception):
                if node.rpc.stats["responses"] > 0:
                    return True
        return False

    async def run(self) -> None:
        if not await self._find():
            return
        if not await self._connect():
            return
        await self._echo()

    async def _find(self) -> bool:
        try:
            await asyncio.gather(
                self.server_node.bootstrap(require_reply=True), self.client_node.bootstrap(require_reply=True)
            )
        except DHTError as e:
            self.stage(False, str(e))
            return False
        q = await self.client_node.find_peer(self.pk)
        holders = []
        for r in q.replies:
            with contextlib.suppress(DHTError):
                if r.value and PeerRecord.decode(r.value).public_key == self.pk:
                    holders.append(r.peer.address)
        if not holders:
            self.stage(
                False,
                f"no DHT node holds an announce for this key (asked {len(q.replies)} nodes): "
                "is the relay running, and on this DHT?",
            )
            return False
        self.stage(True, f"{len(holders)} DHT node(s) hold its announce")
        return True

    async def _connect(self) -> bool:
        """A relaying server and a relaying client, punching off, meet through the relay."""
        server_kp, client_kp = key_pair(), key_pair()
        self.result.peer_keys = [encode_id(server_kp.public_key), encode_id(client_kp.public_key)]
        if self.remember is not None:
            self.remember(self.result.peer_keys)  # before the relay can see them
        conns: asyncio.Queue[Connection] = asyncio.Queue()

        async def echo(conn: Connection) -> None:
            conns.put_nowait(conn)
            with contextlib.suppress(Exception):
                async for msg in conn.secret_stream:
                    conn.secret_stream.send(msg)

        self.server = HyperDHTServer(
            self.server_node,
            server_kp,
            echo,
            holepunch=False,
            share_local_address=False,
            relay_through=self.pk,
        )
        loop = asyncio.get_running_loop()
        t0 = loop.time()  # the trace's stages are in the loop's time (relay.dht's one clock)
        try:
            await self.server.listen()
            self.trace.started = loop.time()
            self.conn = await connect(
                self.client_node,
                server_kp.public_key,
                relay_through=self.pk,
                punch=False,
                key_pair=client_kp,
                trace=self.trace,
                timeout=max(1.0, self.deadline - time.monotonic() - 0.5),  # fail here, with the stage named
            )
        except DHTError as e:
            st = self.trace.stages
            if "relay_connected" not in st:
                self.stage(False, self._why_relay(e))
            else:
                self.stage(True, "secret stream open to the relay", st["relay_connected"] - st.get("handshake", 0))
                self.stage(False, f"the relay did not join the two peers: {e}")
            return False
        st = self.trace.stages
        listen = self.trace.started - t0
        relay_s = round(listen + st["relay_connected"], 4)
        self.stage(True, "secret stream open to the relay (Noise IK through the DHT)", relay_s)
        assert self.conn is not None
        addr = self.conn.remote_address
        self.result.relay_address = f"{addr[0]}:{addr[1]}" if addr else None
        self.result.relayed = self.conn.relayed
        if not self.conn.relayed:
            self.stage(False, "connected, but not through the relay")
            return False
        self.stage(
            True, f"both peers' raw streams joined at {self.result.relay_address}", st["opened"] - st["relay_connected"]
        )
        self.clock.lap()
        return True

    @staticmethod
    def _why_relay(e: DHTError) -> str:
        text = str(e)
        if e.code == "RELAY_ABORTED":
            return text
        return f"the probe's own peers could not start a relayed connection: {text}"

    async def _echo(self) -> None:
        assert self.conn is not None
        ss = self.conn.secret_stream
        hello = b"cosmictui probe " + os.urandom(8).hex().encode()
        ss.send(hello)
        back = await ss.recv()
        if back != hello:
            self.stage(False, "the echo did not come back intact" if back else "the stream closed before the echo")
            return
        self.stage(True, f"{len(hello)} bytes came back through the relay")
        rtts = []
        for _ in range(ROUND_TRIPS):
            ping = os.urandom(16)
            t = time.monotonic()
            ss.send(ping)
            if await ss.recv() != ping:
                self.stage(False, "a round-trip message came back wrong")
                return
            rtts.append(time.monotonic() - t)
        data = os.urandom(self.payload_bytes)
        t = time.monotonic()
        for i in range(0, len(data), 16384):
            ss.send(data[i : i + 16384])
        got = bytearray()
        while len(got) < len(data):
            msg = await ss.recv()
            if msg is None:
                self.stage(False, f"the stream closed after {len(got)} of {len(data)} bytes")
                return
            got += msg
        bulk = time.monotonic() - t
        if bytes(got) != data:
            self.stage(False, f"{len(data)} bytes came back altered")
            return
        rtt = statistics.median(rtts) * 1000
        self.result.rtt_ms = round(rtt, 2)
        self.result.bytes = len(data) * 2
        rate = len(data) * 2 / bulk / 1e6 if bulk > 0 else 0.0
        self.stage(
            True,
            f"{len(data)} bytes each way intact in {bulk * 1000:.0f} ms ({rate:.1f} MB/s); "
            f"round trip {rtt:.1f} ms (median of {ROUND_TRIPS})",
        )

    async def close(self) -> None:
        if self.conn is not None:
            self.conn.destroy()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.close(), 5)
        for n in (self.client_node, self.server_node):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(n.close(), 5)
        self.udx.close()


PROBE_CHECK = "Relay carries a connection (probe)"
#: The words the DHT node (and this probe) use when no bootstrap node answered.
NO_BOOTSTRAP = "no DHT bootstrap node answered"
BOOTSTRAP_FIX = (
    "give DHT bootstrap nodes that answer: --bootstrap HOST:PORT[,...] (or [relay] bootstrap in the config), "
    "and allow outbound UDP to them"
)

_FIXES = {
    STAGES[0]: "start the relay (or wait for its first announce), and check it uses the same DHT bootstrap nodes",
    STAGES[1]: "open the relay's UDP port to the internet; a firewalled relay cannot be reached by blocked peers",
    STAGES[2]: "read the relay's log: it refused or never matched the pairing (allow-list, caps)",
    STAGES[3]: "the relay joined the streams but forwarded nothing: read its log and /stats dropped counters",
    STAGES[4]: "the relayed stream broke under load: read the relay's log",
}


def probe_check(res: ProbeResult) -> Any:
    """The probe as one `CheckResult` row (wizard step 2, `cosmictui check`)."""
    from cosmictui.ops.vocabulary import CheckResult

    if res.ok:
        return CheckResult(
            PROBE_CHECK,
            "ok",
            f"two peers, punching off, echoed through {res.relay_address} in {res.seconds:.1f}s "
            f"(round trip {res.rtt_ms} ms)",
        )
    return CheckResult(PROBE_CHECK, "fail", f"failed at {res.error}", probe_fix(res))


def probe_fix(res: ProbeResult) -> str:
    """How to fix a failed probe: the failed stage's fix, or the bootstrap when no node answered."""
    failed = res.failed
    if failed is None:
        return ""
    if NO_BOOTSTRAP in failed.detail:
        return BOOTSTRAP_FIX
    return _FIXES.get(failed.name, "")


async def probe_from_host(
    runner: Any,
    relay_key: str,
    bootstrap: list[str] | tuple[str, ...] | None,
    timeout: float = PROBE_TIMEOUT,
    remember: KeysHook | None = remember_probe_keys,
) -> Any:
    """The same probe run on the deployment host, where the jobs are, when cosmictui is
    installed there (`cosmictui relay probe KEY --json`); None when it is not."""
    from cosmictui.ops.runner import RunnerError
    from cosmictui.ops.vocabulary import CheckResult

    name = f"Relay carries a connection from {runner.label} (probe)"
    cmd = f"cosmictui relay probe {shlex.quote(relay_key)} --json --timeout {timeout:g}"
    if bootstrap:
        cmd += f" --bootstrap {shlex.quote(','.join(bootstrap))}"
    try:
        res = await runner.run(cmd, timeout=timeout + 15)
    except RunnerError as e:
        if e.kind == "missing-command":
            return None
        return CheckResult(name, "warn", f"could not run the probe there: {e.what}", e.fix)
    text = res.output
    try:
        data = json.loads(text[text.index("{") : text.rindex("}") + 1])
        ok, error, where, rtt = bool(data["ok"]), data.get("error"), data.get("relay_address"), data.get("rtt_ms")
        keys = data.get("peer_keys")
    except (ValueError, KeyError, TypeError):
        return CheckResult(
            name, "warn", f"cosmictui there printed no probe result (exit {res.exit_code})", "update cosmictui there"
        )
    if isinstance(keys, list) and remember is not None:  # its pairing is the probe's, not a job's
        remember([k for k in keys[:2] if isinstance(k, str) and k.isalnum() and len(k) <= 128])
    if ok:
        return CheckResult(name, "ok", f"two peers there echoed through {where} (round trip {rtt} ms)")
    return CheckResult(name, "fail", f"failed at {error}", "the jobs there would fail the same way: see the stage")
