"""`cosmictui monitor`: the live monitor of one or more relays."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TextIO

from cosmictui.cli.context import settings_from
from cosmictui.cli.output import BOOTSTRAP_FIX, EXIT_CODES, FAILED, KEY_FIX, OK, UsageError
from cosmictui.cli.parser import FORMAT, interval_seconds, metrics_addr, timeout_seconds

ORDER = 10


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add monitor to the parser."""
    m = sub.add_parser(
        "monitor",
        parents=[common],
        help="live monitor of one or more relays",
        description="Live monitor of one or more relays (memory, CPU, traffic, pairings, DHT, log). "
        "Without --storage/--metrics/--relay-key: the configured relay storage, else the default metrics "
        "address (or, with [monitor] prometheus in the config, every relay that Prometheus scrapes). "
        "--prometheus URL adds every relay a Prometheus server scrapes (jobs blind-relay, blind-relay-dht). "
        "A relay without metrics (--relay-key, or a local relay started with --metrics off) is "
        "probed over the DHT instead: its graph is the probe's round trip over time.",
        epilog="keys: +/- refresh interval, p pause, r refresh now, t light/dark theme, l log, q quit\n\n" + EXIT_CODES,
        formatter_class=FORMAT,
    )
    m.add_argument("--storage", metavar="DIR", action="append", default=[], help="relay storage dir (repeatable)")
    m.add_argument(
        "--metrics", metavar="URL", action="append", type=metrics_addr, default=[], help="HOST:PORT or URL (repeat)"
    )
    m.add_argument(
        "--interval", metavar="S", type=interval_seconds, default=1.0, help="refresh interval in seconds (1)"
    )
    m.add_argument(
        "--timeout",
        metavar="S",
        type=timeout_seconds,
        default=None,
        help="give up on a relay's scrape (or a --prometheus read) after S seconds and show it DOWN "
        "(default: the interval, 2-5 s)",
    )
    m.add_argument(
        "--relay-key",
        metavar="KEY",
        action="append",
        default=[],
        help="watch a relay known only by its key (e.g. npm blind-relay-service) by probing it (repeatable)",
    )
    m.add_argument(
        "--bootstrap",
        metavar="HOST:PORT,…",
        help="DHT bootstrap nodes for the probes (default: the config's [relay] bootstrap, else the public nodes)",
    )
    m.add_argument(
        "--prometheus",
        metavar="URL",
        help="also every relay this Prometheus server scrapes, e.g. http://127.0.0.1:9090 "
        "(default: the config's [monitor] prometheus when no relay is named)",
    )
    m.add_argument(
        "--probe-interval", metavar="S", type=interval_seconds, default=None, help="seconds between probe echoes (5)"
    )
    m.set_defaults(handler=cmd_monitor)


def monitor_targets(args: argparse.Namespace, settings: Any) -> list[Any]:
    """--storage/--metrics as given; neither: the configured storage if a relay runs there,
    else the configured metrics address."""
    from cosmictui.ops.metrics.client import Target, normalize_url, unique_targets
    from cosmictui.ops.relayproc import read_runtime

    targets: list[Target] = [Target(storage=Path(s).expanduser().absolute()) for s in args.storage]
    for url in args.metrics:
        try:
            normalize_url(url)
        except ValueError as e:
            raise UsageError(f"--metrics {url}: {e}", "--metrics HOST:PORT or http://HOST:PORT") from None
        targets.append(Target(metrics=url))
    for key in getattr(args, "relay_key", None) or []:
        from cosmictui.ops.metrics.probe import ProbeUsageError, parse_relay_key

        try:
            parse_relay_key(key)
        except ProbeUsageError as e:
            raise UsageError(f"--relay-key: {e}", f"--relay-key KEY with {KEY_FIX}") from None
        targets.append(Target(relay_key=key))
    if not targets and prometheus_url(args, settings) is None:
        storage = Path(settings.relay_storage).expanduser().absolute()
        if read_runtime(str(storage)) is not None or settings.metrics_url is None:
            targets.append(Target(storage=storage))
        else:
            targets.append(Target(metrics=settings.metrics_url))
    return unique_targets(targets)


def prometheus_url(args: argparse.Namespace, settings: Any) -> str | None:
    """--prometheus, else the config's [monitor] prometheus unless a relay was named on the command
    line; checked here, so a typo is a usage error before the screen opens."""
    from cosmictui.ops.metrics.prometheus import base_url

    url = getattr(args, "prometheus", None)
    named = bool(args.storage or args.metrics or getattr(args, "relay_key", None))
    source = "--prometheus"
    configured: str = getattr(settings, "monitor_prometheus", None) or ""
    if url is None and not named and configured:
        url, source = configured, "[monitor] prometheus"
    if url is None:
        return None
    try:
        return base_url(url)
    except ValueError as e:
        raise UsageError(f"{source}: {e}", f"{source} http://HOST:PORT, e.g. http://127.0.0.1:9090") from None


def cmd_monitor(args: argparse.Namespace, out: TextIO) -> int:
    settings = settings_from(args)
    prometheus = prometheus_url(args, settings)
    targets = monitor_targets(args, settings)
    from cosmictui.monitor_app import MonitorApp

    # the probes join the DHT the configured relay joins, unless told otherwise
    bootstrap = list(getattr(settings, "relay_bootstrap", ()) or ()) or None
    if args.bootstrap:
        from cosmictui.ops.metrics.probe import ProbeUsageError, parse_bootstrap

        try:
            bootstrap = parse_bootstrap([b.strip() for b in args.bootstrap.split(",") if b.strip()])
        except ProbeUsageError as e:
            raise UsageError(f"--bootstrap: {e}", BOOTSTRAP_FIX) from None
    app = MonitorApp(
        targets,
        interval=args.interval,
        scrape_timeout=args.timeout,
        bootstrap=bootstrap,
        probe_interval=args.probe_interval,
        prometheus=prometheus,
    )
    app.run()
    # a crash inside the app (Textual prints the traceback) must not look like success to scripts
    return FAILED if app.return_code else OK
