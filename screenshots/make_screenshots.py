"""Make the SVG screenshots in README and docs/: every wizard step and the monitor, from the demo sandbox.

    python3 screenshots/make_screenshots.py [--only wizard|monitor] [--out DIR]
    python3 screenshots/make_screenshots.py --check

The wizard runs against a fresh demo sandbox (real `.env`, sandbox `task`/`cosmicac`, the real
Python relay on a private loopback DHT), driven by Textual's Pilot the way an operator would:
each step's own key, then Next. Each step is captured when it has finished its work. The monitor
is captured on the sandbox's running relay at 80×24 and 200×50, in dark and light themes.
Nothing here is faked; numbers are whatever the relay reports at that moment.

`--check` renders every shot into a temporary directory and compares the words each shows with
the committed picture (screenshots/text_layer.py says what is made alike first); the test suite
runs it, so a screen that changed cannot leave a stale picture in README or docs.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
# the wizard saves progress under XDG_STATE_HOME: keep the operator's own state out of this
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="cosmictui-shots-state-")
atexit.register(shutil.rmtree, os.environ["XDG_STATE_HOME"], True)  # nothing left behind in /tmp

from textual.pilot import Pilot  # noqa: E402

from cosmictui.app import WizardApp, make_context  # noqa: E402
from cosmictui.monitor_app import MonitorApp  # noqa: E402
from cosmictui.ops.metrics.client import RelayState, Target  # noqa: E402
from cosmictui.screens.monitor import MonitorScreen  # noqa: E402

STRICT = False  # --check: a wait that gives up is an error, not a picture taken anyway
WIZARD_SIZE = (80, 24)  # the size operators get in a tmux pane; the wizard is laid out for it first
SAFETY = 90.0

# step id → keys that do the step's work in the demo (before Next)
STEP_KEYS: dict[str, list[str]] = {
    "prereqs": [],
    "relay": ["s"],
    "env": ["w"],
    "apply": ["r"],
    "verify": ["j"],
    "recover": [],
}


async def until(pilot: Pilot[Any], cond: Callable[[], Any], what: str, timeout: float = SAFETY) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            if STRICT:  # a check must not compare a picture taken before the screen was ready
                raise TimeoutError(f"gave up waiting for {what}")
            print(f"  ! gave up waiting for {what}", file=sys.stderr)
            return False
        await pilot.pause(0.1)
    return True


OUT = HERE  # --out DIR writes elsewhere; --check renders into a temporary directory


async def save_settled(pilot: Pilot[Any], name: str) -> None:
    """Save once the screen has settled: two renders a moment apart show the same words (a clock
    or a job's age may move). A busy machine can catch a screen between a worker's result and its
    layout; the picture must show the screen an operator looks at, not that moment."""
    from text_layer import words

    last = None
    for _ in range(30):
        now = words(pilot.app.export_screenshot())
        if now == last:
            break
        last = now
        await pilot.pause(0.2)
    else:
        if STRICT:
            raise TimeoutError(f"{name}: the screen kept changing")
    save(pilot.app, name)


def save(app: Any, name: str) -> None:
    app.save_screenshot(filename=f"{name}.svg", path=str(OUT))
    print(f"  wrote {OUT / name}.svg")


async def next_step(pilot: Pilot[Any], screen: Any, i: int) -> bool:
    """Press Next as an operator would: again if the step was busy (a list refreshing) when
    pressed, which Next ignores, until the wizard moves on or the step says why not."""
    deadline = time.monotonic() + SAFETY
    while time.monotonic() < deadline and screen.steps[i].validate_step() is None:
        await until(pilot, lambda: not screen.steps[i].busy, "the step to be idle")
        await pilot.press("n")
        for _ in range(20):
            if screen.index == i + 1:
                return True
            await pilot.pause(0.1)
    if STRICT:
        raise TimeoutError(f"step {i + 1} refused Next: {screen.steps[i].validate_step()}")
    return False


async def wizard_shots() -> Any:
    ctx = make_context(None, True, None)
    app = WizardApp(ctx)
    sandbox = ctx.demo
    try:
        async with app.run_test(size=WIZARD_SIZE) as pilot:
            screen = app.screen
            for i, step in enumerate(screen.steps):
                sid = step.STEP_ID
                await until(pilot, lambda i=i: screen.index == i, f"step {sid}")
                await until(pilot, lambda s=step: not s.busy, f"{sid} to settle")
                # a step that watches (Verify lists the jobs every few seconds) has looked once
                await until(pilot, lambda s=step: getattr(s, "polls", 1) >= 1, f"{sid}'s first look")
                for key in STEP_KEYS.get(sid, []):
                    await pilot.press(key)
                    await pilot.pause(0.3)
                    if app.screen is not screen:  # a confirmation: show it, then say yes
                        await save_settled(pilot, f"wizard-{i + 1}-{sid}-confirm")
                        await pilot.press("y")
                        await until(pilot, lambda: app.screen is screen, "the confirmation to close")
                    await until(pilot, lambda s=step: not s.busy, f"{sid} after {key}")
                if sid == "verify":  # the new job must leave Creating: the step says so when it did
                    await until(pilot, lambda s=step: s.validate_step() is None, "a new job to leave Creating")

                # the step's own workers (a jobs list on a slow host) have finished: no half-loaded list;
                # Verify's watch runs as long as the step is shown: it is between two lists
                def idle(s: Any = step) -> bool:
                    watching = getattr(s, "session", None)
                    busy = [w for w in app.workers if w.node is s and w.is_running and w.group != "verify-poll"]
                    return not busy and not (watching is not None and watching.polling)

                await until(pilot, idle, f"{sid}'s work")
                await pilot.pause(0.3)
                await save_settled(pilot, f"wizard-{i + 1}-{sid}")
                if i < len(screen.steps) - 1 and not await next_step(pilot, screen, i):
                    print(f"  ! {sid} refused Next: {step.validate_step()}", file=sys.stderr)
                    break
            # the monitor as the wizard opens it (m), on the demo's relay
            await pilot.press("m")
            await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "the monitor screen")
            mon = app.screen
            await until(pilot, lambda: mon.watches[0].state is RelayState.UP and mon.polls >= 3, "monitor data")
            save(app, "wizard-monitor")
    except BaseException:
        sandbox.close()
        raise
    return sandbox


class SteadyTraffic:
    """Real Node hyperdht peers holding `pairs` relayed connections open and echoing through each
    every fraction of a second (the npm packages of tests/interop), so the monitor shows traffic
    beside the sessions and pairings that carry it. Pairs opened and closed in bursts would show
    a rate from pairs already gone beside "0 open" sessions."""

    def __init__(self, node: str, bootstrap: str, key: str, port: int, pairs: int = 4) -> None:
        import threading

        from tests.interop._capacity_peers import CapacityPeers

        self.peers = CapacityPeers(node, bootstrap, key, port).__enter__()
        opened = self.peers.open(pairs)
        if opened.failed:
            self.peers.__exit__()
            raise RuntimeError(f"{opened.failed} of {pairs} relayed connections failed: {opened.failures}")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.peers.echo(64_000)  # every connection echoes 64 KB
            self.stop.wait(0.2)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(120)
        self.peers.__exit__()


async def relaying_sandbox() -> tuple[Any, Any, SteadyTraffic] | None:
    """A second demo sandbox whose relay joins a Node hyperdht testnet, with pairs relaying."""
    node = shutil.which("node")
    if node is None or not (HERE.parent / "tests" / "interop" / "node_modules" / "hyperdht").is_dir():
        return None
    from cosmictui.ops.demo.sandbox import create_sandbox
    from cosmictui.ops.relayproc import start_relay
    from tests.interop._relay_net import Testnet

    tn = Testnet(node, 4).start()
    sandbox = create_sandbox(bootstrap=tuple(tn.bootstrap.split(",")), seed_jobs=False)
    s = sandbox.settings
    try:
        rt = await start_relay(
            str(sandbox.relay_storage), s.relay_port, s.relay_host, s.relay_bootstrap, s.relay_metrics
        )
        return tn, sandbox, SteadyTraffic(node, tn.bootstrap, rt.key, rt.port)
    except BaseException:
        sandbox.close()
        tn.stop()
        raise


async def monitor_shots(storage: Path, settle_polls: int = 8) -> None:
    for size, theme, name in (
        ((80, 24), "textual-dark", "monitor-80x24-dark"),
        ((80, 24), "textual-light", "monitor-80x24-light"),
        ((200, 50), "textual-dark", "monitor-200x50-dark"),
    ):
        app = MonitorApp([Target(storage=storage)], interval=0.5, theme=theme)
        async with app.run_test(size=size) as pilot:
            screen = app.screen
            await until(
                pilot, lambda s=screen: s.watches[0].state is RelayState.UP and s.polls >= settle_polls, "monitor data"
            )
            save(app, name)


async def render(only: str | None, settle_polls: int) -> None:
    sandbox = None
    try:
        if only != "monitor":
            print("wizard (demo sandbox):")
            sandbox = await wizard_shots()
        if only != "wizard":
            relaying = await relaying_sandbox()
            if relaying is not None:
                tn, busy, traffic = relaying
                try:
                    print("monitor (a demo relay with Node peers relaying through it):")
                    await monitor_shots(busy.relay_storage, settle_polls=settle_polls)
                finally:
                    traffic.close()
                    busy.close()
                    tn.stop()
                return
            if STRICT:
                raise RuntimeError("the monitor shots need node and tests/interop/node_modules (npm ci there)")
            if sandbox is None:
                from cosmictui.ops.demo.sandbox import create_sandbox
                from cosmictui.ops.relayproc import start_relay

                sandbox = create_sandbox(seed_jobs=False)
                s = sandbox.settings
                await start_relay(
                    str(sandbox.relay_storage),
                    s.relay_port,
                    s.relay_host,
                    s.relay_bootstrap,
                    s.relay_metrics,
                )
            print("monitor (the demo relay):")
            await monitor_shots(sandbox.relay_storage)
    finally:
        if sandbox is not None:
            sandbox.close()


def check(fresh: Path, only: str | None) -> int:
    """Compare the words of each committed screenshot with the same shot rendered just now."""
    from text_layer import differences

    stale = 0
    made = {p.name for p in fresh.glob("*.svg")}
    for committed in sorted(HERE.glob("*.svg")):
        if committed.name not in made and (only is None or committed.name.startswith(only)):
            print(f"  {committed.name}: in screenshots/, but the demo no longer makes it")
            stale += 1
    for made in sorted(fresh.glob("*.svg")):
        committed = HERE / made.name
        if not committed.exists():
            print(f"  {made.name}: the demo makes it, but screenshots/ has no such picture")
            stale += 1
            continue
        if found := differences(committed, made):
            print(f"  {made.name} is stale:")
            for line in found:
                print(f"    {line}")
            stale += 1
    if stale:
        print(f"{stale} screenshot(s) no longer show what the demo shows: run python3 screenshots/make_screenshots.py")
        return 1
    print("every screenshot shows what the demo shows")
    return 0


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("wizard", "monitor"))
    ap.add_argument("--out", type=Path, default=HERE, help="directory for the SVGs (default: screenshots/)")
    ap.add_argument(
        "--check",
        action="store_true",
        help="render into a temporary directory and compare each picture's words with screenshots/ "
        "(clocks, keys, paths and numbers made alike; charts not compared); exit 1 when one is stale",
    )
    a = ap.parse_args()
    global OUT, STRICT
    if not a.check:
        OUT = a.out
        await render(a.only, settle_polls=50)
        return 0
    STRICT = True
    OUT = Path(tempfile.mkdtemp(prefix="cosmictui-shots-check-"))
    await render(a.only, settle_polls=6)  # the charts are not compared: a short history will do
    if code := check(OUT, a.only):
        print(f"(the pictures rendered just now are in {OUT})")
    else:
        shutil.rmtree(OUT)
    return code


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
