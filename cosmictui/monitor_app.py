"""`cosmictui monitor`: the monitor screen as its own small app, for a tmux pane."""

from __future__ import annotations

from textual.app import App

from cosmictui.ops.metrics.client import Target
from cosmictui.screens.monitor import MonitorScreen


class MonitorApp(App[None]):
    """Just the monitor; q quits."""

    TITLE = "cosmictui monitor"
    ENABLE_COMMAND_PALETTE = False

    def __init__(
        self,
        targets: list[Target],
        interval: float = 1.0,
        theme: str | None = None,
        scrape_timeout: float | None = None,
        bootstrap: list[str] | None = None,
        probe_interval: float | None = None,
        prometheus: str | None = None,
    ) -> None:
        super().__init__()
        self.prometheus = prometheus
        self.bootstrap = bootstrap
        self.probe_interval = probe_interval
        self.targets = targets
        self.interval = interval
        self.scrape_timeout = scrape_timeout
        if theme is not None:
            self.theme = theme

    def on_mount(self) -> None:
        self.push_screen(
            MonitorScreen(
                self.targets,
                self.interval,
                standalone=True,
                scrape_timeout=self.scrape_timeout,
                bootstrap=self.bootstrap,
                probe_interval=self.probe_interval,
                prometheus=self.prometheus,
            )
        )
