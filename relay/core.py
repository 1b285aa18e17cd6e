"""The one vocabulary every sans-IO core in `relay/` speaks (aioquic's and h11's words).

A core never touches a socket or a clock. The asyncio glue feeds it input with `now` taken
from the running loop's clock (`loop.time()`, the only clock in the relay), collects what it
wants sent, arms one timer at the core's own next deadline, and dispatches its events:

    input     receive(..., now)          bytes in (a datagram cores also gets its address)
    output    datagrams_to_send(...)     for datagram cores: what to put on the wire now
              data_to_send()             for byte-stream cores: bytes to write, in order
    timers    get_timer() -> float|None  absolute loop time of the next deadline, None if none
              handle_timer(now)          run everything due at `now` (called at or after it)
    events    next_event() -> E|None     one event at a time, None when there are no more

No core is driven by a fixed period: the glue re-reads `get_timer()` after every input and
every `handle_timer` and re-arms its one timer for that time. These Protocols exist so the
contract is checked by mypy rather than remembered; cores do not inherit from them.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

E_co = TypeVar("E_co", covariant=True)


class TimedCore(Protocol):
    """A core with deadlines of its own."""

    def get_timer(self) -> float | None: ...

    def handle_timer(self, now: float) -> None: ...


class EventSource(Protocol[E_co]):
    """A core that reports what happened as events, drained one at a time."""

    def next_event(self) -> E_co | None: ...


class StreamCore(TimedCore, EventSource[Any], Protocol):
    """A core over an ordered byte stream (secret-stream, protomux, a blind-relay session)."""

    def data_to_send(self) -> Any: ...


class DatagramCore(TimedCore, EventSource[Any], Protocol):
    """A core over datagrams (dht-rpc, the HyperDHT core, a UDX stream)."""

    def datagrams_to_send(self, *args: Any) -> Any: ...


def drain_events(core: EventSource[E_co]) -> list[E_co]:
    """Every event `core` has now, in order (for glue that dispatches a batch)."""
    out: list[E_co] = []
    event = core.next_event()
    while event is not None:
        out.append(event)
        event = core.next_event()
    return out
