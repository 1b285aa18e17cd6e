"""The setup wizard App and `main_wizard`, which `cosmictui` (no subcommand) calls."""

from __future__ import annotations

import sys
from pathlib import Path, PurePath
from typing import Any, ClassVar

from textual.app import App
from textual.binding import Binding

from cosmictui.ops.config import ConfigError, load_settings
from cosmictui.screens.context import WizardContext
from cosmictui.screens.wizard import WizardScreen


class WizardApp(App[int]):
    """Takes an operator from "jobs are stuck in Creating" to "new jobs leave Creating"."""

    TITLE = "cosmictui"
    CSS_PATH: ClassVar[list[str | PurePath]] = ["app.tcss", "screens/wizard.tcss"]
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", show=False, priority=True)]  # noqa: RUF012

    def __init__(self, ctx: WizardContext) -> None:
        super().__init__()
        self.ctx = ctx

    def on_mount(self) -> None:
        self.push_screen(WizardScreen(self.ctx))

    def open_monitor(self) -> None:
        """Push the relay monitor (owned by the monitor engineer) for the wizard's relay."""
        try:
            from cosmictui.ops.metrics import Target
            from cosmictui.screens.monitor import MonitorScreen
        except ImportError:
            self.notify("The monitor is not available in this build.", severity="warning")
            return
        storage = self.ctx.relay_storage
        target = (
            Target(storage=Path(storage).expanduser().absolute())
            if storage
            else Target(metrics=self.ctx.settings.metrics_url)
        )
        self.push_screen(MonitorScreen([target]))

    async def on_unmount(self) -> None:
        await self.ctx.close()


def make_context(deployment: str | None, demo: bool, config: str | None, **overrides: Any) -> WizardContext:
    """Settings for a real deployment, or a fresh demo sandbox when none is given.

    A deployment counts as given on the command line or in the config file.
    """
    if not demo:
        settings = load_settings(config, deployment=deployment, **overrides)
        from_config = settings.config_path is not None and settings.deployment not in ("", ".")
        if deployment is not None or from_config:
            return WizardContext(settings)
    from cosmictui.ops.sandbox import create_sandbox

    sandbox = create_sandbox()
    return WizardContext(sandbox.settings.with_overrides(**overrides), demo=sandbox)


def main_wizard(deployment: str | None, demo: bool, config: str | None) -> int:
    """Run the wizard; no deployment given means the demo sandbox. Returns the exit code."""
    try:
        ctx = make_context(deployment, demo, config)
    except ConfigError as e:
        print(f"cosmictui: {e}", file=sys.stderr)
        return 2
    if ctx.demo is not None:
        print(f"cosmictui: demo sandbox in {ctx.demo.root}", file=sys.stderr)
    app = WizardApp(ctx)
    try:
        result = app.run()
    finally:
        if ctx.demo is not None:
            # The demo is throwaway: stop its relay and private DHT with the wizard.
            ctx.demo.close()
    return result or 0
