"""A relay whose loop stalls (a full garbage collection over thousands of pairs, a busy host) must
not lose its peers' packets: its socket has room for the stall, the kernel's drops are counted in
`/stats`, the start-up heap is frozen out of full collections, and the pauses themselves are
reported."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

from relay import cli
from relay.keys import key_pair
from relay.service.app import RelayApp, RelayConfig
from relay.service.pauses import GC_THRESHOLDS, RELAY_RECEIVE_BUFFER, Pauses


def _rmem_max() -> int:
    return int(Path("/proc/sys/net/core/rmem_max").read_text())


def test_the_relay_socket_has_room_for_a_stall_and_counts_what_the_kernel_drops(tmp_path: Path) -> None:
    async def run() -> None:
        app = RelayApp(RelayConfig(storage=tmp_path, key_pair=key_pair(), host="127.0.0.1", port=0, metrics=None))
        await app.bind()
        try:
            assert app.socket is not None
            granted = app.socket.receive_buffer
            if os.geteuid() == 0:  # SO_RCVBUFFORCE: granted whatever net.core.rmem_max says
                assert granted >= 2 * RELAY_RECEIVE_BUFFER
            else:
                assert granted >= min(2 * RELAY_RECEIVE_BUFFER, 2 * _rmem_max())
            stats = app.snapshot()["socket"]
            assert stats == {"receive_buffer_bytes": granted, "kernel_drops": 0}
            # the loop does not run while we send: more than the buffer holds is dropped by the kernel
            sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                payload = b"\x00" * 1100
                sent = 0
                while sent < 4 * granted // len(payload):
                    sender.sendto(payload, ("127.0.0.1", app.port))
                    sent += 1
            finally:
                sender.close()
            drops = app.snapshot()["socket"]["kernel_drops"]
            assert 0 < drops < sent
        finally:
            await app.close()

    asyncio.run(run())


def test_pauses_report_full_collections_and_loop_stalls() -> None:
    async def run() -> dict[str, Any]:
        pauses = Pauses()
        pauses.start(asyncio.get_running_loop())
        try:
            await asyncio.sleep(0.2)
            gc.collect()
            time.sleep(0.4)  # the loop is blocked at least this long
            await asyncio.sleep(0.2)
            return pauses.snapshot()
        finally:
            pauses.stop()

    snap = asyncio.run(run())
    assert snap["gc_full_collections"] >= 1
    assert snap["loop_longest_stall_ms"] >= 300  # 0.4 s blocked, less at most one 0.05 s tick
    assert snap["loop_stalls_over_1s"] == 0 or snap["loop_longest_stall_ms"] >= 1000


class _StartedApp:
    """Stands in for RelayApp: starts at once, and records the GC policy as the relay listens."""

    seen: ClassVar[dict[str, Any]] = {}

    def __init__(self, config: Any) -> None:
        self.key = "k"
        self.port = 0
        self.metrics = None

    async def start(self) -> None:
        pass

    def write_runtime(self) -> None:
        _StartedApp.seen = {"frozen": gc.get_freeze_count(), "thresholds": gc.get_threshold()}
        os.kill(os.getpid(), signal.SIGTERM)  # the relay's own stop path

    async def close(self) -> None:
        pass

    def remove_runtime(self) -> None:
        pass


def test_the_gc_policy_is_applied_once_the_relay_has_started(tmp_path: Path) -> None:
    before = gc.get_threshold()
    config: Any = SimpleNamespace(host="127.0.0.1", storage=tmp_path)
    try:
        assert cli._run(config, _StartedApp, (RuntimeError,)) == cli.EXIT_OK  # type: ignore[arg-type]
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    assert _StartedApp.seen["frozen"] > 0
    assert _StartedApp.seen["thresholds"] == GC_THRESHOLDS
