"""The allow-list: which peer public keys may open blind-relay sessions (default: everyone).

blind-relay-service relays for anyone who knows its key; an operator who knows the keys of
their CosmicAC agents and worker can shut everyone else out with `--allow`/`--allow-file`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from relay.keys import KeyEncodingError, decode_id


class AllowListError(ValueError):
    """A key in `--allow` or the allow file is not a hypercore key; says where."""


def parse_key(text: str, where: str) -> bytes:
    try:
        return decode_id(text.strip())
    except (KeyEncodingError, ValueError, TypeError) as e:
        raise AllowListError(f"{where}: {text.strip()!r} is not a public key (52 z32 or 64 hex characters)") from e


def read_allow_file(path: str | Path) -> set[bytes]:
    """One key per line; blank lines and `#` comments ignored."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise AllowListError(f"cannot read allow file {p}: {e.strerror or e}") from e
    keys: set[bytes] = set()
    for n, line in enumerate(text.splitlines(), 1):
        body = line.split("#", 1)[0].strip()
        if body:
            keys.add(parse_key(body, f"{p}:{n}"))
    return keys


def build_allow_list(keys: Iterable[str] = (), files: Iterable[str] = ()) -> frozenset[bytes] | None:
    """None means open (no `--allow` and no `--allow-file` given)."""
    keys = list(keys)
    files = list(files)
    if not keys and not files:
        return None
    allowed = {parse_key(k, "--allow") for k in keys}
    for f in files:
        allowed |= read_allow_file(f)
    return frozenset(allowed)
