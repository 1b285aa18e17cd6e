"""Step 2 as a use case: start the relay (or attach to the one running, or restart it with the
wizard's flags), check it from the deployment host, and prove it carries a connection, all
within one timeout. Driven the same way by the wizard's step 2 and by `cosmictui relay start`.

`plan_relay` says what would happen and what needs the operator's yes first (a key that would
change, a running relay to restart, a port another process holds); `bring_up` does it and
yields events; `prove_relay` (the probe from this machine and, where cosmictui runs there, from
the deployment host) is also what `cosmictui check` runs.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from cosmictui.ops import relayproc
from cosmictui.ops.config import Settings
from cosmictui.ops.relayproc import RelayProcError, RelayRuntime
from cosmictui.ops.runner import Runner, RunnerError
from cosmictui.ops.setup.checks import check_udp_port
from cosmictui.ops.setup.steps import RELAY_REACH_PREFIX, relay_reach_checks
from cosmictui.ops.vocabulary import CheckResult
from cosmictui.ops.wording import sentences

#: The whole of step 2 (start, reach checks, both probes) by default.
RELAY_UP_TIMEOUT = 120.0

Action = Literal["start", "attach", "restart"]


@dataclass(frozen=True)
class RelayPlan:
    """What `bring_up` will do with `storage` and `port`, and what the operator must say yes to."""

    action: Action
    storage: str
    port: int
    #: the relay running with this storage (attach, restart)
    running: RelayRuntime | None = None
    #: restart: the running relay's flags, where they differ from the wizard's
    other_flags: str | None = None
    #: the commands, as the operator reads them before saying yes
    commands: tuple[str, ...] = ()
    #: why this would change the relay key (a loud warning), None when it keeps it
    key_warning: str | None = None
    #: why it cannot go ahead at all (and nothing was done), with its fix
    error: str | None = None
    fix: str = ""
    #: how the outcome names what was done ("Started", "Attached to", "Already running (pid N): checked")
    verb: str = "Attached to"

    @property
    def needs_yes(self) -> bool:
        return self.action == "restart" or self.key_warning is not None


def probe_verdict(local: Any, from_host: Any) -> str | None:
    """Why the relay is not proven by these probe rows (`CheckResult`s), None when it is (or none ran).

    The probe from the deployment host runs where the jobs are, so its outcome decides when it
    has one (passed or failed); the probe from this machine decides only when there is none (the
    host has no cosmictui, or could not run it).
    """
    if from_host is not None and from_host.status == "ok":
        return None
    if from_host is not None and from_host.status == "fail":
        where = from_host.name.removeprefix("Relay carries a connection from ").removesuffix(" (probe)")
        return f"from {where} {from_host.detail}"
    if local is not None and local.status == "fail":
        return str(local.detail)
    return None


def relay_args(pid: int) -> list[str] | None:
    """The flags a running relay was started with (its command line from the first flag on)."""
    import psutil  # only here: the rest of step 2 does not need it

    try:
        argv = psutil.Process(pid).cmdline()
    except (psutil.Error, OSError):
        return None
    for i, a in enumerate(argv):
        if (a == "relay" and i > 0 and argv[i - 1] == "-m") or os.path.basename(a) == "blind-relay":
            return argv[i + 1 :]
    return None


def wanted_args(settings: Settings, storage: str, port: int) -> list[str]:
    """The flags the wizard starts its relay with (as `relayproc.relay_command` builds them)."""
    metrics = settings.relay_metrics if settings.relay_metrics else None
    cmd = relayproc.relay_command(
        storage,
        port,
        settings.relay_host,
        settings.relay_bootstrap,
        metrics,
        kernel_forwarding=settings.relay_kernel_forwarding,
    )
    return cmd[3:]  # after `python -m relay`


def other_flags(settings: Settings, rt: RelayRuntime, port: int) -> str | None:
    """The running relay's flags when they differ from the wizard's settings (None: the same)."""
    have = relay_args(rt.pid)
    want = wanted_args(settings, rt.storage, port)
    if have is None or have == want:
        return None
    return shlex.join(have) or "(none)"


def start_command(settings: Settings, storage: str, port: int) -> list[str]:
    metrics = settings.relay_metrics if settings.relay_metrics else None
    return relayproc.relay_command(
        storage,
        port,
        settings.relay_host,
        settings.relay_bootstrap,
        metrics,
        kernel_forwarding=settings.relay_kernel_forwarding,
    )


def plan_relay(
    settings: Settings,
    storage: str,
    port: int,
    want: Literal["start", "attach"] = "start",
    *,
    env_keys: tuple[str, ...] = (),
    previous_storage: str | None = None,
    others: list[RelayRuntime] | None = None,
) -> RelayPlan:
    """What starting (or attaching to) the relay of `storage` on `port` takes. `env_keys`: the keys
    the .env lists; `previous_storage`: the one used last time; `others`: relays running on this
    host (None: not looked at, as in the self-contained demo)."""
    running = relayproc.attach(storage)
    log = relayproc.log_path(storage)
    warning = relayproc.key_change_warning(storage, previous_storage, env_keys, others, port)
    if want == "attach":
        if running is None:
            return RelayPlan(
                "attach",
                storage,
                port,
                error=f"No relay is running with storage {relayproc.runtime_path(storage).parent} "
                "(no live relay-runtime.json).",
                fix="start it (s in step 2, or cosmictui relay start)",
            )
        return RelayPlan("attach", storage, port, running, key_warning=warning)
    if running is not None:
        flags = other_flags(settings, running, port)
        if flags is None:  # already runs with these settings: nothing to start, look at it again
            verb = f"Already running (pid {running.pid}): checked"
            return RelayPlan("attach", storage, port, running, key_warning=warning, verb=verb)
        cmd = shlex.join(start_command(settings, storage, port)) + f"  &> {log} &"
        return RelayPlan("restart", storage, port, running, flags, (f"kill {running.pid}", cmd), key_warning=warning)
    port_check = check_udp_port(port, settings.relay_host, storage)
    if port_check.status == "fail":
        return RelayPlan(
            "start",
            storage,
            port,
            error=f"UDP port {port} is {port_check.detail}.",
            fix="choose another port (UDP port in step 2, --port, [relay] port in the config; open it in the "
            "firewall), or stop that process",
        )
    cmd = shlex.join(start_command(settings, storage, port)) + f"  &> {log} &"
    return RelayPlan("start", storage, port, commands=(cmd,), key_warning=warning)


# -- events ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """What runs now, in words ("Starting the relay …")."""

    text: str


@dataclass(frozen=True)
class Note:
    """A fact for the command log, not the status line (e.g. why kernel forwarding is on or off)."""

    text: str


@dataclass(frozen=True)
class LocalCommand:
    """A command run on this machine (started, then `ended` with its exit code and output)."""

    cmd: str
    ended: bool = False
    exit_code: int = 0
    output: str = ""


@dataclass(frozen=True)
class RelayRunning:
    """The relay runs (started, restarted or attached): its runtime file."""

    runtime: RelayRuntime
    verb: str


@dataclass(frozen=True)
class RelayOutcome:
    """The end of step 2: the relay (or why not), what was checked, and the verdict."""

    runtime: RelayRuntime | None
    key: str | None
    checks: list[CheckResult] = field(default_factory=list)
    #: a failure that blocks jobs from using it (the deployment host does not reach it)
    blocking: str | None = None
    #: why it is not proven (the probe failed), None when a probe passed or none ran
    unproven: str | None = None
    #: the relay did not start or stop (nothing to check), with its fix and last log lines
    error: str | None = None
    fix: str = ""
    log_tail: str = ""
    verb: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and self.blocking is None and self.unproven is None


RelayEvent = Stage | Note | LocalCommand | RelayRunning | RelayOutcome


def _left(deadline: float, floor: float = 1.0) -> float:
    return max(floor, deadline - time.monotonic())


async def bring_up(
    settings: Settings,
    plan: RelayPlan,
    connect: Callable[[], Awaitable[Runner]] | None,
    *,
    timeout: float = RELAY_UP_TIMEOUT,
) -> AsyncIterator[RelayEvent]:
    """Carry out `plan` (the operator said yes to what it needed), then check and prove the relay;
    everything within `timeout`. `connect` opens the deployment's runner (None: local checks only)."""
    deadline = time.monotonic() + timeout
    if plan.error is not None:
        yield RelayOutcome(None, None, error=plan.error, fix=plan.fix)
        return
    rt = plan.running
    verb = plan.verb
    if plan.action == "restart" and rt is not None:
        yield LocalCommand(f"kill {rt.pid}")
        try:
            await relayproc.stop_relay(plan.storage)
        except RelayProcError as e:
            yield LocalCommand(f"kill {rt.pid}", True, 1, e.what)
            yield RelayOutcome(rt, rt.key, error=f"The relay was not stopped: {e.what}", fix=e.fix)
            return
        yield LocalCommand(f"kill {rt.pid}", True, 0)
        rt = None
    if plan.action in ("start", "restart"):
        kernel = settings.relay_kernel_forwarding  # None ("auto"): on where the host allows it
        yield Note((await asyncio.to_thread(relayproc.choose_kernel_forwarding, kernel)).why)
        cmd = (
            shlex.join(start_command(settings, plan.storage, plan.port)) + f"  &> {relayproc.log_path(plan.storage)} &"
        )
        yield LocalCommand(cmd)
        yield Stage("Starting the relay (waiting for it to listen) …")
        s = settings
        try:
            rt = await relayproc.start_relay(
                plan.storage,
                plan.port,
                s.relay_host,
                s.relay_bootstrap,
                s.relay_metrics if s.relay_metrics else None,
                timeout=_left(deadline, 5.0),
                kernel_forwarding=kernel,
            )
        except RelayProcError as e:
            yield LocalCommand(cmd, True, 1, (e.log_tail or "").strip())
            what = sentences(f"The relay did not start: {e.what.rstrip('.')}")
            yield RelayOutcome(None, None, error=what, fix=e.fix, log_tail=(e.log_tail or "").strip())
            return
        yield LocalCommand(cmd, True, 0, f"Server listening on {rt.key} (pid {rt.pid})")
        verb = "Started" if plan.action == "start" else "Restarted"  # same storage, same key
    assert rt is not None
    yield RelayRunning(rt, verb)
    async for ev in check_relay(settings, rt, connect, deadline, verb):
        yield ev


async def check_relay(
    settings: Settings,
    rt: RelayRuntime,
    connect: Callable[[], Awaitable[Runner]] | None,
    deadline: float,
    verb: str = "Attached to",
) -> AsyncIterator[RelayEvent]:
    """The relay runs: what step 1 could not check (DHT, its port from the deployment host), then the
    probes. Ends with the RelayOutcome."""
    yield Stage(f"{verb} the relay; checking that the deployment host reaches it …")
    runner: Runner | None = None
    results: list[CheckResult] = []
    if connect is not None:
        try:
            runner = await connect()
            results = await relay_reach_checks(settings, runner, rt)
        except RunnerError as e:
            from cosmictui.ops.jobs.listing import runner_problem

            results = [CheckResult("Deployment host reachable", "fail", runner_problem(e, "connect"), e.fix)]
            runner = None
    yield Stage(f"{verb} the relay; probing it: two peers connect through it …")
    local, remote = await prove_relay(settings, rt.key, runner, _left(deadline, 5.0))
    results.append(local)
    if remote is not None:
        results.append(remote)
    yield RelayOutcome(rt, rt.key, results, blocking(results), probe_verdict(local, remote), verb=verb)


async def prove_relay(
    settings: Settings, key: str, runner: Runner | None, timeout: float
) -> tuple[CheckResult, CheckResult | None]:
    """The probe from this machine and, where cosmictui runs on the deployment host, from there
    (where the jobs are), both within `timeout`: the rows `cosmictui check` and step 2 show."""
    from cosmictui.ops.metrics.probe import PROBE_TIMEOUT, probe_check, probe_from_host, run_probe

    deadline = time.monotonic() + timeout
    boot = list(settings.relay_bootstrap) or None
    local = probe_check(await run_probe(key, boot, min(PROBE_TIMEOUT, timeout)))
    remote = None
    if runner is not None and getattr(runner, "host", None):
        left = deadline - time.monotonic()
        if left > 5:
            remote = await probe_from_host(runner, key, boot, min(PROBE_TIMEOUT, left - 2))
        else:
            remote = CheckResult(
                f"Relay carries a connection from {runner.label} (probe)",
                "warn",
                f"not run: the {timeout:g} s for this step were used up",
                "give it more time (--timeout)",
            )
    return local, remote


def blocking(results: list[CheckResult]) -> str | None:
    """Jobs can only use the relay if the deployment host reaches it: that failing blocks step 2."""
    for r in results:
        if r.status == "fail" and (r.name.startswith(RELAY_REACH_PREFIX) or r.name == "Deployment host reachable"):
            return f"{r.name}: {r.detail}."
    return None


async def attach_by_key(settings: Settings, key: str, timeout: float = RELAY_UP_TIMEOUT) -> AsyncIterator[RelayEvent]:
    """A relay this machine does not run (no runtime file, maybe no /stats): the probe is the proof."""
    from cosmictui.ops.metrics.probe import PROBE_TIMEOUT, probe_check, run_probe

    yield Stage(f"Probing relay {key[:12]}…: two peers connect through it …")
    res = await run_probe(key, list(settings.relay_bootstrap) or None, min(PROBE_TIMEOUT, timeout))
    row = probe_check(res)
    if not res.ok:
        yield RelayOutcome(None, key, [row], unproven=f"did not carry the probe: {res.error}", verb="Attached by key")
        return
    yield RelayOutcome(None, key, [row], verb="Attached by key")
