"""The one vocabulary every sans-IO core in `relay/` speaks (aioquic's and h11's words), and the
one driver that runs a core on the asyncio loop.

A core never touches a socket or a clock. The glue gives it input with `now` taken from the
running loop's clock (`loop.time()`, the only clock in the relay), sends what it wants sent,
arms one timer at the core's own next deadline, and dispatches its events:

    input     receive(data, ..., now)    bytes in (a datagram core also gets the source address);
                                         `now` is always the last argument
    output    datagrams_to_send(now)     for datagram cores: what to put on the wire now
              data_to_send()             for byte-stream cores: bytes to write, in order
    timers    get_timer() -> float|None  absolute loop time of the next deadline, None if none
              handle_timer(now)          run everything due at `now` (called at or after it)
    events    next_event() -> E|None     one event at a time, None when there are no more

No core is driven by a fixed period: periodic work (the DHT's tick, kernel counters) is a
deadline in `get_timer()` like any other. The Protocols below exist so the contract is checked
by mypy rather than remembered: cores do not inherit from them, each core module states its
conformance in an `if TYPE_CHECKING:` block (so the sans-IO guard, which follows imports, never
sees this module's asyncio).

`Driver` is the one piece of glue that runs a core: `feed(core.receive, data, addr)` calls the
input with the loop's `now` appended, then `pump()` drains the core's events one at a time into
`handle_event`, calls `transmit(now)` to send its output, and re-arms the single timer from
`get_timer()`. A pump that is asked for while it runs (an event's callback fed the core again,
or closed something that reports back) does not recurse: the running pump goes round once more.
The timer is the driver's (it remembers its own due time; no handle method that one event loop
has and another lacks), and `handle_timer` gets the later of the loop's time and the due time
(a loop may fire a timer up to its granularity early), never a time behind one already given.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

E = TypeVar("E")
E_co = TypeVar("E_co", covariant=True)
R = TypeVar("R")


class TimedCore(Protocol):
    """A core with deadlines of its own."""

    def get_timer(self) -> float | None: ...

    def handle_timer(self, now: float) -> None: ...


class EventSource(Protocol[E_co]):
    """A core that reports what happened as events, drained one at a time."""

    def next_event(self) -> E_co | None: ...


class DrivenCore(TimedCore, EventSource[E_co], Protocol[E_co]):
    """What `Driver` needs of a core: deadlines and events (input and output are the glue's)."""


class ByteStreamCore(EventSource[E_co], Protocol[E_co]):
    """A core over an ordered byte stream or its messages (secret-stream, protomux, a
    blind-relay session or client, the scraper's protomux-rpc)."""

    def receive(self, data: bytes, now: float, /) -> object: ...

    def data_to_send(self) -> Any: ...


class DatagramCore(EventSource[E_co], Protocol[E_co]):
    """A core over datagrams (dht-rpc, the HyperDHT core, a UDX stream); its input is
    `receive(data, ..., now)` with what the datagram's core needs of its source."""

    def datagrams_to_send(self, now: float, /) -> Any: ...


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Loop(Protocol):
    """The loop as a driver sees it: its clock and its timers (asyncio's, uvloop's, a test's)."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object], /) -> Cancellable: ...


_DISPATCH = 1
_PUMP = 2


class Driver(Generic[E]):
    """Runs one core on the loop: input with the loop's time, events drained iteratively,
    output sent, one timer at the core's own deadline.

    Give `on_event`/`transmit` callbacks, or subclass and override `handle_event`/`transmit`
    (a class with many instances, such as a UDX stream, saves the two bound methods).
    `loop` None: the running loop, found on first use. `granularity`: the timer fires no
    sooner than that many seconds after it is armed (expiries batched: one scan serves many).
    """

    __slots__ = (
        "_again",
        "_closed",
        "_core",
        "_due",
        "_evented",
        "_granularity",
        "_loop",
        "_now",
        "_on_event",
        "_pumping",
        "_timer",
        "_transmit",
    )

    def __init__(
        self,
        core: DrivenCore[E] | TimedCore,
        loop: Loop | None = None,
        *,
        on_event: Callable[[E], object] | None = None,
        transmit: Callable[[float], object] | None = None,
        granularity: float = 0.0,
    ) -> None:
        self._core: Any = core
        #: a core with no events (a backlog that only releases at its time) has no next_event
        self._evented = hasattr(core, "next_event")
        self._loop = loop
        self._on_event = on_event
        self._transmit = transmit
        self._granularity = granularity
        self._timer: Cancellable | None = None
        self._due = 0.0
        self._now = 0.0
        self._pumping = 0  # 0, _DISPATCH or _PUMP while one runs
        self._again = False
        self._closed = False

    # --- for the glue -----------------------------------------------------------------------

    @property
    def loop(self) -> Loop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    @loop.setter
    def loop(self, loop: Loop) -> None:
        self._loop = loop

    def now(self) -> float:
        """The loop's time, never behind a time the core was already given."""
        t = self.loop.time()
        if t > self._now:
            self._now = t
        return self._now

    def feed(self, method: Callable[..., R], *args: Any, **options: Any) -> R:
        """Input: `method(*args, now, **options)` (a core's input method: `now` is the last
        positional argument), then `pump()`."""
        out = method(*args, self.now(), **options)
        self.pump()
        return out

    def pump(self) -> None:
        """Drain the core's events, send its output, re-arm its timer. Asked for from inside a
        running pump (a callback fed the core, or something it closed reports back), it only
        makes that pump go round once more: no recursion, however long the chain."""
        if self._pumping:
            self._pumping = _PUMP  # a `dispatch` running becomes a pump: output and timer too
            self._again = True
            return
        self._run(_PUMP)

    def dispatch(self) -> None:
        """Only the events, iteratively (for glue that sends the output later, as a socket does
        after a whole read); a `pump` asked for meanwhile still sends and re-arms."""
        if self._pumping:
            self._again = True
            return
        self._run(_DISPATCH)

    def _run(self, mode: int) -> None:
        self._pumping = mode
        core: Any = self._core
        try:
            while True:
                self._again = False
                if self._evented:
                    ev = core.next_event()
                    while ev is not None:
                        self.handle_event(ev)
                        ev = core.next_event()
                if self._pumping == _PUMP:
                    self.transmit(self.now())
                if not self._again:
                    break
            mode = self._pumping
        finally:
            self._pumping = 0
        if mode == _PUMP:
            self.arm()

    def arm(self) -> None:
        """The one timer at `get_timer()`. One armed earlier stays (it fires, finds less to do,
        re-arms): no cancel per input."""
        if self._closed:
            return
        due = self._core.get_timer()
        if due is None:
            return
        if self._timer is not None:
            if self._due <= due:
                return
            self._timer.cancel()
        loop = self.loop
        if self._granularity:
            due = max(due, loop.time() + self._granularity)
        self._due = due
        self._timer = loop.call_at(due, self._fire)

    @property
    def armed(self) -> float | None:
        """When the timer fires (None: not armed)."""
        return self._due if self._timer is not None else None

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        """No more timers (events and output are still pumped when asked)."""
        self._closed = True
        self.disarm()

    # --- what a subclass may override -------------------------------------------------------

    def handle_event(self, event: E) -> None:
        if self._on_event is not None:
            self._on_event(event)

    def transmit(self, now: float) -> None:
        if self._transmit is not None:
            self._transmit(now)

    # --- the timer ----------------------------------------------------------------------------

    def _fire(self) -> None:
        self._timer = None
        if self._closed:
            return
        # a loop may run a timer up to its granularity early (uvloop: 1 ms): it is due by the
        # loop's own contract, so the core is told the time it was armed for
        now = self.now()
        if self._due > now:
            now = self._now = self._due
        self._core.handle_timer(now)
        self.pump()


class Deadline:
    """One `Deadlines` entry: `cancel()` and its action never runs."""

    __slots__ = ("action",)

    def __init__(self, action: Callable[[], object]) -> None:
        self.action: Callable[[], object] | None = action

    def cancel(self) -> None:
        self.action = None


class Deadlines:
    """A sans-IO core of one-shot deadlines: `add(when, action)`; `handle_timer(now)` makes every
    action due by `now` an event (in time order), for a `Driver` whose `on_event` runs it. For
    the glue's own waits (a passive connect's timeout, a late destroy, a memory trim): they too
    go through a driver's one timer."""

    __slots__ = ("_heap", "_ready", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = 0
        self._ready: list[Callable[[], object]] = []

    def add(self, when: float, action: Callable[[], object]) -> Deadline:
        self._seq += 1
        d = Deadline(action)
        heapq.heappush(self._heap, (when, self._seq, d))
        return d

    def get_timer(self) -> float | None:
        heap = self._heap
        while heap and heap[0][2].action is None:  # cancelled: no deadline
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def handle_timer(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            action = heapq.heappop(heap)[2].action
            if action is not None:
                self._ready.append(action)

    def next_event(self) -> Callable[[], object] | None:
        return self._ready.pop(0) if self._ready else None

    def __len__(self) -> int:
        return len(self._heap) + len(self._ready)


def run_action(action: Callable[[], object]) -> None:
    """`Deadlines`' events are actions: a driver's `on_event` for it."""
    action()


def drain_events(core: EventSource[E_co]) -> list[E_co]:
    """Every event `core` has now, in order (for tests and glue that dispatch a batch)."""
    out: list[E_co] = []
    event = core.next_event()
    while event is not None:
        out.append(event)
        event = core.next_event()
    return out
