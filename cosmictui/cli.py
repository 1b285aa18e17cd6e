"""`cosmictui` entry point: the wizard by default, subcommands for scripts."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cosmictui", description="Set up a CosmicAC relay and watch it.")
    p.add_argument("--demo", action="store_true", help="run against a built-in sandbox deployment")
    p.parse_args(argv)
    print("cosmictui: the wizard is not built yet (see issue 6)")
    return 2
