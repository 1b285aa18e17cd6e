"""dht-rpc's request/response machinery as a sans-IO state machine (`dht-rpc/lib/io.js`).

The core owns transaction ids, retransmission deadlines, the congestion window and the
round-trip token secrets. It never touches a socket or a clock: the runtime feeds it
datagrams with `receive(data, addr, socket, now)` and timer expiries with
`handle_timer(now)`, then collects `datagrams_to_send(now)` and `next_event()`.

Sockets are named, not owned: "server" (the well-known port, shared with UDX) and "client"
(a random port used while we may be firewalled, so a PING_NAT reply to the server port
proves that port is reachable).
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from .messages import (
    REQUEST_ID,
    RESPONSE_ID,
    Address,
    DHTError,
    ErrorCode,
    Request,
    Response,
    decode_message,
    hash32,
    node_id,
)
from .table import RoutingTable

SERVER = "server"
CLIENT = "client"

DRAIN_INTERVAL = 0.75
ROTATE_EVERY = 10  # drains: secrets rotate every 7.5 s, a token lives 7.5-15 s
DEFAULT_TIMEOUT = 1.0
DEFAULT_RETRIES = 3
MAX_WINDOW = 80


class RequestOptions(TypedDict, total=False):
    """What a caller may set on one request; the defaults are `RPC.request`'s."""

    internal: bool
    target: bytes | None
    value: bytes | None
    token: bytes | None
    socket: str | None
    retries: int
    timeout: float


class SendOptions(RequestOptions, total=False):
    """`RequestOptions` plus what the node runtime attaches: the receiver's id (to evict it
    on a timeout) and the context that hears the outcome."""

    to_id: bytes | None
    context: Any


@dataclass(slots=True, eq=False)
class PendingRequest:
    """One of our requests in flight. `context` belongs to whoever sent it."""

    tid: int
    to: Address
    socket: str
    message: Request
    data: bytes  # `message` encoded, sent as is on every retransmission
    retries: int = DEFAULT_RETRIES
    timeout: float = DEFAULT_TIMEOUT
    to_id: bytes | None = None
    context: Any = None
    sent: int = 0
    deadline: float | None = None
    started: float = 0.0
    done: bool = False
    queued: bool = False


@dataclass(slots=True)
class Peer:
    """A message's sender: its address and its id if it sent a valid one."""

    host: str
    port: int
    id: bytes | None = None

    @property
    def address(self) -> Address:
        return (self.host, self.port)


@dataclass(slots=True)
class IncomingRequest:
    request: Request
    peer: Peer
    socket: str
    external: bool  # arrived on the socket we do not currently send from

    @property
    def target(self) -> bytes | None:
        return self.request.target

    @property
    def value(self) -> bytes | None:
        return self.request.value

    @property
    def command(self) -> int:
        return self.request.command


@dataclass(slots=True)
class Reply:
    """A response matched to one of our requests."""

    pending: PendingRequest
    response: Response
    peer: Peer
    external: bool
    rtt: float = 0.0

    @property
    def error(self) -> int:
        return self.response.error

    @property
    def token(self) -> bytes | None:
        return self.response.token

    @property
    def value(self) -> bytes | None:
        return self.response.value

    @property
    def to(self) -> Address:
        return self.response.to

    @property
    def closer_nodes(self) -> list[Address]:
        return self.response.closer_nodes


@dataclass(slots=True)
class RequestReceived:
    incoming: IncomingRequest


@dataclass(slots=True)
class ResponseReceived:
    reply: Reply


@dataclass(slots=True)
class RequestRetrying:
    """First retransmission of a request: queries stop counting it against concurrency."""

    pending: PendingRequest


@dataclass(slots=True)
class RequestFailed:
    pending: PendingRequest
    error: DHTError


Event = RequestReceived | ResponseReceived | RequestRetrying | RequestFailed


@dataclass(slots=True)
class CongestionWindow:
    """4 slots of 750 ms; full at 80 sends in a slot or 160 over the window."""

    max_window: int = MAX_WINDOW
    i: int = 0
    total: int = 0
    window: list[int] = field(default_factory=lambda: [0, 0, 0, 0])

    def full(self) -> bool:
        return self.total >= 2 * self.max_window or self.window[self.i] >= self.max_window

    def send(self) -> None:
        self.total += 1
        self.window[self.i] += 1

    def recv(self) -> None:
        if self.window[self.i] > 0:
            self.window[self.i] -= 1
            self.total -= 1

    def drain(self) -> None:
        self.i = (self.i + 1) & 3
        self.total -= self.window[self.i]
        self.window[self.i] = 0


def validate_id(id_: bytes | None, addr: Address) -> bytes | None:
    """A claimed id counts only if it is the hash of the address we saw it come from."""
    if id_ is None:
        return None
    try:
        expected = node_id(addr)
    except DHTError:
        return None
    return expected if expected == id_ else None


class RPC:
    """Transaction layer of dht-rpc. Holds no sockets; see module docstring."""

    def __init__(self, table: RoutingTable, *, firewalled: bool = True, max_window: int = MAX_WINDOW) -> None:
        self.table = table
        self.firewalled = firewalled
        self.ephemeral = True
        self.congestion = CongestionWindow(max_window)
        self.inflight: dict[int, PendingRequest] = {}
        self._queue: deque[PendingRequest] = deque()
        self._out: list[tuple[str, bytes, Address]] = []
        self._events: deque[Event] = deque()
        self._tid = int.from_bytes(os.urandom(2), "little")
        self._secrets: list[bytes] | None = None
        self._rotate = ROTATE_EVERY
        self._next_drain: float | None = None
        self.destroyed = False
        self.stats = {"requests": 0, "responses": 0, "timeouts": 0, "retries": 0, "received": 0, "dropped": 0}

    # ------------------------------------------------------------------ outputs

    def datagrams_to_send(self, now: float = 0.0) -> list[tuple[str, bytes, Address]]:
        out, self._out = self._out, []
        return out

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def get_timer(self) -> float | None:
        deadlines = [p.deadline for p in self.inflight.values() if p.deadline is not None and not p.queued]
        if self._next_drain is not None:
            deadlines.append(self._next_drain)
        return min(deadlines) if deadlines else None

    @property
    def socket(self) -> str:
        """The socket requests leave from: client while firewalled, server once reachable."""
        return CLIENT if self.firewalled else SERVER

    # ------------------------------------------------------------------ tokens

    def token(self, host: str, i: int) -> bytes:
        if self._secrets is None:
            self._secrets = [os.urandom(32), os.urandom(32)]
        return hash32(host.encode(), self._secrets[i])

    def set_secrets(self, old: bytes, current: bytes) -> None:
        """For deterministic tests against recorded tokens."""
        self._secrets = [old, current]

    def _rotate_secrets(self) -> None:
        if self._secrets is None:
            return
        self._rotate -= 1
        if self._rotate == 0:
            self._rotate = ROTATE_EVERY
            old = self._secrets[0]
            self._secrets = [self._secrets[1], hash32(old)]

    # ------------------------------------------------------------------ requests

    def request(
        self,
        to: Address,
        command: int,
        now: float,
        *,
        internal: bool = False,
        target: bytes | None = None,
        value: bytes | None = None,
        token: bytes | None = None,
        socket: str | None = None,
        retries: int = DEFAULT_RETRIES,
        timeout: float = DEFAULT_TIMEOUT,
        to_id: bytes | None = None,
        context: Any = None,
        force: bool = False,
    ) -> PendingRequest:
        if self.destroyed:
            raise DHTError("node destroyed", "NODE_DESTROYED")
        tid = self._tid
        while tid in self.inflight:
            tid = (tid + 1) & 0xFFFF
        self._tid = (tid + 1) & 0xFFFF
        sock = socket or self.socket
        msg = Request(
            tid=tid,
            to=to,
            command=command,
            internal=internal,
            id=self._own_id(sock),
            token=token,
            target=target,
            value=value,
        )
        # encoded now, once: a non-IPv4 address fails here, not later in a timer
        p = PendingRequest(tid, to, sock, msg, msg.encode(), retries, timeout, to_id, context, started=now)
        self.inflight[tid] = p
        self.stats["requests"] += 1
        self._ensure_drain(now)
        if not force and self.congestion.full():
            p.queued = True
            self._queue.append(p)
        else:
            self._transmit(p, now)
        return p

    def cancel(self, p: PendingRequest) -> None:
        if p.done:
            return
        p.done = True
        if self.inflight.get(p.tid) is p:
            del self.inflight[p.tid]
            self.congestion.recv()

    def _own_id(self, socket: str) -> bytes | None:
        return self.table.id if not self.ephemeral and socket == SERVER else None

    def _transmit(self, p: PendingRequest, now: float) -> None:
        p.queued = False
        p.sent += 1
        self.congestion.send()
        self._out.append((p.socket, p.data, p.to))
        p.deadline = now + p.timeout

    def _ensure_drain(self, now: float) -> None:
        if self._next_drain is None:
            self._next_drain = now + DRAIN_INTERVAL

    def handle_timer(self, now: float) -> None:
        if self._next_drain is not None and now >= self._next_drain:
            self._next_drain = now + DRAIN_INTERVAL
            self._rotate_secrets()
            self.congestion.drain()
            while self._queue and not self.congestion.full():
                p = self._queue.popleft()
                if not p.done:
                    self._transmit(p, now)
            if not self.inflight and self._secrets is None:
                self._next_drain = None
        for p in list(self.inflight.values()):
            if p.done or p.queued or p.deadline is None or now < p.deadline:
                continue
            p.deadline = None
            if p.sent > p.retries:
                self.stats["timeouts"] += 1
                self.cancel(p)
                self._events.append(RequestFailed(p, DHTError(f"request to {p.to} timed out", "REQUEST_TIMEOUT")))
                continue
            if p.sent == 1:
                self._events.append(RequestRetrying(p))
            self.stats["retries"] += 1
            if self.congestion.full():
                p.queued = True
                self._queue.append(p)
            else:
                self._transmit(p, now)

    # ------------------------------------------------------------------ receiving

    def receive(self, data: bytes, addr: Address, socket: str, now: float) -> None:
        """Feed one datagram; anything malformed is counted and dropped, never raised."""
        if len(data) < 2 or not 0 < addr[1] < 65536 or data[0] not in (REQUEST_ID, RESPONSE_ID):
            self.stats["dropped"] += 1
            return
        try:
            msg = decode_message(data)
        except DHTError:
            self.stats["dropped"] += 1
            return
        self.stats["received"] += 1
        self._ensure_drain(now)
        external = socket != self.socket
        peer = Peer(addr[0], addr[1], validate_id(msg.id, addr))
        if isinstance(msg, Request):
            incoming = IncomingRequest(msg, peer, socket, external)
            if msg.token is not None and msg.token not in (self.token(addr[0], 1), self.token(addr[0], 0)):
                self.reply(incoming, error=ErrorCode.INVALID_TOKEN, token=True)
                return
            self._events.append(RequestReceived(incoming))
            return
        p = self.inflight.get(msg.tid)
        if p is None or p.done or p.to != addr:
            self.stats["dropped"] += 1
            return
        self.cancel(p)
        self.stats["responses"] += 1
        self._events.append(ResponseReceived(Reply(p, msg, peer, external, now - p.started)))

    # ------------------------------------------------------------------ answering

    def reply(
        self,
        incoming: IncomingRequest,
        value: bytes | None = None,
        *,
        error: int = 0,
        token: bool | None = None,
        closer_nodes: bool = True,
        to: Address | None = None,
        socket: str | None = None,
    ) -> None:
        """Answer a request. Token defaults to on for success and off for errors, as in
        dht-rpc's `reply()` / `error()`; closer nodes only when the request had a target."""
        if token is None:
            token = error == 0
        sock = socket or incoming.socket
        dest = to or incoming.peer.address
        target = incoming.request.target
        closer = [n.address for n in self.table.closest(target)] if target is not None and closer_nodes else []
        res = Response(
            tid=incoming.request.tid,
            to=dest,
            id=self._own_id(sock),
            token=self.token(dest[0], 1) if token else None,
            closer_nodes=closer,
            error=error,
            value=value if error == 0 else None,
        )
        self._out.append((sock, res.encode(), dest))

    def relay(self, incoming: IncomingRequest, value: bytes, to: Address, socket: str | None = None) -> None:
        """Forward as a request with the same tid, command and target (hyperdht's routed
        handshakes): the final hop's response then matches the original requester."""
        sock = socket or incoming.socket
        req = incoming.request
        msg = Request(
            tid=req.tid,
            to=to,
            command=req.command,
            internal=req.internal,
            id=self._own_id(sock),
            token=None,
            target=req.target,
            value=value,
        )
        self._out.append((sock, msg.encode(), to))

    def destroy(self) -> None:
        self.destroyed = True
        for p in list(self.inflight.values()):
            self.cancel(p)
            self._events.append(RequestFailed(p, DHTError("node destroyed", "REQUEST_DESTROYED")))
        self._queue.clear()
        self._next_drain = None


if TYPE_CHECKING:
    from relay.core import DatagramCore, DrivenCore

    # mypy checks the core against relay.core's contract here (never run: the guard sees no asyncio)
    def _conforms(core: RPC) -> tuple[DatagramCore[Event], DrivenCore[Event]]:
        return core, core
