"""Read a relay's record of its pairings (`GET /pairings` on its metrics port), defensively.

The record is what a verdict about one job stands on: who paired through the relay, when, and
what each side sent (`relay/service/pairings.py` documents the shape). A metrics endpoint can
be anything that answers on that port, so nothing it sends is trusted: the answer is bounded
in size, and a value of the wrong type, not finite or out of range is *missing* (None), never
guessed. What a missing value means for a verdict is the verdict's business (mostly "cannot
tell"); this module only says what is known.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field
from typing import Any

from cosmictui.ops.metrics.client import (
    HTTPStatus,
    MetricsError,
    _failure,
    _get,
    normalize_url,
)

#: A full record (1,024 pairings of two peers) is a few hundred KB; past this it is not a relay.
MAX_PAIRINGS_BYTES = 4 * 1024 * 1024
#: More entries than this are not read (a relay keeps 1,024 by default).
MAX_ENTRIES = 100_000
MAX_KEY_CHARS = 128


@dataclass(frozen=True)
class PeerSeen:
    """One side of a pairing as the relay recorded it; None where the value was missing or bad."""

    key: str
    first_seen_at: float | None
    seen_before: bool | None
    bytes: int | None
    packets: int | None


@dataclass(frozen=True)
class PairingSeen:
    id: int | None
    opened_at: float
    closed_at: float | None
    peers: tuple[PeerSeen, ...]
    #: the record said closed_at, but with a bad value: whether it is still open is not known
    closed_unknown: bool = False

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(p.key for p in self.peers)

    @property
    def bytes(self) -> int | None:
        """Bytes both sides sent through the relay; None when either count is missing."""
        counts = [p.bytes for p in self.peers]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)


@dataclass(frozen=True)
class PairingRecord:
    """The relay's record as read. Counts are None when the relay sent none (or a bad one)."""

    relay_key: str | None
    started_at: float | None
    capacity: int | None
    recorded: int | None
    evicted: int | None
    keys_capacity: int | None
    keys_evicted: int | None
    keys_evicted_at: float | None
    pairings: tuple[PairingSeen, ...]
    #: entries that could not be read (no usable open time or peer keys): they might be anything
    unreadable: int = 0
    #: what was dropped as bad, for the operator ("pairings[3].opened_at: not a number")
    problems: tuple[str, ...] = field(default_factory=tuple)


def _time(v: Any) -> float | None:
    """A wall-clock time: a finite number > 0 (bool is not a number here)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        return None
    return float(v)


def _count(v: Any) -> int | None:
    """A count: a whole number >= 0 (a float like 3.0 is accepted, 3.5 is not)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        return None
    if isinstance(v, float) and not v.is_integer():
        return None
    return int(v)


def _key(v: Any) -> str | None:
    if not isinstance(v, str) or not v or len(v) > MAX_KEY_CHARS or not v.isascii() or not v.isalnum():
        return None
    return v


def parse_pairings(data: bytes | str) -> PairingRecord:
    """The record from `/pairings`' body. Raises `MetricsError` only when the body is not a JSON
    object at all; every bad value inside becomes None (and is listed in `problems`)."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise MetricsError(
            "/pairings", f"not JSON ({type(e).__name__})", "is that a blind relay's metrics port?"
        ) from None
    if not isinstance(doc, dict):
        raise MetricsError("/pairings", "not a JSON object", "is that a blind relay's metrics port?")
    problems: list[str] = []

    def top(name: str, read: Any) -> Any:
        raw = doc.get(name)
        value = read(raw)
        if value is None and not (name == "keys_evicted_at" and raw is None):
            problems.append(f"{name}: {'missing' if name not in doc else 'bad value'}")
        return value

    entries = doc.get("pairings")
    if not isinstance(entries, list):
        problems.append("pairings: missing or not a list")
        entries = []
    pairings: list[PairingSeen] = []
    unreadable = 0
    for i, raw in enumerate(entries[:MAX_ENTRIES]):
        p = _pairing(raw, f"pairings[{i}]", problems)
        if p is None:
            unreadable += 1
        else:
            pairings.append(p)
    unreadable += max(0, len(entries) - MAX_ENTRIES)
    return PairingRecord(
        relay_key=top("relay_key", _key),
        started_at=top("started_at", _time),
        capacity=top("capacity", _count),
        recorded=top("recorded", _count),
        evicted=top("evicted", _count),
        keys_capacity=top("keys_capacity", _count),
        keys_evicted=top("keys_evicted", _count),
        keys_evicted_at=top("keys_evicted_at", _time),
        pairings=tuple(pairings),
        unreadable=unreadable,
        problems=tuple(problems[:20]),  # a hostile record must not flood the screen
    )


def _pairing(raw: Any, where: str, problems: list[str]) -> PairingSeen | None:
    """One entry, or None when it cannot be read at all (no open time, or not two keyed peers)."""
    if not isinstance(raw, dict):
        problems.append(f"{where}: not an object")
        return None
    opened = _time(raw.get("opened_at"))
    peers_raw = raw.get("peers")
    if opened is None or not isinstance(peers_raw, list) or len(peers_raw) != 2:
        problems.append(f"{where}: no usable opened_at or not two peers")
        return None
    peers: list[PeerSeen] = []
    for j, pr in enumerate(peers_raw):
        key = _key(pr.get("key")) if isinstance(pr, dict) else None
        if key is None or not isinstance(pr, dict):
            problems.append(f"{where}.peers[{j}]: no usable key")
            return None
        seen_before = pr.get("seen_before")
        peer = PeerSeen(
            key,
            _time(pr.get("first_seen_at")),
            seen_before if isinstance(seen_before, bool) else None,
            _count(pr.get("bytes")),
            _count(pr.get("packets")),
        )
        if peer.first_seen_at is None or peer.bytes is None:
            problems.append(f"{where}.peers[{j}]: bad first_seen_at or bytes")
        peers.append(peer)
    closed_raw = raw.get("closed_at")
    closed = _time(closed_raw)
    return PairingSeen(
        _count(raw.get("id")),
        opened,
        closed,
        tuple(peers),
        closed_unknown=closed is None and closed_raw is not None,
    )


class NoPairingRecord(MetricsError):
    """The metrics port answers, but keeps no pairing record (`/pairings` is 404): another relay
    (blind-relay-service) or an older version of this one."""


async def read_pairings(base_url: str, timeout: float = 3.0) -> PairingRecord:
    """GET `/pairings` within `timeout`; MetricsError (with a fix) when it cannot be read."""
    try:
        base = normalize_url(base_url)
    except ValueError as e:
        raise MetricsError(base_url, f"bad address ({e})", "use HOST:PORT, e.g. 127.0.0.1:49738") from e
    try:
        async with asyncio.timeout(timeout):
            body = await _get(base + "/pairings", MAX_PAIRINGS_BYTES)
    except HTTPStatus as e:
        if e.code == 404:
            raise NoPairingRecord(
                base,
                "it keeps no record of its pairings (/pairings: HTTP 404)",
                "run this project's blind-relay (the Node relay and older versions keep none)",
            ) from e
        raise _failure(base, "/pairings", e, timeout) from e
    except (OSError, TimeoutError, UnicodeError, ValueError) as e:
        raise _failure(base, "/pairings", e, timeout) from e
    try:
        return parse_pairings(body)
    except MetricsError as e:
        raise e.at(base) from e
