"""`cosmictui relay status --prometheus URL`: every relay a Prometheus server scrapes, one line each."""

from __future__ import annotations

import argparse
from typing import TextIO

from cosmictui.cli.output import FAILED, OK, dump, fail

BADGE = {"up": "▲ UP", "down": "✖ DOWN", "not joined": "✖ NOT JOINED", "full": "✖ FULL", "over budget": "✖ OVER BUDGET"}


def cmd_relay_status_prometheus(args: argparse.Namespace, out: TextIO, prometheus: str) -> int:
    """Exit 0 when Prometheus (`prometheus`: --prometheus or the config's) knows at least one relay
    and all are up; 1 otherwise."""
    from cosmictui.ops.metrics.client import human_bytes, human_duration
    from cosmictui.ops.metrics.prometheus import PrometheusError, relays_from_prometheus

    try:
        rows = relays_from_prometheus(prometheus, timeout=args.timeout)
    except PrometheusError as e:
        return fail(args, out, "relay status", str(e), FAILED, e.fix)
    code = OK if rows and all(r.state == "up" for r in rows) else FAILED
    if args.json:
        dump(
            {"prometheus": prometheus, "relays": [{**vars(r), "state": r.state} for r in rows], "exit_code": code},
            out,
        )
        return code
    if not rows:
        out.write(f"no relay targets in {prometheus} (jobs blind-relay, blind-relay-dht)\n")
        out.write(
            "next     scrape your relays with those job names: cosmictui export prometheus --file prometheus.yml\n"
        )
        return code
    width = max(len(r.instance) for r in rows)
    for r in rows:
        rate = human_bytes(r.relayed_bytes_per_second, per_second=True)
        sessions = "–" if r.sessions_open is None else f"{r.sessions_open:g}"
        pairs = "–" if r.pairs_active is None else f"{r.pairs_active:g}"
        out.write(
            f"{BADGE.get(r.state, r.state):<14} {r.instance:<{width}}  {r.job:<15} sessions {sessions:>5}  "
            f"pairs {pairs:>5}  rss {human_bytes(r.rss_bytes):>8}  relayed {rate:>10}  "
            f"up {human_duration(r.uptime_seconds)}\n"
        )
    down = sum(r.state != "up" for r in rows)
    out.write(f"{len(rows)} relay targets, {down} not up\n")
    return code
