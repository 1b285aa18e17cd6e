"""What each thing a stranger can make the relay hold costs in memory, measured in-process.

    python3 benchmarks/relay_costs.py [--top 8]

Builds the relay's real objects the way `RelayApp` builds them for real peers (a control UDX
stream with the relay's reorder bound, the responder secret stream with its asyncio protocol
and UDX transport, the hyperdht `Connection`, the blind-relay session; two raw relay streams
relayed to each other per matched pair; a pending token), driven by a Python blind-relay
client's real secret-stream bytes, and measures each with tracemalloc: bytes per session, per
pending token, per active pair. Then adds up the worst case at the default caps (every session
also parking its full out-of-order budget and an incomplete control frame at the frame limit,
the relay streams holding the relay-wide early-packet budget). tests/unit/
test_relay_costs.py asserts that sum against the 200 MB budget; README's attack section shows it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from relay.blindrelay import PAIR_MESSAGE, PROTOCOL, UNPAIR_MESSAGE, Pair  # noqa: E402
from relay.core import drain_events  # noqa: E402
from relay.dht.connection import (  # noqa: E402
    Connection,
    UDXTransport,
    responder_secret_stream,
    start_secret_stream,
)
from relay.dht.messages import NoisePayload  # noqa: E402
from relay.keys import encode_id, key_pair  # noqa: E402
from relay.protomux import MessageReceived, Mux  # noqa: E402
from relay.secretstream import HandshakeResult, Message, SecretStream  # noqa: E402
from relay.service.app import CONTROL_REORDER_BYTES, RelayApp, RelayConfig  # noqa: E402
from relay.service.limits import Limits  # noqa: E402
from relay.service.memory import (  # noqa: E402
    DEFAULT_BUDGET,
    IDLE_RSS,
    MB,
    RSS_PER_BUFFER_BYTE,
    RSS_PER_TRACED_BYTE,
    EmbeddedResidentSet,
)
from relay.service.pairings import PairingLog  # noqa: E402
from relay.udx.stream import REORDER_OVERHEAD  # noqa: E402
from relay.udx.udxstream import EARLY_BYTES_TOTAL  # noqa: E402

#: the figures the relay's budget uses (`relay.service.memory`): this script measures what they stand for
RSS_BUDGET = DEFAULT_BUDGET


@dataclass
class Client:
    """A blind-relay client's side of one session: its secret stream and protomux channel;
    `heard` what the relay wrote to it (kept only for a session made with `listen=True`)."""

    stream: SecretStream
    mux: Mux
    channel: Any
    heard: list[bytes] = field(default_factory=list)

    def replies(self) -> list[Any]:
        """The blind-relay messages the relay sent since the last call, decrypted and decoded."""
        data, self.heard[:] = b"".join(self.heard), []
        self.stream.receive(data, 0.0)
        out = []
        for ev in self.stream.events():
            if isinstance(ev, Message):
                self.mux.receive(ev.data, 0.0)
                out += [m.message for m in drain_events(self.mux) if isinstance(m, MessageReceived)]
        return out

    def pair(self, is_initiator: bool, token: bytes, stream_id: int) -> None:
        self.channel.send(0, Pair(is_initiator, token, stream_id, 0))

    def flush(self) -> bytes:
        for m in self.mux.data_to_send():
            self.stream.send(m)
        return bytes(self.stream.data_to_send())


class Relay:
    """A `RelayApp` (never bound: no socket, no DHT) taking sessions as `_on_connection` does."""

    def __init__(self, storage: Path) -> None:
        # no memory budget here: the process measuring is not a relay (its RSS is the test's)
        limits = Limits(memory_budget=1 << 50)
        self.app = RelayApp(
            RelayConfig(storage=storage, key_pair=key_pair(), metrics=None, limits=limits),
            rss=EmbeddedResidentSet(),  # this process holds more than the relay
        )
        self.n = 0
        self.socket: Any = None

    async def bind(self) -> None:
        """The relay's socket on loopback: what our streams send comes back to an unknown id
        and is dropped, so nothing is ever acked (as with a peer that never acks)."""
        self.socket = await self.app.udx.create_socket("127.0.0.1", 0)

    def session(self, key: bytes | None = None, host: str | None = None, *, listen: bool = False) -> Client:
        """One accepted connection whose blind-relay channel is open, as a real peer leaves it;
        from peer key `key` and source `host` (by default a new key and a new 10.x address).
        `listen`: keep what the relay writes on it for `Client.replies`."""
        self.n += 1
        tx, rx, h = os.urandom(32), os.urandom(32), os.urandom(64)
        server_pk, client_pk = os.urandom(32), key or os.urandom(32)
        app = self.app
        stream = app.udx.create_stream(firewall=lambda s, sock, addr: False, max_reorder_bytes=CONTROL_REORDER_BYTES)
        stream.connect(self.socket, int.from_bytes(os.urandom(4), "little"), ("127.0.0.1", self.socket.port))
        hs = HandshakeResult(tx, rx, h, server_pk, client_pk)
        proto = responder_secret_stream(hs)
        heard: list[bytes] = []
        if listen:
            transport = UDXTransport(stream, proto)
            write = transport.write

            def tap(data: bytes) -> None:
                heard.append(bytes(data))
                write(data)

            transport.write = tap  # type: ignore[method-assign]
            proto.connection_made(transport)
        else:
            start_secret_stream(stream, proto)
        host = host or f"10.{(self.n >> 16) & 255}.{(self.n >> 8) & 255}.{self.n & 255}"
        conn = Connection(client_pk, hs, stream, proto, NoisePayload(), (host, 40000), False)
        app._on_connection(conn)
        client = SecretStream(True, handshake=HandshakeResult(rx, tx, h, client_pk, server_pk))
        client.start(0.0)
        mux = Mux()
        channel = mux.open_channel(PROTOCOL, client_pk, messages=[PAIR_MESSAGE, UNPAIR_MESSAGE])
        c = Client(client, mux, channel, heard)
        proto.data_received(c.flush())
        return c


def traced(build: Callable[[], Any]) -> tuple[int, list[tracemalloc.StatisticDiff], Any]:
    """(bytes `build` left allocated, the top lines, what it returned)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    kept = build()
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    diff = after.compare_to(before, "lineno")
    return sum(d.size_diff for d in diff), diff, kept


@dataclass
class Costs:
    session: float
    pending: float
    pair: float
    top: dict[str, list[tracemalloc.StatisticDiff]]
    #: the pairing record when full (`relay.service.pairings`: its last 1,024 pairings and the
    #: first sighting of 8,192 keys); a live pair's own entry is in `pair`
    record: float = 0.0

    def worst_case(self, limits: Limits | None = None) -> dict[str, float]:
        """Bytes the relay may hold at once at these caps (RSS, idle relay included)."""
        lim = limits or Limits()
        objects = {
            "sessions": lim.max_sessions * self.session,
            "pending tokens": lim.max_pending_total * self.pending,
            "active pairs": lim.max_active_pairs * self.pair,
            "pairing record": self.record,
        }
        buffers = {
            # charged as the stream charges them: payload + REORDER_OVERHEAD per packet
            "out-of-order (control streams)": lim.max_sessions * CONTROL_REORDER_BYTES,
            "incomplete control frames": lim.max_sessions * (lim.max_control_frame + 3),
            # one budget for all relay streams (at most EARLY_PACKETS each)
            "early packets": EARLY_BYTES_TOTAL * (1 + REORDER_OVERHEAD / 1200),
        }
        out = {k: v * RSS_PER_TRACED_BYTE for k, v in objects.items()}
        out |= {k: v * RSS_PER_BUFFER_BYTE for k, v in buffers.items()}
        out["idle relay"] = IDLE_RSS
        out["total"] = sum(out.values())
        return out

    def per_connection(self) -> float:
        """RSS bytes one relayed connection may hold at worst: two sessions (hyperdht's client
        and server each open one to the relay), each with its full reorder and frame bounds,
        and one active pair."""
        lim = Limits()
        buffers = 2 * (CONTROL_REORDER_BYTES + lim.max_control_frame + 3) * RSS_PER_BUFFER_BYTE
        return (2 * self.session + self.pair) * RSS_PER_TRACED_BYTE + buffers

    def connections_that_fit(self, budget: float = 0.95 * RSS_BUDGET) -> int:
        """How many relayed connections fit the budget beside an idle relay, a full pending cap,
        the early-packet budget and a full pairing record: what `--max-active-pairs` (and twice it, `--max-sessions`)
        may be by default."""
        fixed = self.worst_case()
        rest = fixed["idle relay"] + fixed["pending tokens"] + fixed["early packets"] + fixed["pairing record"]
        return int((budget - rest) // self.per_connection())


def record_cost() -> float:
    """Bytes a full pairing record holds: every pairing closed (its byte counts kept as ints
    past 2**30, as a busy relay's are) and the key table full of 52-character keys."""

    def fill() -> PairingLog:
        log = PairingLog("r" * 52)
        for _ in range(log.keys_capacity):
            log.saw_key(encode_id(os.urandom(32)))
        for _ in range(log.capacity):
            rec = log.open(
                ((log.saw_key(encode_id(os.urandom(32))), None), (log.saw_key(encode_id(os.urandom(32))), None))
            )
            for side in rec.peers:
                side.bytes, side.packets = 2**40 + 1, 2**31 + 1
            log.close(rec)
        return log

    size, _, _ = traced(fill)
    return float(size)


def measure(n_sessions: int = 400, n_pending: int = 4000, n_pairs: int = 2000) -> Costs:
    async def run() -> Costs:
        with tempfile.TemporaryDirectory(prefix="relay-costs-") as tmp:
            relay = Relay(Path(tmp))
            await relay.bind()
            relay.session()  # warm up: first-use allocations are not per object
            # a relay that has met many keys: each new session's key takes the place of the
            # least recently seen one (the full key table is counted once, in `record`)
            for _ in range(relay.app.pairings.keys_capacity):
                relay.app.pairings.saw_key(encode_id(os.urandom(32)))
            top: dict[str, list[tracemalloc.StatisticDiff]] = {}
            # the clients are dropped as they go: only what the relay keeps is counted
            size, top["session"], _ = traced(lambda: [relay.session() and None for _ in range(n_sessions)])
            per_session = size / n_sessions

            pender = relay.session()
            pender_proto = relay.app._sessions[next(reversed(relay.app._sessions))].conn.secret_stream

            def pend() -> None:
                for i in range(n_pending):
                    pender.pair(True, os.urandom(32), i + 1)
                    if i % 50 == 49:  # under the per-session cap: other sessions' tokens
                        pender_proto.data_received(pender.flush())
                pender_proto.data_received(pender.flush())

            relay.app.blind.max_pending_per_session = None
            size, top["pending"], _ = traced(pend)
            per_pending = size / n_pending

            pairer = relay.session()
            proto = relay.app._sessions[next(reversed(relay.app._sessions))].conn.secret_stream
            relay.app.blind.max_pending_per_session = 64

            def pairs() -> None:
                for i in range(n_pairs):
                    token = os.urandom(32)
                    pairer.pair(True, token, 2 * i + 1)
                    pairer.pair(False, token, 2 * i + 2)
                    if i % 16 == 15:
                        proto.data_received(pairer.flush())
                proto.data_received(pairer.flush())

            size, top["pair"], _ = traced(pairs)
            per_pair = size / n_pairs
            assert relay.app.blind.stats.pairings_active >= n_pairs, relay.app.blind.stats
            relay.app.udx.close()
            return Costs(per_session, per_pending, per_pair, top, record_cost())

    return asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=0, help="show the N lines that allocate most, per object")
    args = ap.parse_args()
    c = measure()
    print(f"per session      {c.session:8.0f} B")
    print(f"per pending token {c.pending:7.0f} B")
    print(f"per active pair  {c.pair:8.0f} B (two relay streams + the blind-relay links)")
    for what, top in c.top.items() if args.top else ():
        print(f"-- {what}")
        for d in top[: args.top]:
            print(f"   {d}")
    lim = Limits()
    print(
        f"worst case at the default caps ({lim.max_sessions} sessions, {lim.max_pending_total} pending, "
        f"{lim.max_active_pairs} active pairs), RSS x{RSS_PER_TRACED_BYTE} per traced object byte, "
        f"x{RSS_PER_BUFFER_BYTE} per buffer byte:"
    )
    for k, v in c.worst_case().items():
        print(f"  {k:32s} {v / MB:7.1f} MB")
    print(
        f"one relayed connection (2 sessions + 1 pair, full buffers): {c.per_connection() / 1024:.1f} KiB; "
        f"{c.connections_that_fit():,} fit 95% of {RSS_BUDGET // MB} MB beside the idle relay, pending cap and "
        f"early packets (defaults: --max-active-pairs {lim.max_active_pairs}, --max-sessions {lim.max_sessions})"
    )


if __name__ == "__main__":
    main()
