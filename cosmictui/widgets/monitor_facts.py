"""The monitor's numbers panel: one relay's state, memory, traffic, pairings and DHT view.

Every state is a word plus a symbol (▲ UP, ✖ DOWN, "firewalled YES"), never only a colour, so
it reads in light and dark themes, in monochrome tmux and for colour-blind operators.
"""

from __future__ import annotations

import textwrap
import time
from typing import Any

from rich.text import Text
from textual.widgets import Static

from cosmictui.ops.metrics.client import (
    MEMORY_BUDGET_BYTES,
    STATE_BADGE,
    RelayState,
    RelayWatch,
    by_cause,
    human_bytes,
    human_duration,
)
from cosmictui.ops.metrics.forwarding import forwarding_path

STATE_STYLE = {
    RelayState.UP: "bold $success",
    RelayState.DOWN: "bold reverse $error",
    RelayState.NOT_RUNNING: "bold $warning",
    RelayState.CONNECTING: "bold $secondary",
    RelayState.METRICS_OFF: "bold $success",
    RelayState.BAD_DATA: "bold reverse $error",
    RelayState.RELAYING: "bold $success",
}

NOT_JOINED = "not joined to the DHT yet — retrying"


def short_key(key: str | None, width: int = 52) -> str:
    if not key:
        return "–"
    if len(key) <= width:
        return key
    half = max(4, (width - 1) // 2)
    return key[:half] + "…" + key[-(width - 1 - half) :]


def _rate(v: float | None, unit: str = "/s") -> str:
    if v is None:
        return "–"
    if v >= 100 or v == 0:
        return f"{v:.0f}{unit}"
    return f"{v:.1f}{unit}"


def _int(v: Any) -> str:
    return "–" if v is None else f"{int(v)}"


class _Rows:
    """Label/value lines as one Text: a Rich Table laid out the same thing at several times the
    cost, and this panel is redrawn on every refresh."""

    LABEL = 10

    def __init__(self) -> None:
        self.lines: list[Text] = []

    @property
    def row_count(self) -> int:
        return len(self.lines)

    def add_row(self, label: str, value: Text | str) -> None:
        line = Text(no_wrap=True, end="")
        line.append(f"{label:<{self.LABEL}} ", style="bold")  # the label only: values stay regular
        line.append_text(value if isinstance(value, Text) else Text(value))
        self.lines.append(line)

    def add_wrapped(self, label: str, value: str, width: int, lines: int = 2, style: str = "") -> None:
        """A value over up to `lines` rows instead of cut off at the pane's edge."""
        for i, part in enumerate(textwrap.wrap(value, width, max_lines=lines, placeholder=" …") or [value]):
            self.add_row(label if i == 0 else "", Text(part, style=style))

    def to_text(self) -> Text:
        return Text("\n", no_wrap=True, overflow="ellipsis").join(self.lines)


class RelayFacts(Static):
    """Numbers for one relay; `show(watch)` after each poll."""

    DEFAULT_CSS = """
    RelayFacts { width: 100%; height: auto; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__("", id=id, classes=classes)
        self.watch_: RelayWatch | None = None
        self.key_width = 24
        self._rows = -1

    def show(self, watch: RelayWatch, key_width: int = 24, roomy: bool = False, now: float | None = None) -> None:
        """`roomy`: blank lines between groups and the address, when the pane is tall enough."""
        self.watch_ = watch
        self.key_width = key_width
        table = self.render_facts(watch, key_width, roomy, time.time() if now is None else now)
        rows = table.row_count
        # same number of rows: same size, so skip the layout pass (it would repaint every widget)
        self.update(table.to_text(), layout=rows != self._rows)
        self._rows = rows

    def _path_row(self, t: _Rows, stats: dict[str, Any], width: int) -> None:
        """Which path carries the traffic: the kernel's share (nftables) and Python's, or why
        Python carries it all (a warning when kernel forwarding was asked for and is off)."""
        fp = forwarding_path(stats)
        if fp is None:
            return
        style = self._style("$text-warning") if fp.path == "python" and fp.asked else ""
        t.add_wrapped("path", fp.line(), width, style=style)

    def render_facts(self, w: RelayWatch, key_width: int, roomy: bool, now: float) -> _Rows:
        t = _Rows()
        badge = Text(f" {STATE_BADGE[w.state]} ", style=self._style(STATE_STYLE[w.state]))
        started = w.started_at()
        since = time.strftime("%H:%M:%S", time.localtime(w.since if started is None else started))
        width = max(20, (self.size.width or 40) - _Rows.LABEL - 2)
        suffix = f" since {since}"
        t.add_row("relay", Text.assemble(badge, suffix) if len(badge) + len(suffix) <= width else badge)
        if w.error and w.state is not RelayState.UP:
            # the reason and the next step are what the operator needs here: wrapped, not cut off
            first = "note" if w.state is RelayState.METRICS_OFF else "why"
            for label, words, lines in ((first, w.error, 4), ("next", w.fix, 4)):
                for i, part in enumerate(textwrap.wrap(words or "", width, max_lines=lines, placeholder=" …")):
                    t.add_row(label if i == 0 else "", Text(part, style=self._style("$text-warning")))
            if w.last is not None:
                seen = time.strftime("%H:%M:%S", time.localtime(w.last.wall))
                t.add_row("last seen", f"{seen} ({human_duration(now - w.last.wall)} ago)")
        t.add_row("key", short_key(w.key, key_width))
        if w.probe is not None:
            self._probe_rows(t, w, width, now)
            if w.target.key_only:
                return t  # nothing else is known about a relay known by key only
            if w.state is not RelayState.UP and w.last is None:
                # metrics off: the probe is all there is; skip a column of dashes
                pid = w.runtime.pid if w.runtime is not None and w.state is RelayState.METRICS_OFF else None
                t.add_row("uptime", f"{human_duration(w.uptime(now))}" + (f"   pid {pid}" if pid else ""))
                return t
        if roomy:
            if w.target.storage is not None and w.url is None:
                t.add_row("storage", str(w.target.storage))
            else:
                t.add_row("metrics", w.url or w.target.label)
        s = w.last if w.state is RelayState.UP else None
        pid = s.stat("pid") if s else None
        if pid is None and w.state is RelayState.METRICS_OFF and w.runtime is not None:
            pid = w.runtime.pid
        t.add_row("uptime", f"{human_duration(w.uptime(now))}" + (f"   pid {pid}" if pid else ""))
        rss = s.rss_bytes if s else None
        if rss is not None:
            pct = 100 * rss / MEMORY_BUDGET_BYTES
            over = "  OVER BUDGET" if rss > MEMORY_BUDGET_BYTES else ""
            mem = Text(f"{human_bytes(rss)} of 200 MB ({pct:.0f}%){over}")
            if over:
                mem.stylize(self._style("bold $error"))
            t.add_row("memory", mem)
        else:
            t.add_row("memory", "–")
        r = w.rates
        t.add_row("cpu", f"{r.cpu_percent:.1f}% of a core" if r else "–")
        if roomy:
            t.add_row("", "")
        t.add_row(
            "in", f"{human_bytes(r['received_bytes'], True)}  {_rate(r['received_packets'], ' pkt/s')}" if r else "–"
        )
        t.add_row("out", f"{human_bytes(r['sent_bytes'], True)}  {_rate(r['sent_packets'], ' pkt/s')}" if r else "–")
        t.add_row(
            "relayed", f"{human_bytes(r['relayed_bytes'], True)}  drop {_rate(r['dropped_packets'])}" if r else "–"
        )
        stats = s.stats if s is not None and isinstance(s.stats, dict) else {}
        self._path_row(t, stats, width)
        if s is not None and isinstance(s.stats, dict):
            # new in the relay's /stats: shown only when the relay sends them, wrapped (causes
            # are words like unknown_stream, and the pane is narrow at 80 columns)
            for block in ("dropped", "shed"):
                if block in s.stats:
                    t.add_wrapped(block, by_cause(s.stats[block]).replace(" · ", ", "), width)
        if roomy:
            t.add_row("", "")
        g = s.get if s else (lambda name, default=None: None)
        active, pending = _int(g("blind_relay_pairings_active")), _int(g("blind_relay_pairings_pending"))
        t.add_row("pairings", f"{active} active  {pending} pending")
        matched = _rate(r["pairings_matched"] if r else None)
        cancelled = _rate(r["pairings_cancelled"] if r else None)
        t.add_row("", f"{matched} matched {cancelled} cancelled")
        opened, closed = g("blind_relay_sessions_opened"), g("blind_relay_sessions_closed")
        sessions = f"{int(opened - closed)} open" if opened is not None and closed is not None else "–"
        errors = g("blind_relay_streams_errors")
        new_errors = r["streams_errors"] if r else 0.0
        err = Text(f"{_int(errors)} stream errors" + (f" +{_rate(new_errors)}" if new_errors else ""))
        if new_errors:
            err.stylize(self._style("bold $error"))
        t.add_row("sessions", Text.assemble(f"{sessions}  ", err))
        if roomy:
            t.add_row("", "")
        dht = s.stat("dht") if s else None
        if isinstance(dht, dict):
            joined = dht.get("bootstrapped")
            if joined is False:  # the relay says so itself: it keeps trying, nothing to do yet
                t.add_wrapped("dht", NOT_JOINED, width, style=self._style("$text-warning"))
            else:
                t.add_row("dht", "bootstrapped ✓" if joined else "NOT bootstrapped ✗")
            if "firewalled" not in dht:  # read through Prometheus: it has the join and the nodes only
                t.add_row("", f"{_int(dht.get('nodes'))} nodes")
                return self._totals(t, s, g, roomy)
            t.add_row("firewall", "firewalled ✗ (unreachable)" if dht.get("firewalled") else "open ✓ (reachable)")
            host, port = dht.get("public_host"), dht.get("public_port")
            t.add_row("public", f"{host}:{port}" if host else "unknown (not seen yet)")
            ann = dht.get("last_announce")
            when = f"{human_duration(now - ann)} ago" if isinstance(ann, int | float) else "never"
            t.add_row("announced", f"{when} · {_int(dht.get('nodes'))} nodes")
        else:
            t.add_row("dht", "–")
        return self._totals(t, s, g, roomy)

    def _totals(self, t: _Rows, s: Any, g: Any, roomy: bool) -> _Rows:
        """A tall pane's totals since the relay started, its limits, storage and version."""
        if roomy and s is not None:
            # a tall pane has room for the totals since the relay started
            t.add_row("", "")
            relayed = g("blind_relay_relayed_bytes_total")
            t.add_row("total", f"{human_bytes(relayed)} relayed in {_int(g('blind_relay_relayed_packets_total'))} pkts")
            t.add_row("", f"{_int(g('blind_relay_dropped_packets_total'))} packets dropped")
            matched_total, cancelled_total = g("blind_relay_pairings_matched"), g("blind_relay_pairings_cancelled")
            t.add_row("", f"{_int(matched_total)} pairs matched, {_int(cancelled_total)} cancelled")
            t.add_row(
                "",
                f"{_int(g('blind_relay_sessions_accepted'))} sessions, {_int(g('blind_relay_streams_opened'))} streams",
            )
            rejected = g("blind_relay_limit_rejections_total")
            if rejected is not None:
                t.add_row("limits", f"{int(rejected)} requests refused by limits")
            version, storage = s.stat("version"), s.stat("storage")
            if storage:
                t.add_row("storage", str(storage))
            if version:
                t.add_row("version", str(version))
        return t

    def _probe_rows(self, t: _Rows, w: RelayWatch, width: int, now: float) -> None:
        """Latest round trip, the relay address it went through, counts, and the last failure
        with its stage and reason (unless the why row above already says it)."""
        p = w.probe
        assert p is not None
        if p.last is None:
            t.add_row("probe", p.stopped or "probing… (first probe under way)")
        elif p.last.ok:
            rtt = p.latest_rtt_ms
            t.add_row("probe", Text(f"✓ {rtt:.1f} ms round trip" if rtt is not None else "✓ relayed"))
        else:
            t.add_row("probe", Text("✖ FAILED", style=self._style("bold reverse $error")))
        t.add_row("via", p.relay_address or "–")
        if p.last is not None:
            at = time.strftime("%H:%M:%S", time.localtime(p.last.at))
            t.add_row("samples", f"{p.ok_count} ok · {p.failed_count} failed · {at}")
        f = p.last_failure
        if f is not None and not (w.error and f.text in w.error):
            at = time.strftime("%H:%M:%S", time.localtime(f.at))
            style = "$text-error" if p.last is not None and not p.last.ok else "$text-warning"
            words = f"{at} {f.text}"
            for i, part in enumerate(textwrap.wrap(words, width, max_lines=3, placeholder=" …")):
                t.add_row("failed" if i == 0 else "", Text(part, style=self._style(style)))

    def _style(self, style: str) -> str:
        """Resolve `$variable` colours from the app theme into a Rich style."""
        variables = self.app.theme_variables
        parts = []
        for word in style.split():
            if word.startswith("$"):
                parts.append(variables.get(word[1:], "default"))
            else:
                parts.append(word)
        return " ".join(parts)
