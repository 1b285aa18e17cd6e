"""Step 4 as a use case: apply the config and restart the worker, output streamed, stopping at the
first failure. Driven the same way by the wizard's step 4 and by `cosmictui apply`.

Before anything runs, the `.env` is read: the keys it lists are what the worker will hand to new
jobs, so a `.env` that no longer lists the relay set up in step 2 is said first, naming both
keys (`env_mismatch`); the caller decides (a dialog, or `--force`). The restart's start is told
to the caller before the command runs (`restart_began`), so a quit halfway still knows when the
worker may have restarted, and its end only once it exited 0 (`restart_ended`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from cosmictui.ops.config import Settings
from cosmictui.ops.jobs.listing import runner_problem
from cosmictui.ops.runner import CommandResult, RunnerError
from cosmictui.ops.wording import command_failure_hint

#: How the caller runs a deployment command with its output streamed to `on_output`.
RunStreamed = Callable[[str, Callable[[str], None]], Awaitable[CommandResult]]


def env_mismatch(env_keys: tuple[str, ...] | None, relay_key: str | None) -> str | None:
    """Why applying now would not give the worker this relay: the .env lists other keys (both named)."""
    if env_keys is None or relay_key is None or relay_key in env_keys:
        return None
    listed = ", ".join(env_keys) if env_keys else "no relay at all"
    return (
        f"The .env lists {listed}, not the relay set up in step 2 ({relay_key}). Applying now gives the "
        "worker what the .env lists: new jobs would not use this relay."
    )


@dataclass(frozen=True)
class CommandBegan:
    index: int
    cmd: str


@dataclass(frozen=True)
class CommandOutput:
    index: int
    text: str


@dataclass(frozen=True)
class CommandEnded:
    index: int
    cmd: str
    exit_code: int


@dataclass(frozen=True)
class ApplyDone:
    """The end: `ok`, or which command failed (`failed`), why and how to fix it."""

    ok: bool
    message: str
    fix: str = ""
    failed: int | None = None
    #: how it failed: "exit N", a runner error kind, or "" when it did not
    detail: str = ""


ApplyEvent = CommandBegan | CommandOutput | CommandEnded | ApplyDone


def commands(settings: Settings) -> list[str]:
    return [settings.apply_command, settings.restart_command]


async def apply_and_restart(
    run: RunStreamed,
    settings: Settings,
    *,
    restart_began: Callable[[], object] | None = None,
    restart_ended: Callable[[], object] | None = None,
) -> AsyncIterator[ApplyEvent]:
    """Run the apply command, then the restart command; the first failure stops it (`ApplyDone`)."""
    cmds = commands(settings)
    for i, cmd in enumerate(cmds):
        restart = i == len(cmds) - 1
        if restart and restart_began is not None:
            restart_began()
        yield CommandBegan(i, cmd)
        queue: asyncio.Queue[str] = asyncio.Queue()
        task = asyncio.ensure_future(run(cmd, queue.put_nowait))
        try:
            while not task.done() or not queue.empty():
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield CommandOutput(i, getter.result())
                else:
                    getter.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await getter
            try:
                result = task.result()
            except RunnerError as e:
                yield ApplyDone(False, runner_problem(e, f"run {cmd}"), e.fix, i, e.kind)
                return
        finally:
            if not task.done():  # the caller stopped listening (cancelled): stop the command too
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        yield CommandEnded(i, cmd, result.exit_code)
        if result.exit_code != 0:
            hint = command_failure_hint(cmd, result.exit_code, result.output, "then apply and restart again")
            yield ApplyDone(
                False, f"{cmd} exited {result.exit_code}; stopped here. {hint}", hint, i, f"exit {result.exit_code}"
            )
            return
        if restart and restart_ended is not None:
            restart_ended()
    yield ApplyDone(True, "Applied and restarted: jobs created from now on get the relay key.")
