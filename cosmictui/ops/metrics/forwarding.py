"""Which path carries a relay's traffic: nftables in the kernel, or the relay's Python loop.

Read from `/stats`: `kernel` (enabled, directions, or why off) and `traffic` (relayed_bytes and
kernel_bytes, the share nftables carried). One reading for the monitor and `relay status --json`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

NOT_ASKED = "not asked"


@dataclass(frozen=True)
class ForwardingPath:
    path: Literal["kernel", "python"]
    #: share of the relayed bytes nftables carried (0..1); None before anything was relayed
    kernel_share: float | None
    #: pair directions in the kernel now
    directions: int | None
    #: why kernel forwarding is off (None when on)
    reason: str | None

    @property
    def asked(self) -> bool:
        """Whether kernel forwarding was asked for (off because unavailable, or on)."""
        return self.path == "kernel" or not (self.reason or "").startswith(NOT_ASKED)

    def line(self) -> str:
        """One line for people: the path and its share, or why Python carries it all."""
        if self.path == "kernel":
            ways = f" · {self.directions} ways now" if self.directions is not None else ""
            if self.kernel_share is None:
                return f"kernel forwarding on, nothing relayed yet{ways}"
            k = min(100.0, 100 * self.kernel_share)
            return f"kernel {k:.0f}% · Python {100 - k:.0f}% of relayed bytes{ways}"
        if not self.asked:
            return "Python only (started without --kernel-forwarding)"
        return f"Python (kernel forwarding off: {self.reason or 'no reason given'})"

    def as_json(self) -> dict[str, Any]:
        share = self.kernel_share
        return {
            "path": self.path,
            "kernel_share": None if share is None else round(min(1.0, share), 4),
            "python_share": None if share is None else round(1 - min(1.0, share), 4),
            "kernel_directions": self.directions,
            "reason": self.reason,
        }


def _number(v: Any) -> float | None:
    """A finite, non-negative count, else None (a hostile or odd /stats shows nothing)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        return None
    return float(v)


def forwarding_path(stats: Any) -> ForwardingPath | None:
    """The path from a `/stats` document; None when it says nothing usable (an older relay)."""
    if not isinstance(stats, dict):
        return None
    kernel = stats.get("kernel")
    if not isinstance(kernel, dict):
        return None
    traffic = stats.get("traffic")
    tr = traffic if isinstance(traffic, dict) else {}
    ways = kernel.get("directions")
    directions = ways if isinstance(ways, int) and not isinstance(ways, bool) else None
    if kernel.get("enabled") is True:
        rel, kb = _number(tr.get("relayed_bytes")), _number(tr.get("kernel_bytes"))
        share = kb / rel if rel is not None and kb is not None and rel > 0 else None
        return ForwardingPath("kernel", share, directions, None)
    reason = kernel.get("reason")
    share = 0.0 if (_number(tr.get("relayed_bytes")) or 0) > 0 else None
    return ForwardingPath("python", share, None, reason if isinstance(reason, str) else None)
