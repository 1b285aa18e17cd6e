"""Every relay a Prometheus server scrapes, from its HTTP API: the many-relays view past one host.

`relays_from_prometheus(url)` asks a handful of instant queries (`/api/v1/query`) and joins them
by `(job, instance)` into one `PromRelay` per relay target. It reads the raw metric names (the
relay's own and blind-relay-service's), so it works whether or not the pack's recording rules
are loaded. A server that is down, slow, answers something that is not the Prometheus API, or
answers too much becomes one `PrometheusError` naming the fix; it never hangs the caller
(`timeout` per request, at most `MAX_BODY` bytes read).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from cosmictui.ops.metrics.client import MEMORY_BUDGET_BYTES

JOBS = "blind-relay|blind-relay-dht"
MAX_BODY = 8 << 20
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


def _get(base: str, path: str, params: dict[str, str], timeout: float) -> Any:
    url = base.rstrip("/") + path + "?" + urllib.parse.urlencode(params)
    fix = f"check that Prometheus answers at {base} (curl {base.rstrip('/')}/-/ready), or pass another --prometheus URL"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = r.read(MAX_BODY + 1)
    except urllib.error.HTTPError as e:
        raise PrometheusError(f"{base} answered HTTP {e.code} to {path}", fix) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise PrometheusError(f"cannot read {base}: {reason}", fix) from None
    if len(body) > MAX_BODY:
        raise PrometheusError(f"{base} answered more than {MAX_BODY >> 20} MiB to {path}", fix)
    try:
        doc = json.loads(body)
    except ValueError:
        raise PrometheusError(f"{base} did not answer with the Prometheus API's JSON", fix) from None
    if not isinstance(doc, dict) or doc.get("status") != "success" or not isinstance(doc.get("data"), dict):
        error = doc.get("error") if isinstance(doc, dict) else None
        raise PrometheusError(f"{base} refused the query: {error or 'not a Prometheus API answer'}", fix)
    return doc["data"]


def query(base: str, expr: str, timeout: float = 5.0) -> list[tuple[dict[str, str], float]]:
    """An instant query: (labels, value) per series; samples that are not finite numbers are dropped."""
    data = _get(base, "/api/v1/query", {"query": expr}, timeout)
    out: list[tuple[dict[str, str], float]] = []
    result = data.get("result")
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


def relays_from_prometheus(base: str, timeout: float = 5.0, jobs: str = JOBS) -> list[PromRelay]:
    """Every relay target of `jobs` Prometheus knows, sorted by job then instance."""
    if not base.startswith(("http://", "https://")):
        base = "http://" + base
    rows: dict[tuple[str, str], PromRelay] = {}
    for labels, value in query(base, QUERIES["up"].format(jobs=jobs), timeout):
        k = (labels.get("job", ""), labels.get("instance", ""))
        rows[k] = PromRelay(job=k[0], instance=k[1], up=value == 1)
    for labels, _ in query(base, f'blind_relay_info{{job=~"{jobs}"}}', timeout):
        row = rows.get((labels.get("job", ""), labels.get("instance", "")))
        if row is not None:
            row.key, row.version = labels.get("key"), labels.get("version")
    for field, expr in QUERIES.items():
        if field == "up":
            continue
        for labels, value in query(base, expr.format(jobs=jobs), timeout):
            row = rows.get((labels.get("job", ""), labels.get("instance", "")))
            if row is None:
                continue
            setattr(row, field, bool(value) if field in ("bootstrapped", "scraper_registered") else value)
    return [rows[k] for k in sorted(rows)]
