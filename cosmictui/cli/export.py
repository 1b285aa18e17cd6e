"""`cosmictui export prometheus|grafana`: print or install the Prometheus pack (rules, dashboard)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TextIO

from cosmictui.cli.output import FAILED, OK, UsageError, dump
from cosmictui.cli.parser import FORMAT

ORDER = 60

EPILOG = """\
prometheus: blind-relay.rules.yml (recording and alert rules with runbooks; printed by default),
  blind-relay.rules.test.yml (promtool test rules), prometheus.yml (scrape examples: HTTP --metrics
  and through hyperdht-prometheus-bridge for relays started with --scraper-*).
grafana: blind-relay.json (the dashboard; import it, or --install into a provisioning directory).

exit codes:
  0  printed, or installed (files that differ from ours are kept and listed unless --force)
  1  installed, but promtool rejected the rules
  2  unknown file, or a directory that cannot be written"""


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add export to the parser."""
    e = sub.add_parser(
        "export",
        help="print or install the Prometheus rules and the Grafana dashboard",
        description="Print a file of the Prometheus pack on stdout, or install the whole pack into a directory.",
        epilog=EPILOG,
        formatter_class=FORMAT,
    )
    e.add_argument("kind", choices=("prometheus", "grafana"), help="which part of the pack")
    e.add_argument("--file", metavar="NAME", help="print this file of the pack instead of the default one")
    e.add_argument("--install", metavar="DIR", type=Path, help="write the pack's files into DIR (made if missing)")
    e.add_argument("--force", action="store_true", help="with --install: replace files that differ from ours")
    e.add_argument("--json", action="store_true", help="with --install: print what was done as JSON")
    e.set_defaults(handler=cmd_export)


def cmd_export(args: argparse.Namespace, out: TextIO) -> int:
    from cosmictui.ops.pack import PackError, install, read

    try:
        if args.install is None:
            if args.force or args.json:
                raise UsageError("--force and --json go with --install", "add --install DIR, or drop them")
            out.write(read(args.kind, args.file))
            return OK
        if args.file:
            raise UsageError("--install writes every file of the pack; --file is for printing one", "drop --file")
        result = install(args.kind, args.install, force=args.force)
    except PackError as e:
        raise UsageError(str(e), e.fix) from None
    if args.json:
        dump(result, out)
    else:
        where = result.directory
        for name in result.written:
            out.write(f"wrote      {where / name}\n")
        for name in result.unchanged:
            out.write(f"unchanged  {where / name}\n")
        for name in result.kept:
            out.write(f"kept       {where / name} (yours differs; --force replaces it)\n")
        if result.check is not None:
            out.write(("promtool: " if result.check_ok else "promtool rejected the rules:\n") + result.check + "\n")
        if args.kind == "prometheus":
            out.write(
                f"next: add {where / 'blind-relay.rules.yml'} to rule_files in your prometheus.yml "
                "(prometheus.yml here is an example), then reload Prometheus\n"
            )
        else:
            out.write(
                "next: import blind-relay.json in Grafana (Dashboards > New > Import), or point a "
                f"dashboard provider at {where}\n"
            )
    return FAILED if result.check_ok is False else OK
