"""blind-relay: pairing two peers' UDX streams through a relay, server side, sans-IO.

Wire-compatible with npm `blind-relay` 1.6.1. Each connection to the relay carries one protomux
channel `("blind-relay", id = the client's static public key)` with two message types:

* 0 `pair`   = `bitfield(7)` flags (bit 0 = isInitiator) ‖ `fixed32 token` ‖ `uint id` ‖ `uint seq`
* 1 `unpair` = `bitfield(7)` flags (zero) ‖ `fixed32 token`

Codecs: `Pair`, `Unpair`, `encode_pair`, `decode_pair`, `encode_unpair`, `decode_unpair`
(decoders raise `BlindRelayError`), and `PAIR_MESSAGE` / `UNPAIR_MESSAGE` for a protomux channel.

Server (`BlindRelayServer`, one `BlindRelaySession` per connection) follows blind-relay's
`Server`: a `pair` creates or joins the pending entry of its token; once one initiator and one
non-initiator are present the entry is *matched*: the server allocates one local raw-stream id
per side (non-initiator first), queues `pair{isInitiator, token, id: <our stream id>}` on each
side's channel (non-initiator first) and reports `PairingMatched` with both `RelayLink`s. The
runtime then creates the raw streams, relays them to each other (`relay_to`), and lets each
stream's firewall connect it to `(packet source, link.remote_stream_id)` on the first packet.
A second `pair` for an occupied side of a pending token is ignored, as in JS.

Driving it (no I/O here):

    server = BlindRelayServer(allocate_stream_id=udx.next_stream_id)      # optional hook
    session = server.accept(id=conn.remote_public_key)                     # opens the channel
    session.receive(msg, now)               # each secret-stream message; raises BlindRelayError
    while (ev := server.next_event()) is not None: ...  # PairingMatched -> create streams
                                            # first, DestroyStream -> destroy a raw stream
    for sess, msgs in server.data_to_send(): write msgs on sess's secret-stream
    server.stream_closed(stream_id)         # a relay raw stream closed by itself
    server.stream_error(stream_id)          # ... or failed (counted in streams_errors)
    session.connection_closed()             # the secret-stream ended or broke
    server.stream_carried(stream_id)        # a relay raw stream received its first packet
    server.get_timer(); server.handle_timer(now)  # timeouts and reaping (see fair shares)
    server.shed_session(now)                # at the service's session cap: close the heaviest's

Stats (`server.stats`, `BlindRelayStats`; `as_dict()` gives the `/stats` JSON groups) move
exactly when npm blind-relay moves them: sessions accepted on `accept`, opened when the channel
is fully open, closed when it closes (either side, or the stream); pairings requested per
accepted `pair`, pending while one side waits, matched when both are there, cancelled by
`unpair` (pending or active) or by the session's channel closing with its tokens still pending
(one per token); pairings active = tokens with at least one live relay stream; streams opened
(two per match), closed (destroyed by us or closed under us), errors.

Fair shares (hooks for the service; None = unlimited, the npm behaviour). Sessions belong to an
*owner* (the service passes the peer's source host), and every cap sheds from the heaviest
holder instead of refusing the newcomer, so one peer can fill a cap but never lock others out:

* `max_pending_per_session`: a new pending token over it cancels that session's oldest one;
* `max_pending_total`: a new pending token over it cancels the oldest pending token of the
  heaviest session of the owner holding the most pending tokens;
* `max_active_pairs`: a match over it destroys a pair of the owner holding the most relay links
  (a pair that never carried a packet first, else its oldest);
* `pairing_timeout`: pending tokens older than that are cancelled by `handle_timer(now)` (also in
  `pairings_timed_out` and `pairings_cancelled`);
* `pair_idle_timeout`: a matched pair whose two streams have not both carried a packet by then
  is destroyed (the runtime reports traffic with `stream_carried(stream_id)`);
* `session_idle_timeout`: a session with no relay link for that long (since it was accepted or
  its last link ended) is closed, pending tokens or not;
* `shed_session(now)` picks the session to close when the service's session cap is reached:
  the least recently busy session without links of the owner holding the most sessions.
* `memory_full` (set by the service from its memory budget): while true, every cap above counts
  as reached: a new session, pending token or match takes the place of something that carries no
  traffic, or is refused (`sessions_refused_memory`, `pairings_refused_memory`, also in the
  `*_refused_full` counts).

Every shed is counted by cause in `server.shed` (`SHED_*` names); sheds cancel pending tokens or
destroy pairs as `unpair` does (`pairings_cancelled`), so `refusals.session_limit/total_limit`
stay 0 (kept for the `/stats` contract). A `pair` whose stream id does not fit UDX's 32 bits is
ignored and counted in `pairings_refused_invalid`. The client is never told of a shed (npm's
Client ignores a server `unpair`); it sees its pairing time out, as with a lost request.

Deliberate differences from JS, beyond the fair shares above (npm keeps everything until the
session closes), all in corners: `close()` destroys every session (JS waits for
pending pairings to finish, then forgets them without updating stats); a session that pairs
with itself keeps both links (JS keeps one per token and leaks the other until it closes);
`end()` also completes after an `unpair` or timeout empties the session's pending set.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from relay.encoding import DecodeError, Reader, Writer
from relay.protomux import (
    ChannelClosed,
    ChannelOpened,
    Event,
    MessageReceived,
    MessageType,
    Mux,
    ProtomuxError,
)

__all__ = [
    "PAIR_MESSAGE",
    "PROTOCOL",
    "SHED_CAUSES",
    "UNPAIR_MESSAGE",
    "BlindRelayError",
    "BlindRelayServer",
    "BlindRelaySession",
    "BlindRelayStats",
    "DestroyStream",
    "Pair",
    "PairingMatched",
    "RelayEvent",
    "RelayLink",
    "SessionClosed",
    "SessionOpened",
    "Unpair",
    "decode_pair",
    "decode_unpair",
    "encode_pair",
    "encode_unpair",
]

PROTOCOL = "blind-relay"
MAX_STREAM_ID = 0xFFFFFFFF

# Causes of a shed or reap, as they appear in `/stats` `shed` and `blind_relay_shed_total{cause=…}`.
SHED_PENDING_PER_SESSION = "pending_per_session"
SHED_PENDING_TOTAL = "pending_total"
SHED_PENDING_TIMEOUT = "pending_timeout"
SHED_ACTIVE_PAIRS = "active_pairs"
SHED_SILENT_PAIR = "silent_pair"
SHED_IDLE_SESSION = "idle_session"
SHED_SESSIONS = "sessions"
SHED_CAUSES = (
    SHED_PENDING_PER_SESSION,
    SHED_PENDING_TOTAL,
    SHED_PENDING_TIMEOUT,
    SHED_ACTIVE_PAIRS,
    SHED_SILENT_PAIR,
    SHED_IDLE_SESSION,
    SHED_SESSIONS,
)


class BlindRelayError(Exception):
    """The peer broke the blind-relay (or protomux beneath it) protocol; drop its connection."""


# ---------------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Pair:
    is_initiator: bool
    token: bytes
    id: int
    seq: int = 0


@dataclass(frozen=True, slots=True)
class Unpair:
    token: bytes


def _read_pair(r: Reader) -> Pair:
    flags = r.bitfield(7)
    return Pair(bool(flags & 1), r.fixed32(), r.uint(), r.uint())


def _write_pair(w: Writer, m: Pair) -> None:
    w.bitfield(1 if m.is_initiator else 0, 7).fixed32(m.token).uint(m.id).uint(m.seq)


def _read_unpair(r: Reader) -> Unpair:
    r.bitfield(7)
    return Unpair(r.fixed32())


def _write_unpair(w: Writer, m: Unpair) -> None:
    w.bitfield(0, 7).fixed32(m.token)


PAIR_MESSAGE = MessageType(_read_pair, _write_pair, "pair")
UNPAIR_MESSAGE = MessageType(_read_unpair, _write_unpair, "unpair")


def encode_pair(m: Pair) -> bytes:
    w = Writer()
    _write_pair(w, m)
    return w.getvalue()


def encode_unpair(m: Unpair) -> bytes:
    w = Writer()
    _write_unpair(w, m)
    return w.getvalue()


def decode_pair(data: bytes) -> Pair:
    try:
        return _read_pair(Reader(data))
    except DecodeError as e:
        raise BlindRelayError(f"bad pair message: {e}") from e


def decode_unpair(data: bytes) -> Unpair:
    try:
        return _read_unpair(Reader(data))
    except DecodeError as e:
        raise BlindRelayError(f"bad unpair message: {e}") from e


# ---------------------------------------------------------------------------------- stats


@dataclass(slots=True)
class BlindRelayStats:
    sessions_accepted: int = 0
    sessions_opened: int = 0
    sessions_closed: int = 0
    pairings_requested: int = 0
    pairings_matched: int = 0
    pairings_cancelled: int = 0
    pairings_pending: int = 0
    pairings_active: int = 0
    streams_opened: int = 0
    streams_closed: int = 0
    streams_errors: int = 0
    pairings_refused_session_limit: int = 0
    pairings_refused_total_limit: int = 0
    pairings_refused_invalid: int = 0
    pairings_timed_out: int = 0
    sessions_refused_full: int = 0
    pairings_refused_full: int = 0
    sessions_refused_memory: int = 0
    pairings_refused_memory: int = 0

    def as_dict(self) -> dict[str, dict[str, int]]:
        """The `/stats` groups: sessions, pairings, streams, refusals."""
        return {
            "sessions": {
                "accepted": self.sessions_accepted,
                "opened": self.sessions_opened,
                "closed": self.sessions_closed,
            },
            "pairings": {
                "requested": self.pairings_requested,
                "matched": self.pairings_matched,
                "cancelled": self.pairings_cancelled,
                "pending": self.pairings_pending,
                "active": self.pairings_active,
            },
            "streams": {"opened": self.streams_opened, "closed": self.streams_closed, "errors": self.streams_errors},
            "refusals": {
                "session_limit": self.pairings_refused_session_limit,
                "total_limit": self.pairings_refused_total_limit,
                "invalid": self.pairings_refused_invalid,
                "timed_out": self.pairings_timed_out,
                "full_sessions": self.sessions_refused_full,
                "full_pairs": self.pairings_refused_full,
                "memory_sessions": self.sessions_refused_memory,
                "memory_pairs": self.pairings_refused_memory,
            },
        }


# ---------------------------------------------------------------------------------- events


class RelayEvent:
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class RelayLink:
    """One side of a matched pairing, as the runtime needs it."""

    session: BlindRelaySession
    is_initiator: bool
    stream_id: int
    """Our raw-stream id for this side (sent back to the peer in `pair`)."""
    remote_stream_id: int
    """The peer's own raw-stream id (from its `pair`): where our stream sends."""


@dataclass(frozen=True, slots=True)
class PairingMatched(RelayEvent):
    """Create `links[i].stream_id` for each side, relay them to each other, then flush output."""

    token: bytes
    links: tuple[RelayLink, RelayLink]  # (non-initiator, initiator)


@dataclass(frozen=True, slots=True)
class DestroyStream(RelayEvent):
    """Destroy our raw stream `stream_id` (unpaired, or its session closed)."""

    stream_id: int
    session: BlindRelaySession
    reason: str


@dataclass(frozen=True, slots=True)
class SessionOpened(RelayEvent):
    session: BlindRelaySession


@dataclass(frozen=True, slots=True)
class SessionClosed(RelayEvent):
    session: BlindRelaySession


# ---------------------------------------------------------------------------------- state


@dataclass(eq=False, slots=True)
class _Link:
    session: BlindRelaySession
    is_initiator: bool
    remote_id: int
    key: bytes
    stream_id: int | None = None
    remote: _Link | None = None
    carried: bool = False  # our stream for this side has received a packet
    both: bool = False  # the pair carried both ways: counted in its session's `_carrying`


@dataclass(eq=False, slots=True)
class _PendingPair:
    token: bytes
    created: float
    links: list[_Link | None] = field(default_factory=lambda: [None, None])  # [non-initiator, initiator]


def _drain(mux: Mux) -> list[Event]:
    """Every event the mux has now, in order."""
    out: list[Event] = []
    while (ev := mux.next_event()) is not None:
        out.append(ev)
    return out


class BlindRelaySession:
    """The blind-relay channel on one connection; made by `BlindRelayServer.accept`."""

    __slots__ = (
        "_carrying",
        "_ending",
        "_link_count",
        "_links",
        "_others",
        "_pairing",
        "_server",
        "channel",
        "closed",
        "id",
        "idle_since",
        "mux",
        "opened",
        "owner",
        "remote_handshake",
    )

    def __init__(
        self,
        server: BlindRelayServer,
        mux: Mux,
        id: bytes | None,
        handshake: bytes | None,
        owner: object = None,
        now: float = 0.0,
    ) -> None:
        self._server = server
        self.mux = mux
        self.id = id
        self.owner = owner
        self.idle_since: float | None = now
        """When the session last had no relay link (None while it has one)."""
        channel = mux.open_channel(PROTOCOL, id, messages=[PAIR_MESSAGE, UNPAIR_MESSAGE], handshake=handshake)
        if channel is None:
            raise BlindRelayError("a blind-relay channel with this id is already open on this stream")
        self.channel = channel
        self.opened = False
        self.closed = False
        self.remote_handshake: bytes | None = None
        self._ending = False
        self._pairing: dict[bytes, None] = {}  # ordered: oldest pending token first
        self._links: dict[bytes, list[_Link]] = {}
        self._link_count = 0
        self._carrying = 0  # links whose pair carried packets both ways: never shed for room
        self._others: list[Event] | None = None  # protomux events of other channels, made on first use

    def __repr__(self) -> str:
        return (
            f"<BlindRelaySession {(self.id or b'').hex()[:16]} pending={len(self._pairing)} links={self.active_links}>"
        )

    @property
    def pending_tokens(self) -> int:
        return len(self._pairing)

    @property
    def active_links(self) -> int:
        return self._link_count

    # ---------------------------------------------------------------- runtime API

    def receive(self, data: bytes | bytearray | memoryview, now: float) -> None:
        """Feed one secret-stream message (protomux events of other channels go to
        `next_event`); the server's events and replies follow from it."""
        self._server._now = now
        try:
            self.mux.receive(data, now)
        except ProtomuxError as e:
            raise BlindRelayError(str(e)) from e
        finally:
            self._server._dirty[self] = None
        self._process(_drain(self.mux), now)

    def connection_closed(self) -> None:
        """The secret-stream closed: the channel closes and everything pending is cancelled."""
        self._server._dirty.pop(self, None)
        self.mux.connection_closed()
        self._process(_drain(self.mux), self._server._now)

    def next_event(self) -> Event | None:
        """The oldest protomux event of another channel on this connection, or None."""
        others = self._others
        return others.pop(0) if others else None

    def data_to_send(self) -> list[bytes]:
        self._server._dirty.pop(self, None)
        return self.mux.data_to_send()

    def end(self) -> None:
        """Close the channel once no pairing of this session is pending."""
        self._ending = True
        self._end_maybe()

    def destroy(self) -> None:
        """Close the channel now: pending tokens are cancelled, active links destroyed."""
        if not self.channel.closed:
            self.channel.close()
            self._server._dirty[self] = None
            self._process(_drain(self.mux), 0.0)

    # ---------------------------------------------------------------- internals

    def _end_maybe(self) -> None:
        if self._ending and not self._pairing:
            self.destroy()

    def _process(self, events: list[Event], now: float) -> None:
        for ev in events:
            chan = getattr(ev, "channel", None)
            if chan is not self.channel:
                if self._others is None:
                    self._others = []
                self._others.append(ev)
            elif isinstance(ev, MessageReceived):
                if ev.type == 0:
                    self._server._on_pair(self, ev.message, now)
                else:
                    self._server._on_unpair(self, ev.message)
            elif isinstance(ev, ChannelOpened):
                self.opened = True
                self.remote_handshake = ev.handshake
                self._server.stats.sessions_opened += 1
                self._server._events.append(SessionOpened(self))
            elif isinstance(ev, ChannelClosed):
                self._server._on_session_close(self)


class _Owner:
    """What one owner (source host) holds: its sessions, pending tokens and relay links."""

    __slots__ = ("carried_links", "carrying", "linked", "links", "pending", "sessions")

    def __init__(self) -> None:
        self.sessions: dict[BlindRelaySession, None] = {}
        self.pending = 0
        self.links = 0
        self.linked = 0  # sessions with at least one relay link
        self.carrying = 0  # sessions with a link whose pair carried both ways
        self.carried_links = 0  # links whose pair carried both ways

    def shed_weight(self) -> tuple[float, int]:
        """What this owner holds that may go to make room for a newcomer: an idle session
        weighs 1, one waiting for its partner (pending tokens) 1/2, one whose pairs never
        carried a packet 1/8; a session relaying traffic weighs nothing, it is never shed.
        Ties: fewer relaying sessions lose first."""
        unlinked = len(self.sessions) - self.linked
        waiting = min(self.pending, unlinked)
        silent = self.linked - self.carrying
        return (unlinked - waiting / 2 + silent / 8, -self.carrying)

    def silent_links(self) -> int:
        return self.links - self.carried_links


class BlindRelayServer:
    """Pairs tokens across sessions and tells the runtime which raw streams to make and relay."""

    def __init__(
        self,
        *,
        allocate_stream_id: Callable[[], int] | None = None,
        stream_id_free: Callable[[int], bool] | None = None,
        max_pending_per_session: int | None = None,
        max_pending_total: int | None = None,
        pairing_timeout: float | None = None,
        max_active_pairs: int | None = None,
        pair_idle_timeout: float | None = None,
        session_idle_timeout: float | None = None,
        max_sessions: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._allocate_hook = allocate_stream_id
        self._id_free = stream_id_free
        self._rng = rng or random.SystemRandom()
        self.max_pending_per_session = max_pending_per_session
        self.max_pending_total = max_pending_total
        self.pairing_timeout = pairing_timeout
        self.max_active_pairs = max_active_pairs
        self.pair_idle_timeout = pair_idle_timeout
        self.session_idle_timeout = session_idle_timeout
        self.max_sessions = max_sessions
        self.memory_full = False
        """The service's memory budget is reached: every cap counts as reached (see above)."""
        self.stats = BlindRelayStats()
        self.shed: Counter[str] = Counter()
        self._now = 0.0
        self._pairing: dict[bytes, _PendingPair] = {}
        self._active_refs: dict[bytes, int] = {}
        self._sessions: dict[BlindRelaySession, None] = {}
        self._idle: dict[BlindRelaySession, float] = {}  # sessions without a link -> since; oldest first
        self._owners: dict[object, _Owner] = {}
        self._by_stream: dict[int, _Link] = {}
        self._silent: dict[_Link, float] = {}  # non-initiator link of a pair not yet carried both ways -> matched at
        self._events: deque[RelayEvent] = deque()
        self._dirty: dict[BlindRelaySession, None] = {}  # ordered: replies go out in pairing order

    # ---------------------------------------------------------------- runtime API

    @property
    def sessions(self) -> Iterator[BlindRelaySession]:
        return iter(list(self._sessions))

    def accept(
        self,
        id: bytes | None = None,
        mux: Mux | None = None,
        *,
        handshake: bytes | None = None,
        owner: object = None,
        now: float | None = None,
    ) -> BlindRelaySession:
        """Start the blind-relay channel on a new connection (id = the client's public key).

        `owner` groups sessions for fair shares (the service passes the source host)."""
        if now is not None:
            self._now = now
        session = BlindRelaySession(self, mux or Mux(), id, handshake, owner, self._now)
        self._sessions[session] = None
        self._idle[session] = self._now
        self._owner(owner).sessions[session] = None
        self.stats.sessions_accepted += 1
        self._dirty[session] = None
        session._process(_drain(session.mux), 0.0)
        return session

    def sessions_of(self, owner: object) -> int:
        o = self._owners.get(owner)
        return len(o.sessions) if o is not None else 0

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    def room_for_session(self, now: float) -> bool:
        """Whether a newcomer may have a session now, under `max_sessions`: at the cap one
        session goes (`shed_session`); when every session relays traffic, none may go and the
        newcomer is refused (counted in `sessions_refused_full`; the caller tells its peer).
        While `memory_full`, the same holds below the cap."""
        at_cap = self.max_sessions is not None and len(self._sessions) >= self.max_sessions
        if not at_cap and not self.memory_full:
            return True
        if self.shed_session(now) is not None and (
            self.max_sessions is None or len(self._sessions) < self.max_sessions
        ):
            return True
        self.stats.sessions_refused_full += 1
        if self.memory_full:
            self.stats.sessions_refused_memory += 1
        return False

    def shed_session(self, now: float) -> BlindRelaySession | None:
        """Close one session to make room for a newcomer; counted as `sessions`. None when
        every session has a pair that carried traffic: those are never shed.

        The owner holding the most that may go loses (`_Owner.shed_weight`), so one address
        hoarding idle sessions pays first, and a worker address whose thousands of sessions all
        relay is never picked for its size. Within it, an idle session goes first (no links, no
        pending tokens), then one waiting for its partner, then one whose pairs never carried a
        packet; the least recently busy first."""
        self._now = now
        best: _Owner | None = None
        best_weight: tuple[float, int] = (0.0, 0)
        for o in self._owners.values():
            w = o.shed_weight()
            if w[0] > 0 and (best is None or w > best_weight):
                best, best_weight = o, w
        if best is None:
            return None
        victim = min(
            (s for s in best.sessions if s._carrying == 0),
            key=lambda s: (s._link_count > 0, bool(s._pairing), s.idle_since if s.idle_since is not None else now),
            default=None,
        )
        if victim is None:
            return None
        self.shed[SHED_SESSIONS] += 1
        victim.destroy()
        return victim

    def next_event(self) -> RelayEvent | None:
        """The oldest event not yet taken (a `PairingMatched` before the replies it queued)."""
        return self._events.popleft() if self._events else None

    def data_to_send(self) -> list[tuple[BlindRelaySession, list[bytes]]]:
        """Messages to write, per session that has any (pair replies go to other sessions too)."""
        out = []
        for session in list(self._dirty):
            msgs = session.mux.data_to_send()
            if msgs:
                out.append((session, msgs))
        self._dirty.clear()
        return out

    def stream_carried(self, stream_id: int) -> None:
        """Our relay stream `stream_id` received a packet (its peer is really there)."""
        link = self._by_stream.get(stream_id)
        if link is None or link.carried:
            return
        link.carried = True
        remote = link.remote
        if remote is not None and remote.carried:
            self._silent.pop(link if not link.is_initiator else remote, None)
            for side in (link, remote):
                side.both = True
                side.session._carrying += 1
                o = self._owners.get(side.session.owner)
                if o is not None:
                    o.carried_links += 1
                    if side.session._carrying == 1:
                        o.carrying += 1

    def stream_closed(self, stream_id: int) -> None:
        """A relay raw stream closed by itself (peer ended, timed out); unknown ids are ignored."""
        link = self._by_stream.pop(stream_id, None)
        if link is None:
            return
        link.stream_id = None
        self._forget_link(link)

    def stream_error(self, stream_id: int) -> None:
        """A relay raw stream failed; `stream_closed` is expected to follow."""
        if stream_id in self._by_stream:
            self.stats.streams_errors += 1

    def handle_timer(self, now: float) -> None:
        """Cancel pending pairings, reap silent pairs and close idle sessions whose time is up."""
        self._now = now
        # each loop looks at the oldest entry only (insertion order = time order): no copy of
        # thousands of entries each time a deadline is due
        if self.pairing_timeout is not None:
            while self._pairing:
                key, pair = next(iter(self._pairing.items()))
                if now - pair.created < self.pairing_timeout:
                    break
                self._cancel_pending(key, pair)
                self.stats.pairings_timed_out += 1
                self.shed[SHED_PENDING_TIMEOUT] += 1
        if self.pair_idle_timeout is not None:
            while self._silent:
                link, matched = next(iter(self._silent.items()))
                if now - matched < self.pair_idle_timeout:
                    break
                del self._silent[link]
                self.shed[SHED_SILENT_PAIR] += 1
                self._destroy_pair(link, "never carried a packet")
        if self.session_idle_timeout is not None:
            while self._idle:
                session, since = next(iter(self._idle.items()))
                if now - since < self.session_idle_timeout:
                    break
                del self._idle[session]
                if not session.closed:
                    self.shed[SHED_IDLE_SESSION] += 1
                    session.destroy()

    def get_timer(self) -> float | None:
        """When `handle_timer` next has work (pending timeouts, silent pairs, idle sessions), or None."""
        times = []
        if self.pairing_timeout is not None and self._pairing:
            times.append(next(iter(self._pairing.values())).created + self.pairing_timeout)
        if self.pair_idle_timeout is not None and self._silent:
            times.append(next(iter(self._silent.values())) + self.pair_idle_timeout)
        if self.session_idle_timeout is not None and self._idle:
            times.append(next(iter(self._idle.values())) + self.session_idle_timeout)
        return min(times) if times else None

    def compact(self) -> None:
        """Rebuild the tables to what they hold now (in order): a dict keeps the table it grew to,
        ~0.3 MB at 8,192 entries, after a burst that filled it has gone."""
        for name in ("_pairing", "_active_refs", "_sessions", "_idle", "_owners", "_by_stream", "_silent", "_dirty"):
            setattr(self, name, dict(getattr(self, name)))

    def close(self) -> None:
        """Destroy every session (cancels pending pairings, destroys relay streams)."""
        for session in list(self._sessions):
            session.destroy()

    # ---------------------------------------------------------------- pairing

    def _owner(self, owner: object) -> _Owner:
        o = self._owners.get(owner)
        if o is None:
            o = self._owners[owner] = _Owner()
        return o

    def _allocate(self, prefer: int | None = None) -> int:
        """A free relay stream id: with `stream_id_free`, the partner peer's own stream id when it
        is free, so packets need no id rewrite (the kernel can forward them: relay.udx.kernel)."""
        if prefer is not None and self._id_free is not None and prefer not in self._by_stream and self._id_free(prefer):
            return prefer
        if self._allocate_hook is not None:
            return self._allocate_hook()
        while True:
            sid = self._rng.getrandbits(32)
            if sid not in self._by_stream:
                return sid

    def _on_pair(self, session: BlindRelaySession, m: Pair, now: float) -> None:
        key = m.token
        if m.id > MAX_STREAM_ID:
            self.stats.pairings_refused_invalid += 1
            return
        pair = self._pairing.get(key)
        side = 1 if m.is_initiator else 0
        if pair is None:
            cap = self.max_pending_per_session
            if cap is not None and len(session._pairing) >= cap:
                oldest = next(iter(session._pairing))
                self.shed[SHED_PENDING_PER_SESSION] += 1
                self._cancel_pending(oldest, self._pairing[oldest])
            if (self.max_pending_total is not None and self.stats.pairings_pending >= self.max_pending_total) or (
                self.memory_full and self.stats.pairings_pending > 0
            ):
                self._shed_pending()
            pair = self._pairing[key] = _PendingPair(key, now)
            self.stats.pairings_pending += 1
        elif pair.links[side] is not None:
            return
        if key not in session._pairing:  # a session pairing a token with itself holds it once
            session._pairing[key] = None
            self._owner(session.owner).pending += 1
        self.stats.pairings_requested += 1
        pair.links[side] = _Link(session, m.is_initiator, m.id, key)
        a, b = pair.links
        if a is None or b is None:
            return
        cap = self.max_active_pairs
        at_cap = (cap is not None and self.stats.pairings_active >= cap) or self.memory_full
        if at_cap and not self._shed_active():
            if self.memory_full:
                self.stats.pairings_refused_memory += 1
            self._refuse_pairing(key, pair)
            return
        del self._pairing[key]
        self.stats.pairings_pending -= 1
        self.stats.pairings_matched += 1
        for link, partner in ((a, b), (b, a)):
            link.stream_id = self._allocate(partner.remote_id)
            self._by_stream[link.stream_id] = link
        a.remote, b.remote = b, a
        for link in (a, b):
            self._drop_pending_ref(link.session, key)
            link.session._links.setdefault(key, []).append(link)
            link.session._link_count += 1
            link.session.idle_since = None
            self._idle.pop(link.session, None)
            o = self._owner(link.session.owner)
            o.links += 1
            if link.session._link_count == 1:
                o.linked += 1
            self._active_refs[key] = self._active_refs.get(key, 0) + 1
            if self._active_refs[key] == 1:
                self.stats.pairings_active += 1
            self.stats.streams_opened += 1
        self._silent[a] = now
        assert a.stream_id is not None and b.stream_id is not None
        self._events.append(
            PairingMatched(
                key,
                (
                    RelayLink(a.session, False, a.stream_id, a.remote_id),
                    RelayLink(b.session, True, b.stream_id, b.remote_id),
                ),
            )
        )
        for link in (a, b):
            assert link.stream_id is not None
            link.session.channel.send(0, Pair(link.is_initiator, key, link.stream_id, 0))
            self._dirty[link.session] = None
            link.session._end_maybe()

    def _shed_pending(self) -> None:
        """Total pending cap: the heaviest owner's heaviest session loses its oldest pending token."""
        owner = max(self._owners.values(), key=lambda o: o.pending)
        victim = max(owner.sessions, key=lambda s: len(s._pairing))
        # the cap holds whatever the books say: with nothing to take there, the oldest token goes
        oldest = next(iter(victim._pairing or self._pairing), None)
        if oldest is None:
            return
        self.shed[SHED_PENDING_TOTAL] += 1
        self._cancel_pending(oldest, self._pairing[oldest])

    def _shed_active(self) -> bool:
        """Active pairs cap: make room for a new pair. The owner holding the most links whose
        pair never carried a packet loses its oldest such pair; a pair that carried traffic both
        ways is never shed (False: nothing may go, the new pairing is refused)."""
        owner = max(self._owners.values(), key=_Owner.silent_links, default=None)
        if owner is None or owner.silent_links() <= 0:
            return False
        for link in self._silent:  # oldest match first
            remote = link.remote
            if self._owners.get(link.session.owner) is owner or (
                remote is not None and self._owners.get(remote.session.owner) is owner
            ):
                self.shed[SHED_ACTIVE_PAIRS] += 1
                self._destroy_pair(link, "relay at its active pairs cap")
                return True
        return False

    def _refuse_pairing(self, key: bytes, pair: _PendingPair) -> None:
        """The relay is full of pairs that carry traffic: the pairing is off, and a session
        left with nothing else closes its channel, so its peer learns at once (the blind-relay
        protocol has no refusal message; npm's client fails the pairing with CHANNEL_CLOSED)
        instead of waiting out its 15 s pairing timeout."""
        self.stats.pairings_refused_full += 1
        self._cancel_pending(key, pair, cancelled=False)
        for link in pair.links:
            if link is None:
                continue
            session = link.session
            if not session.closed and session._link_count == 0 and not session._pairing:
                session.destroy()

    def _destroy_pair(self, link: _Link, reason: str) -> None:
        remote = link.remote
        self._destroy_link(link, reason)
        if remote is not None:
            self._destroy_link(remote, reason)
        self.stats.pairings_cancelled += 1

    def _drop_pending_ref(self, session: BlindRelaySession, key: bytes) -> None:
        if session._pairing.pop(key, 0) is None:
            o = self._owners.get(session.owner)
            if o is not None:
                o.pending -= 1

    def _on_unpair(self, session: BlindRelaySession, m: Unpair) -> None:
        key = m.token
        pair = self._pairing.get(key)
        if pair is not None:
            self._cancel_pending(key, pair)
            return
        links = session._links.get(key)
        if links:
            for link in list(links):
                remote = link.remote
                self._destroy_link(link, "unpaired")
                if remote is not None:
                    self._destroy_link(remote, "unpaired")
            self.stats.pairings_cancelled += 1

    def _cancel_pending(self, key: bytes, pair: _PendingPair, *, cancelled: bool = True) -> None:
        """Drop a pending token for every side present (npm: any session may unpair it)."""
        del self._pairing[key]
        self.stats.pairings_pending -= 1
        self.stats.pairings_cancelled += cancelled
        for link in pair.links:
            if link is not None:
                self._drop_pending_ref(link.session, key)
                link.session._end_maybe()

    def _on_session_close(self, session: BlindRelaySession) -> None:
        if session.closed:
            return
        session.closed = True
        session._ending = True
        self.stats.pairings_cancelled += len(session._pairing)
        for key in list(session._pairing):
            self._drop_pending_ref(session, key)
            if self._pairing.pop(key, None) is not None:
                self.stats.pairings_pending -= 1
        for links in list(session._links.values()):
            for link in list(links):
                self._destroy_link(link, "session closed")
        session._pairing.clear()
        session._links.clear()
        self._sessions.pop(session, None)
        self._idle.pop(session, None)
        o = self._owners.get(session.owner)
        if o is not None:
            o.sessions.pop(session, None)
            if not o.sessions:
                del self._owners[session.owner]
        self.stats.sessions_closed += 1
        self._events.append(SessionClosed(session))

    def _destroy_link(self, link: _Link, reason: str) -> None:
        sid = link.stream_id
        if sid is None:
            return
        link.stream_id = None
        self._by_stream.pop(sid, None)
        self._forget_link(link)
        self._events.append(DestroyStream(sid, link.session, reason))

    def _forget_link(self, link: _Link) -> None:
        remote = link.remote
        link.remote = None
        if remote is not None and remote.remote is link:
            remote.remote = None
        self._silent.pop(link, None)
        if remote is not None:
            self._silent.pop(remote, None)
        session = link.session
        links = session._links.get(link.key)
        if links is not None:
            if link in links:
                links.remove(link)
                session._link_count -= 1
                o = self._owners.get(session.owner)
                if o is not None:
                    o.links -= 1
                    if session._link_count == 0:
                        o.linked -= 1
                    if link.both:
                        o.carried_links -= 1
                        if session._carrying == 1:
                            o.carrying -= 1
                if link.both:
                    link.both = False
                    session._carrying -= 1
                if session._link_count == 0 and not session.closed:
                    session.idle_since = self._now
                    self._idle[session] = self._now
            if not links:
                del session._links[link.key]
        refs = self._active_refs.get(link.key)
        if refs is not None:
            if refs == 1:
                del self._active_refs[link.key]
                self.stats.pairings_active -= 1
            else:
                self._active_refs[link.key] = refs - 1
        self.stats.streams_closed += 1


if TYPE_CHECKING:
    from relay.core import ByteStreamCore, DrivenCore

    # mypy checks the core against relay.core's contract here (never run: the guard sees no asyncio)
    def _conforms(
        session: BlindRelaySession, server: BlindRelayServer
    ) -> tuple[ByteStreamCore[Event], DrivenCore[RelayEvent]]:
        return session, server
