"""Read a relay's `/metrics` and `/stats`, turn its counters into rates, notice when it goes away.

UI-free on purpose: the monitor screen, `cosmictui relay status` and the wizard's checks all
use it, and it is tested without Textual. The core (`RelayWatch.observe`/`observe_failure`) takes
scrapes and times in and never touches the network; `RelayWatch.poll` is the I/O around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ipaddress
import json
import math
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cosmictui.ops import relayproc

if TYPE_CHECKING:  # the probe pulls in the DHT client: only the monitor's probe rows need it
    from cosmictui.ops.metrics.probewatch import ProbeWatch

DEFAULT_METRICS = "127.0.0.1:49738"
RUNTIME_FILE = relayproc.RUNTIME_FILE
LOG_FILE = relayproc.LOG_FILE
MEMORY_BUDGET_BYTES = 200_000_000
"""The seed page's promise: the relay uses up to 200 MB of RAM (decimal MB, as shown everywhere)."""

GAUGES = (
    "blind_relay_sessions_accepted",
    "blind_relay_sessions_opened",
    "blind_relay_sessions_closed",
    "blind_relay_pairings_requested",
    "blind_relay_pairings_matched",
    "blind_relay_pairings_cancelled",
    "blind_relay_pairings_pending",
    "blind_relay_pairings_active",
    "blind_relay_streams_opened",
    "blind_relay_streams_closed",
    "blind_relay_streams_errors",
)

# rate name -> the sample it differences. blind-relay's "gauges" for matched/cancelled/errors only
# ever grow (npm blind-relay semantics), so they are differenced like counters.
RATE_SOURCES: dict[str, str] = {
    "relayed_bytes": "blind_relay_relayed_bytes_total",
    "relayed_packets": "blind_relay_relayed_packets_total",
    "dropped_packets": "blind_relay_dropped_packets_total",
    "received_bytes": "blind_relay_udp_received_bytes_total",
    "sent_bytes": "blind_relay_udp_sent_bytes_total",
    "received_packets": "blind_relay_udp_received_packets_total",
    "sent_packets": "blind_relay_udp_sent_packets_total",
    "pairings_matched": "blind_relay_pairings_matched",
    "pairings_cancelled": "blind_relay_pairings_cancelled",
    "streams_errors": "blind_relay_streams_errors",
    "cpu_seconds": "process_cpu_seconds_total",
}

# What counts as "something happened" for the adaptive refresh: relaying and pairing state. Raw
# UDP counters are left out on purpose: a relay on the DHT always has some ping/announce chatter,
# and that alone should not keep the monitor at full speed.
ACTIVITY = (
    "blind_relay_relayed_packets_total",
    "blind_relay_sessions_opened",
    "blind_relay_sessions_closed",
    "blind_relay_pairings_requested",
    "blind_relay_pairings_pending",
    "blind_relay_pairings_active",
    "blind_relay_streams_errors",
)


NOT_A_RELAY = "is that a blind relay's metrics address? (see `cosmictui relay status`)"


class MetricsError(Exception):
    """A relay's metrics could not be read: which URL, why, and what to try next (`fix`), in
    words for an operator."""

    def __init__(self, url: str, reason: str, fix: str = "") -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason
        self.fix = fix

    def at(self, url: str) -> MetricsError:
        """The same error said of the relay's address (parsers only know the path they read)."""
        e = copy.copy(self)
        where = _hostport(url) + (self.url if self.url.startswith("/") else "")
        e.reason = f"{self.reason} from {where}" if isinstance(self, BadData) else f"{where}: {self.reason}"
        e.url, e.args = url, (f"{url}: {e.reason}",)
        return e

    def __copy__(self) -> MetricsError:
        e = self.__class__.__new__(self.__class__)
        e.__dict__.update(self.__dict__)
        e.args = self.args
        return e


class BadData(MetricsError):
    """The relay answered, but a number it sent is of the wrong type, not finite or out of range:
    shown as "bad data: <field>", never formatted, added up or plotted."""

    def __init__(self, url: str, field: str, why: str) -> None:
        fix = "no relay sends that: check what runs there, its version and its log"
        super().__init__(url, f"bad data: {field} ({why})", fix)
        self.field = field


def normalize_url(target: str) -> str:
    """`127.0.0.1:49738`, `http://h:p` and `http://h:p/metrics` all name the same endpoint base."""
    t = target.strip()
    if not t:
        raise ValueError("empty metrics address")
    if "://" not in t:
        t = "http://" + t
    scheme, _, rest = t.partition("://")
    if scheme not in ("http", "https"):
        raise ValueError(f"metrics address must be http(s): {target!r}")
    host, _, path = rest.partition("/")
    if not host:
        raise ValueError(f"metrics address has no host: {target!r}")
    _check_hostport(host, target)
    path = "/" + path if path else ""
    for suffix in ("/metrics", "/stats"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
    return f"{scheme}://{host}{path.rstrip('/')}"


def _check_hostport(hostport: str, target: str) -> None:
    """HOST[:PORT] must be something http.client can connect to: a name, an IPv4 address or a
    [bracketed] IPv6 address, and a port 1-65535 (`bad:addr:x` is refused here, not mid-scrape)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit("http://" + hostport)
        port = parts.port
    except ValueError as e:
        why = "port must be 1-65535" if "out of range" in str(e) else "expected HOST:PORT"
        raise ValueError(f"bad metrics address {target!r}: {why}") from None
    if not parts.hostname or "@" in hostport or (":" in parts.hostname and not hostport.startswith("[")):
        raise ValueError(f"bad metrics address {target!r}: expected HOST:PORT")
    if port == 0:
        raise ValueError(f"bad metrics address {target!r}: port must be 1-65535")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {sample name: value}; labelled samples of one name are summed.

    `*_created` timestamps are dropped: they are not numbers an operator watches.
    """
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                v = float(sample.value)
                if not math.isfinite(v) and sample.name not in METRICS_RANGES:
                    continue  # nobody reads it; a known one is kept, for check_scrape to name
                values[sample.name] = values.get(sample.name, 0.0) + v
    except Exception as e:  # the parser raises ValueError, IndexError, ... on garbage
        raise MetricsError("/metrics", f"not Prometheus text: {e}", NOT_A_RELAY) from e
    return values


def parse_stats(data: bytes | str) -> dict[str, Any]:
    """`/stats` JSON → dict; anything but a JSON object is an error, not a crash."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise MetricsError("/stats", f"not JSON: {e}", NOT_A_RELAY) from e
    except RecursionError:
        raise MetricsError("/stats", "not JSON: nested too deeply", NOT_A_RELAY) from None
    if not isinstance(obj, dict):
        raise MetricsError("/stats", f"expected a JSON object, got {type(obj).__name__}", NOT_A_RELAY)
    if _depth(obj) > MAX_STATS_DEPTH:
        raise MetricsError("/stats", f"nested deeper than {MAX_STATS_DEPTH} levels", "is that a blind relay?")
    return obj


MAX_STATS_DEPTH = 16
"""A relay's /stats is three levels deep; this bound keeps every later walk over it shallow."""


def _depth(obj: Any) -> int:
    deepest, todo = 0, [(obj, 1)]
    while todo:
        node, d = todo.pop()
        deepest = max(deepest, d)
        if d > MAX_STATS_DEPTH:
            break
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        todo.extend((c, d + 1) for c in children if isinstance(c, dict | list))
    return deepest


# -- remote numbers are untrusted ------------------------------------------------------------------
# Ranges are far beyond any real relay and far inside what float/int formatting, datetime and
# the plots survive: a value outside them is a broken or hostile endpoint, shown as "bad data".
MAX_COUNT = 1e18
"""counters and gauges (bytes relayed in a relay's life stay far below an exabyte)"""
MAX_SECONDS = 1e10
"""durations (uptime, CPU seconds): ~300 years"""
MAX_UNIX_TIME = 1e11
"""timestamps (start time, last announce)"""


def _finite(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (isinstance(v, float) and math.isfinite(v))  # ints never overflow here


def _number(lo: float, hi: float) -> Any:
    def check(v: Any) -> str | None:
        if not _finite(v):
            return "not a finite number" if isinstance(v, int | float) and not isinstance(v, bool) else "not a number"
        return None if lo <= v <= hi else "out of range"

    return check


def _optional(check: Any) -> Any:
    return lambda v: None if v is None else check(v)


def _is(*types: type) -> Any:
    names = " or ".join("text" if t is str else "true/false" if t is bool else t.__name__ for t in types)
    return lambda v: None if isinstance(v, types) else f"not {names}"


def _counts(v: Any) -> str | None:
    """`{cause: count}` (dropped, shed, limits.rejected)."""
    if not isinstance(v, dict):
        return "not an object"
    for cause, n in v.items():
        why = _COUNT(n)
        if why is not None:
            return f"{str(cause)[:40]!r} is {why}"
    return None


_COUNT = _number(0, MAX_COUNT)
_PORT = _number(0, 65535)

STATS_SCHEMA: dict[str, Any] = {
    "key": _is(str),
    "version": _is(str),
    "storage": _is(str),
    "host": _is(str),
    "port": _PORT,
    "pid": _number(0, 2**31),
    "uptime_seconds": _number(0, MAX_SECONDS),
    "cpu_seconds": _number(0, MAX_SECONDS),
    "memory": _is(dict),
    "memory.rss_bytes": _COUNT,
    "dht": _is(dict),
    "dht.bootstrapped": _optional(_is(bool)),
    "dht.firewalled": _optional(_is(bool)),
    "dht.public_host": _optional(_is(str)),
    "dht.public_port": _optional(_PORT),
    "dht.last_announce": _optional(_number(0, MAX_UNIX_TIME)),
    "dht.nodes": _optional(_COUNT),
    "sessions": _counts,
    "pairings": _counts,
    "streams": _counts,
    "traffic": _counts,
    "dropped": _counts,
    "shed": _counts,
    "udx": _is(dict),
    "udx.gso": _optional(_is(bool)),
    "udx.gro": _optional(_is(bool)),
    "udx.gso_fallbacks": _optional(_COUNT),
    "limits": _is(dict),
    "limits.rejected": _counts,
}
"""What the monitor and `relay status` read from `/stats`, and what each must be when present.
Keys not listed pass through untouched (and are only ever printed by `--json`, made strict)."""

METRICS_RANGES: dict[str, tuple[float, float]] = {
    **{name: (0, MAX_COUNT) for name in GAUGES},
    **{name: (0, MAX_COUNT) for name in RATE_SOURCES.values()},
    "process_cpu_seconds_total": (0, MAX_SECONDS),
    "process_resident_memory_bytes": (0, MAX_COUNT),
    "process_start_time_seconds": (0, MAX_UNIX_TIME),
    "blind_relay_limit_rejections_total": (0, MAX_COUNT),
    "blind_relay_uptime_seconds": (0, MAX_SECONDS),
}


def _lookup(stats: dict[str, Any], path: str) -> tuple[bool, Any]:
    node: Any = stats
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _shown(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        return f"{float(v):.3g}" if v.bit_length() < 1000 else f"a {int(v.bit_length() * 0.30103)}-digit number"
    try:
        text = json.dumps(v, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 40 else text[:39] + "…"


def check_scrape(values: dict[str, float], stats: dict[str, Any] | None) -> None:
    """Raise BadData naming the first field the monitor would show that is of the wrong type,
    not finite or out of range; a scrape that passes is safe to format, add up and plot."""
    for name, (lo, hi) in METRICS_RANGES.items():
        v = values.get(name)
        if v is not None and not (math.isfinite(v) and lo <= v <= hi):
            raise BadData("/metrics", name, f"{_shown(v)} is {'out of range' if math.isfinite(v) else 'not finite'}")
    if stats is None:
        return
    for path, check in STATS_SCHEMA.items():
        present, v = _lookup(stats, path)
        if not present:
            continue
        why = check(v)
        if why is not None:
            raise BadData("/stats", path, f"{_shown(v)} is {why}" if not why.startswith("'") else why)


def strict_json(obj: Any) -> Any:
    """A copy that `json.dumps(..., allow_nan=False)` accepts: non-finite floats become null,
    keys become strings; whatever a hostile endpoint sent, the output is JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): strict_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [strict_json(v) for v in obj]
    return obj


@dataclass(frozen=True)
class Scrape:
    """One reading of one relay: `/metrics` samples plus `/stats` (None if it has none)."""

    at: float
    """monotonic seconds, for rates"""
    wall: float
    """unix seconds, for the graphs' time axis"""
    values: dict[str, float]
    stats: dict[str, Any] | None = None

    def get(self, name: str, default: float | None = None) -> float | None:
        return self.values.get(name, default)

    def stat(self, *path: str) -> Any:
        node: Any = self.stats
        for p in path:
            if not isinstance(node, dict):
                return None
            node = node.get(p)
        return node

    @property
    def rss_bytes(self) -> float | None:
        v = self.values.get("process_resident_memory_bytes")
        if v is None:
            s = self.stat("memory", "rss_bytes")
            v = float(s) if isinstance(s, int | float) else None
        return v

    @property
    def identity(self) -> tuple[Any, ...]:
        """Changes when the relay behind the address is another process (restart)."""
        return (self.stat("pid"), self.values.get("process_start_time_seconds"))


MAX_METRICS_BYTES = 4 * 1024 * 1024
"""A relay's /metrics is a few KB; anything past this is not a relay, and is not read further."""
MAX_STATS_BYTES = 1024 * 1024
READ_CHUNK = 64 * 1024


class BadAddress(OSError):
    """The metrics address cannot be connected to at all (e.g. a non-numeric port)."""


class NotHTTP(OSError):
    """Something answered, but not with HTTP."""


class TooLarge(OSError):
    """The answer is larger than any relay's."""


class HTTPStatus(OSError):
    """The endpoint answered with a status other than 200."""

    def __init__(self, code: int) -> None:
        super().__init__(f"HTTP {code}")
        self.code = code


async def _get(url: str, max_bytes: int) -> bytes:
    """One GET on the event loop (h11 parses, asyncio does the I/O), so the caller's deadline can
    cancel it at any byte: no thread is left behind to hang a scrape or the process exit."""
    import ssl
    from urllib.parse import urlsplit

    import h11

    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as e:
        raise BadAddress(str(e)) from None
    if not host:
        raise BadAddress(f"no host in {url!r}")
    tls = parts.scheme == "https"
    port = port or (443 if tls else 80)
    ctx = ssl.create_default_context() if tls else None
    reader, writer = await _connect(host, port, ctx)
    try:
        conn = h11.Connection(h11.CLIENT)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = [("Host", parts.netloc), ("User-Agent", "cosmictui-monitor"), ("Connection", "close")]
        writer.write(conn.send(h11.Request(method="GET", target=target, headers=head)))
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()
        body = bytearray()
        status = 0
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as e:
                raise NotHTTP(str(e)) from None
            if event is h11.NEED_DATA:
                data = await reader.read(READ_CHUNK)
                try:
                    conn.receive_data(data)
                except h11.RemoteProtocolError as e:
                    raise NotHTTP(str(e)) from None
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > max_bytes:
                    raise TooLarge(f"more than {human_bytes(max_bytes)}")
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
        if status != 200:
            raise HTTPStatus(status)
        return bytes(body)
    finally:
        writer.transport.abort()  # never wait on a peer to close politely


async def _resolve(host: str, port: int) -> list[str]:
    """Addresses for `host`. A name is looked up in a daemon thread of its own: asyncio would use
    its default executor, whose threads are joined at exit, so a DNS lookup hanging on a dead
    network would hold up quitting the monitor; the caller's deadline cancels the wait."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    found: asyncio.Future[list[str]] = loop.create_future()

    def settle(addrs: list[str] | None, error: BaseException | None) -> None:
        if found.done():
            return  # the scrape gave up already
        if error is not None:
            found.set_exception(error)
        else:
            found.set_result(addrs or [])

    def lookup() -> None:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            result: tuple[list[str] | None, BaseException | None] = ([str(i[4][0]) for i in infos], None)
        except OSError as e:
            result = (None, e)
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting
            loop.call_soon_threadsafe(settle, *result)

    threading.Thread(target=lookup, name="cosmictui-resolve", daemon=True).start()
    return await found


async def _connect(host: str, port: int, ctx: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    error: OSError = socket.gaierror(socket.EAI_NONAME, f"no address for {host}")
    for addr in dict.fromkeys(await _resolve(host, port)):
        try:
            return await asyncio.open_connection(addr, port, ssl=ctx, server_hostname=host if ctx else None)
        except OSError as e:
            error = e
    raise error


def _hostport(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0]


def _failure(base: str, what: str, e: BaseException, timeout: float) -> MetricsError:
    """The error an operator reads: what happened, at which address, and what to try next."""
    at = _hostport(base)
    if isinstance(e, TimeoutError):
        return MetricsError(
            base,
            f"timed out after {timeout:g} s waiting for {at}{what}",
            "frozen, overloaded or firewalled? check its log and `cosmictui relay status`",
        )
    if isinstance(e, ConnectionRefusedError):
        return MetricsError(
            base,
            f"connection refused by {at}",
            "is the relay running? start it, or point --metrics at its metrics HOST:PORT",
        )
    if isinstance(e, BadAddress):
        return MetricsError(base, f"bad address {at} ({e})", "use HOST:PORT, e.g. 127.0.0.1:49738")
    if isinstance(e, NotHTTP):
        return MetricsError(
            base,
            f"{at} answered, but not with HTTP ({e})",
            "is that the relay's metrics port? (not its UDP port; see `cosmictui relay status`)",
        )
    if isinstance(e, TooLarge):
        return MetricsError(base, f"{at}{what} answered {e}: not a relay", "check the --metrics address")
    if isinstance(e, HTTPStatus):
        return MetricsError(base, f"{at}{what} answered HTTP {e.code}", NOT_A_RELAY)
    if isinstance(e, socket.gaierror):
        return MetricsError(base, f"cannot resolve {at} ({e.strerror or e})", "check the host name")
    reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return MetricsError(base, f"no answer from {at} ({reason})", "is the relay running and its metrics address right?")


async def scrape(base_url: str, timeout: float = 2.0) -> Scrape:
    """Read `/metrics` then `/stats` under ONE deadline for both: a relay that drips its answer
    byte by byte is DOWN after `timeout` seconds, never waited on forever."""
    try:
        base = normalize_url(base_url)
    except ValueError as e:
        raise MetricsError(base_url, f"bad address ({e})", "use HOST:PORT, e.g. 127.0.0.1:49738") from e
    what = "/metrics"
    stats_body: bytes | None = None
    try:
        async with asyncio.timeout(timeout):
            body = await _get(base + "/metrics", MAX_METRICS_BYTES)
            what = "/stats"
            try:
                stats_body = await _get(base + "/stats", MAX_STATS_BYTES)
            except HTTPStatus:
                stats_body = None  # a plain Prometheus exporter: the monitor still shows what /metrics has
    except (OSError, TimeoutError, UnicodeError, ValueError) as e:
        raise _failure(base, what, e, timeout) from e
    try:
        values = parse_metrics(body.decode("utf-8", errors="replace"))
        stats = parse_stats(stats_body) if stats_body is not None else None
        check_scrape(values, stats)
    except MetricsError as e:
        raise e.at(base) from e
    return Scrape(at=time.monotonic(), wall=time.time(), values=values, stats=stats)


async def read_stats(base_url: str, timeout: float = 3.0) -> dict[str, Any] | None:
    """`/stats` alone, as the checks read it: the one /stats fetcher (bounded, one deadline, parsed
    as `scrape` parses it). None when it cannot be read: a check says "not known yet" then."""
    try:
        base = normalize_url(base_url)
        async with asyncio.timeout(timeout):
            body = await _get(base + "/stats", MAX_STATS_BYTES)
        return parse_stats(body)
    except (MetricsError, OSError, TimeoutError, UnicodeError, ValueError):
        return None


def fetch(base_url: str, timeout: float = 2.0) -> Scrape:
    """Blocking `scrape` for scripts and the CLI (not for code already inside an event loop)."""
    return asyncio.run(scrape(base_url, timeout))


@dataclass(frozen=True)
class Rates:
    """Per-second rates between two scrapes of the same process."""

    seconds: float
    per_second: dict[str, float]

    def __getitem__(self, name: str) -> float:
        return self.per_second.get(name, 0.0)

    @property
    def cpu_percent(self) -> float:
        """Percent of one core."""
        return 100.0 * self["cpu_seconds"]


def rates_between(prev: Scrape, cur: Scrape) -> Rates | None:
    """Difference counters; None when no time passed or the relay restarted between the two."""
    dt = cur.at - prev.at
    if dt <= 0 or prev.identity != cur.identity:
        return None
    out: dict[str, float] = {}
    for name, sample in RATE_SOURCES.items():
        a, b = prev.values.get(sample), cur.values.get(sample)
        if a is None or b is None:
            continue
        if b < a:  # counter went backwards: a restart the identity did not catch
            return None
        out[name] = (b - a) / dt
    return Rates(seconds=dt, per_second=out)


class RelayState(Enum):
    CONNECTING = "connecting"
    UP = "up"
    DOWN = "down"
    NOT_RUNNING = "not running"
    METRICS_OFF = "running, metrics off"
    """the pid in the runtime file is alive, but the relay serves no /metrics to read"""
    BAD_DATA = "bad data"
    """it answers, but with numbers no relay can have (wrong type, NaN, ±1e300): not shown"""
    RELAYING = "relaying (probed)"
    """known by key only (no metrics): the latest probe's echo came back through it"""


# Words and symbols, so state never depends on colour alone.
STATE_BADGE = {
    RelayState.CONNECTING: "… connecting",
    RelayState.UP: "▲ UP",
    RelayState.DOWN: "✖ DOWN",
    RelayState.NOT_RUNNING: "■ NOT RUNNING",
    RelayState.METRICS_OFF: "▲ RUNNING",
    RelayState.BAD_DATA: "✖ BAD DATA",
    RelayState.RELAYING: "▲ RELAYING",
}

RUNNING = (RelayState.UP, RelayState.METRICS_OFF, RelayState.RELAYING)
"""States in which the relay process is alive."""

METRICS_OFF_NOTE = "metrics off — start the relay with --metrics HOST:PORT to see numbers"
KEY_ONLY_NOTE = "known by key only: no metrics, so the monitor probes it over the DHT"
PROBING_NOTE = "probing: looking the key up and connecting through the relay…"
PROBE_FIX = "is the relay running, announced on this DHT (--bootstrap), and reachable from here?"

SERIES = ("rss_mb", "cpu_percent", "in_bps", "out_bps", "relayed_bps", "in_pps", "out_pps")


@dataclass
class Target:
    """What to watch: a metrics URL, a storage directory whose runtime file names one, or only a
    relay key (e.g. npm blind-relay-service): then the monitor can only probe it."""

    metrics: str | None = None
    storage: Path | None = None
    relay_key: str | None = None
    prometheus: str | None = None
    """a relay target of this Prometheus server (its `job` and `instance`): read from there"""
    job: str | None = None
    instance: str | None = None

    @property
    def key_only(self) -> bool:
        return self.relay_key is not None and self.metrics is None and self.storage is None

    @property
    def label(self) -> str:
        if self.prometheus is not None:
            return f"{self.instance} ({self.job}, via Prometheus)"
        if self.key_only:
            assert self.relay_key is not None
            return f"key {self.relay_key[:8]}…" if len(self.relay_key) > 9 else f"key {self.relay_key}"
        return str(self.storage) if self.storage is not None else normalize_url(self.metrics or DEFAULT_METRICS)

    @property
    def short_label(self) -> str:
        """The label without `http://`, for narrow columns (the host:port is what tells relays apart)."""
        if self.prometheus is not None:
            return str(self.instance)
        label = self.label
        return label.split("://", 1)[1] if self.storage is None and "://" in label else label

    @property
    def identity(self) -> tuple[str, str]:
        """Two targets with the same identity are the same relay (`h:1` and `http://h:1/metrics`)."""
        if self.storage is not None:
            return ("storage", str(Path(self.storage).expanduser().absolute()))
        if self.prometheus is not None:
            return ("prometheus", f"{self.prometheus} {self.job} {self.instance}")
        if self.key_only:
            return ("key", str(self.relay_key))
        return ("metrics", normalize_url(self.metrics or DEFAULT_METRICS))

    def status(self) -> relayproc.RelayStatus | None:
        """The relay process of a storage target (runtime file + pid check), via ops.relayproc."""
        return relayproc.relay_status(str(self.storage)) if self.storage is not None else None

    def log_path(self, stats: dict[str, Any] | None = None) -> Path | None:
        if self.storage is not None:
            return self.storage / LOG_FILE
        storage = (stats or {}).get("storage")
        return Path(storage) / LOG_FILE if isinstance(storage, str) else None


def unique_targets(targets: Iterable[Target]) -> list[Target]:
    """Targets in the order given, each relay once however its address was spelled."""
    seen: set[tuple[str, str]] = set()
    out: list[Target] = []
    for t in targets:
        if t.identity not in seen:
            seen.add(t.identity)
            out.append(t)
    return out


@dataclass
class RelayWatch:
    """One relay followed over time: last scrape, rates, history, and whether it answers.

    One failed scrape marks it DOWN (so a dead relay shows within two refreshes whatever the
    phase), the next good one marks it UP again and starts fresh rates.
    """

    target: Target
    history_len: int = 3600
    state: RelayState = RelayState.CONNECTING
    error: str | None = None
    fix: str | None = None
    """the next step for the operator when it is not UP"""
    last: Scrape | None = None
    rates: Rates | None = None
    since: float = field(default_factory=time.time)
    """wall time of the last state change"""
    failures: int = 0
    restarts: int = 0
    url: str | None = None
    history: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)
    probe: ProbeWatch | None = None
    """round trips over time, when the monitor probes this relay (no metrics to read)"""
    start_fix: str | None = None
    """how to start a storage target's relay that is not running, when not `blind-relay --storage`
    (the wizard starts its own relay: its step 2's s)"""
    _runtime: relayproc.RelayRuntime | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.history = {name: deque(maxlen=self.history_len) for name in SERIES}
        if self.target.metrics is not None:
            self.url = normalize_url(self.target.metrics)

    # -- sans-IO core -------------------------------------------------------------------------
    def observe(self, scrape: Scrape, rates: Rates | None = None, *, rated: bool = False) -> bool:
        """Take a good scrape; True when something an operator would notice changed. `rated`: the
        rates come with the scrape (a Prometheus server's rate(); None while it has too few
        samples) instead of from differencing scrapes."""
        prev = self.last
        changed = self.state is not RelayState.UP
        if changed:
            self.since = scrape.wall
        if prev is not None and prev.identity != scrape.identity and self.state is RelayState.UP:
            self.restarts += 1
        self.state, self.error, self.fix, self.failures = RelayState.UP, None, None, 0
        if rated:
            self.rates = rates
        else:
            self.rates = rates_between(prev, scrape) if prev is not None else None
        if prev is not None and not changed:
            changed = any(prev.values.get(n) != scrape.values.get(n) for n in ACTIVITY)
        self.last = scrape
        self._record(scrape)
        return changed

    def observe_failure(
        self, reason: str, now: float, state: RelayState = RelayState.DOWN, fix: str | None = None
    ) -> bool:
        """Take a failed scrape; True when this is news (it just went down)."""
        changed = self.state is not state or self.error != reason
        if self.state is not state:
            self.since = now
        self.state, self.error, self.fix = state, reason, fix or None
        self.failures += 1
        self.rates = None
        return changed

    def _record(self, s: Scrape) -> None:
        h, t = self.history, s.wall
        rss = s.rss_bytes
        if rss is not None:
            h["rss_mb"].append((t, rss / 1e6))
        r = self.rates
        if r is None:
            return
        h["cpu_percent"].append((t, r.cpu_percent))
        h["in_bps"].append((t, r["received_bytes"]))
        h["out_bps"].append((t, r["sent_bytes"]))
        h["relayed_bps"].append((t, r["relayed_bytes"]))
        h["in_pps"].append((t, r["received_packets"]))
        h["out_pps"].append((t, r["sent_packets"]))

    # -- I/O ----------------------------------------------------------------------------------
    def resolve(self) -> tuple[str | None, str]:
        """(metrics URL to scrape now, why not). Storage targets re-read the runtime file each
        time, so a relay restarted on another metrics port is found again."""
        st = self.target.status()
        if st is None:
            return self.url, "no metrics address"
        self._runtime = st.runtime
        if st.runtime is None:
            return None, f"no {RUNTIME_FILE} in {st.storage} (start the relay)"
        if not st.running:
            return None, f"pid {st.runtime.pid} is gone (stale {RUNTIME_FILE})"
        if not st.runtime.metrics:
            return None, METRICS_OFF_NOTE
        try:
            self.url = normalize_url(st.runtime.metrics)
        except ValueError as e:
            return None, f"bad address in {RUNTIME_FILE}: {e}"
        return self.url, ""

    def observe_probe(self, now: float) -> bool:
        """A key-only relay's state is its probe's: RELAYING while echoes come back through it,
        DOWN (with the failed stage and why) when the latest one failed."""
        p = self.probe
        if p is None or p.last is None:
            why = p.stopped if p is not None and p.stopped else PROBING_NOTE
            return self.observe_failure(why, now, RelayState.CONNECTING, KEY_ONLY_NOTE)
        if p.last.ok:
            changed = self.state is not RelayState.RELAYING
            if changed:
                self.since = now
            self.state, self.error, self.fix, self.failures = RelayState.RELAYING, None, None, 0
            return changed
        assert p.last_failure is not None
        return self.observe_failure(f"probe failed at {p.last_failure.text}", now, RelayState.DOWN, PROBE_FIX)

    async def poll(self, timeout: float = 2.0) -> bool:
        """Scrape once; True when the screen has news."""
        if self.target.prometheus is not None:
            return False  # read with every relay of its server: PrometheusWatch.poll
        if self.target.key_only:
            return self.observe_probe(time.time())
        url, why = self.resolve()
        if url is None:
            state = RelayState.NOT_RUNNING if self.target.storage is not None else RelayState.DOWN
            fix = (
                (self.start_fix or f"start it: blind-relay --storage {self.target.storage}")
                if self.target.storage is not None
                else None
            )
            if why == METRICS_OFF_NOTE:
                state, fix = RelayState.METRICS_OFF, None
            elif why.startswith("bad address"):
                fix = f"fix the metrics address in {RUNTIME_FILE} (restart the relay with --metrics HOST:PORT)"
            return self.observe_failure(why, time.time(), state, fix)
        try:
            s = await scrape(url, timeout)
        except BadData as e:
            return self.observe_failure(e.reason, time.time(), RelayState.BAD_DATA, e.fix)
        except MetricsError as e:
            return self.observe_failure(e.reason, time.time(), fix=e.fix)
        return self.observe(s)

    # -- what the screen shows -----------------------------------------------------------------
    @property
    def runtime(self) -> relayproc.RelayRuntime | None:
        """The runtime file as last read (storage targets only)."""
        return self._runtime

    @property
    def key(self) -> str | None:
        k = self.last.stat("key") if self.last else None
        if k is None and self._runtime is not None:
            k = self._runtime.key
        if k is None:
            k = self.target.relay_key
        return k if isinstance(k, str) else None

    def started_at(self) -> float | None:
        """Wall time the relay process started: /stats uptime, else the process start time, else
        the runtime file's started_at. Not when this monitor first saw it."""
        if self.state is RelayState.UP and self.last is not None:
            up = self.last.stat("uptime_seconds")
            if isinstance(up, int | float):
                return self.last.wall - float(up)
            start = self.last.get("process_start_time_seconds")
            if start:
                return start
        if self.state in RUNNING and self._runtime is not None and self._runtime.started_at:
            return float(self._runtime.started_at)
        return None

    def uptime(self, now: float | None = None) -> float | None:
        """Seconds the relay process has run (see `started_at`)."""
        start = self.started_at()
        return None if start is None else max(0.0, (now or time.time()) - start)


def summarize(watches: Iterable[RelayWatch]) -> dict[str, float]:
    """Totals across relays for the summary row: how many up, memory, traffic, pairs."""
    out = {"relays": 0.0, "up": 0.0, "rss_bytes": 0.0, "in_bps": 0.0, "out_bps": 0.0, "relayed_bps": 0.0}
    out |= {"pairings_active": 0.0, "pairings_pending": 0.0, "streams_errors": 0.0}
    for w in watches:
        out["relays"] += 1
        if w.state in (RelayState.METRICS_OFF, RelayState.RELAYING):
            out["up"] += 1  # running (or its probe came back); it just has no numbers to add
            continue
        if w.state is not RelayState.UP or w.last is None:
            continue
        out["up"] += 1
        out["rss_bytes"] += w.last.rss_bytes or 0.0
        if w.rates is not None:
            out["in_bps"] += w.rates["received_bytes"]
            out["out_bps"] += w.rates["sent_bytes"]
            out["relayed_bps"] += w.rates["relayed_bytes"]
        out["pairings_active"] += w.last.get("blind_relay_pairings_active", 0.0) or 0.0
        out["pairings_pending"] += w.last.get("blind_relay_pairings_pending", 0.0) or 0.0
        out["streams_errors"] += w.last.get("blind_relay_streams_errors", 0.0) or 0.0
    return out


class LogTail:
    """The last lines of the relay's log, re-read only when the file changed."""

    def __init__(self, path: Path | None, lines: int = 200, max_bytes: int = 64 * 1024) -> None:
        self.path = path
        self.lines = lines
        self.max_bytes = max_bytes
        self._sig: tuple[int, int, int] | None = None
        self._tail: list[str] = []

    def read(self) -> tuple[list[str], bool]:
        """(lines, changed)."""
        if self.path is None:
            return [], False
        try:
            st = self.path.stat()
        except OSError:
            changed = self._sig is not None
            self._sig, self._tail = None, []
            return [], changed
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        if sig == self._sig:
            return self._tail, False
        try:
            with self.path.open("rb") as f:
                start = max(0, st.st_size - self.max_bytes)
                f.seek(start)
                data = f.read(self.max_bytes)
        except OSError:
            return self._tail, False
        text = data.decode("utf-8", errors="replace")
        lines = text.splitlines()
        if start > 0 and lines:
            lines = lines[1:]  # first line is cut
        self._sig, self._tail = sig, lines[-self.lines :]
        return self._tail, True


def by_cause(counts: Any, top: int = 3) -> str:
    """`{"garbage": 12, "unknown_stream": 3}` → "garbage 12 · unknown_stream 3", biggest first
    (the /stats `dropped` and `shed` blocks; validated as counts before they get here)."""
    if not isinstance(counts, dict):
        return "–"
    items = sorted(((str(k), int(v)) for k, v in counts.items() if v), key=lambda kv: (-kv[1], kv[0]))
    if not items:
        return "none"
    shown = " · ".join(f"{k} {v}" for k, v in items[:top])
    return shown + (f" · +{len(items) - top} more" if len(items) > top else "")


def human_bytes(n: float | None, per_second: bool = False) -> str:
    """1536 → '1.5 KB'; decimal units like the MB in the seed page's budget."""
    if n is None:
        return "–"
    suffix = "/s" if per_second else ""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}{suffix}" if unit == "B" else f"{n:.1f} {unit}{suffix}"
        n /= 1000
    raise AssertionError("unreachable")


def human_duration(s: float | None) -> str:
    if s is None:
        return "–"
    s = max(0, int(s))
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    if d:
        return f"{d}d {h:02d}h{m:02d}m"
    if h:
        return f"{h}h{m:02d}m{sec:02d}s"
    if m:
        return f"{m}m{sec:02d}s"
    return f"{sec}s"
