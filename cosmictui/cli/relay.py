"""`cosmictui relay status|probe`: the relay on this machine, and any relay by its key."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from datetime import datetime
from typing import Any, TextIO

from cosmictui.cli.context import settings_from
from cosmictui.cli.output import BOOTSTRAP_FIX, EXIT_CODES, FAILED, KEY_FIX, OK, UsageError, dump, plain
from cosmictui.cli.parser import FORMAT, interval_seconds, metrics_addr, timeout_seconds

ORDER = 50


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add relay to the parser."""
    r = sub.add_parser(
        "relay", parents=[common], help="the relay on this machine", epilog=EXIT_CODES, formatter_class=FORMAT
    )
    rsub = r.add_subparsers(dest="relay_command", metavar="ACTION", required=True)
    rs = rsub.add_parser(
        "status",
        parents=[common],
        help="is the relay running and answering",
        description="Read <storage>/relay-runtime.json and the relay's /stats.",
        epilog=EXIT_CODES,
        formatter_class=FORMAT,
    )
    rs.add_argument("--json", action="store_true", help="print a JSON object")
    rs.add_argument("--storage", metavar="DIR", help="relay storage directory (config)")
    rs.add_argument(
        "--metrics", metavar="URL", type=metrics_addr, help="ask this metrics address instead of the runtime file's"
    )
    rs.add_argument(
        "--timeout", metavar="S", type=timeout_seconds, default=3.0, help="seconds to wait for the relay's answer (3)"
    )
    rs.add_argument(
        "--prometheus",
        metavar="URL",
        help="instead: every relay this Prometheus server scrapes (jobs blind-relay, blind-relay-dht), one line each "
        "(default: the config's [monitor] prometheus when neither --storage nor --metrics is given)",
    )
    rp = rsub.add_parser(
        "probe",
        parents=[common],
        help="prove a relay carries a connection (two peers meet through it)",
        description="Two Python peers on this host, punching off, connect through the relay by its key and "
        "echo: key found on the DHT, handshake with the relay, pairing matched, first echo, bytes and round "
        "trip. Works for any blind relay (this one or blind-relay-service). Exit 0: the echo came back "
        "relayed; 1: a stage failed (which and why); 2: usage.",
        epilog=EXIT_CODES,
        formatter_class=FORMAT,
    )
    rp.add_argument("key", metavar="KEY", nargs="?", help="relay public key (default: the configured/running relay)")
    rp.add_argument(
        "--bootstrap", metavar="HOST:PORT[,...]", help="DHT bootstrap nodes (default: config, else the public DHT)"
    )
    rp.add_argument(
        "--timeout", metavar="S", type=interval_seconds, default=30.0, help="bound for the whole probe (30)"
    )
    rp.add_argument("--storage", metavar="DIR", help="relay storage directory to take the key from (config)")
    rp.add_argument("--json", action="store_true", help="print a JSON object with every stage")
    rp.add_argument(
        "--watch", action="store_true", help="then echo every --interval seconds: round trip over time (Ctrl-C ends)"
    )
    rp.add_argument("--interval", metavar="S", type=interval_seconds, default=5.0, help="seconds between echoes (5)")
    rp.add_argument("--count", type=int, default=None, help=argparse.SUPPRESS)  # bounded --watch, for tests
    rs.set_defaults(handler=cmd_relay_status)
    rp.set_defaults(handler=cmd_relay_probe)
    from cosmictui.cli._relay_start import add_start

    add_start(rsub, common)


def relay_status_report(storage: str | None, metrics: str | None, timeout: float = 3.0) -> dict[str, Any]:
    """What `relay status` prints: runtime file, process liveness, /stats, and a verdict."""
    from cosmictui.ops import relayproc
    from cosmictui.ops.metrics.client import BadData, MetricsError, fetch
    from cosmictui.ops.metrics.forwarding import forwarding_path

    report: dict[str, Any] = {"state": "not running", "storage": storage, "runtime": None, "stats": None}
    report |= {"metrics": metrics, "error": None, "fix": None, "key": None}
    if storage is not None and (problem := relayproc.storage_problem(storage)):
        report["storage"] = os.path.abspath(storage)
        report["error"], report["fix"] = problem, relayproc.STORAGE_FIX
        return report
    if storage is not None:
        st = relayproc.relay_status(storage)
        report["storage"] = st.storage
        report["log"] = st.log_path
        report["runtime"] = plain(st.runtime) if st.runtime else None
        report["key"] = st.runtime.key if st.runtime else None
        holder = relayproc.lock_holder(storage) if st.runtime is None or not st.running else None
        if holder is not None:  # it holds the storage but writes its runtime file only once it listens
            report["state"], report["pid"], report["runtime"] = "starting", holder, None
            report["error"] = f"the relay (pid {holder}) is starting: joining the DHT, not listening yet"
            report["fix"] = f"wait a few seconds and ask again; its log: {st.log_path}"
            return report
        if st.runtime is None:
            report["error"] = f"no relay is running with storage {st.storage}"
            report["fix"] = f"start it: blind-relay --storage {st.storage}"
        elif not st.running or st.stale_runtime:
            report["error"] = f"pid {st.runtime.pid} from {relayproc.RUNTIME_FILE} is gone"
            report["fix"] = f"start it again: blind-relay --storage {st.storage} (and see its log {st.log_path})"
        elif metrics is None:
            metrics = st.runtime.metrics
            report["metrics"] = metrics
            if metrics is None:
                report["state"] = "up"
                report["error"] = "running with metrics off: no /stats to read"
                return report
        if report["error"] is not None and metrics is None:
            return report
    if metrics is None:
        report["error"] = report["error"] or "no metrics address"
        return report
    try:
        s = fetch(metrics, timeout=timeout)
    except BadData as e:  # it answers, with numbers no relay has: nothing of it is shown
        report["state"] = "bad data"
        report["error"], report["fix"], report["bad_field"] = e.reason, e.fix, e.field
        return report
    except MetricsError as e:
        report["state"] = "down"
        report["error"], report["fix"] = e.reason, e.fix or None
        return report
    report["state"] = "up"
    report["error"] = None
    report["stats"] = s.stats
    dht = s.stat("dht")
    if isinstance(dht, dict) and dht.get("bootstrapped") is False:
        # listening anyway, as blind-relay-service does, but no peer can find its key yet
        report["state"] = "not joined"
        report["error"] = "listening, but not joined to the DHT yet (it keeps retrying): peers cannot find its key"
        report["fix"] = "check that this host reaches the DHT's bootstrap nodes over UDP (--bootstrap); see its log"
    path = forwarding_path(s.stats)  # which path carries the traffic: kernel (nftables) or Python
    report["forwarding"] = path.as_json() if path is not None else None
    if isinstance(s.stat("key"), str):
        report["key"] = s.stat("key")
    report["rss_bytes"] = s.rss_bytes
    return report


def find_running_relay(settings: Any, configured: dict[str, Any], timeout: float) -> dict[str, Any]:
    """No flags and nothing on the configured storage: look where a relay would be before
    saying NOT RUNNING: the configured metrics address (by default blind-relay's 127.0.0.1:49738),
    then relays running on this machine (found by their runtime file in their storage)."""
    from cosmictui.ops import relayproc

    where = configured.get("storage")
    url = settings.metrics_url
    if url:
        rep = relay_status_report(None, url, timeout)
        if rep["state"] in ("up", "not joined", "bad data"):
            rep["found_by"] = f"its metrics address {url} ([relay] metrics in the config)"
            rep["configured_storage"] = where
            return rep
    running = relayproc.running_relays()
    if running:
        rep = relay_status_report(running[0].storage, None, timeout)
        rep["found_by"] = f"a relay running on this machine (storage {running[0].storage})"
        rep["configured_storage"] = where
        if len(running) > 1:
            others = ", ".join(f"{r.storage} (pid {r.pid})" for r in running[1:])
            rep["others"] = [r.storage for r in running[1:]]
            rep["fix"] = rep["fix"] or f"more relays run here: {others}; pick one with --storage DIR"
        return rep
    configured["fix"] = (
        f"start it: blind-relay --storage {where}" if where else "start it: blind-relay --storage DIR"
    ) + " (or point at a running one with --storage DIR or --metrics HOST:PORT)"
    configured["error"] = (
        f"no relay is running with storage {where}, none runs on this machine, and nothing answers on "
        f"{url or 'a metrics address (metrics off in the config)'}"
    )
    return configured


def cmd_relay_status(args: argparse.Namespace, out: TextIO) -> int:
    from cosmictui.cli.monitor import prometheus_url
    from cosmictui.ops.metrics.client import by_cause, human_bytes, human_duration

    settings = settings_from(args)
    prometheus = prometheus_url(args, settings)  # --prometheus, else [monitor] prometheus when no relay is named
    if prometheus is not None:
        from cosmictui.cli._promview import cmd_relay_status_prometheus

        return cmd_relay_status_prometheus(args, out, prometheus)
    storage = args.storage if args.storage is not None else (None if args.metrics else settings.relay_storage)
    rep = relay_status_report(storage, args.metrics, timeout=args.timeout)
    if args.storage is None and args.metrics is None and rep["state"] == "not running":
        rep = find_running_relay(settings, rep, args.timeout)
    rep["exit_code"] = OK if rep["state"] == "up" else FAILED
    if args.json:
        dump(rep, out)
        return int(rep["exit_code"])
    badge = {
        "up": "▲ UP",
        "starting": "◌ STARTING",
        "not joined": "✖ NOT JOINED",
        "down": "✖ DOWN",
        "not running": "■ NOT RUNNING",
        "bad data": "✖ BAD DATA",
    }[rep["state"]]
    stats = rep["stats"] or {}
    rt = rep["runtime"] or {}
    key = stats.get("key") or rt.get("key") or "–"
    out.write(f"relay    {badge}   key {key}\n")
    if rep.get("found_by"):
        out.write(f"found    by {rep['found_by']}\n")
    if rep.get("storage"):
        out.write(f"storage  {rep['storage']}\n")
    if rep.get("pid") and not rt:
        out.write(f"process  pid {rep['pid']}  (holds {rep['storage']}/relay.lock)\n")
    if rt:
        out.write(f"process  pid {rt.get('pid')}  udp {rt.get('host')}:{rt.get('port')}  version {rt.get('version')}\n")
    if rep.get("metrics"):
        out.write(f"metrics  {rep['metrics']}\n")
    if stats:
        sessions, pairings, streams = stats.get("sessions", {}), stats.get("pairings", {}), stats.get("streams", {})
        out.write(f"uptime   {human_duration(stats.get('uptime_seconds'))}   rss {human_bytes(rep.get('rss_bytes'))}\n")
        out.write(
            f"sessions {sessions.get('opened', 0) - sessions.get('closed', 0)} open   "
            f"pairings {pairings.get('active', 0)} active, {pairings.get('pending', 0)} pending, "
            f"{pairings.get('matched', 0)} matched   stream errors {streams.get('errors', 0)}\n"
        )
        dht = stats.get("dht", {})
        pub = f"{dht.get('public_host')}:{dht.get('public_port')}" if dht.get("public_host") else "unknown"
        ann = dht.get("last_announce")
        ago = f"{human_duration(time.time() - ann)} ago" if isinstance(ann, int | float) else "never"
        joined = dht.get("bootstrapped")
        out.write(
            f"dht      bootstrapped {'yes' if joined else 'NO'}   "
            f"firewalled {'YES' if dht.get('firewalled') else 'no'}   public {pub}   last announce {ago}\n"
        )
        if rep.get("forwarding"):
            from cosmictui.ops.metrics.forwarding import forwarding_path

            if (path := forwarding_path(stats)) is not None:
                out.write(f"path     {path.line()}\n")
        for block in ("dropped", "shed"):
            if block in stats:
                out.write(f"{block:<8} {by_cause(stats[block], top=8)}\n")
    if rep["error"]:
        out.write(f"note     {rep['error']}\n")
    if rep.get("fix"):
        out.write(f"next     {rep['fix']}\n")
    return OK if rep["state"] == "up" else FAILED


def probe_key(key: str | None, storage: str | None, *, explicit_storage: bool = False) -> str:
    """KEY as given, else the relay running on (or the key held by) the storage; with no
    --storage given, the one relay running on this machine if there is exactly one."""
    if key:
        return key
    from cosmictui.ops import relayproc

    if storage:
        found = relayproc.read_key(storage) or relayproc.storage_key(storage)
        if found:
            return found
    if not explicit_storage:
        running = relayproc.running_relays()
        if len(running) == 1:
            return running[0].key
    where = f"storage {storage}" if storage else "the configured storage"
    raise UsageError(
        f"no KEY given and no relay key in {where}",
        f"pass KEY ({KEY_FIX}), or --storage DIR of a relay that ran on this machine",
    )


def cmd_relay_probe(args: argparse.Namespace, out: TextIO) -> int:
    from cosmictui.ops.metrics.probe import ProbeUsageError, probe_fix, run_probe

    settings = settings_from(args)
    storage = args.storage if args.storage is not None else settings.relay_storage
    key = probe_key(args.key, storage, explicit_storage=args.storage is not None)
    boot = [b.strip() for b in args.bootstrap.split(",") if b.strip()] if args.bootstrap else None
    if args.watch:
        return _relay_probe_watch(args, out, key, boot or list(settings.relay_bootstrap) or None)
    try:
        res = asyncio.run(run_probe(key, boot or list(settings.relay_bootstrap) or None, args.timeout))
    except ProbeUsageError as e:
        raise UsageError(str(e), BOOTSTRAP_FIX if "bootstrap" in str(e) else f"KEY must be {KEY_FIX}") from None
    rc = OK if res.ok else FAILED
    if args.json:
        dump(res.as_dict() | {"fix": probe_fix(res) or None, "exit_code": rc}, out)
        return rc
    out.write(f"probe    relay {res.relay_key}\n")
    for st in res.stages:
        mark = "✔" if st.ok else "✖"
        out.write(f"  {mark} {st.name:<26} {st.seconds:7.2f} s  {st.detail}\n")
    if res.ok:
        out.write(f"result   ✔ relayed echo through {res.relay_address}, round trip {res.rtt_ms} ms\n")
        return OK
    out.write(f"result   ✖ failed at {res.error} (after {res.seconds:.1f} s)\n")
    if fix := probe_fix(res):
        out.write(f"fix      {fix}\n")
    return FAILED


def _relay_probe_watch(args: argparse.Namespace, out: TextIO, key: str, boot: list[str] | None) -> int:
    """`relay probe --watch`: one line (NDJSON with --json) per echo through the relay."""
    from cosmictui.ops.metrics.probe import ProbeUsageError, watch_probe

    last_ok = False

    async def go() -> None:
        nonlocal last_ok
        async for p in watch_probe(key, boot, args.interval, args.timeout, args.count):
            last_ok = p.ok
            if args.json:
                dump(p, out, stream=True)
            else:
                when = datetime.fromtimestamp(p.at).strftime("%H:%M:%S")
                rtt = f"round trip {p.rtt_ms:7.2f} ms" if p.rtt_ms is not None else "no echo          "
                out.write(f"{when}  {'✔' if p.ok else '✖'} {rtt}  via {p.relay_address or '–'}  {p.detail}\n")
            out.flush()

    try:
        asyncio.run(go())
    except ProbeUsageError as e:
        raise UsageError(str(e), BOOTSTRAP_FIX if "bootstrap" in str(e) else f"KEY must be {KEY_FIX}") from None
    except KeyboardInterrupt:
        return OK
    return OK if last_ok else FAILED
