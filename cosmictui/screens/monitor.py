"""The relay monitor: is it alive, how much memory and traffic, how many pairs, what the DHT sees.

Made for a tmux pane. At 80 columns it shows the numbers beside a memory graph (with the
200 MB budget drawn on it) and a traffic graph; from 120 columns it adds CPU and packet graphs
and a longer log. Polling runs in a worker with one task per relay, so a relay that hangs never
holds up another's row; every scrape has a deadline and runs on the event loop (no thread), so
quitting never waits for one. A relay without metrics (started with `--metrics off`, or known
only by `--relay-key`) is probed instead, in its own task too: its graph is the probe's round
trip over time, and a failed probe is a row state, never an exception. After a while with
nothing changing the refresh slows (up to 4×, at most 5 s) and snaps back on activity.
Pointed at a Prometheus server (`prometheus=URL`) it also shows every relay that server scrapes,
in the same table, read in one task with one deadline (ops.metrics.prometheus.PrometheusWatch);
one line under the status says what the server knows, or why it cannot be read and the fix.
Used standalone by `cosmictui monitor` and pushed by the wizard.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.css.query import NoMatches
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Log, Static

from cosmictui.ops.metrics.client import (
    MEMORY_BUDGET_BYTES,
    RUNNING,
    STATE_BADGE,
    LogTail,
    RelayState,
    RelayWatch,
    Target,
)
from cosmictui.widgets.monitor_facts import RelayFacts, short_key
from cosmictui.widgets.monitor_graphs import COUNT_UNITS, RATE_UNITS, Series, TimePlot
from cosmictui.widgets.monitor_relays import RelayTable, summary_line

if TYPE_CHECKING:
    from cosmictui.ops.metrics.probewatch import ProbeWatch
    from cosmictui.ops.metrics.prometheus import PrometheusWatch

INTERVAL_STEPS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
QUIET_POLLS_PER_SLOWDOWN = 5
MAX_SLOWDOWN = 4
MAX_IDLE_INTERVAL = 5.0


def effective_interval(interval: float, quiet_polls: int) -> float:
    """The refresh actually used: slower while nothing changes, never slower than 4× or 5 s
    (unless the operator asked for more), so a relay dying is still seen within seconds."""
    factor = min(MAX_SLOWDOWN, 2 ** (quiet_polls // QUIET_POLLS_PER_SLOWDOWN))
    return max(interval, min(interval * factor, MAX_IDLE_INTERVAL))


class MonitorScreen(Screen[None]):
    """Live view of one or more relays."""

    CSS_PATH = "monitor.tcss"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]  # noqa: RUF012 (typed by Textual)
    VERTICAL_BREAKPOINTS = [(0, "-short"), (36, "-tall")]  # noqa: RUF012 (typed by Textual)

    # What must stay in view on a narrow pane comes first (the footer cuts at its right edge):
    # at 60 columns "q Quit" was past it. Alone (`cosmictui monitor`) q quits; pushed by the wizard
    # it is one of the wizard's screens, so q (and esc) go back to the wizard, which goes on.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("q", "close", "Back"),
        Binding("escape", "close", "Back", show=False),
        Binding("l", "toggle_log", "Log"),
        Binding("p", "pause", "Pause"),
        Binding("r", "refresh_now", "Refresh"),
        Binding("t", "toggle_theme", "Theme"),
        Binding("plus,equals_sign", "slower", "Slower"),
        Binding("minus,underscore", "faster", "Faster"),
    ]

    interval: reactive[float] = reactive(1.0)
    paused: reactive[bool] = reactive(False)
    selected: reactive[int] = reactive(0)

    def __init__(
        self,
        targets: list[Target],
        interval: float = 1.0,
        standalone: bool = False,
        *,
        autopoll: bool = True,
        clock: Callable[[], float] = time.time,
        scrape_timeout: float | None = None,
        bootstrap: list[str] | None = None,
        probe_interval: float | None = None,
        probe_metrics_off: bool = True,
        prometheus: str | None = None,
        start_fix: str | None = None,
        name: str | None = None,
    ) -> None:
        """`autopoll=False` and `clock` let snapshot tests and screenshots draw fixed data;
        `scrape_timeout` overrides the deadline derived from the interval. `bootstrap` is the
        DHT the probes join (default: the public one); `probe_metrics_off` probes a local relay
        running with metrics off by the key in its runtime file. `prometheus`: also every relay
        that Prometheus server scrapes (then `targets` may be empty). `start_fix`: how a relay that
        is not running is started, said instead of a `blind-relay` command (the wizard's step 2)."""
        super().__init__(name=name)
        self.bootstrap = bootstrap
        self.probe_interval = probe_interval
        self.probe_metrics_off = probe_metrics_off
        self._tg: asyncio.TaskGroup | None = None
        self.scrape_timeout = scrape_timeout
        self.autopoll = autopoll
        self.clock = clock
        self.prometheus: PrometheusWatch | None = None
        if prometheus is not None:
            from cosmictui.ops.metrics.prometheus import PrometheusWatch

            self.prometheus = PrometheusWatch(prometheus)
        if not targets and self.prometheus is None:
            raise ValueError("the monitor needs at least one relay to watch")
        self.watches = [RelayWatch(t, start_fix=start_fix) for t in targets]
        self.tails = [LogTail(t.log_path()) for t in targets]
        self.standalone = standalone
        self._quiet = [0] * len(self.watches)
        self.polls = 0
        """scrapes done, all relays together"""
        self.relay_polls = [0] * len(self.watches)
        """scrapes done, per relay"""
        self.last_poll: float | None = None
        self._plotted_at = 0.0
        self._wakes = [asyncio.Event() for _ in self.watches]
        self._prometheus_wake = asyncio.Event()
        self.set_reactive(MonitorScreen.interval, interval)

    # -- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static("", id="status", markup=False)
        prom_line = Static("", id="prometheus", markup=False)
        prom_line.display = self.prometheus is not None
        yield prom_line
        multi = self.multi
        table = RelayTable(id="relays")
        table.display = multi
        yield table
        summary = Static("", id="summary", markup=False)
        summary.display = multi
        yield summary
        with Horizontal(id="body"):
            with VerticalScroll(id="facts-pane"):
                yield RelayFacts(id="facts")
            with Grid(id="graphs"):
                yield TimePlot(
                    "memory",
                    unit="MB",
                    floor=1.0,
                    limit=MEMORY_BUDGET_BYTES / 1e6,
                    limit_label="200 MB budget",
                    id="plot-memory",
                    classes="metric-plot",
                )
                yield TimePlot("traffic", units=RATE_UNITS, floor=1000.0, id="plot-traffic", classes="metric-plot")
                yield TimePlot("cpu", unit="% of a core", floor=5.0, id="plot-cpu", classes="wide-only metric-plot")
                yield TimePlot(
                    "packets", units=COUNT_UNITS, floor=10.0, id="plot-packets", classes="wide-only metric-plot"
                )
                yield TimePlot("probe round trip", unit="ms", floor=1.0, id="plot-probe")
        yield Log(id="log", max_lines=500, auto_scroll=True)
        # No "^p palette" entry: pushed from the wizard (which has the palette) it took the room
        # "q Quit" needs at 80 columns; ctrl+p still opens it.
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self._fit_footer()
        self.set_class(self.multi, "-multi")
        self.query_one("#facts-pane").border_title = "relay"
        log = self.query_one("#log", Log)
        log.border_title = "log"
        self._render_status()
        if self.autopoll:
            self.poll_loop()

    @property
    def multi(self) -> bool:
        """The table of relays is shown: several relays, or a Prometheus server's (however many)."""
        return len(self.watches) > 1 or self.prometheus is not None

    # -- polling --------------------------------------------------------------------------------
    @property
    def quiet_polls(self) -> int:
        """Polls in a row that brought no news, for the idle slowdown (the least quiet relay's)."""
        return min(self._quiet, default=0)

    @quiet_polls.setter
    def quiet_polls(self, value: int) -> None:
        self._quiet = [value] * len(self.watches)

    @property
    def timeout(self) -> float:
        """Deadline of one scrape. Generous: a relay slow to answer on a loaded box is not down;
        a hung one is DOWN ("timed out after N s") when it passes."""
        return self.scrape_timeout or max(2.0, min(self.interval, 5.0))

    @work(exclusive=True, group="monitor-poll")
    async def poll_loop(self) -> None:
        # cancelling the worker (quit, Back) cancels every relay's task with it
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            for i, w in enumerate(self.watches):
                if w.target.key_only:
                    self.start_probe(i)
                tg.create_task(self._follow(i))
            if self.prometheus is not None:
                tg.create_task(self._follow_prometheus(self.prometheus))

    def start_probe(self, i: int) -> ProbeWatch | None:
        """Probe relay `i` by its key in a task of its own (beside its polling), so a probe
        stuck on the DHT holds up nothing and is cancelled with the worker on quit."""
        w = self.watches[i]
        if w.probe is not None or self._tg is None or not w.key:
            return w.probe
        from cosmictui.ops.metrics.probewatch import PROBE_INTERVAL, ProbeWatch

        w.probe = ProbeWatch(w.key, self.bootstrap, interval=self.probe_interval or PROBE_INTERVAL)
        self._tg.create_task(w.probe.follow(lambda _p: self._probe_landed(i)))
        return w.probe

    def _probe_landed(self, i: int) -> None:
        w = self.watches[i]
        if w.target.key_only:
            self._quiet[i] = 0 if w.observe_probe(time.time()) else self._quiet[i]
        self._redraw(i, force_plots=True)

    async def _follow(self, i: int) -> None:
        """One relay's own loop: its scrape, then its own wait; no relay waits for another."""
        while True:
            if not self.paused:
                await self.poll_relay(i)
            w = self.watches[i]
            if self.probe_metrics_off and w.probe is None and w.state is RelayState.METRICS_OFF:
                self.start_probe(i)
            delay = effective_interval(self.interval, self.quiet_polls)
            self._wakes[i].clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakes[i].wait(), timeout=delay)

    async def _follow_prometheus(self, prom: PrometheusWatch) -> None:
        """The Prometheus server's own loop: all its relays in one read under one deadline, so a
        slow or hostile server costs its own rows nothing more than staying as they were."""
        while True:
            if not self.paused:
                await self.poll_prometheus(prom)
            delay = effective_interval(self.interval, self.quiet_polls)
            self._prometheus_wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._prometheus_wake.wait(), timeout=delay)

    async def poll_prometheus(self, prom: PrometheusWatch) -> bool:
        """Read the server once, take in relays it names for the first time, redraw."""
        try:
            changed = await prom.poll(self.timeout)
        except Exception as e:  # a bug here must cost the Prometheus rows, never the monitor
            from cosmictui.ops.metrics.prometheus import PrometheusError

            changed = prom.observe_failure(
                PrometheusError(
                    f"monitor error: {e!r}"[:200], "restart cosmictui monitor (or watch the relays with --metrics)"
                ),
                time.time(),
            )
        first = not self.watches
        shown = {id(w) for w in self.watches}
        for w in prom.watches:
            if id(w) not in shown:
                self._adopt(w)
        theirs = {id(w) for w in prom.watches}
        for i, w in enumerate(self.watches):
            if id(w) in theirs:
                self._quiet[i] = 0 if changed else self._quiet[i] + 1
                self.relay_polls[i] += 1
        self.polls += 1
        self.last_poll = self.clock()
        with contextlib.suppress(NoMatches):
            if first and self.watches:
                self.refresh_view()
            elif self.watches:
                self._redraw(self.selected)
            else:
                self._render_status()
        return changed

    def _adopt(self, w: RelayWatch) -> None:
        """A relay the Prometheus server named for the first time: a new row, at the end."""
        self.watches.append(w)
        self.tails.append(LogTail(None))
        self._quiet.append(0)
        self.relay_polls.append(0)
        self._wakes.append(asyncio.Event())

    async def poll_once(self) -> bool:
        """Scrape every relay once (side by side, each redrawn as it lands); True on any news."""
        return any(await asyncio.gather(*(self.poll_relay(i) for i in range(len(self.watches)))))

    async def poll_relay(self, i: int) -> bool:
        """Scrape relay `i` and redraw what it changed; True when it has news."""
        w = self.watches[i]
        try:
            changed = await w.poll(self.timeout)
        except Exception as e:  # a bug here must cost one relay its row, never the monitor
            changed = w.observe_failure(f"monitor error: {e!r}"[:200], time.time())
        self._quiet[i] = 0 if changed else self._quiet[i] + 1
        self.polls += 1
        self.relay_polls[i] += 1
        self.last_poll = self.clock()
        self._redraw(i)
        return changed

    def _redraw(self, i: int, force_plots: bool = False) -> None:
        # dismissed (Back in the wizard) while the scrape was in flight: its widgets are already
        # gone, and cancelling the worker is under way
        with contextlib.suppress(NoMatches):
            if i == self.selected:
                self.refresh_view(force_plots=force_plots)
            else:
                self._refresh_table()
                self._render_status()

    # -- drawing --------------------------------------------------------------------------------
    def refresh_view(self, force_plots: bool = True) -> None:
        """Redraw from the watches. Plots are skipped (unless forced) while less time has passed
        than one braille dot of the x axis covers: the picture could not change, and plotting is
        most of the monitor's CPU."""
        wide = self.has_class("-wide")
        self._refresh_table()
        if not self.watches:  # a Prometheus server that named no relay (yet): its line says why
            self.query_one(RelayFacts).update("no relay yet: see the Prometheus line above")
            self._render_status()
            return
        w = self.watches[self.selected]
        facts_pane = self.query_one("#facts-pane")
        now = self.clock()
        roomy = facts_pane.size.height >= 24
        self.query_one(RelayFacts).show(w, key_width=52 if wide else 24, roomy=roomy, now=now)
        memory_plot = self.query_one("#plot-memory", TimePlot)
        dot_seconds = memory_plot.window / max(1, 2 * (memory_plot.size.width - 6))
        if force_plots or now - self._plotted_at >= dot_seconds * 0.95:
            self._plotted_at = now
            self._draw_plots(w, now, wide)
        self._render_log()
        self._render_status()

    def _refresh_table(self) -> None:
        if self.multi:
            self.query_one(RelayTable).show(self.watches, self.clock(), compact=not self.has_class("-wide"))
            self.query_one("#summary", Static).update(summary_line(self.watches), layout=False)

    def _draw_plots(self, w: RelayWatch, now: float, wide: bool) -> None:
        probe_only = w.probe is not None and w.state is not RelayState.UP
        self.set_class(probe_only, "-probe-only")
        if w.probe is not None:
            p = w.probe
            series = [Series("rtt", list(p.rtt), "in")]
            if p.failed_at:
                series.append(Series("failed", [(t, 0.0) for t in p.failed_at], "out"))
            self.query_one("#plot-probe", TimePlot).show(series, now)
        if probe_only:
            return
        h = w.history
        self.query_one("#plot-memory", TimePlot).show([Series("rss", h["rss_mb"], "rss")], now)
        traffic = [Series("in", h["in_bps"], "in"), Series("out", h["out_bps"], "out")]
        if wide:
            traffic.append(Series("relayed", h["relayed_bps"], "relayed"))
        self.query_one("#plot-traffic", TimePlot).show(traffic, now)
        if wide:
            self.query_one("#plot-cpu", TimePlot).show([Series("cpu", h["cpu_percent"], "cpu")], now)
            pk = [Series("in", h["in_pps"], "in"), Series("out", h["out_pps"], "out")]
            self.query_one("#plot-packets", TimePlot).show(pk, now)

    def _render_log(self) -> None:
        tail = self.tails[self.selected]
        if tail.path is None:
            w = self.watches[self.selected]
            tail.path = w.target.log_path(w.last.stats if w.last else None)
        lines, changed = tail.read()
        log = self.query_one("#log", Log)
        subtitle = str(tail.path) if tail.path else "no log file known"
        if log.border_subtitle != subtitle:  # setting it, even to the same text, repaints everything
            log.border_subtitle = subtitle
        if changed:
            log.clear()
            log.write_lines(lines[-200:] if lines else [f"(no log at {tail.path})" if tail.path else "(no log)"])

    def _render_status(self) -> None:
        if self.prometheus is not None:
            line = self.query_one("#prometheus", Static)
            text = self.prometheus.line()
            if str(line.content) != text:  # it wraps: a new text may need another row
                line.update(text)
            line.set_class(self.prometheus.error is not None, "-error")
        status = self.query_one("#status", Static)
        if not self.watches:
            assert self.prometheus is not None
            status.update(f"{STATE_BADGE[RelayState.CONNECTING]}  relays of {self.prometheus.url}", layout=False)
            return
        w = self.watches[self.selected]
        eff = effective_interval(self.interval, self.quiet_polls)
        refresh = "PAUSED" if self.paused else f"refresh {_secs(self.interval)}"
        if eff > self.interval and not self.paused:
            refresh += f" (idle {_secs(eff)})"
        which = f"relay {self.selected + 1}/{len(self.watches)}" if len(self.watches) > 1 else "relay"
        parts = [f"{STATE_BADGE[w.state]}  {which} {short_key(w.key, 16)}", refresh]
        if self.last_poll:
            parts.append(time.strftime("%H:%M:%S", time.localtime(self.last_poll)))
        if self.has_class("-wide"):
            parts.insert(0, "cosmictui monitor")
        status.update("  ·  ".join(parts), layout=False)
        status.set_class(w.state not in RUNNING, "-down")

    # -- reactions ------------------------------------------------------------------------------
    def watch_paused(self) -> None:
        if self.is_mounted:
            self._render_status()

    def watch_interval(self) -> None:
        if self.is_mounted:
            self._render_status()

    def watch_selected(self) -> None:
        if self.is_mounted and self.watches:
            self.tails[self.selected]._sig = None  # force the log to load
            self.refresh_view()

    @on(DataTable.RowHighlighted, "#relays")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self.selected = int(event.row_key.value)

    def on_resize(self) -> None:
        self._fit_footer()
        self.call_after_refresh(self._refresh_if_present)

    def _fit_footer(self) -> None:
        """Below 80 columns the footer drops its padding (as the wizard's does): q Quit stays in view."""
        with contextlib.suppress(NoMatches):
            footer = self.query_one(Footer)
            if footer.compact != (self.app.size.width < 80):
                footer.compact = self.app.size.width < 80

    def _refresh_if_present(self) -> None:
        with contextlib.suppress(NoMatches):
            self.refresh_view()

    def on_unmount(self) -> None:
        self.workers.cancel_node(self)  # stop polling once the screen is gone

    # -- actions --------------------------------------------------------------------------------
    def action_slower(self) -> None:
        self.interval = next((s for s in INTERVAL_STEPS if s > self.interval), INTERVAL_STEPS[-1])
        self.quiet_polls = 0
        self._wake_all()

    def action_faster(self) -> None:
        self.interval = next((s for s in reversed(INTERVAL_STEPS) if s < self.interval), INTERVAL_STEPS[0])
        self.quiet_polls = 0
        self._wake_all()

    def action_refresh_now(self) -> None:
        self.quiet_polls = 0
        self._wake_all()

    def action_pause(self) -> None:
        self.paused = not self.paused
        self._wake_all()

    def action_toggle_theme(self) -> None:
        self.app.theme = "textual-light" if self.app.current_theme.dark else "textual-dark"
        self.call_after_refresh(self._refresh_if_present)

    def action_toggle_log(self) -> None:
        log = self.query_one("#log", Log)
        log.display = not log.display
        log.styles.display = "block" if log.display else "none"  # an inline style beats the -multi rule

    def action_quit(self) -> None:
        self.app.exit()

    def action_close(self) -> None:
        self.dismiss()

    def _wake_all(self) -> None:
        for wake in self._wakes:
            wake.set()
        self._prometheus_wake.set()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "quit":
            return self.standalone
        if action == "close":
            return not self.standalone  # standalone: q quits, Back makes no sense
        return True


def _secs(s: float) -> str:
    return f"{s:g}s"
