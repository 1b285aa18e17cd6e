"""The core contract (relay/core.py) is checked by mypy, and the driver keeps it.

Every sans-IO core states its conformance to its Protocol in an `if TYPE_CHECKING:` block that
mypy checks (CI's mypy step runs over relay/). Here mypy is run on two small modules: a core
that speaks the vocabulary passes, and the same core with one method misnamed fails, so a
wrong name cannot slip through. The driver's own behaviour (iterative draining, one timer that
is its own, the loop's time never going back) is tested with a virtual loop.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from relay.core import Deadlines, Driver, drain_events, run_action

ROOT = Path(__file__).resolve().parents[2]

CORE = '''
from __future__ import annotations

from typing import TYPE_CHECKING


class Tick:
    pass


class Clock:
    """A tiny datagram core."""

    def __init__(self) -> None:
        self.due: float | None = None
        self.events: list[Tick] = []

    def receive(self, data: bytes, addr: tuple[str, int], now: float) -> None:
        self.due = now + 1.0

    def datagrams_to_send(self, now: float) -> list[bytes]:
        return []

    def {timer}(self) -> float | None:
        return self.due

    def handle_timer(self, now: float) -> None:
        self.events.append(Tick())

    def next_event(self) -> Tick | None:
        return self.events.pop(0) if self.events else None


if TYPE_CHECKING:
    from relay.core import DatagramCore, DrivenCore

    def _conforms(core: Clock) -> tuple[DatagramCore[Tick], DrivenCore[Tick]]:
        return core, core
'''


def mypy(source: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    mod = tmp_path / "stub_core.py"
    mod.write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", str(mod)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_mypy_accepts_a_core_that_speaks_the_vocabulary_and_refuses_a_misnamed_method(tmp_path: Path) -> None:
    good = mypy(CORE.format(timer="get_timer"), tmp_path)
    assert good.returncode == 0, good.stdout + good.stderr
    bad = mypy(CORE.format(timer="next_deadline"), tmp_path)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "Incompatible return value type" in bad.stdout and "DrivenCore" in bad.stdout, bad.stdout


def test_every_core_states_its_conformance() -> None:
    """Each module that holds a core says which Protocol it keeps, where mypy sees it."""
    expected = {
        "relay/udx/stream.py": "DatagramCore",
        "relay/dht/core.py": "DatagramCore",
        "relay/dht/rpc.py": "DatagramCore",
        "relay/secretstream.py": "ByteStreamCore",
        "relay/protomux.py": "ByteStreamCore",
        "relay/blindrelay.py": "ByteStreamCore",
        "relay/dht/blindclient.py": "ByteStreamCore",
        "relay/dhtprom.py": "ByteStreamCore",
        "relay/dht/handshake.py": "DrivenCore",
        "relay/dht/backlog.py": "TimedCore",
        "relay/udx/kerneltable.py": "DrivenCore",
        "relay/service/pauses.py": "TimedCore",
    }
    for path, protocol in expected.items():
        text = (ROOT / path).read_text()
        _, found, block = text.rpartition("\nif TYPE_CHECKING:\n")
        assert found and "def _conforms(" in block and protocol in block, f"{path} states no {protocol} conformance"


# --- the driver -------------------------------------------------------------------------------


class _Handle:
    def __init__(self, loop: VirtualLoop, when: float, callback: Any) -> None:
        self.loop, self.when_, self.callback, self.cancelled = loop, when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualLoop:
    """`time()` and `call_at` only; its handles have no `when()` (as uvloop's plain Handle)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.handles: list[_Handle] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any) -> _Handle:
        h = _Handle(self, when, callback)
        self.handles.append(h)
        return h

    def armed(self) -> list[float]:
        return sorted(h.when_ for h in self.handles if not h.cancelled)

    def run_until(self, t: float, early: float = 0.0) -> None:
        """Fire what is due by `t`; `early`: each fires that much before its time (uvloop's ms)."""
        while True:
            due = [h for h in self.handles if not h.cancelled and h.when_ - early <= t]
            if not due:
                break
            h = min(due, key=lambda x: x.when_)
            self.handles.remove(h)
            self.now = max(self.now, h.when_ - early)
            h.callback()
        self.now = max(self.now, t)


class Chain:
    """A core whose every event asks for another pump (as a closing relay stream reports back
    to the blind-relay core that is destroying it): `n` events in a chain."""

    def __init__(self, n: int) -> None:
        self.left = n
        self.pending: list[int] = []
        self.due: float | None = None
        self.times: list[float] = []

    def start(self, now: float) -> None:
        self.times.append(now)
        if self.left:
            self.pending.append(self.left)

    def get_timer(self) -> float | None:
        return self.due

    def handle_timer(self, now: float) -> None:
        self.times.append(now)
        self.due = None

    def next_event(self) -> int | None:
        return self.pending.pop() if self.pending else None


def test_a_long_chain_of_events_that_each_pump_again_is_drained_without_recursion() -> None:
    loop = VirtualLoop()
    core = Chain(50_000)
    seen: list[int] = []

    def on_event(ev: int) -> None:
        seen.append(ev)
        core.left -= 1
        if core.left:
            core.pending.append(core.left)
        driver.pump()  # a callback that reports back: no recursion (50,000 deep would raise)

    driver: Driver[int] = Driver(core, loop, on_event=on_event)
    driver.feed(core.start)
    assert len(seen) == 50_000 and seen[-1] == 1


def test_the_driver_keeps_one_timer_of_its_own_and_never_goes_back_in_time() -> None:
    loop = VirtualLoop()
    core = Chain(0)
    sent: list[float] = []
    driver: Driver[int] = Driver(core, loop, transmit=sent.append)
    core.due = 105.0
    driver.pump()
    assert loop.armed() == [105.0] and driver.armed == 105.0
    core.due = 103.0  # earlier: re-armed
    driver.pump()
    assert loop.armed() == [103.0]
    core.due = 104.0  # later: the earlier timer stays (it fires, finds less, re-arms)
    driver.pump()
    assert loop.armed() == [103.0]
    loop.run_until(103.0, early=0.001)  # the loop fires a millisecond early, as uvloop may
    assert core.times == [103.0]  # ... the core is told the time it was armed for
    assert driver.now() == 103.0  # and nothing it is given later is behind that
    assert sent and sent[-1] == 103.0
    driver.close()
    core.due = 200.0
    driver.pump()
    assert loop.armed() == []


def test_deadlines_run_each_action_at_its_time_through_one_timer() -> None:
    loop = VirtualLoop()
    deadlines = Deadlines()
    driver: Driver[Any] = Driver(deadlines, loop, on_event=run_action)
    ran: list[str] = []
    deadlines.add(loop.time() + 2.0, lambda: ran.append("b"))
    deadlines.add(loop.time() + 1.0, lambda: ran.append("a"))
    driver.arm()
    assert loop.armed() == [101.0]
    loop.run_until(101.5)
    assert ran == ["a"] and loop.armed() == [102.0]
    loop.run_until(110.0)
    assert ran == ["a", "b"] and len(deadlines) == 0 and loop.armed() == []


def test_drain_events_takes_them_in_order() -> None:
    core = Chain(0)
    core.pending = [3, 2, 1]
    assert drain_events(core) == [1, 2, 3]


@pytest.mark.parametrize("early", [0.0, 0.0009])
def test_an_event_loop_handle_without_when_is_never_asked_for_it(early: float) -> None:
    """The driver compares its own due time: a loop whose handles have no `when()` is enough."""
    loop = VirtualLoop()
    core = Chain(0)
    driver: Driver[int] = Driver(core, loop)
    core.due = 100.0005  # under a millisecond away
    driver.arm()
    core.due = 100.5
    driver.arm()  # a later deadline with one armed: compared with the driver's own due time
    loop.run_until(100.5, early=early)
    assert core.times and core.times[0] >= 100.0005
