"""The setup wizard: what `cosmictui` runs without a subcommand (flags on the root parser)."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from cosmictui.cli.context import settings_from
from cosmictui.cli.output import FAILED


def cmd_wizard(args: argparse.Namespace, out: TextIO) -> int:
    try:
        from cosmictui.app import main_wizard  # type: ignore[attr-defined]
    except ImportError as e:
        print(f"cosmictui: the setup wizard is not available in this build ({e}).", file=sys.stderr)
        print("The monitor and the headless commands work: see `cosmictui --help`.", file=sys.stderr)
        return FAILED
    if not args.demo:
        # a bad --config or --deployment is said as every command says it, with its fix, before any screen
        settings_from(args)
    rc = main_wizard(getattr(args, "deployment", None), args.demo, getattr(args, "config", None))
    return int(rc or 0)
