"""One row per relay plus a summary line, for `cosmictui monitor --metrics A --metrics B`.

CosmicAC's relays value is an array and operators run more than one relay; this table is the
"all of them at a glance" row, the rest of the screen details the highlighted one.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from cosmictui.ops.metrics import STATE_BADGE, RelayState, RelayWatch, human_bytes, human_duration, summarize
from cosmictui.widgets.monitor_facts import short_key

COLUMNS = ("state", "relay", "key", "uptime", "memory", "cpu", "in", "out", "pairs", "errors")


class RelayTable(DataTable[Text | str]):
    """Rows are relays, keyed by their index in the monitor's watch list."""

    DEFAULT_CSS = """
    RelayTable { height: auto; max-height: 10; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        for c in COLUMNS:
            self.add_column(c, key=c)

    def show(self, watches: list[RelayWatch], now: float) -> None:
        for i, w in enumerate(watches):
            row = self._row(w, now)
            key = str(i)
            if key in self.rows:
                for col, value in zip(COLUMNS, row, strict=True):
                    self.update_cell(key, col, value)
            else:
                self.add_row(*row, key=key)

    @staticmethod
    def _row(w: RelayWatch, now: float) -> tuple[Text | str, ...]:
        state = Text(STATE_BADGE[w.state])
        if w.state is not RelayState.UP:
            state.stylize("bold reverse")
        s = w.last if w.state is RelayState.UP else None
        r = w.rates
        return (
            state,
            w.target.label,
            short_key(w.key, 12),
            human_duration(w.uptime(now)),
            human_bytes(s.rss_bytes) if s else "–",
            f"{r.cpu_percent:.1f}%" if r else "–",
            human_bytes(r["received_bytes"], True) if r else "–",
            human_bytes(r["sent_bytes"], True) if r else "–",
            f"{int(s.get('blind_relay_pairings_active', 0) or 0)}" if s else "–",
            f"{int(s.get('blind_relay_streams_errors', 0) or 0)}" if s else "–",
        )


def summary_line(watches: list[RelayWatch]) -> str:
    s = summarize(watches)
    down = int(s["relays"] - s["up"])
    head = f"{int(s['up'])} of {int(s['relays'])} relays up" + (f", {down} NOT answering" if down else "")
    return (
        f"{head}  ·  memory {human_bytes(s['rss_bytes'])}  ·  in {human_bytes(s['in_bps'], True)}"
        f"  out {human_bytes(s['out_bps'], True)}  ·  {int(s['pairings_active'])} pairs active,"
        f" {int(s['pairings_pending'])} pending  ·  {int(s['streams_errors'])} stream errors"
    )
