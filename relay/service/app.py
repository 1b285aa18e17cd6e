"""The relay process: one UDP socket, the DHT server on the storage key, blind-relay sessions, metrics.

`RelayApp` wires the layers the way blind-relay-service wires hyperdht + blind-relay:

* one `relay.udx.UDXSocket` on `--host:--port` carries dht-rpc, every hyperdht connection to
  the relay and every relayed packet (peers send relayed data to the address of their control
  connection);
* a `DHTNode` + `HyperDHTServer` announce the corestore key; each accepted connection arrives
  with its secret stream already keyed by the Noise IK handshake;
* each connection gets a `BlindRelaySession` (protomux channel `blind-relay`, id = the peer's
  key); `PairingMatched` becomes two raw UDX streams whose firewall connects them to the first
  sender and which `relay_to` each other; the blind-relay core's replies go out afterwards.

Fair shares (sessions, pending pairings per session and in total, active pairs, idle sessions,
silent pairs: `relay.blindrelay`, grouped by the peer's source host), handshake gating per source
address, the control-frame bound and the allow-list are enforced here; every refusal, shed and
reap is counted by cause in the single stats snapshot behind `/metrics` and `/stats`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

import relay
from relay.blindrelay import (
    BlindRelayError,
    BlindRelayServer,
    BlindRelaySession,
    DestroyStream,
    PairingMatched,
    RelayEvent,
    SessionClosed,
    SessionOpened,
)
from relay.core import Deadline, Deadlines, Driver, Loop, run_action
from relay.dht import Connection, DHTError, DHTNode, HyperDHTServer
from relay.dht.connection import KEEP_ALIVE
from relay.dhtprom import ScraperConfig
from relay.keys import KeyPair, encode_id
from relay.secretstream import Closed, Ended, FrameTooLarge, Message, SecretStreamError
from relay.service.closing import reset_targets, send_resets
from relay.service.limits import (
    LIMIT_CONTROL_FRAME,
    LIMIT_MEMORY,
    LIMIT_NOT_ALLOWED,
    LIMIT_SESSIONS,
    HandshakeGate,
    LimitCounters,
    Limits,
)
from relay.service.memory import CONTROL_REORDER_BYTES, MemoryBudget, MemoryWatch, caps_beyond, held_bytes
from relay.service.metrics import MetricsError, MetricsServer, build_registry, render_metrics
from relay.service.pairings import PairingLog, PairingRecord, Sighting
from relay.service.pauses import RELAY_RECEIVE_BUFFER, Pauses
from relay.service.runtime import remove_runtime, take_returning, write_returning, write_runtime
from relay.service.scraper import ScraperLink
from relay.service.snapshot import stats_document
from relay.udx import UDX, UDXSocket, UDXStream
from relay.udx.kernel import KernelUnavailable

log = logging.getLogger("relay")

PUBLIC_BOOTSTRAP = (
    "88.99.3.86@node1.hyperdht.org:49737",
    "142.93.90.113@node2.hyperdht.org:49737",
    "138.68.147.8@node3.hyperdht.org:49737",
)


Address = tuple[str, int]
BOOTSTRAP_TIMEOUT = 20.0
#: Seconds closing waits for the DHT to drop the relay's announcement before it resets its
#: peers (each answers in milliseconds; a dead node must not hold the exit up).
UNANNOUNCE_TIMEOUT = 2.0
#: Seconds after a start during which the hosts the last clean stop recorded may reconnect the
#: sessions they held without the handshake gates' throttling (their reconnect storm).
RETURNING_WINDOW = 60.0


class RelayStartError(Exception):
    """The relay cannot start; the message is the one line the operator sees."""


@dataclass
class RelayConfig:
    storage: Path
    key_pair: KeyPair
    host: str = "0.0.0.0"
    port: int = 49737
    bootstrap: list[str] = field(default_factory=lambda: list(PUBLIC_BOOTSTRAP))
    metrics: tuple[str, int] | None = ("127.0.0.1", 49738)
    metrics_fallback: bool = False
    """The metrics address is the default, not asked for: if it is taken, serve on a free port."""
    metrics_socket: socket.socket | None = None
    """The metrics address, bound already (the command line binds it before touching storage)."""
    allow: frozenset[bytes] | None = None
    limits: Limits = field(default_factory=Limits)
    kernel_forwarding: bool = False
    """Forward established pairs in the kernel (nftables, needs CAP_NET_ADMIN); off if it cannot be."""
    scraper: ScraperConfig | None = None
    """`--scraper-*`: register with a dht-prometheus scraper over the DHT and serve it metrics."""


class _Session:
    """One accepted hyperdht connection and the blind-relay session on it; `sighting` is what the
    pairing record learnt of its key when it was accepted."""

    __slots__ = ("conn", "peer", "session", "sighting")

    def __init__(self, conn: Connection, session: BlindRelaySession, sighting: Sighting) -> None:
        self.conn = conn
        self.session = session
        self.peer = sighting.key
        self.sighting = sighting


class _RelayLeg:
    """One relay stream's hooks (its firewall, its close), in one small object: two closures
    per stream were ~500 B of a relayed pair's ~6 KB. `record` is the pair's entry in the
    pairing record while this stream is open; the second leg to close closes it."""

    __slots__ = ("app", "partner", "record", "remote_id", "stream_id")

    def __init__(self, app: RelayApp, remote_id: int, stream_id: int) -> None:
        self.app = app
        self.remote_id = remote_id
        self.stream_id = stream_id
        self.record: PairingRecord | None = None
        self.partner: _RelayLeg | None = None

    def __call__(self, stream: UDXStream, sock: UDXSocket, addr: Address) -> bool:
        """The first packet: connect to its sender (the firewall hook)."""
        stream.connect(sock, self.remote_id, addr)
        self.app.blind.stream_carried(stream.id)  # its peer is really there: not a silent pair
        return False  # accept: the packet that taught us the address is forwarded at once

    def closed(self, err: Any) -> None:
        rec, partner = self.record, self.partner
        self.record = self.partner = None
        if rec is not None and (partner is None or partner.record is None):
            self.app.pairings.close(rec)  # both streams are closed: the bytes are final
        self.app._on_relay_stream_closed(self.stream_id, err)


class RelayApp:
    """Start, run and stop one relay; `snapshot()` is the truth behind the metrics."""

    def __init__(
        self,
        config: RelayConfig,
        *,
        bootstrap_timeout: float = BOOTSTRAP_TIMEOUT,
        rss: Callable[[], int] | None = None,
    ) -> None:
        """`rss`: how the memory budget reads the relay's resident set (default: the whole
        process's, as `blind-relay` runs; `EmbeddedResidentSet` for a relay inside another program)."""
        self.config = config
        self.key = encode_id(config.key_pair.public_key)
        self.bootstrap_timeout = bootstrap_timeout
        self.limit_counters = LimitCounters()
        self.started_at = time.time()
        self.process = psutil.Process()  # what /stats reads memory and CPU from
        self.metrics: MetricsServer | None = None
        self.port = config.port
        self.udx = UDX()
        self.socket: UDXSocket | None = None
        self.kernel_error: str | None = None
        self.node: DHTNode | None = None
        self.server: HyperDHTServer | None = None
        self.scraper: ScraperLink | None = None
        lim = config.limits
        self.blind = BlindRelayServer(
            allocate_stream_id=self.udx.random_id,
            stream_id_free=self.udx.id_free,
            max_pending_per_session=lim.max_pending_per_session,
            max_pending_total=lim.max_pending_total,
            pairing_timeout=lim.pending_timeout,
            max_active_pairs=lim.max_active_pairs,
            pair_idle_timeout=lim.silent_pair_timeout,
            session_idle_timeout=lim.session_idle_timeout,
            max_sessions=lim.max_sessions,
        )
        self.handshakes = HandshakeGate(lim)
        beyond = caps_beyond(
            lim.memory_budget, lim.max_sessions, lim.max_active_pairs, lim.max_pending_total, lim.max_control_frame
        )
        self.memory = MemoryWatch(
            MemoryBudget(lim.memory_budget, lim.max_control_frame, caps_beyond_budget=beyond),
            rss=rss,
            release=self._release_memory,
        )
        """The memory budget: RSS read at admission, full or not, trims after a burst."""
        self.pairings = PairingLog(self.key)
        """Who paired through this relay and what each side sent (`GET /pairings`)."""
        self._sessions: dict[BlindRelaySession, _Session] = {}
        self._streams: dict[int, UDXStream] = {}
        #: runs the blind-relay core: its events, its replies, its one timer (relay.core)
        self.driver: Driver[RelayEvent] = Driver(self.blind, on_event=self._on_blind_event, transmit=self._send_replies)
        #: the glue's own one-shot waits (`after`)
        self._later = Deadlines()
        self._later_driver: Driver[Callable[[], object]] = Driver(self._later, on_event=run_action)
        self._closed = False
        self.pauses = Pauses()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the port, serve metrics, join the DHT and announce the key; raises RelayStartError."""
        await self.bind()
        await self.join()

    async def bind(self) -> None:
        """Hold the UDP port (UDX + dht-rpc share it) and start the metrics endpoint."""
        cfg = self.config
        try:
            self.socket = await self.udx.create_socket(cfg.host, cfg.port, receive_buffer=RELAY_RECEIVE_BUFFER)
        except OSError as e:
            raise RelayStartError(_bind_error(cfg.host, cfg.port, e)) from e
        self.port = self.socket.port
        self.pauses.start(asyncio.get_running_loop())
        returning = take_returning(cfg.storage, time.time())
        if returning:
            self.handshakes.expect_returning(returning, self._now(), RETURNING_WINDOW)
            log.info(
                "expecting the last run's peers back",
                extra={"hosts": len(returning), "sessions": sum(returning.values()), "seconds": RETURNING_WINDOW},
            )
        if cfg.kernel_forwarding:
            try:
                k = self.socket.enable_kernel_forwarding()
                log.info("established pairs are forwarded in the kernel (nftables table inet %s)", k.table.name)
            except KernelUnavailable as e:
                self.kernel_error = str(e)
                log.warning("kernel forwarding is off, pairs are forwarded in Python: %s", e)
        if cfg.metrics is not None:
            self.metrics = MetricsServer(
                self.snapshot, *cfg.metrics, pairings=self.pairings_record, sock=cfg.metrics_socket
            )
            try:
                await self.metrics.start()
            except MetricsError as e:
                if not (cfg.metrics_fallback and e.errno == errno.EADDRINUSE):
                    raise
                host, port = cfg.metrics
                self.metrics = MetricsServer(self.snapshot, host, 0, pairings=self.pairings_record)
                await self.metrics.start()
                log.warning(
                    "metrics address %s:%d is in use (another relay?); serving metrics on %s instead",
                    host,
                    port,
                    self.metrics.url,
                )

    async def join(self) -> None:
        """Bootstrap the DHT node on the bound socket and announce the relay key."""
        cfg = self.config
        assert self.socket is not None, "bind() first"
        log.info("joining the DHT", extra={"port": self.port, "bootstrap": ",".join(cfg.bootstrap)})
        self.node = DHTNode(socket=self.socket, udx=self.udx, bootstrap=cfg.bootstrap, host=cfg.host, port=self.port)
        try:
            await asyncio.wait_for(self.node.bootstrap(), self.bootstrap_timeout)
        except TimeoutError:
            # as blind-relay-service: listen anyway; the node keeps joining in the background
            log.warning(self._bootstrap_error() + "; still trying")
        except DHTError as e:
            raise RelayStartError(f"cannot join the DHT: {e}") from e
        # nobody answered (the network is not up yet?): the node warned once and keeps
        # retrying with backoff; /stats says bootstrapped: false until it joins
        self.server = HyperDHTServer(
            self.node,
            cfg.key_pair,
            self._on_connection,
            admit=self._admit_handshake,
            keep_alive=KEEP_ALIVE,
            max_reorder_bytes=CONTROL_REORDER_BYTES,
        )
        try:
            await asyncio.wait_for(self.server.listen(), self.bootstrap_timeout)
        except (TimeoutError, DHTError) as e:
            raise RelayStartError(f"cannot announce the relay key on the DHT: {e or 'timed out'}") from e
        self.driver.arm()
        if cfg.scraper is not None:
            registry = self.metrics.registry if self.metrics is not None else build_registry(self.snapshot)
            self.scraper = ScraperLink(self.node, cfg.scraper, lambda: render_metrics(registry))
            self.scraper.start()
        log.info(
            "dht ready" if self.node.bootstrapped else "dht not joined yet, listening anyway",
            extra={
                "nodes": len(self.node.table),
                "firewalled": self.node.firewalled,
                "public": self.node.remote_address(),
            },
        )
        if self.node.firewalled and self.node.bootstrapped:
            log.warning(
                "the DHT sees this relay as firewalled: peers may fail to reach it; open UDP port %d", self.port
            )

    def _bootstrap_error(self) -> str:
        nodes = ",".join(self.config.bootstrap)
        wait = f"{self.bootstrap_timeout:g}s"
        return f"cannot reach any bootstrap node ({nodes}) within {wait}; check --bootstrap and the network"

    async def close(self) -> None:
        """Go away so that peers notice at once; safe to call twice.

        Stop answering handshakes and, meanwhile, withdraw the announcement (a peer that
        reconnects straight away must not be served by a relay on its way out); reset every
        relayed peer's stream (`relay.service.closing`: ECONNRESET at the peer, not ETIMEDOUT
        13-17 s later), end every session (its peer's channel closes), reset them all once more;
        then close the DHT node and the sockets."""
        if self._closed:
            return
        self._closed = True
        self.pauses.stop()
        self.memory.close()
        unannounced: asyncio.Future[None] | None = None
        if self.server is not None:
            self.server.accepting = False  # from here on no handshake is answered
            unannounced = asyncio.ensure_future(asyncio.wait_for(self.server.unannounce(), UNANNOUNCE_TIMEOUT))
        targets = reset_targets(self._streams.values())
        held = Counter(s.conn.client_address[0] for s in self._sessions.values())
        if held:
            with contextlib.suppress(OSError):
                write_returning(self.config.storage, held, time.time())
        if targets or self._sessions:
            n = len(self._sessions)
            log.info("closing: resetting relayed peers, ending sessions", extra={"peers": len(targets), "sessions": n})
        self.driver.close()
        self._later_driver.close()
        with contextlib.suppress(Exception):
            await send_resets(targets, rounds=1)  # first: the peers' data is what must not wait
        self.blind.close()
        self._pump()
        with contextlib.suppress(Exception):
            await send_resets(targets, rounds=1)  # again, for any a busy receiver dropped
        if unannounced is not None:
            with contextlib.suppress(Exception):
                await unannounced
        if self.scraper is not None:
            await self.scraper.close()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.close(), 5)
        if self.node is not None:
            with contextlib.suppress(Exception):
                await self.node.close()
        self.udx.close()
        if self.metrics is not None:
            await self.metrics.close()

    def runtime_info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "key": self.key,
            "host": self.config.host,
            "port": self.port,
            "metrics": self.metrics.url if self.metrics is not None else None,
            "started_at": int(self.started_at),
            "version": relay.__version__,
        }

    def write_runtime(self) -> Path:
        return write_runtime(self.config.storage, self.runtime_info())

    def remove_runtime(self) -> None:
        remove_runtime(self.config.storage, os.getpid())

    # -- connections and sessions ----------------------------------------------------------

    def _admit_handshake(self, address: Address) -> float | None:
        """HyperDHT admit hook, before any crypto: None drops the handshake, else the seconds it
        waits for its address's rate (a host holding many sessions waits behind others while
        the relay is busy)."""
        host = address[0]
        verdict = self.handshakes.admit(host, self.blind.sessions_of(host), self._now())
        if isinstance(verdict, str):
            self.limit_counters.hit(verdict)
            log.debug("handshake refused", extra={"address": host, "limit": verdict})
            return None
        return verdict

    def _on_connection(self, conn: Connection) -> None:
        peer = encode_id(conn.remote_public_key)
        if self._closed:  # completed its handshake while the relay was closing
            self._refuse(conn)
            return
        allow = self.config.allow
        if allow is not None and conn.remote_public_key not in allow:
            self.limit_counters.hit(LIMIT_NOT_ALLOWED)
            log.warning("refused a peer that is not on the allow-list", extra={"peer": peer})
            self._refuse(conn)
            return
        now = self._now()
        lim = self.config.limits
        # at --max-sessions, or with the memory budget reached, an idle or never-paired session
        # goes (the heaviest address's), never one relaying traffic; with none to spare the
        # newcomer is refused at once
        full = self.blind.memory_full = self._memory_full(now, fresh=True)
        room = self.blind.room_for_session(now)
        self._pump()
        if not room:
            if full:
                self.memory.refused_sessions += 1
                self.limit_counters.hit(LIMIT_MEMORY)
                log.info("relay full: memory budget reached; refused a new session", extra={"peer": peer})
            else:
                self.limit_counters.hit(LIMIT_SESSIONS)
                log.info("relay full: every session relays traffic; refused a new session", extra={"peer": peer})
            self._refuse(conn)
            return
        conn.secret_stream.stream.max_frame = lim.max_control_frame
        session = self.blind.accept(id=conn.remote_public_key, owner=conn.client_address[0], now=now)
        s = _Session(conn, session, self.pairings.saw_key(peer))
        self._sessions[session] = s
        conn.secret_stream.on_event = lambda ev: self._on_stream_event(s, ev)
        log.debug("session accepted", extra={"peer": peer, "address": conn.client_address})
        self._pump()
        self._held()

    @staticmethod
    def _refuse(conn: Connection) -> None:
        """End the secret stream gracefully: the peer sees its relay connection close at once
        (and gives up on the pairing) instead of waiting out its 15 s pairing timeout."""
        try:
            conn.close()
        except SecretStreamError:
            conn.destroy()

    def _on_stream_event(self, s: _Session, ev: Any) -> None:
        if isinstance(ev, Message):
            now = self._now()
            # a pair request may add a pending token or a pair: at most READ_EVERY-old RSS says
            # whether the budget lets it in
            self.blind.memory_full = self._memory_full(now, fresh=False)
            try:
                s.session.receive(ev.data, now)
            except BlindRelayError as e:
                log.warning("peer broke the blind-relay protocol: %s", e, extra={"peer": s.peer})
                s.conn.destroy()
        elif isinstance(ev, Ended):
            s.session.connection_closed()
            with contextlib.suppress(Exception):
                s.conn.close()
        elif isinstance(ev, Closed):
            if isinstance(ev.error, FrameTooLarge):
                self.limit_counters.hit(LIMIT_CONTROL_FRAME)
                log.info("session ended: %s", ev.error, extra={"peer": s.peer})
            s.session.connection_closed()
            self._pump()
            self._sessions.pop(s.session, None)
            self._held()
            return
        self._pump()

    def _pump(self) -> None:
        """After input to the blind-relay core: its events, its replies, its timer (the driver
        drains iteratively: a relay stream closing inside a pump reports back without recursing)."""
        self.driver.pump()

    def _on_blind_event(self, ev: RelayEvent) -> None:
        """Carry out what the blind-relay core asked for: make/destroy streams, end sessions."""
        if isinstance(ev, PairingMatched):
            self._link(ev)
        elif isinstance(ev, DestroyStream):
            log.debug("relay stream destroyed", extra={"stream": ev.stream_id, "reason": ev.reason})
            stream = self._streams.pop(ev.stream_id, None)
            if stream is not None:
                stream.destroy()
        elif isinstance(ev, SessionOpened):
            log.debug("session opened", extra={"peer": self._peer(ev.session)})
        elif isinstance(ev, SessionClosed):
            log.debug("session closed", extra={"peer": self._peer(ev.session)})
            s = self._sessions.pop(ev.session, None)
            if s is not None and not s.conn.secret_stream.stream.closed:
                s.conn.close()

    def _send_replies(self, now: float) -> None:
        for session, msgs in self.blind.data_to_send():
            s = self._sessions.get(session)
            if s is None:
                continue
            try:
                for m in msgs:
                    s.conn.secret_stream.send(m)
            except SecretStreamError:
                pass

    def _peer(self, session: BlindRelaySession) -> str:
        s = self._sessions.get(session)
        return s.peer if s is not None else "?"

    def _link(self, ev: PairingMatched) -> None:
        """Two raw streams, each learning its peer's address from its first packet, relayed both ways."""
        streams = []
        legs = []
        for link in ev.links:
            leg = _RelayLeg(self, link.remote_stream_id, link.stream_id)
            stream = self.udx.create_stream(link.stream_id, firewall=leg, framed=True)
            stream.on_close = leg.closed
            self._streams[link.stream_id] = stream
            streams.append(stream)
            legs.append(leg)
        a, b = streams
        a.relay_to(b)
        b.relay_to(a)
        # A peer sends its datagrams to the id the relay gave its side (`link.stream_id`, in the
        # `pair` reply), so that side's stream is the one receiving, and counting, what it sent.
        # The record lists the initiator first (`ev.links` is non-initiator, initiator).
        rec = self.pairings.open((self._side(ev.links[1].session, b), self._side(ev.links[0].session, a)))
        legs[0].record = legs[1].record = rec
        legs[0].partner, legs[1].partner = legs[1], legs[0]
        log.debug(
            "pair matched",
            extra={
                "token": ev.token.hex()[:16],
                "streams": [s.id for s in streams],
                "peers": [self._peer(x.session) for x in ev.links],
            },
        )

    def _memory_full(self, now: float, *, fresh: bool) -> bool:
        b = self.blind
        held = held_bytes(b.session_count, b.stats.pairings_active, b.stats.pairings_pending)
        return self.memory.check(now, b.session_count, held, fresh=fresh)

    def memory_snapshot(self, rss: int) -> dict[str, Any]:
        """`/stats` `memory`, its verdict read now (the last admission may be long past)."""
        with contextlib.suppress(RuntimeError):  # outside a running loop: the last verdict
            self.blind.memory_full = self._memory_full(self._now(), fresh=True)
        b = self.blind
        return self.memory.snapshot(b.session_count) | {
            "rss_bytes": rss,
            "refused_pairings": b.stats.pairings_refused_memory,
        }

    def _held(self) -> None:
        """Tell the memory watch how much the relay holds (it trims after a large fall)."""
        self.memory.held(self.blind.session_count, self.after)

    def _release_memory(self) -> None:
        """Before a trim: nothing left pointing at closed streams (the send vectors' slots), and
        every table a burst grew rebuilt to what it holds now (a dict keeps the table it grew to)."""
        for sock in self.udx.sockets:
            sock.forget_sent()
        self.udx.streams = dict(self.udx.streams)
        self._sessions = dict(self._sessions)
        self._streams = dict(self._streams)
        self.blind.compact()

    def after(self, delay: float, action: Callable[[], object]) -> Deadline:
        """Run `action` `delay` seconds of loop time from now (a one-shot wait of the glue, on
        its driver's timer); the handle cancels it."""
        d = self._later.add(self._now() + delay, action)
        self._later_driver.arm()
        return d

    def _side(self, session: BlindRelaySession, stream: UDXStream) -> tuple[Sighting, UDXStream]:
        s = self._sessions.get(session)
        if s is not None:
            return s.sighting, stream
        # a match comes from its sessions' own messages, so both are known; should one not be, the
        # record still names its key rather than losing the pairing
        key = encode_id(session.id) if session.id is not None else "?"
        return self.pairings.saw_key(key), stream

    def _on_relay_stream_closed(self, stream_id: int, err: Any) -> None:
        log.debug("relay stream closed", extra={"stream": stream_id, "error": getattr(err, "code", err)})
        self._streams.pop(stream_id, None)
        if err is not None and getattr(err, "code", None) not in (None, "ECONNRESET"):
            self.blind.stream_error(stream_id)
        self.blind.stream_closed(stream_id)
        self._pump()
        self._held()

    @property
    def loop(self) -> Loop:
        """The loop whose clock (`loop.time()`) feeds every core; the running loop unless set."""
        return self.driver.loop

    @loop.setter
    def loop(self, loop: Loop) -> None:
        self.driver.loop = self._later_driver.loop = loop

    def _now(self) -> float:
        """The loop's clock: the one time every core here is fed (relay.core)."""
        return self.driver.now()

    # -- stats -----------------------------------------------------------------------------

    def pairings_record(self) -> dict[str, Any]:
        """The `/pairings` document (`relay.service.pairings`), with what the kernel forwarded up
        to now attributed to the open pairings' streams (otherwise read once a second)."""
        for sock in self.udx.sockets:
            kernel = getattr(sock, "kernel", None)
            if kernel is not None:
                kernel.refresh()
        return self.pairings.as_json()

    def snapshot(self) -> dict[str, Any]:
        """The `/stats` document (docs/relay.md); `/metrics` is rendered from the same dict."""
        return stats_document(self)


def _bind_error(host: str, port: int, e: OSError) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"UDP port {port} on {host} is already in use (is another relay running? pick one with --port)"
    if e.errno == errno.EACCES:
        return f"not allowed to bind UDP port {port} on {host} (ports below 1024 need privileges)"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"cannot bind {host}:{port}: {host} is not an address of this machine (check --host)"
    return f"cannot bind UDP {host}:{port}: {e.strerror or e}"
