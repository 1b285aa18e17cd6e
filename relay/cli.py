"""`blind-relay`: the command line of blind-relay-service, served by the Python relay."""

from __future__ import annotations

import argparse
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="blind-relay", description="Blind relay for HyperDHT peers (Python, Node-free).")
    p.add_argument("-s", "--storage", default="./corestore", help="storage directory holding the relay's key")
    p.add_argument("-p", "--port", type=int, default=49737, help="UDP port (default 49737)")
    p.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    p.add_argument("--bootstrap", default=None, help="HOST:PORT[,HOST:PORT...] (default: public HyperDHT nodes)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    parse_args(argv)
    print("blind-relay: the relay service is not assembled yet (see issue 4)", file=sys.stderr)
    return 2
