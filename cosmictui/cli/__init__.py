"""`cosmictui` entry point: the wizard by default, subcommands for the monitor and for scripts.

Every headless subcommand prints for people by default and for programs with `--json`, and
ends with an exit code scripts can branch on (`EXIT_CODES`); every error has one shape
(`output.error_doc`). The work itself lives in `cosmictui.ops`; this package only parses flags,
calls it, prints and picks the exit code.

Layout: `parser` (the root parser and the flag types), `output` (exit codes, JSON, the error
shape), `context` (settings and the deployment's runner), and one module per command group
(`monitor`, `check`, `env`, `jobs`, `relay`, `wizard`). A new group is one new module here
with `ORDER` and `register(sub, common)` (see `parser`); nothing else changes.
"""

from __future__ import annotations

import sys
from typing import TextIO

from cosmictui.cli.output import EXIT_CODES, FAILED, NOT_CONFIRMED, OK, USAGE, UsageError, dump, error_doc
from cosmictui.cli.parser import ParseError, build_parser

__all__ = ["EXIT_CODES", "FAILED", "NOT_CONFIRMED", "OK", "USAGE", "UsageError", "build_parser", "main"]


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except ParseError as e:
        e.parser.print_usage(sys.stderr)
        print(f"{e.parser.prog}: error: {e}", file=sys.stderr)
        if "--json" in (sys.argv[1:] if argv is None else argv):
            dump(error_doc(str(e), f"see `{e.parser.prog} --help`", USAGE), out)
        raise SystemExit(USAGE) from None  # as argparse itself does: callers and tests expect it
    try:
        return int(args.handler(args, out))
    except UsageError as e:
        print(f"cosmictui: {e}" + (f"\n  fix: {e.fix}" if e.fix else ""), file=sys.stderr)
        if getattr(args, "json", False):
            dump(error_doc(str(e), e.fix, USAGE), out)
        return USAGE
    except NotImplementedError:
        print(f"cosmictui {args.command}: not available in this build yet", file=sys.stderr)
        return FAILED
