"""Every relay a Prometheus server scrapes, from its HTTP API: the many-relays view past one host.

`read_relays(url)` asks a handful of instant queries (`/api/v1/query`) and joins them by
`(job, instance)` into one `PromRelay` per relay target. It reads the raw metric names (the
relay's own and blind-relay-service's), so it works whether or not the pack's recording rules
are loaded. A server that is down, slow, answers something that is not the Prometheus API, or
answers too much becomes one `PrometheusError` naming the fix; it never hangs the caller: the
requests run on the event loop (client.py's h11 GET) under ONE deadline for all of them, at most
`MAX_BODY` bytes each, a few at a time. `relays_from_prometheus` is the same for blocking callers
(`relay status`); `PrometheusWatch` turns the rows into the monitor's `RelayWatch`es.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from cosmictui.ops.metrics.client import (
    MAX_COUNT,
    MEMORY_BUDGET_BYTES,
    RATE_SOURCES,
    BadData,
    HTTPStatus,
    Rates,
    RelayState,
    RelayWatch,
    Scrape,
    Target,
    TooLarge,
    check_scrape,
)
from cosmictui.ops.metrics.client import (
    _get as http_get,
)

JOBS = "blind-relay|blind-relay-dht"
MAX_BODY = 8 << 20
AT_ONCE = 3
"""queries in flight at once: a server answering MAX_BODY to each costs at most this many bodies"""
RATE_WINDOW = "1m"
"""the rate() window: four samples at Prometheus's default 15 s scrape interval"""
#: field -> PromQL (label selector filled with the jobs); each answers one number per (job, instance)
QUERIES: dict[str, str] = {
    "up": 'up{{job=~"{jobs}"}}',
    "bootstrapped": 'blind_relay_dht_bootstrapped{{job=~"{jobs}"}}',
    "sessions_open": 'blind_relay_sessions_opened{{job=~"{jobs}"}} - blind_relay_sessions_closed{{job=~"{jobs}"}}',
    "pairs_active": 'blind_relay_pairings_active{{job=~"{jobs}"}}',
    "pairings_pending": 'blind_relay_pairings_pending{{job=~"{jobs}"}}',
    "rss_bytes": 'process_resident_memory_bytes{{job=~"{jobs}"}} and on (job, instance) blind_relay_info',
    "relayed_bytes_per_second": 'sum by (job, instance) (rate(blind_relay_relayed_bytes_total{{job=~"{jobs}"}}[1m]))',
    "refused_per_second": 'sum by (job, instance) (rate(blind_relay_refused_total{{job=~"{jobs}"}}[5m]))',
    "uptime_seconds": 'blind_relay_uptime_seconds{{job=~"{jobs}"}}',
    "scraper_registered": 'blind_relay_scraper_registered{{job=~"{jobs}"}}',
}
#: the raw samples the monitor's panel reads, as a relay's own /metrics has them (labelled ones summed)
SAMPLES = (
    '{{__name__=~"blind_relay_(sessions|pairings|streams)_[a-z]+|blind_relay_.+_total|blind_relay_dht_nodes'
    '|process_resident_memory_bytes|process_start_time_seconds|process_cpu_seconds_total", job=~"{jobs}"}}'
)
#: every rate the monitor plots (client.RATE_SOURCES), in one query: each term labelled rate="<name>"
RATES = " or ".join(
    f'label_replace(sum by (job, instance) (rate({metric}{{{{job=~"{{jobs}}"}}}}[{RATE_WINDOW}])), '
    f'"rate", "{name}", "", "")'
    for name, metric in RATE_SOURCES.items()
)


class PrometheusError(Exception):
    """The Prometheus server could not be read; `fix` says what to check."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


@dataclass
class PromRelay:
    """One relay target as Prometheus sees it (None: no sample for that field)."""

    job: str
    instance: str
    up: bool
    key: str | None = None
    version: str | None = None
    bootstrapped: bool | None = None
    sessions_open: float | None = None
    pairs_active: float | None = None
    pairings_pending: float | None = None
    rss_bytes: float | None = None
    relayed_bytes_per_second: float | None = None
    refused_per_second: float | None = None
    uptime_seconds: float | None = None
    scraper_registered: bool | None = None
    samples: dict[str, float] = field(default_factory=dict)
    """raw sample name -> value (labelled series summed), as in the relay's own /metrics"""
    rates: dict[str, float] = field(default_factory=dict)
    """client.RATE_SOURCES name -> per second over the last minute, from Prometheus's rate()"""

    @property
    def state(self) -> str:
        """One word for the row: down, not joined, full, over budget, or up."""
        if not self.up:
            return "down"
        if self.bootstrapped is False:
            return "not joined"
        if self.refused_per_second:
            return "full"
        if self.rss_bytes is not None and self.rss_bytes > MEMORY_BUDGET_BYTES:
            return "over budget"
        return "up"


def base_url(url: str) -> str:
    """`h:9090`, `http://h:9090/` and `http://h:9090/prom` name a server (and its path prefix);
    ValueError for what no HTTP client can connect to."""
    u = url.strip()
    if not u:
        raise ValueError("empty Prometheus address")
    if "://" not in u:
        u = "http://" + u
    try:
        parts = urllib.parse.urlsplit(u)
        parts.port  # noqa: B018 (raises on a port out of range or not a number)
    except ValueError as e:
        raise ValueError(f"bad Prometheus address {url!r}: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"bad Prometheus address {url!r}: expected http://HOST:PORT[/PATH]")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def _fix(base: str) -> str:
    return f"check that Prometheus answers: curl {base}/-/ready, or pass another --prometheus URL"


def api_data(base: str, path: str, body: bytes) -> Any:
    """The `data` of a Prometheus API answer, or the PrometheusError that says why it is none."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise PrometheusError(f"{base} did not answer with the Prometheus API's JSON", _fix(base)) from None
    if not isinstance(doc, dict) or doc.get("status") != "success" or not isinstance(doc.get("data"), dict):
        error = doc.get("error") if isinstance(doc, dict) else None
        why = str(error or "not a Prometheus API answer")[:200]
        raise PrometheusError(f"{base} refused the query: {why}", _fix(base))
    return doc["data"]


def vector(data: Any) -> list[tuple[dict[str, str], float]]:
    """(labels, value) per series of an instant query's data; samples that are not finite numbers
    are dropped."""
    out: list[tuple[dict[str, str], float]] = []
    result = data.get("result") if isinstance(data, dict) else None
    if data.get("resultType") != "vector" or not isinstance(result, list):
        return out
    for item in result:
        try:
            labels = {str(k): str(v) for k, v in item["metric"].items()}
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            continue
        if math.isfinite(value):
            out.append((labels, value))
    return out


def _unreadable(base: str, e: BaseException, timeout: float) -> PrometheusError:
    if isinstance(e, TimeoutError):
        fix = f"check that Prometheus answers: curl {base}/-/ready, or give it longer: --timeout S"
        return PrometheusError(f"cannot read {base}: no answer within {timeout:g} s", fix)
    if isinstance(e, ConnectionRefusedError):
        return PrometheusError(f"cannot read {base}: connection refused", _fix(base))
    if isinstance(e, socket.gaierror):
        return PrometheusError(f"cannot read {base}: cannot resolve its host ({e.strerror or e})", _fix(base))
    reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return PrometheusError(f"cannot read {base}: {reason}", _fix(base))


async def query_async(base: str, expr: str) -> list[tuple[dict[str, str], float]]:
    """One instant query; the caller's deadline bounds it (it is cancellable at any byte)."""
    path = "/api/v1/query"
    url = base + path + "?" + urllib.parse.urlencode({"query": expr})
    try:
        body = await http_get(url, MAX_BODY)
    except HTTPStatus as e:
        raise PrometheusError(f"{base} answered HTTP {e.code} to {path}", _fix(base)) from None
    except TooLarge:
        raise PrometheusError(f"{base} answered more than {MAX_BODY >> 20} MiB to {path}", _fix(base)) from None
    return vector(api_data(base, path, body))


async def read_relays(base: str, timeout: float = 5.0, jobs: str = JOBS) -> list[PromRelay]:
    """Every relay target of `jobs` Prometheus knows, sorted by job then instance; all of its
    queries under one `timeout`."""
    try:
        base = base_url(base)
    except ValueError as e:
        raise PrometheusError(str(e), "--prometheus http://HOST:PORT (e.g. http://127.0.0.1:9090)") from None
    gate = asyncio.Semaphore(AT_ONCE)

    async def ask(expr: str) -> list[tuple[dict[str, str], float]]:
        async with gate:
            return await query_async(base, expr.format(jobs=jobs))

    exprs = {"info": 'blind_relay_info{{job=~"{jobs}"}}', **QUERIES, "samples": SAMPLES, "rates": RATES}
    try:
        async with asyncio.timeout(timeout):
            answers = dict(zip(exprs, await _all(ask(e) for e in exprs.values()), strict=True))
    except PrometheusError:
        raise
    except (OSError, TimeoutError, UnicodeError, ValueError) as e:
        raise _unreadable(base, e, timeout) from None
    return join(answers)


async def _all(aws: Any) -> list[Any]:
    """gather, but the first failure (or the deadline) cancels the rest: no request is left
    running, and the error raised is the first one itself, not a group."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def join(answers: dict[str, list[tuple[dict[str, str], float]]]) -> list[PromRelay]:
    """The queries' answers joined into one row per (job, instance) that `up` names."""
    rows: dict[tuple[str, str], PromRelay] = {}

    def row_of(labels: dict[str, str]) -> PromRelay | None:
        return rows.get((labels.get("job", ""), labels.get("instance", "")))

    for labels, value in answers["up"]:
        k = (labels.get("job", ""), labels.get("instance", ""))
        rows[k] = PromRelay(job=k[0], instance=k[1], up=value == 1)
    for labels, _ in answers["info"]:
        if (row := row_of(labels)) is not None:
            row.key, row.version = labels.get("key"), labels.get("version")
    for name in QUERIES:
        if name == "up":
            continue
        for labels, value in answers[name]:
            if (row := row_of(labels)) is not None:
                setattr(row, name, bool(value) if name in ("bootstrapped", "scraper_registered") else value)
    for labels, value in answers.get("samples", ()):
        if (row := row_of(labels)) is not None and "__name__" in labels:
            metric = labels["__name__"]
            row.samples[metric] = row.samples.get(metric, 0.0) + value
    for labels, value in answers.get("rates", ()):
        if (row := row_of(labels)) is not None and labels.get("rate") in RATE_SOURCES:
            row.rates[labels["rate"]] = value
    return [rows[k] for k in sorted(rows)]


def relays_from_prometheus(base: str, timeout: float = 5.0, jobs: str = JOBS) -> list[PromRelay]:
    """`read_relays` for blocking callers (not from inside an event loop)."""
    return asyncio.run(read_relays(base, timeout, jobs))


# -- the monitor's view --------------------------------------------------------------------------
GONE = "no longer among Prometheus's targets"
GONE_FIX = "check Prometheus's scrape config (jobs blind-relay, blind-relay-dht) and its Targets page"
NO_RELAYS_FIX = "scrape your relays with those job names: cosmictui export prometheus --file prometheus.yml"


class PrometheusWatch:
    """Every relay one Prometheus server scrapes, each as a `RelayWatch` the monitor shows like a
    relay it scrapes itself: memory and counters from the samples Prometheus holds, traffic and
    CPU from its rate() over the last minute (its scrapes are seconds apart, so differencing them
    here would show steps). Relays are only ever added, in the order Prometheus first named them,
    so the monitor's rows keep their places. Sans-IO core (`observe`, `observe_failure`) plus
    `poll`, which reads the server."""

    def __init__(self, url: str, jobs: str = JOBS) -> None:
        self.url = base_url(url)
        self.jobs = jobs
        self.relays: dict[tuple[str, str], RelayWatch] = {}
        self.error: PrometheusError | None = None
        self.read_at: float | None = None
        """wall time of the last good answer"""
        self.polls = 0

    @property
    def watches(self) -> list[RelayWatch]:
        return list(self.relays.values())

    def observe(self, rows: list[PromRelay], now: float) -> bool:
        """Take a good answer; True when something an operator would notice changed."""
        changed = self.error is not None or self.read_at is None
        self.error, self.read_at = None, now
        seen = set()
        for row in rows:
            k = (row.job, row.instance)
            seen.add(k)
            w = self.relays.get(k)
            if w is None:
                target = Target(prometheus=self.url, job=row.job, instance=row.instance)
                w = self.relays[k] = RelayWatch(target)
                changed = True
            changed = _observe_row(w, row, self.url, now) or changed
        for k, w in self.relays.items():
            if k not in seen:
                changed = w.observe_failure(GONE, now, RelayState.DOWN, GONE_FIX) or changed
        return changed

    def observe_failure(self, error: PrometheusError, now: float) -> bool:
        """The server could not be read: the relays' last numbers stay (their state is unknown,
        not down); the monitor's Prometheus line says why and since when."""
        changed = self.error is None or str(self.error) != str(error)
        self.error = error
        return changed

    async def poll(self, timeout: float) -> bool:
        self.polls += 1
        try:
            rows = await read_relays(self.url, timeout, self.jobs)
        except PrometheusError as e:
            return self.observe_failure(e, time.time())
        return self.observe(rows, time.time())

    def line(self) -> str:
        """The monitor's one line about the server: what it knows, or why it cannot be read and
        the fix."""
        where = self.url.split("://", 1)[-1]
        if self.error is not None:
            since = f" (numbers from {time.strftime('%H:%M:%S', time.localtime(self.read_at))})" if self.read_at else ""
            return f"✖ Prometheus {self.error}{since} — next: {self.error.fix}"
        if self.read_at is None:
            return f"… Prometheus {where}: asking"
        if not self.relays:
            return f"Prometheus {where} knows no relay (jobs blind-relay, blind-relay-dht) — next: {NO_RELAYS_FIX}"
        down = sum(w.state is not RelayState.UP for w in self.relays.values())
        return f"Prometheus {where} · {len(self.relays)} relay targets, {down} not up"  # read when the status says


def _observe_row(w: RelayWatch, row: PromRelay, url: str, now: float) -> bool:
    """One row into its watch: what Prometheus holds is as untrusted as a relay's own /metrics."""
    if not row.up:
        return w.observe_failure(
            f"Prometheus cannot scrape {row.instance} (up == 0 in job {row.job})",
            now,
            RelayState.DOWN,
            f"is the relay at {row.instance} running? {url}/targets says why",
        )
    values = dict(row.samples)
    if row.rss_bytes is not None:
        values.setdefault("process_resident_memory_bytes", row.rss_bytes)
    stats: dict[str, Any] = {"key": row.key, "version": row.version, "uptime_seconds": row.uptime_seconds}
    stats = {k: v for k, v in stats.items() if v is not None}
    if row.bootstrapped is not None:
        stats["dht"] = {"bootstrapped": row.bootstrapped, "nodes": row.samples.get("blind_relay_dht_nodes")}
    try:
        check_scrape(values, stats)
        for name, v in row.rates.items():
            if not 0 <= v <= MAX_COUNT:
                raise BadData("rate()", name, f"{v:.3g} per second is out of range")
    except BadData as e:
        return w.observe_failure(f"{e.reason} from Prometheus", now, RelayState.BAD_DATA, e.fix)
    scrape = Scrape(at=time.monotonic(), wall=now, values=values, stats=stats)
    rates = Rates(seconds=60.0, per_second=dict(row.rates)) if row.rates else None
    return w.observe(scrape, rates, rated=True)
