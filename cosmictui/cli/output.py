"""What every headless command prints for programs: one JSON error shape and the exit codes.

An error is `{"error": <what went wrong>, "fix": <a flag or config key that fixes it>,
"exit_code": <the code the process exits with>}`, on stdout with `--json`, and as two lines
(`cosmictui COMMAND: error` / `  fix: ...`) on stderr for people.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, is_dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

OK, FAILED, USAGE, NOT_CONFIRMED = 0, 1, 2, 3

EXIT_CODES = """\
exit codes:
  0  ok (checks passed, relay up, .env written or already right, jobs listed, verify proven)
  1  a check failed, the relay is down, not running or not on the DHT yet, a command on the
     deployment failed, verify not proven
  2  usage or configuration error (bad flag, unreadable config, invalid key, missing deployment
     directory or .env, .env not editable; jobs recover: no known create command and no
     --delete-only, or a --create-command with {fields} the jobs list does not fill)
  3  jobs recover, relay start or setup without --yes: the plan was printed, nothing was done"""


#: How to give a relay key, for every error about one.
KEY_FIX = (
    "the relay's public key as blind-relay prints it after 'Server listening on' (52 z-base32 or 64 hex characters)"
)
BOOTSTRAP_FIX = "--bootstrap HOST:PORT[,HOST:PORT...] of DHT bootstrap nodes (or [relay] bootstrap in the config)"


class UsageError(Exception):
    """Bad input from the operator: exit 2 with the message and the flag or key that fixes it."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


def plain(obj: Any) -> Any:
    """Dataclasses, paths and datetimes as JSON-ready values."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return plain(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, Path):
        return str(obj)
    return obj


def dump(obj: Any, out: TextIO, stream: bool = False) -> None:
    """Pretty on a terminal's stdout; `stream` (watch modes): always one object per line (NDJSON).

    Always strict JSON: remote values (a relay's /stats) may hold NaN or Infinity, which
    `json.dumps` would print as bare words no JSON parser takes; they become null."""
    from cosmictui.ops.metrics.client import strict_json

    pretty = out is sys.stdout and not stream
    out.write(json.dumps(strict_json(plain(obj)), indent=2 if pretty else None, allow_nan=False) + "\n")


def error_doc(error: str, fix: str, code: int, **extra: Any) -> dict[str, Any]:
    """The one JSON error shape; `extra` adds context (e.g. the command's raw output)."""
    return {"error": error, "fix": fix or None, "exit_code": code, **extra}


def fail(
    args: argparse.Namespace, out: TextIO, command: str, error: str, code: int, fix: str = "", **extra: Any
) -> int:
    """An error for people on stderr and, with --json, for programs on stdout; returns `code`."""
    print(f"cosmictui {command}: {error}" + (f"\n  fix: {fix}" if fix else ""), file=sys.stderr)
    if getattr(args, "json", False):
        dump(error_doc(error, fix, code, **extra), out)
    return code
