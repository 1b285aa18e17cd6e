"""The setup wizard App and `main_wizard`, which `cosmictui` (no subcommand) calls."""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
from pathlib import Path, PurePath
from typing import Any, ClassVar

from textual.app import App
from textual.binding import Binding
from textual.screen import ModalScreen

from cosmictui.ops import progress as progress_mod
from cosmictui.ops import relayproc
from cosmictui.ops.config import ConfigError, load_settings
from cosmictui.ops.session import WizardContext
from cosmictui.ops.wording import OUTPUT_SHOWN_IN
from cosmictui.screens.wizard import WizardScreen


class WizardApp(App[int]):
    """Takes an operator from "jobs are stuck in Creating" to "new jobs leave Creating"."""

    TITLE = "cosmictui"
    CSS_PATH: ClassVar[list[str | PurePath]] = ["app.tcss", "screens/wizard.tcss"]
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", show=False, priority=True)]  # noqa: RUF012

    #: Signals that end the wizard like q does, so `main_wizard`'s cleanup runs: SIGHUP when the
    #: terminal (or tmux pane) closes, SIGTERM from `kill` or a service manager.
    EXIT_SIGNALS = (signal.SIGHUP, signal.SIGTERM)

    def __init__(self, ctx: WizardContext, *, handle_signals: bool = False) -> None:
        super().__init__()
        self.ctx = ctx
        self._handle_signals = handle_signals
        self.exit_signal: int | None = None

    def on_load(self) -> None:
        # Set in the app's own task before its screens and workers exist (they inherit it), not in
        # the caller's context: a failed command's fix points at the wizard's command log, while
        # headless commands (which print the output) name no wizard key.
        OUTPUT_SHOWN_IN.set("command log: l")

    def on_mount(self) -> None:
        if self._handle_signals:
            loop = asyncio.get_running_loop()
            for sig in self.EXIT_SIGNALS:
                loop.add_signal_handler(sig, self._exit_on_signal, sig)
        self.push_screen(WizardScreen(self.ctx))
        # The first kernel-forwarding check (~0.2 s, a child process) would otherwise run on the UI
        # thread the first time a relay command is composed ([relay] kernel_forwarding unset).
        self.run_worker(relayproc.kernel_support, thread=True, exit_on_error=False, group="warm-up")

    async def action_quit(self) -> None:
        """ctrl+q: like q on the wizard (also from the monitor it opened), it asks first while a
        command runs or when the relay keeps running; in a dialog it quits."""
        wizard = next((s for s in self.screen_stack if isinstance(s, WizardScreen)), None)
        if wizard is not None and not isinstance(self.screen, ModalScreen):
            wizard.action_quit()
        else:
            self.exit()

    def _exit_on_signal(self, sig: int) -> None:
        # Without this the default action kills the process and the demo's relay and DHT live on.
        self.exit_signal = sig
        self.exit(return_code=128 + sig)

    def open_monitor(self) -> None:
        """Push the relay monitor (owned by the monitor engineer) for the wizard's relay."""
        try:
            from cosmictui.ops.metrics.client import Target
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
        # a relay with metrics off is probed: on the DHT the wizard's relay joins, never another
        bootstrap = list(self.ctx.settings.relay_bootstrap) or None
        # the wizard starts its relay itself: a `blind-relay` command would start one it does not know
        start = "back to the wizard (q), then s in step 2 (Relay) starts it"
        self.push_screen(MonitorScreen([target], bootstrap=bootstrap, start_fix=start))

    async def on_unmount(self) -> None:
        if self._handle_signals:
            loop = asyncio.get_running_loop()
            for sig in self.EXIT_SIGNALS:
                loop.remove_signal_handler(sig)
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
    from cosmictui.ops.demo.sandbox import create_sandbox

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
    app = WizardApp(ctx, handle_signals=True)

    def early_exit(sig: int, _frame: object) -> None:  # until the app's loop takes the signals over
        raise SystemExit(128 + sig)

    previous = {sig: signal.signal(sig, early_exit) for sig in WizardApp.EXIT_SIGNALS}
    try:
        result = app.run()
    finally:
        if ctx.demo is not None:
            for sig in WizardApp.EXIT_SIGNALS:  # a second SIGHUP must not cut the cleanup short
                signal.signal(sig, signal.SIG_IGN)
            records = close_demo(ctx)
            # the path printed at the start is gone now: say so, so nobody goes looking for it
            n = len(records)
            also = f", with the {n} job record{'s' if n != 1 else ''} it saved in {records[0].parent}" if n else ""
            print(f"cosmictui: demo finished; its sandbox {ctx.demo.root} was removed{also}.", file=sys.stderr)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if app.exit_signal is not None:
        return 128 + app.exit_signal
    return result or app.return_code or 0


def close_demo(ctx: WizardContext) -> list[Path]:
    """The demo is throwaway: stop its relay and private DHT, remove its files, saved progress and
    the job records step 6 saved for it (returned).

    Never called for a real deployment: there the relay outlives the wizard and progress is kept
    so a rerun resumes.
    """
    demo = ctx.demo
    try:
        demo.close()
    finally:
        progress_mod.clear_progress(ctx.settings.deployment)
        progress_mod.journal_path(ctx.settings.deployment).unlink(missing_ok=True)
        shutil.rmtree(demo.root, ignore_errors=True)
    return demo.remove_job_records()
