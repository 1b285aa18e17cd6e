"""Read a relay's `/metrics` and `/stats`, turn its counters into rates, notice when it goes away.

UI-free on purpose: the monitor screen, `cosmictui relay status` and the wizard's checks all
use it, and it is tested without Textual. The core (`RelayWatch.observe`/`observe_failure`) takes
scrapes and times in and never touches the network; `RelayWatch.poll` is the I/O around it.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from cosmictui.ops import relayproc

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


class MetricsError(Exception):
    """A relay's metrics could not be read: says which URL and why, in words for an operator."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason


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
    except ValueError:
        raise ValueError(f"bad metrics address {target!r}: expected HOST:PORT") from None
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
                if math.isnan(v):
                    continue
                values[sample.name] = values.get(sample.name, 0.0) + v
    except Exception as e:  # the parser raises ValueError, IndexError, ... on garbage
        raise MetricsError("/metrics", f"not Prometheus text: {e}") from e
    return values


def parse_stats(data: bytes | str) -> dict[str, Any]:
    """`/stats` JSON → dict; anything but a JSON object is an error, not a crash."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise MetricsError("/stats", f"not JSON: {e}") from e
    if not isinstance(obj, dict):
        raise MetricsError("/stats", f"expected a JSON object, got {type(obj).__name__}")
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


_OPENER: Any = None


def _get(url: str, timeout: float) -> bytes:
    # urllib is imported here, in the poll worker, so it does not delay the monitor's first frame
    import urllib.request

    global _OPENER
    if _OPENER is None:
        # No proxies: metrics live on loopback or the relay host, and an http_proxy set for the
        # operator's browsing must not swallow them.
        _OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, headers={"User-Agent": "cosmictui-monitor"})
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return resp.read(8 * 1024 * 1024)
    except (ValueError, http.client.InvalidURL) as e:
        # urllib/http.client refuse an address they cannot even connect to (InvalidURL is not a
        # ValueError): to the operator that relay is down with a bad address, not a crash.
        raise BadAddress(str(e)) from e
    except http.client.HTTPException as e:  # e.g. a status line that is not HTTP: not our relay
        raise ConnectionError(f"not an HTTP answer: {e!r}") from e


class BadAddress(OSError):
    """The metrics address cannot be connected to at all (e.g. a non-numeric port)."""


def fetch(base_url: str, timeout: float = 2.0) -> Scrape:
    """Blocking scrape of `/metrics` and `/stats`; MetricsError says what went wrong."""
    import urllib.error

    try:
        base = normalize_url(base_url)
    except ValueError as e:
        raise MetricsError(base_url, f"bad address ({e})") from e
    try:
        body = _get(base + "/metrics", timeout)
    except BadAddress as e:
        raise MetricsError(base, f"bad address ({e})") from e
    except urllib.error.HTTPError as e:
        raise MetricsError(base, f"/metrics answered HTTP {e.code}") from e
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        reason = getattr(e, "reason", e)
        raise MetricsError(base, f"no answer ({reason})") from e
    try:
        values = parse_metrics(body.decode("utf-8", errors="replace"))
    except MetricsError as e:
        raise MetricsError(base, e.reason) from e
    stats: dict[str, Any] | None = None
    try:
        stats = parse_stats(_get(base + "/stats", timeout))
    except urllib.error.HTTPError:
        stats = None  # a plain Prometheus exporter: the monitor still shows what /metrics has
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise MetricsError(base, f"/stats: no answer ({getattr(e, 'reason', e)})") from e
    except MetricsError as e:
        raise MetricsError(base, e.reason) from e
    return Scrape(at=time.monotonic(), wall=time.time(), values=values, stats=stats)


async def scrape(base_url: str, timeout: float = 2.0) -> Scrape:
    """`fetch` off the event loop, so a hung relay never freezes the UI."""
    return await asyncio.to_thread(fetch, base_url, timeout)


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


# Words and symbols, so state never depends on colour alone.
STATE_BADGE = {
    RelayState.CONNECTING: "… connecting",
    RelayState.UP: "▲ UP",
    RelayState.DOWN: "✖ DOWN",
    RelayState.NOT_RUNNING: "■ NOT RUNNING",
    RelayState.METRICS_OFF: "▲ RUNNING",
}

RUNNING = (RelayState.UP, RelayState.METRICS_OFF)
"""States in which the relay process is alive."""

METRICS_OFF_NOTE = "metrics off — start the relay with --metrics HOST:PORT to see numbers"

SERIES = ("rss_mb", "cpu_percent", "in_bps", "out_bps", "relayed_bps", "in_pps", "out_pps")


@dataclass
class Target:
    """What to watch: a metrics URL, or a storage directory whose runtime file names one."""

    metrics: str | None = None
    storage: Path | None = None

    @property
    def label(self) -> str:
        return str(self.storage) if self.storage is not None else normalize_url(self.metrics or DEFAULT_METRICS)

    @property
    def short_label(self) -> str:
        """The label without `http://`, for narrow columns (the host:port is what tells relays apart)."""
        label = self.label
        return label.split("://", 1)[1] if self.storage is None and "://" in label else label

    @property
    def identity(self) -> tuple[str, str]:
        """Two targets with the same identity are the same relay (`h:1` and `http://h:1/metrics`)."""
        if self.storage is not None:
            return ("storage", str(Path(self.storage).expanduser().absolute()))
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
    last: Scrape | None = None
    rates: Rates | None = None
    since: float = field(default_factory=time.time)
    """wall time of the last state change"""
    failures: int = 0
    restarts: int = 0
    url: str | None = None
    history: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)
    _runtime: relayproc.RelayRuntime | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.history = {name: deque(maxlen=self.history_len) for name in SERIES}
        if self.target.metrics is not None:
            self.url = normalize_url(self.target.metrics)

    # -- sans-IO core -------------------------------------------------------------------------
    def observe(self, scrape: Scrape) -> bool:
        """Take a good scrape; True when something an operator would notice changed."""
        prev = self.last
        changed = self.state is not RelayState.UP
        if changed:
            self.since = scrape.wall
        if prev is not None and prev.identity != scrape.identity and self.state is RelayState.UP:
            self.restarts += 1
        self.state, self.error, self.failures = RelayState.UP, None, 0
        self.rates = rates_between(prev, scrape) if prev is not None else None
        if prev is not None and not changed:
            changed = any(prev.values.get(n) != scrape.values.get(n) for n in ACTIVITY)
        self.last = scrape
        self._record(scrape)
        return changed

    def observe_failure(self, reason: str, now: float, state: RelayState = RelayState.DOWN) -> bool:
        """Take a failed scrape; True when this is news (it just went down)."""
        changed = self.state is not state or self.error != reason
        if self.state is not state:
            self.since = now
        self.state, self.error = state, reason
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

    async def poll(self, timeout: float = 2.0) -> bool:
        """Scrape once; True when the screen has news."""
        url, why = self.resolve()
        if url is None:
            state = RelayState.NOT_RUNNING if self.target.storage is not None else RelayState.DOWN
            if why == METRICS_OFF_NOTE:
                state = RelayState.METRICS_OFF
            return self.observe_failure(why, time.time(), state)
        try:
            s = await scrape(url, timeout)
        except MetricsError as e:
            return self.observe_failure(e.reason, time.time())
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
        if w.state is RelayState.METRICS_OFF:
            out["up"] += 1  # running; it just has no numbers to add
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
