"""What the wizard's steps share: settings, the deployment runner, the relay key, progress.

The context is the only place that talks to the runner on the steps' behalf, so every command
and every file write goes through one door and lands in the command log.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cosmictui.ops import progress as progress_mod
from cosmictui.ops import relayproc
from cosmictui.ops.config import Settings
from cosmictui.ops.runner import CommandResult, LocalRunner, Runner, RunnerError, open_deployment

if TYPE_CHECKING:
    from cosmictui.widgets.command_log import CommandEntry, CommandLog

STEP_IDS = ["prereqs", "relay", "env", "apply", "verify", "recover"]

RunnerFactory = Callable[[Settings], Awaitable[Runner]]
#: (storage, key) -> why that relay cannot serve jobs right now, or None when it runs.
RelayCheck = Callable[[str, str], "str | None"]


def relay_problem(storage: str, key: str) -> str | None:
    """Is the relay the deployment was set up with still running? (runtime file + live pid)"""
    problem = relayproc.relay_problem(storage, key)
    if problem is None:
        return None
    if "is not running" in problem:
        return problem + " Go back to step 2 (b) and press s to start it again: jobs cannot leave Creating without it."
    return problem + " Go back to step 2 (b) and check the storage directory."


async def _close_quietly(runner: Runner) -> None:
    with contextlib.suppress(Exception):  # a dead connection may fail to close; it is gone either way
        await runner.close()


async def _open_runner(settings: Settings) -> Runner:
    return await open_deployment(
        settings.deployment,
        env=settings.command_env or None,
        known_hosts=settings.ssh_known_hosts,
        client_keys=list(settings.ssh_identity) or None,
        connect_timeout=settings.ssh_connect_timeout,
    )


class LoggedRunner(Runner):
    """The deployment runner as the ops layer sees it, with every command going to the log."""

    def __init__(
        self, ctx: WizardContext, inner: Runner, expect: tuple[Callable[[str], bool], str] | None = None
    ) -> None:
        self._ctx = ctx
        self.inner = inner
        self.root = inner.root
        self.label = inner.label
        self._expect = expect

    def expecting(self, match: Callable[[str], bool], why: str) -> LoggedRunner:
        """The same runner, logging a failure of commands that `match` as expected (`why`), not FAILED."""
        return LoggedRunner(self._ctx, self.inner, (match, why))

    async def run(
        self, cmd: str, cwd: str | None = None, on_output: Any = None, timeout: float | None = None
    ) -> CommandResult:
        expected = self._expect[1] if self._expect is not None and self._expect[0](cmd) else None
        return await self._ctx.run(
            cmd, on_output=on_output, runner=self.inner, timeout=timeout, cwd=cwd, expected_failure=expected
        )

    async def read_file(self, path: str) -> bytes:
        return await self.inner.read_file(path)

    async def write_file_atomic(
        self, path: str, data: bytes, backup: bool = True, expect: bytes | None = None
    ) -> str | None:
        return await self.inner.write_file_atomic(path, data, backup, expect)

    async def exists(self, path: str) -> bool:
        return await self.inner.exists(path)

    def resolve(self, path: str) -> str:
        return self.inner.resolve(path)

    def __getattr__(self, name: str) -> Any:  # e.g. SSHRunner.host, used to tell local from remote
        return getattr(self.inner, name)


class WizardContext:
    """State shared by the steps for one deployment."""

    def __init__(
        self,
        settings: Settings,
        *,
        demo: Any = None,
        open_runner: RunnerFactory = _open_runner,
        save: bool = True,
        clock: Callable[[], float] = time.time,
        relay_check: RelayCheck = relay_problem,
    ) -> None:
        self.settings = settings
        self.demo = demo
        self._open_runner = open_runner
        self._runner: Runner | None = None
        self._runner_lock = asyncio.Lock()
        self.local = LocalRunner(str(Path.cwd()), env=settings.command_env or None)
        self._save = save
        self._clock = clock
        self._relay_check = relay_check
        self.progress = progress_mod.load_progress(settings.deployment)
        self.relay_key: str | None = self.progress.relay_key
        # step 2 attached by key: the relay runs elsewhere, no runtime file here
        self.relay_external = self.progress.relay_external is True
        self.relay_storage: str = self.progress.relay_storage or settings.relay_storage
        self.restarted_at: float | None = self.progress.restarted_at
        self.env_backup: str | None = self.progress.env_backup
        self.env_writes = 0  # bumped on every .env write: an apply from before a write is stale
        self._log: CommandLog | None = None
        self._on_command: Callable[[str], None] | None = None
        self._on_notice: Callable[[str], None] | None = None
        self._dropped: str | None = None  # label of a connection that was lost, until it is back

    # -- deployment -----------------------------------------------------------------------------

    def describe_deployment(self) -> str:
        return ("demo sandbox · " if self.demo is not None else "") + self.settings.deployment

    async def deployment(self) -> Runner:
        """The deployment runner, connected on first use (SSH errors surface as RunnerError)."""
        async with self._runner_lock:
            if self._runner is not None and getattr(self._runner, "lost", False):
                self.drop_connection()  # reconnect on the next action, with a plain note in the log
            if self._runner is None:
                self._runner = await self._open_runner(self.settings)
                if self._dropped is not None:
                    self._dropped = None
                    self._notice(f"Connected to {self._runner.label} again.")
            return self._runner

    async def logged_deployment(self) -> Runner:
        """The deployment runner for ops functions that run commands themselves (checks)."""
        return LoggedRunner(self, await self.deployment())

    def drop_connection(self, e: RunnerError | None = None) -> None:
        """After a lost SSH connection, forget it: the next action connects again.

        Without this every later action failed with the dead connection's error forever.
        """
        runner = self._runner
        if runner is None or (e is not None and e.kind != "disconnected" and not getattr(runner, "lost", False)):
            return
        self._runner = None
        self._dropped = runner.label
        self._notice(f"The SSH connection to {runner.label} was lost; the next action connects again.")
        asyncio.get_running_loop().create_task(_close_quietly(runner))

    def relay_metrics_url(self) -> str | None:
        """Where the wizard's relay serves /metrics: its runtime file, else the configured address."""
        rt = relayproc.attach(self.relay_storage) if self.relay_storage else None
        if rt is not None and rt.metrics:
            return rt.metrics if "://" in rt.metrics else f"http://{rt.metrics}"
        return self.settings.metrics_url

    def journal(self) -> progress_mod.CommandJournal | None:
        """The command log's file beside the progress file (none when progress is not saved)."""
        if not self._save:
            return None
        return progress_mod.CommandJournal(progress_mod.journal_path(self.settings.deployment))

    def remember_lost(self, message: str) -> None:
        """Keep "job X was DELETED and NOT recreated" in the progress file until dismissed."""
        lost = self.progress.data.setdefault("lost_jobs", [])
        if message not in lost:
            lost.append(message)
        if self._save:
            progress_mod.save_progress(self.progress)

    def lost_jobs(self) -> list[str]:
        lost = self.progress.data.get("lost_jobs")
        return [m for m in lost if isinstance(m, str)] if isinstance(lost, list) else []

    def dismiss_lost(self) -> None:
        if self.progress.data.pop("lost_jobs", None) is not None and self._save:
            progress_mod.save_progress(self.progress)

    def uncomplete(self, *step_ids: str) -> None:
        """Take back the ticks of `step_ids` (e.g. after the .env changed): saved at once."""
        changed = False
        for sid in step_ids:
            if sid in self.progress.completed:
                self.progress.completed.remove(sid)
                changed = True
        if changed and self._save:
            progress_mod.save_progress(self.progress)

    @property
    def env_path(self) -> str:
        if self._runner is not None:
            return self._runner.resolve(self.settings.env_path)
        return self.settings.env_path

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.close()
            self._runner = None

    # -- commands and files, all logged ---------------------------------------------------------

    def attach_log(
        self,
        log: CommandLog,
        on_command: Callable[[str], None] | None = None,
        on_notice: Callable[[str], None] | None = None,
    ) -> None:
        self._log = log
        self._on_command = on_command
        self._on_notice = on_notice

    def _notice(self, text: str) -> None:
        self.note(text)
        if self._on_notice is not None:
            self._on_notice(text)

    async def run(
        self,
        cmd: str,
        *,
        on_output: Callable[[str], None] | None = None,
        runner: Runner | None = None,
        timeout: float | None = None,
        cwd: str | None = None,
        expected_failure: str | None = None,
    ) -> CommandResult:
        """Run `cmd` on the deployment (or `runner`), logged with its output and exit code.

        `expected_failure` says why a non-zero exit is expected, so the log does not cry FAILED.
        """
        runner = runner or await self.deployment()
        entry = self._log.begin(cmd, f"{runner.label}:{runner.root}") if self._log else None
        if self._on_command:
            self._on_command(cmd)

        def chunk(text: str) -> None:
            if entry is not None and self._log is not None:
                self._log.output(entry, text)
            if on_output is not None:
                on_output(text)

        try:
            result = await runner.run(cmd, cwd=cwd, on_output=chunk, timeout=timeout)
        except RunnerError as e:
            if entry is not None and self._log is not None:
                self._log.output(entry, str(e))
                self._log.end(entry, -1)
            if e.kind == "disconnected" and runner is self._runner:
                self.drop_connection(e)
            raise
        except asyncio.CancelledError:
            if entry is not None and self._log is not None:
                self._log.output(entry, "cancelled by the operator")
                self._log.end(entry, -1)
            raise
        if entry is not None and self._log is not None:
            self._log.end(entry, result.exit_code, expected_failure)
        return result

    def begin_local(self, cmd: str) -> CommandEntry | None:
        """Log a command the wizard runs itself on this machine (e.g. starting the relay)."""
        if self._on_command:
            self._on_command(cmd)
        return self._log.begin(cmd, "this machine") if self._log else None

    def end_local(self, entry: CommandEntry | None, exit_code: int, output: str = "") -> None:
        if entry is None or self._log is None:
            return
        if output:
            self._log.output(entry, output)
        self._log.end(entry, exit_code)

    def note(self, text: str) -> None:
        if self._log is not None:
            self._log.note(text)

    def relay_problem(self) -> str | None:
        """Why the relay set up in step 2 cannot serve jobs now; None when it runs (or before step 2)."""
        if not self.relay_key or self.relay_external:
            return None
        return self._relay_check(self.relay_storage, self.relay_key)

    # -- progress -------------------------------------------------------------------------------

    def progress_step(self) -> int:
        """Index of the step to resume at."""
        current = self.progress.current_step
        if current in STEP_IDS:
            return STEP_IDS.index(current)
        return 0

    def save_progress(self, step_index: int) -> None:
        p = self.progress
        for sid in STEP_IDS[:step_index]:
            p.complete(sid)
        p.current_step = STEP_IDS[min(step_index, len(STEP_IDS) - 1)]
        p.relay_key = self.relay_key
        p.relay_storage = self.relay_storage
        p.relay_external = self.relay_external
        p.restarted_at = self.restarted_at
        p.env_backup = self.env_backup
        if self._save:
            progress_mod.save_progress(p)

    def now(self) -> float:
        """Wall-clock time; injectable so layout snapshots of job ages are reproducible."""
        return self._clock()

    def now_dt(self) -> datetime:
        return datetime.fromtimestamp(self._clock(), UTC)
