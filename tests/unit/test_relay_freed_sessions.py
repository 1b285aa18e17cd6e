"""A closed relayed session is freed by reference counting: it leaves no cyclic garbage.

Each closed session used to leave ~60 objects that only a garbage collection could free (its
UDX stream's hooks were bound methods of the secret-stream protocol and transport that held the
stream, the protocol and its transport held each other, the relay's event handler was a closure
over the session, the handshake's firewall a closure over the attempt), so when thousands
closed together one collection paused the relay for about a second. Real peers in a process of
their own (tests/unit/_relay_pairs_client.py) pair through an in-process relay and relay bytes;
then every session ends, gracefully or by its stream failing, with automatic collection off.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from relay.keys import key_pair
from relay.service.app import RelayApp, RelayConfig
from relay.service.memory import EmbeddedResidentSet
from relay.udx import UDXError

ROOT = Path(__file__).resolve().parents[2]
PAIRS = 6


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[RelayApp]:
    relay = RelayApp(
        RelayConfig(storage=tmp_path, key_pair=key_pair(), host="127.0.0.1", port=0, bootstrap=[], metrics=None),
        rss=EmbeddedResidentSet(),
    )
    await relay.bind()
    await relay.join()
    try:
        yield relay
    finally:
        await relay.close()


async def until(cond: Callable[[], bool], what: str, seconds: float = 30.0) -> bool:
    """Wait for `cond` (the deadline is a safety net); False if it never held."""
    for _ in range(int(seconds / 0.02)):
        if cond():
            return True
        await asyncio.sleep(0.02)
    return False


def timed_out(relay: RelayApp) -> None:
    """What the relay's side does when its peer is gone: each stream times out, unacknowledged."""
    for s in list(relay._sessions.values()):
        s.conn.stream.destroy(UDXError("stream timed out: no acknowledgement after 6 retransmissions", "ETIMEDOUT"))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("ending", ["close", "kill"])
async def test_closed_relayed_sessions_leave_no_cyclic_garbage(app: RelayApp, ending: str) -> None:
    peers = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.unit._relay_pairs_client",
        app.config.key_pair.public_key.hex(),
        str(app.port),
        str(PAIRS),
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert peers.stdin is not None and peers.stdout is not None
    was_enabled = gc.isenabled()
    gc.disable()  # an automatic collection would free the cycles this test looks for
    try:
        line = await asyncio.wait_for(peers.stdout.readline(), 60)
        assert line == b"relayed\n", line
        assert len(app._sessions) == 2 * PAIRS and app.blind.stats.pairings_active == PAIRS
        conns = [weakref.ref(s.conn) for s in app._sessions.values()]
        gc.collect()  # whatever the pairing itself left, so that what follows is the closing's
        peers.stdin.write(f"{ending}\n".encode())
        await peers.stdin.drain()
        if ending == "kill":
            await peers.wait()
            timed_out(app)
        assert await until(lambda: not app._sessions and not app._streams, "every session and stream closed")
        await peers.wait()
        # freed as they closed, by reference counting (a few loop turns for queued callbacks)
        await until(lambda: not any(c() for c in conns), "the closed connections freed", seconds=5.0)
        alive = sum(c() is not None for c in conns)

        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            collected = gc.collect()
            relay_garbage = sorted({type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("relay")})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        # it was ~50 objects per session closed gracefully, ~60 per session timed out
        assert (alive, relay_garbage) == (0, []), f"{alive} connections alive; {collected} objects in cycles"
        assert collected < 2 * PAIRS
    finally:
        if peers.returncode is None:
            peers.kill()
            await peers.wait()
        if was_enabled:
            gc.enable()
