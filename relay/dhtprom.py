"""The dht-prometheus wire, sans-IO: register an alias with a scraper, answer its metrics requests.

What blind-relay-service does through hyper-instrument 3.2.1 -> dht-prom-client 2.1.0, and
what hyperdht-prometheus-bridge 2.1.1 (with dht-prom-alias-rpc / hyperdht-prometheus-alias-rpc)
expects on the other end. Both directions are protomux-rpc 1.10.0 channels on a hyperdht
secret stream:

* the relay connects to the scraper's key and opens `("register-alias", id empty)`; request
  `alias` carries `uint major=1, uint minor=1, fixed32 secret, string alias, fixed32 target key,
  string hostname, string service`; the answer is `uint major, uint minor, bool success` then
  `bool updated` or `string errorMessage`;
* the scraper connects to the relay's *target key* (a second server on the same DHT node,
  whose firewall admits the scraper's key only) and opens `("prometheus-metrics", id empty)`;
  request `metrics` is `uint major=1, uint minor=1`; the answer is `uint version=0, bool
  success` then `string metrics` (Prometheus text) or `string errorMessage`.

protomux-rpc frames: message type 0 is a request `uint id, string method, raw value`, type 1 a
response `bitfield(1) flags, uint id` then the raw value, or on error `string message`,
`[string code]`, `[string cause message, string cause code, [string context]]`.

`AliasRegistrar` is one registration over one connection; `MetricsResponder` serves one
scraper connection, with a token bucket so a scraper asking too often gets a cheap refusal
instead of a render; `RegistrationSchedule` decides when to (re-)register: at once, again
after every failure with backoff, soon after the scraper's connection drops (it restarted),
and every `refresh` seconds while all is well (the bridge forgets aliases after 3 hours).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay.encoding import DecodeError, Reader, Writer
from relay.protomux import (
    ChannelClosed,
    ChannelOpened,
    MessageReceived,
    MessageType,
    Mux,
    ProtomuxError,
)

ALIAS_PROTOCOL = "register-alias"
METRICS_PROTOCOL = "prometheus-metrics"
MAJOR = 1
MINOR = 1
METRICS_REPLY_VERSION = 0
#: blind-relay-service: "The Prometheus alias must have length less than 100".
MAX_ALIAS = 99
SERVICE_NAME = "blind-relay"


@dataclass(frozen=True)
class ScraperConfig:
    """`--scraper-public-key`, `--scraper-secret`, `--scraper-alias` (decoded and checked)."""

    public_key: bytes
    secret: bytes
    alias: str
    hostname: str = ""  # the glue fills in this host's name (dht-prom-client: `os.hostname()`)
    service: str = SERVICE_NAME

    def __repr__(self) -> str:  # never print the secret into logs
        return f"ScraperConfig(alias={self.alias!r})"


class ScraperProtocolError(Exception):
    """The scraper (or something claiming to be it) broke the wire; drop its connection."""


def default_alias(relay_key_z32: str) -> str:
    """blind-relay-service's default: `blind-relay-<z32 key>`, cut to 99 characters."""
    return f"{SERVICE_NAME}-{relay_key_z32}"[:MAX_ALIAS]


def check_alias(alias: str) -> str:
    """The alias as given, or ValueError saying why blind-relay-service would refuse it too."""
    if len(alias) > MAX_ALIAS:
        raise ValueError(f"the Prometheus alias must have length less than 100 (got {len(alias)} characters)")
    if not alias:
        raise ValueError("the Prometheus alias is empty")
    if ":" in alias:
        # the bridge writes `<alias>:<key>:<host>:<service>` into targets.json and splits on ':'
        raise ValueError(f"the Prometheus alias must not contain ':' (got {alias!r})")
    return alias


# ------------------------------------------------------------------------- protomux-rpc frames


@dataclass(frozen=True, slots=True)
class RpcRequest:
    id: int
    method: str
    value: bytes


@dataclass(frozen=True, slots=True)
class RpcResponse:
    id: int
    value: bytes | None
    error: str | None = None
    code: str | None = None


def _read_request(r: Reader) -> RpcRequest:
    return RpcRequest(r.uint(), r.string(), r.raw())


def _write_request(w: Writer, m: RpcRequest) -> None:
    w.uint(m.id).string(m.method).raw(m.value)


def _read_response(r: Reader) -> RpcResponse:
    flags = r.bitfield(1)
    rid = r.uint()
    if not flags & 1:
        return RpcResponse(rid, r.raw())
    message = r.string()
    code = r.string() if flags & 2 else None
    if flags & 4:
        cause = r.string()
        r.string()
        if flags & 8:
            r.string()
        message = f"{message}: {cause}"
    return RpcResponse(rid, None, message, code)


def _write_response(w: Writer, m: RpcResponse) -> None:
    if m.error is None:
        w.bitfield(0, 1).uint(m.id).raw(m.value or b"")
        return
    w.bitfield(1 | (2 if m.code else 0), 1).uint(m.id).string(m.error)
    if m.code:
        w.string(m.code)


RPC_MESSAGES = [
    MessageType(_read_request, _write_request, "request"),
    MessageType(_read_response, _write_response, "response"),
]


# ------------------------------------------------------------------------- the two RPCs' values


@dataclass(frozen=True, slots=True)
class AliasRequest:
    secret: bytes
    alias: str
    target_key: bytes
    hostname: str
    service: str

    def encode(self) -> bytes:
        w = Writer().uint(MAJOR).uint(MINOR).fixed32(self.secret).string(self.alias)
        return w.fixed32(self.target_key).string(self.hostname).string(self.service).getvalue()

    @classmethod
    def decode(cls, data: bytes) -> AliasRequest:
        r = Reader(data)
        major, minor = r.uint(), r.uint()
        if major != MAJOR or minor > MINOR:
            raise DecodeError(f"alias request version {major}.{minor} is not {MAJOR}.x")
        return cls(r.fixed32(), r.string(), r.fixed32(), r.string(), r.string())


def encode_alias_response(success: bool, updated: bool = False, error: str = "") -> bytes:
    w = Writer().uint(MAJOR).uint(MINOR).bool(success)
    return (w.bool(updated) if success else w.string(error)).getvalue()


def decode_alias_response(data: bytes) -> tuple[bool, bool, str]:
    """(success, updated, error message)."""
    r = Reader(data)
    major = r.uint()
    r.uint()
    if major != MAJOR:
        raise DecodeError(f"alias response of major version {major} (ours: {MAJOR})")
    if r.bool():
        return True, r.bool(), ""
    return False, False, r.string()


def encode_metrics_request() -> bytes:
    return Writer().uint(MAJOR).uint(MINOR).getvalue()


def decode_metrics_request(data: bytes) -> None:
    r = Reader(data)
    major, minor = r.uint(), r.uint()
    if major != MAJOR or minor > MINOR:
        raise DecodeError(f"metrics request version {major}.{minor} is not {MAJOR}.x")


def encode_metrics_reply(metrics: str | None, error: str = "") -> bytes:
    w = Writer().uint(METRICS_REPLY_VERSION).bool(metrics is not None)
    return w.string(metrics if metrics is not None else error).getvalue()


def decode_metrics_reply(data: bytes) -> tuple[bool, str]:
    r = Reader(data)
    if r.uint() > METRICS_REPLY_VERSION:
        raise DecodeError("metrics reply of a future version")
    return r.bool(), r.string()


# ------------------------------------------------------------------------- registration (client)


@dataclass(frozen=True, slots=True)
class Registered:
    """The scraper took the alias; `updated` is False when it already pointed at our key."""

    updated: bool


@dataclass(frozen=True, slots=True)
class RegistrationFailed:
    """The scraper refused (wrong secret: "Unauthorised"), answered garbage, timed out, or left."""

    reason: str


@dataclass(frozen=True, slots=True)
class ScraperLeft:
    """The connection to the scraper closed after a registration: it may have restarted."""


RegistrarEvent = Registered | RegistrationFailed | ScraperLeft


class AliasRegistrar:
    """One `register-alias` channel on one connection to the scraper."""

    def __init__(self, request: AliasRequest, *, timeout: float, now: float) -> None:
        self.mux = Mux()
        channel = self.mux.open_channel(ALIAS_PROTOCOL, b"", messages=RPC_MESSAGES)
        assert channel is not None
        self.channel = channel
        self._deadline: float | None = now + timeout
        self._events: deque[RegistrarEvent] = deque()
        self.registered = False
        self.done = False
        channel.send(0, RpcRequest(1, "alias", request.encode()))

    def data_to_send(self) -> list[bytes]:
        return self.mux.data_to_send()

    def next_event(self) -> RegistrarEvent | None:
        return self._events.popleft() if self._events else None

    def get_timer(self) -> float | None:
        return self._deadline

    def handle_timer(self, now: float) -> None:
        if self._deadline is not None and now >= self._deadline:
            self._fail("the scraper did not answer the alias request in time")

    def receive(self, data: bytes, now: float) -> None:
        """One secret-stream message from the scraper; raises ScraperProtocolError."""
        try:
            self.mux.receive(data, now)
        except ProtomuxError as e:
            self._fail(f"bad protomux message from the scraper: {e}")
            raise ScraperProtocolError(str(e)) from e
        while (ev := self.mux.next_event()) is not None:
            if isinstance(ev, MessageReceived) and ev.channel is self.channel and ev.type == 1:
                self._on_response(ev.message)
            elif isinstance(ev, ChannelClosed) and ev.channel is self.channel:
                self.connection_closed()

    def _on_response(self, m: RpcResponse) -> None:
        if m.id != 1 or self.done:
            return
        if m.error is not None:
            self._fail(f"the scraper answered with an error: {m.error}")
            return
        try:
            ok, updated, error = decode_alias_response(m.value or b"")
        except DecodeError as e:
            self._fail(f"the scraper's answer does not decode: {e}")
            return
        if not ok:
            hint = " (check --scraper-secret)" if error == "Unauthorised" else ""
            self._fail(f"the scraper refused the alias: {error}{hint}")
            return
        self.done = True
        self.registered = True
        self._deadline = None
        self._events.append(Registered(updated))

    def connection_closed(self) -> None:
        if not self.done:
            self._fail("the connection to the scraper closed before it answered")
        elif self.registered:
            self.registered = False
            self._events.append(ScraperLeft())

    def _fail(self, reason: str) -> None:
        if self.done:
            return
        self.done = True
        self._deadline = None
        self._events.append(RegistrationFailed(reason))


# ------------------------------------------------------------------------- metrics (server)


@dataclass(frozen=True, slots=True)
class MetricsServed:
    bytes: int


@dataclass(frozen=True, slots=True)
class MetricsRefused:
    """A request over the connection's budget (or of a version we do not speak)."""

    reason: str


ResponderEvent = MetricsServed | MetricsRefused


class MetricsResponder:
    """Answers `metrics` on one scraper connection. Renders at most `rate` per second (burst
    `burst`): past that the scraper gets a short error reply, counted, and no render."""

    def __init__(self, render: Callable[[], str], now: float, *, rate: float = 2.0, burst: float = 10.0) -> None:
        self.mux = Mux()
        channel = self.mux.open_channel(METRICS_PROTOCOL, b"", messages=RPC_MESSAGES)
        assert channel is not None
        self.channel = channel
        self._render = render
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = now
        self._events: deque[ResponderEvent] = deque()
        self.closed = False

    def data_to_send(self) -> list[bytes]:
        return self.mux.data_to_send()

    def next_event(self) -> ResponderEvent | None:
        return self._events.popleft() if self._events else None

    def get_timer(self) -> float | None:
        return None

    def handle_timer(self, now: float) -> None:
        return None

    def receive(self, data: bytes, now: float) -> None:
        """One secret-stream message from the scraper; raises ScraperProtocolError."""
        try:
            self.mux.receive(data, now)
        except ProtomuxError as e:
            raise ScraperProtocolError(str(e)) from e
        while (ev := self.mux.next_event()) is not None:
            if isinstance(ev, MessageReceived) and ev.channel is self.channel and ev.type == 0:
                self._on_request(ev.message, now)
            elif isinstance(ev, ChannelClosed) and ev.channel is self.channel:
                self.closed = True
            elif isinstance(ev, ChannelOpened):
                pass

    def _on_request(self, m: RpcRequest, now: float) -> None:
        if m.method != "metrics":
            self._reply(m.id, RpcResponse(m.id, None, f"Unknown method '{m.method}'", "UNKNOWN_METHOD"))
            self._events.append(MetricsRefused(f"unknown method {m.method[:40]!r}"))
            return
        try:
            decode_metrics_request(m.value)
        except DecodeError as e:
            self._reply(m.id, RpcResponse(m.id, None, "Could not decode request", "DECODE_ERROR"))
            self._events.append(MetricsRefused(str(e)))
            return
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            self._reply(m.id, RpcResponse(m.id, encode_metrics_reply(None, "Too many metrics requests")))
            self._events.append(MetricsRefused("over the request budget"))
            return
        self._tokens -= 1.0
        try:
            text = self._render()
        except Exception as e:  # a broken collector must not take the connection down
            self._reply(m.id, RpcResponse(m.id, encode_metrics_reply(None, "Failed to obtain metrics")))
            self._events.append(MetricsRefused(f"render failed: {e}"))
            return
        value = encode_metrics_reply(text)
        self._reply(m.id, RpcResponse(m.id, value))
        self._events.append(MetricsServed(len(value)))

    def _reply(self, rid: int, response: RpcResponse) -> None:
        if rid:  # id 0 is an event: protomux-rpc sends no response
            self.channel.send(1, response)

    def connection_closed(self) -> None:
        self.mux.connection_closed()
        self.closed = True


# ------------------------------------------------------------------------- when to register


@dataclass(frozen=True, slots=True)
class StartAttempt:
    """Connect to the scraper and send the alias (the glue runs one attempt at a time)."""


#: Seconds between failed attempts, as protomux-rpc-client backs off (5 s, 15 s, 60 s, 300 s),
#: with a 1 s first retry so a scraper that restarts is found again quickly.
BACKOFF = (1.0, 5.0, 15.0, 60.0, 300.0)
#: Re-register while all is well: dht-prom-client's hourly interval (the bridge's aliases expire after 3 h).
REFRESH = 3600.0


class RegistrationSchedule:
    """Decides when the next registration attempt starts; never more than one at a time."""

    def __init__(self, now: float, *, backoff: tuple[float, ...] = BACKOFF, refresh: float = REFRESH) -> None:
        self.backoff = backoff
        self.refresh = refresh
        self.failures = 0
        self.attempting = False
        self.registered = False
        self._due: float | None = now
        self._events: deque[StartAttempt] = deque()

    def get_timer(self) -> float | None:
        return None if self.attempting else self._due

    def handle_timer(self, now: float) -> None:
        if self.attempting or self._due is None or now < self._due:
            return
        self.attempting = True
        self._due = None
        self._events.append(StartAttempt())

    def next_event(self) -> StartAttempt | None:
        return self._events.popleft() if self._events else None

    def succeeded(self, now: float) -> None:
        self.attempting = False
        self.registered = True
        self.failures = 0
        self._due = now + self.refresh

    def failed(self, now: float) -> float:
        """An attempt failed; returns the seconds until the next one."""
        self.attempting = False
        self.registered = False
        wait = self.backoff[min(self.failures, len(self.backoff) - 1)]
        self.failures += 1
        self._due = now + wait
        return wait

    def scraper_left(self, now: float) -> None:
        """The registered connection closed: the scraper may have restarted and lost our alias."""
        self.registered = False
        if not self.attempting:
            self._due = min(self._due if self._due is not None else now, now + self.backoff[0])


if TYPE_CHECKING:
    from relay.core import ByteStreamCore, DrivenCore

    # mypy checks the core against relay.core's contract here (never run: the guard sees no asyncio)
    _Conformance = tuple[
        ByteStreamCore[RegistrarEvent],
        DrivenCore[RegistrarEvent],
        ByteStreamCore[ResponderEvent],
        DrivenCore[ResponderEvent],
        DrivenCore[StartAttempt],
    ]

    def _conforms(reg: AliasRegistrar, responder: MetricsResponder, schedule: RegistrationSchedule) -> _Conformance:
        return reg, reg, responder, responder, schedule
