"""One row per relay plus a summary line, for `cosmictui monitor --metrics A --metrics B` (or
`--prometheus URL`: a row for every relay that server scrapes, added as it names them).

CosmicAC's relays value is an array and operators run more than one relay; this table is the
"all of them at a glance" row, the rest of the screen details the highlighted one. Below 120
columns it drops the key, uptime and error columns so the rest fits 80 columns.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from cosmictui.ops.metrics.client import RUNNING, RelayState, RelayWatch, human_bytes, human_duration, summarize
from cosmictui.widgets.monitor_facts import short_key

COLUMNS = ("state", "relay", "key", "uptime", "memory", "cpu", "in", "out", "pairs", "errors")
COMPACT = ("state", "relay", "memory", "cpu", "in", "out", "pairs")
WIDTHS = {"state": 9, "relay": 16, "key": 13, "uptime": 9, "memory": 8, "cpu": 6, "in": 10, "out": 10}
TABLE_BADGE = {
    RelayState.UP: "▲ UP",
    RelayState.DOWN: "✖ DOWN",
    RelayState.NOT_RUNNING: "■ STOPPED",
    RelayState.CONNECTING: "… wait",
    RelayState.METRICS_OFF: "▲ RUNNING",
    RelayState.BAD_DATA: "✖ BAD",
    RelayState.RELAYING: "▲ RELAYS",
}


class RelayTable(DataTable[Text | str]):
    """Rows are relays, keyed by their index in the monitor's watch list."""

    DEFAULT_CSS = """
    RelayTable { height: auto; max-height: 10; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        self.compact: bool | None = None

    def show(self, watches: list[RelayWatch], now: float, compact: bool = False) -> None:
        if compact != self.compact:
            cursor = self.cursor_row
            self.clear(columns=True)
            self.compact = compact
            for c in COMPACT if compact else COLUMNS:
                self.add_column(c, key=c, width=WIDTHS.get(c) if compact else None)
            for i, w in enumerate(watches):
                self.add_row(*self._row(w, now).values(), key=str(i))
            self.move_cursor(row=cursor)
            return
        for i, w in enumerate(watches):
            if i >= self.row_count:  # a relay a Prometheus server named for the first time
                self.add_row(*self._row(w, now).values(), key=str(i))
                continue
            for col, value in self._row(w, now).items():
                self.update_cell(str(i), col, value)

    def _row(self, w: RelayWatch, now: float) -> dict[str, Text | str]:
        state = Text(TABLE_BADGE[w.state])
        if w.state not in RUNNING:
            state.stylize("bold reverse")
        s = w.last if w.state is RelayState.UP else None
        r = w.rates
        label = w.target.short_label
        if self.compact and len(label) > WIDTHS["relay"]:
            label = "…" + label[-(WIDTHS["relay"] - 1) :]
        probe = w.probe.summary() if w.probe is not None and s is None else None
        row: dict[str, Text | str] = {
            "state": state,
            "relay": label,
            "key": short_key(w.key, 12),
            "uptime": human_duration(w.uptime(now)),
            "memory": human_bytes(s.rss_bytes) if s else "–",
            # no metrics: the probe's round trip (or its failed stage) where the traffic would be
            "in": probe or (human_bytes(r["received_bytes"], True) if r else "–"),
            "cpu": f"{r.cpu_percent:.1f}%" if r else "–",
            "out": human_bytes(r["sent_bytes"], True) if r else "–",
            "pairs": f"{int(s.get('blind_relay_pairings_active', 0) or 0)}" if s else "–",
            "errors": f"{int(s.get('blind_relay_streams_errors', 0) or 0)}" if s else "–",
        }
        cols = COMPACT if self.compact else COLUMNS
        return {c: row[c] for c in cols}


def summary_line(watches: list[RelayWatch]) -> str:
    s = summarize(watches)
    down = int(s["relays"] - s["up"])
    head = f"{int(s['up'])} of {int(s['relays'])} relays up" + (f", {down} NOT answering" if down else "")
    return (
        f"{head}  ·  memory {human_bytes(s['rss_bytes'])}  ·  in {human_bytes(s['in_bps'], True)}"
        f"  out {human_bytes(s['out_bps'], True)}  ·  {int(s['pairings_active'])} pairs active,"
        f" {int(s['pairings_pending'])} pending  ·  {int(s['streams_errors'])} stream errors"
    )
