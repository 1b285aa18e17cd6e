"""The `cosmictui` argument parser: the wizard's flags at the root, one subcommand group per module.

A command group is one module in this package with `ORDER` (its place in `--help`) and
`register(sub, common)`, which adds its subparser(s) to `sub` (with `parents=[common]` for
--config/--deployment) and sets `handler=<function(args, out) -> exit code>` on each. The
modules are found by listing the package, so adding a group is adding one file.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from typing import Any

from cosmictui.cli.output import EXIT_CODES

FORMAT = argparse.RawDescriptionHelpFormatter
NOT_COMMANDS = {"output", "parser", "context", "__main__"}  # this package's modules that add no command


class ParseError(Exception):
    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so a bad flag under `--json` is JSON too."""

    def error(self, message: str) -> Any:
        raise ParseError(self, message)


def command_modules() -> list[Any]:
    """Every command-group module of this package, in `--help` order."""
    import cosmictui.cli as package

    found = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.name in NOT_COMMANDS or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        if callable(getattr(module, "register", None)):
            found.append(module)
    return sorted(found, key=lambda m: (getattr(m, "ORDER", 100), m.__name__))


def build_parser() -> argparse.ArgumentParser:
    from cosmictui.cli.wizard import cmd_wizard

    common = Parser(add_help=False)
    common.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS, help="TOML config file")
    common.add_argument(
        "--deployment",
        metavar="SPEC",
        default=argparse.SUPPRESS,
        help="deployment directory or ssh://user@host[:port]/path",
    )
    p = Parser(
        prog="cosmictui",
        description="Set up a CosmicAC blind relay and watch it. Without a subcommand: the setup wizard.",
        epilog=EXIT_CODES,
        formatter_class=FORMAT,
        parents=[common],
    )
    p.add_argument("--demo", action="store_true", help="run the wizard against a built-in sandbox deployment")
    p.set_defaults(handler=cmd_wizard)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for module in command_modules():
        module.register(sub, common)
    return p


def metrics_addr(text: str) -> str:
    """Checked while parsing, so a typo is one usage line (exit 2), never a traceback later."""
    from cosmictui.ops.metrics.client import normalize_url

    try:
        normalize_url(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def port_number(text: str) -> int:
    """1-65535 at parse time: 70000 is a usage error, not a traceback; 0 is not a port to check."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 1-65535, got {v}")
    return v


def _seconds(text: str, what: str, low: float) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not low <= v <= 3600:
        raise argparse.ArgumentTypeError(f"{what} must be between {low} and 3600 seconds")
    return v


def timeout_seconds(text: str) -> float:
    return _seconds(text, "timeout", 0.1)


def interval_seconds(text: str) -> float:
    return _seconds(text, "interval", 0.2)
