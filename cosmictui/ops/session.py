"""The wizard's session: settings, the deployment runner, the relay key, progress, and which steps
are done, derived from what is true now rather than from history.

The progress file says what the operator did; a tick also needs the evidence to still hold: the
relay runs with the key the steps were done with, the `.env` lists that key, the worker was
restarted after the last `.env` write, and later steps only stand on ticked earlier ones. A
rerun, a restart of the relay, a cancelled apply: every tick is derived again the same way, so
the step list, Next and the progress file cannot disagree.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from cosmictui.ops import progress as progress_mod
from cosmictui.ops import relayproc
from cosmictui.ops.config import Settings
from cosmictui.ops.runner import CommandResult, LocalRunner, Runner, RunnerError, open_deployment
from cosmictui.ops.setup.relayup import probe_verdict, relay_args, wanted_args

__all__ = ["probe_verdict", "relay_args", "wanted_args"]  # step 2's helpers, where the steps found them

STEP_IDS = ["prereqs", "relay", "env", "apply", "verify", "recover"]


@dataclass(frozen=True)
class SessionFacts:
    """What the ticks are derived from; None where a fact is not known (yet)."""

    completed: frozenset[str]
    relay_key: str | None
    #: the relay with `relay_key` runs (or was attached by key and proven by the probe)
    relay_running: bool
    #: the keys the deployment's `.env` lists; None when it was not read (e.g. not connected yet)
    env_relays: tuple[str, ...] | None = None
    restarted_at: float | None = None
    #: when the wizard last wrote the `.env`; an apply from before it is stale
    env_written_at: float | None = None
    #: why the relay is not proven (its last probe failed), None when a probe passed or none ran
    relay_unproven: str | None = None
    #: the last worker restart ran to its end (a cancelled or failed one may have restarted it or not)
    restart_finished: bool = True
    #: (relay key, worker restart) step 5 proved the relay with: a new restart or relay undoes it
    verified: tuple[str, float] | None = None


def why_not(step: str, facts: SessionFacts) -> str | None:
    """Why `step`'s own evidence does not hold now (None: it holds), apart from the earlier steps."""
    if step not in facts.completed:
        return "not done yet"
    if step == "relay" and (facts.relay_key is None or not facts.relay_running):
        return "the relay set up in step 2 is not running"
    if step == "env" and facts.env_relays is not None and facts.relay_key not in facts.env_relays:
        return "the .env does not list the relay's key"
    if step == "apply":
        if facts.restarted_at is None:
            return "the worker restart was not recorded"
        if not facts.restart_finished:
            return "the last worker restart did not finish (cancelled, failed or the wizard quit)"
        if facts.env_written_at is not None and facts.restarted_at < facts.env_written_at:
            return "the .env changed after the last restart"
    if step == "verify" and (facts.verified is None or facts.verified != (facts.relay_key, facts.restarted_at)):
        return "no new job was proven to go through this relay since the last restart"
    return None


def derive_ticks(facts: SessionFacts) -> frozenset[str]:
    """The steps that are done now: each one's evidence holds and, from step 2 on, so do all before it.

    Step 1's checks stand on their own (they are run again on every visit); from the relay on,
    a step is only as good as the ones it builds on.
    """
    ticks: set[str] = set()
    if why_not("prereqs", facts) is None:
        ticks.add("prereqs")
    for step in STEP_IDS[1:]:
        if why_not(step, facts) is not None:
            break
        ticks.add(step)
    return frozenset(ticks)


def derive_unproven(facts: SessionFacts) -> frozenset[str]:
    """The ticked steps whose proof is missing: shown as "!" (done, not proven), never as ✔.

    Step 2 stays a fact for the later steps (the relay runs with the key), but a relay whose last
    probe failed has not been seen carrying a connection.
    """
    if facts.relay_unproven and "relay" in derive_ticks(facts):
        return frozenset({"relay"})
    return frozenset()


def unjoined_relay(results: list[Any], runtime: relayproc.RelayRuntime | None, other_flags: str | None) -> list[Any]:
    """Tell "the running relay is not joined" apart from "this host cannot reach a bootstrap node".

    The relay's "not bootstrapped" read as a firewall problem even right above "Bootstrap node
    answers: 1 of 1": when this host reaches a bootstrap node, it is that relay (often started
    with other flags) that is not joined, and the fix is to restart it with the wizard's settings.
    """
    from dataclasses import replace

    if runtime is None:
        return results
    boot = next((r for r in results if r.name == "Bootstrap node answers"), None)
    if boot is None or boot.status != "ok":
        return results
    flags = f" with other flags ({other_flags})" if other_flags else ""
    fix = (
        "press n, then s in step 2 to restart it with the wizard's settings (same storage, so the same key)"
        if other_flags
        else f"read its log ({relayproc.log_path(runtime.storage)}); restart it in step 2 (s) if it stays so"
    )
    return [
        replace(
            r,
            status="warn",  # not this host's problem: step 2 restarts the relay, no dead end here
            detail=f"the relay already running here (pid {runtime.pid}){flags} is not joined to the DHT, "
            "while this host reaches a bootstrap node",
            fix=fix,
        )
        if r.name == "DHT reachable, port open" and r.status in ("fail", "warn") and "not bootstrapped" in r.detail
        else r
        for r in results
    ]


class CommandEntry(Protocol):
    """One command in the log (the widget's entry); only its identity matters here."""

    cmd: str


class CommandSink(Protocol):
    """Where commands and notes go: the wizard's command log (a widget), kept out of ops by this protocol."""

    def begin(self, cmd: str, where: str) -> Any: ...

    def output(self, entry: Any, text: str) -> None: ...

    def end(self, entry: Any, exit_code: int, expected: str | None = None) -> None: ...

    def note(self, text: str) -> None: ...


RunnerFactory = Callable[[Settings], Awaitable[Runner]]

#: Verdicts that take a proof back: the job went back or failed, a newer restart, the .env dropped the relay.
WITHDRAWS = frozenset({"withdrawn", "failed", "stale", "env-dropped", "list-failed"})


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


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
        self, ctx: WizardContext, inner: Runner, expect: tuple[tuple[Callable[[str], bool], str], ...] = ()
    ) -> None:
        self._ctx = ctx
        self.inner = inner
        self.root = inner.root
        self.label = inner.label
        self._expect = expect

    def expecting(self, match: Callable[[str], bool], why: str) -> LoggedRunner:
        """The same runner, logging a failure of commands that `match` as expected (`why`), not FAILED."""
        return LoggedRunner(self._ctx, self.inner, (*self._expect, (match, why)))

    async def run(
        self, cmd: str, cwd: str | None = None, on_output: Any = None, timeout: float | None = None
    ) -> CommandResult:
        expected = next((why for match, why in self._expect if match(cmd)), None)
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
        if restarts := self.restarts():
            self.restarted_at = restarts[-1]["began_at"]  # the last one begun, even if it never finished
        self.env_backup: str | None = self.progress.env_backup
        self.env_writes = 0  # bumped on every .env write: an apply from before a write is stale
        #: the keys the deployment's .env lists, as last read (None: not read yet or unreadable)
        self.env_relays: tuple[str, ...] | None = None
        self._log: CommandSink | None = None
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
        """The deployment runner for ops functions that run commands themselves (checks).

        `task --list-all --json` failing is an expected fallback (a go-task without --json, or a
        stand-in): the check then reads the plain listing or the Taskfile, so it is no FAILED.
        """
        return LoggedRunner(self, await self.deployment()).expecting(
            lambda cmd: cmd == "task --list-all --json", "the Taskfile is read instead"
        )

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

    def save_unit(self, text: str) -> Path | None:
        """Keep the systemd unit Finish printed beside the command log (None when nothing is saved)."""
        if not self._save:
            return None
        path = progress_mod.journal_path(self.settings.deployment).with_suffix(".blind-relay.service")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        except OSError:
            return None  # the dialog still shows it
        return path

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
        log: CommandSink,
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

    # -- what is done, from evidence --------------------------------------------------------------

    async def read_env_relays(self) -> tuple[str, ...] | None:
        """Read the keys the deployment's .env lists now (None when it cannot be read)."""
        from cosmictui.ops.setup.envfile import EnvFileError, decode_text, read_relays

        try:
            runner = await self.deployment()
            text = decode_text(await runner.read_file(runner.resolve(self.settings.env_path)))
            self.env_relays = tuple(read_relays(text, self.settings.env_var))
        except (RunnerError, EnvFileError, OSError):
            self.env_relays = None
        return self.env_relays

    def env_written(self, keys: tuple[str, ...]) -> None:
        """The wizard wrote the .env: an apply from before now is stale (kept across runs)."""
        self.env_relays = keys
        self.progress.data["env_written_at"] = self.now()
        if self._save:
            progress_mod.save_progress(self.progress)

    @property
    def relay_unproven(self) -> str | None:
        """Why the relay step is done but not proven: it runs, yet two peers did not meet through it.

        Kept in the progress file with the key it was seen with, so a rerun shows the same "!"
        (its tick stays a fact for the later steps, but is not shown as ✔); another key is another
        relay, not proven or disproven yet.
        """
        saved = self.progress.data.get("relay_unproven")
        if isinstance(saved, dict) and saved.get("key") == self.relay_key and isinstance(saved.get("why"), str):
            return str(saved["why"])
        return None

    @relay_unproven.setter
    def relay_unproven(self, why: str | None) -> None:
        before = self.progress.data.get("relay_unproven")
        if why is None:
            self.progress.data.pop("relay_unproven", None)
        else:
            self.progress.data["relay_unproven"] = {"key": self.relay_key, "why": why}
        if self._save and self.progress.data.get("relay_unproven") != before:
            progress_mod.save_progress(self.progress)

    def facts(self) -> SessionFacts:
        written = self.progress.data.get("env_written_at")
        last = self.restarts()[-1:]
        return SessionFacts(
            completed=frozenset(self.progress.completed),
            relay_key=self.relay_key,
            relay_running=self.relay_key is not None and self.relay_problem() is None,
            env_relays=self.env_relays,
            restarted_at=self.restarted_at,
            env_written_at=float(written) if isinstance(written, int | float) else None,
            relay_unproven=self.relay_unproven,
            restart_finished=not last or last[0]["ended_at"] is not None,
            verified=self.verified_for(),
        )

    # -- worker restarts: when, whether they finished, which keys they gave the worker -------------

    MAX_RESTARTS = 20

    def restarts(self) -> list[dict[str, Any]]:
        """The worker restarts the wizard (or `cosmictui apply`) ran, oldest first: began_at, ended_at
        (None: cancelled, failed or interrupted), keys (the relays the .env listed at the apply)."""
        raw = self.progress.data.get("restarts")
        out: list[dict[str, Any]] = []
        for r in raw if isinstance(raw, list) else []:
            if not isinstance(r, dict) or not _num(r.get("began_at")):
                continue
            keys = r.get("keys")
            out.append(
                {
                    "began_at": float(r["began_at"]),
                    "ended_at": float(r["ended_at"]) if _num(r.get("ended_at")) else None,
                    "keys": [k for k in keys if isinstance(k, str)] if isinstance(keys, list) else None,
                }
            )
        return out

    def restart_began(self, keys: tuple[str, ...] | None) -> float:
        """The restart command starts now: saved at once, so a quit halfway still knows when it was."""
        at = self.now()
        restarts = [
            *self.restarts(),
            {"began_at": at, "ended_at": None, "keys": list(keys) if keys is not None else None},
        ]
        self.progress.data["restarts"] = restarts[-self.MAX_RESTARTS :]
        self.restarted_at = self.progress.restarted_at = at
        if self._save:
            progress_mod.save_progress(self.progress)
        return at

    def restart_ended(self) -> None:
        """The restart command exited 0: the worker runs with what the apply gave it."""
        restarts = self.restarts()
        if restarts:
            restarts[-1]["ended_at"] = self.now()
            self.progress.data["restarts"] = restarts
            if self._save:
                progress_mod.save_progress(self.progress)

    def key_since(self) -> float | None:
        """Since when new jobs carry the relay's key: the first of the latest run of finished restarts
        that all applied it (a job made after an earlier restart that applied the key has it too).
        Without recorded keys: the last restart, as before."""
        since = None
        for r in reversed(self.restarts()):
            if r["keys"] is None or self.relay_key not in r["keys"]:
                break
            if r["ended_at"] is not None:
                since = r["began_at"]
        return since if since is not None else self.restarted_at

    # -- step 2: the relay -----------------------------------------------------------------------------

    async def plan_relay(self, storage: str, port: int, want: str = "start") -> Any:
        """What step 2's use case would do (`ops.setup.relayup.plan_relay`), compared with the keys the
        .env lists, the storage used last time and (outside the self-contained demo) other relays here."""
        from cosmictui.ops.setup.relayup import plan_relay

        env = await self.read_env_relays() or ()
        demo = self.demo is not None
        previous = self.progress.relay_storage

        def plan() -> Any:  # scans every process (psutil): off the event loop
            others = None if demo else relayproc.running_relays()
            return plan_relay(
                self.settings,
                storage,
                port,
                "attach" if want == "attach" else "start",
                env_keys=env,
                previous_storage=previous,
                others=others,
            )

        return await asyncio.to_thread(plan)

    async def bring_up_relay(self, plan: Any, timeout: float | None = None) -> AsyncIterator[Any]:
        """Step 2's use case on this session: local commands logged, the relay it ends with (key,
        storage) and whether it is proven recorded, the tick set or taken back."""
        from cosmictui.ops.setup.relayup import (
            RELAY_UP_TIMEOUT,
            LocalCommand,
            Note,
            RelayOutcome,
            RelayRunning,
            bring_up,
        )

        entries: dict[str, Any] = {}
        async for ev in bring_up(self.settings, plan, self.logged_deployment, timeout=timeout or RELAY_UP_TIMEOUT):
            if isinstance(ev, Note):
                self.note(ev.text)
            elif isinstance(ev, LocalCommand):
                if not ev.ended:
                    entries[ev.cmd] = self.begin_local(ev.cmd)
                else:
                    self.end_local(entries.pop(ev.cmd, None), ev.exit_code, ev.output)
            elif isinstance(ev, RelayRunning):
                self.relay_external = False
                self.relay_key = ev.runtime.key
                self.relay_storage = ev.runtime.storage
                self.save_progress(STEP_IDS.index("relay"))
            elif isinstance(ev, RelayOutcome):
                self._relay_outcome(ev)
            yield ev

    async def attach_relay_by_key(self, key: str, timeout: float | None = None) -> AsyncIterator[Any]:
        """A relay that runs elsewhere, known by its key: the probe through it is the proof."""
        from cosmictui.ops.setup.relayup import RELAY_UP_TIMEOUT, RelayOutcome, attach_by_key

        async for ev in attach_by_key(self.settings, key, timeout or RELAY_UP_TIMEOUT):
            if isinstance(ev, RelayOutcome) and ev.unproven is None:
                self.relay_key, self.relay_external = key, True
                self.save_progress(STEP_IDS.index("relay"))
                self._relay_outcome(ev)
            elif isinstance(ev, RelayOutcome):
                self.set_done("relay", False)
            yield ev

    def _relay_outcome(self, ev: Any) -> None:
        if ev.error is not None or ev.blocking is not None:
            self.set_done("relay", False)
            return
        self.relay_unproven = ev.unproven  # the probe decides "!" or ✔; the tick stays a fact for later steps
        self.set_done("relay", True)

    # -- step 4: apply and restart -------------------------------------------------------------------

    async def apply_and_restart(self, env_keys: tuple[str, ...] | None) -> AsyncIterator[Any]:
        """Step 4's use case (`ops.setup.apply`) on this session: its commands logged, the restart's
        start and end recorded as they happen (with the keys the .env listed), the tick on success."""
        from cosmictui.ops.setup.apply import ApplyDone, apply_and_restart

        self.set_done("apply", False)  # until both commands succeed again

        async def run(cmd: str, on_output: Callable[[str], None]) -> CommandResult:
            return await self.run(cmd, on_output=on_output)

        async for ev in apply_and_restart(
            run, self.settings, restart_began=lambda: self.restart_began(env_keys), restart_ended=self.restart_ended
        ):
            if isinstance(ev, ApplyDone) and ev.ok:
                self.set_done("apply", True)
                self.save_progress(STEP_IDS.index("apply") + 1)
            yield ev

    # -- step 5: the verdict and what it proved ----------------------------------------------------

    async def read_pairings(self, url: str) -> Any:
        """The relay's record of its pairings (`ops.metrics.pairings`), looked up when called."""
        from cosmictui.ops.metrics import pairings

        return await pairings.read_pairings(url)

    def verified_for(self) -> tuple[str, float] | None:
        v = self.progress.data.get("verified")
        if isinstance(v, dict) and isinstance(v.get("relay_key"), str) and _num(v.get("restart")):
            return (v["relay_key"], float(v["restart"]))
        return None

    def verify_session(self, job_id: str | None = None) -> Any:
        """Step 5's use case on this session: its runner, relay, restart, .env and probes; the watch's
        state comes back from the progress file when it is the same relay and restart."""
        from cosmictui.ops.jobs.verify import VerifyInputs, VerifySession, VerifyState

        inputs = VerifyInputs(
            self.settings,
            lambda cmd: self.run(cmd),
            self.relay_key,
            self.relay_metrics_url,
            lambda: self.restarted_at,
            progress_mod.probe_keys,
            self.read_env_relays,
            self.key_since,
            self._clock,
            self.read_pairings,
        )
        saved = self.progress.data.get("verify")
        state = None
        if (
            job_id is None
            and isinstance(saved, dict)
            and saved.get("relay_key") == self.relay_key
            and saved.get("restart") == self.restarted_at
        ):
            state = VerifyState.from_json(saved.get("state"))
        if job_id is not None:
            state = VerifyState(job_id=job_id)
        return VerifySession(inputs, state)

    def note_verdict(self, verdict: Any, state: Any = None) -> None:
        """Keep what step 5 concluded: a proof (for this relay and restart) ticks it; a verdict that
        contradicts it (the job went back, failed, a restart, the .env dropped the relay) takes it back."""
        before = (self.progress.data.get("verified"), self.progress.data.get("verify"))
        if state is not None:
            self.progress.data["verify"] = {"relay_key": self.relay_key, "restart": self.restarted_at, "state": state}
        if verdict.proven and self.relay_key is not None and self.restarted_at is not None:
            pairing = verdict.attribution.pairing if verdict.attribution is not None else None
            self.progress.data["verified"] = {
                "relay_key": self.relay_key,
                "restart": self.restarted_at,
                "job": verdict.job.id if verdict.job is not None else None,
                "pairing": None if pairing is None else {"id": pairing.id, "opened_at": pairing.opened_at},
                "message": verdict.message,
                "lines": list(verdict.lines),
                "at": self.now(),
            }
            self.progress.complete("verify")
        elif verdict.kind in WITHDRAWS and self.progress.data.get("verified") is not None:
            self.progress.data.pop("verified", None)
            if "verify" in self.progress.completed:
                self.progress.completed.remove("verify")
        if self._save and (self.progress.data.get("verified"), self.progress.data.get("verify")) != before:
            progress_mod.save_progress(self.progress)

    def verified_summary(self) -> tuple[str, list[str]] | None:
        """What step 5 proved, as it said it (for a resume: shown until the watch judges again)."""
        v = self.progress.data.get("verified")
        if self.verified_for() != (self.relay_key, self.restarted_at) or not isinstance(v, dict):
            return None
        lines = [str(x) for x in v.get("lines", []) if isinstance(x, str)]
        return str(v.get("message") or "The relay carried the new job's connection."), lines

    def ticks(self) -> frozenset[str]:
        """The steps that are done now (see `derive_ticks`)."""
        return derive_ticks(self.facts())

    def unproven(self) -> frozenset[str]:
        """The steps done but not proven now (see `derive_unproven`)."""
        return derive_unproven(self.facts())

    def set_done(self, step_id: str, done: bool) -> None:
        """Record that the operator did (or undid) a step; its tick still needs the evidence."""
        if done == self.progress.is_done(step_id):
            return
        if done:
            self.progress.complete(step_id)
        else:
            self.progress.completed.remove(step_id)
        if self._save:
            progress_mod.save_progress(self.progress)

    # -- progress -------------------------------------------------------------------------------

    def progress_step(self) -> int:
        """Index of the step to resume at."""
        current = self.progress.current_step
        if current in STEP_IDS:
            return STEP_IDS.index(current)
        return 0

    def save_progress(self, step_index: int) -> None:
        """Where to resume and the relay it stands on; what is done is recorded by `set_done` only
        (a step passed with Next is marked done by it; step 5 only with the relay's proof)."""
        p = self.progress
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
