"""Test helpers for the sans-IO cores: input, then every event it queued (as `relay.core.Driver`
drains them), so a test can compare the events of one input."""

from __future__ import annotations

from typing import Any

from relay.core import drain_events


def fed(core: Any, data: bytes | bytearray | memoryview, now: float = 0.0) -> list[Any]:
    """`core.receive(data, now)`, then its events."""
    core.receive(data, now)
    return drain_events(core)


def closed(core: Any) -> list[Any]:
    """`core.connection_closed()`, then its events."""
    core.connection_closed()
    return drain_events(core)
