"""Real hyperdht peers (npm `hyperdht` with `relayThrough`) through our relay, run in this process
so its relay streams can be read: each stream's `relayed_bytes`/`relayed_packets` carry what its
peer sent, on the default path and with `--kernel-forwarding` (nftables forwards the established
pair; its element counters are attributed to the streams), and they add up to the socket's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relay.keys import key_pair
from relay.service.app import RelayApp, RelayConfig
from relay.service.memory import EmbeddedResidentSet
from relay.udx import UDXStream
from tests.interop._relay_net import Testnet, run_peers

pytestmark = [pytest.mark.interop, pytest.mark.timeout(240)]

PAYLOAD = 1_000_000
PAIRS = 2


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[Testnet]:
    with Testnet(node, size=5) as tn:
        yield tn


@pytest.mark.parametrize("kernel", [False, True], ids=["default", "kernel"])
async def test_interop_relayed_bytes_of_real_hyperdht_pairs_show_per_stream(
    node: str, testnet: Testnet, tmp_path: Path, kernel: bool
) -> None:
    app = RelayApp(
        RelayConfig(
            storage=tmp_path,
            key_pair=key_pair(),
            host="127.0.0.1",
            port=0,
            bootstrap=testnet.bootstrap.split(","),
            metrics=None,
            kernel_forwarding=kernel,
        ),
        rss=EmbeddedResidentSet(),  # the test process holds more than the relay
    )
    streams: list[UDXStream] = []
    link = app._link

    def keep(ev: Any) -> None:  # the relay streams of each matched pair, as they are made
        link(ev)
        streams.extend(app._streams[x.stream_id] for x in ev.links)

    app._link = keep  # type: ignore[method-assign]
    await app.start()
    try:
        assert app.socket is not None
        assert (app.socket.kernel is not None) == kernel, app.kernel_error
        res = await asyncio.to_thread(
            run_peers, node, testnet.bootstrap, app.key, app.port, "client", pairs=PAIRS, size=PAYLOAD
        )
        assert res.all_ok, (res.pairs, res.summary, res.stderr[-2000:])
        assert all(p["relayed"] for p in res.pairs)
        async with asyncio.timeout(60):  # the peers closed: so do their relay streams
            while not all(s.closed for s in streams):
                await asyncio.sleep(0.01)
        assert len(streams) == 2 * PAIRS
        st = app.socket.stats
        if kernel:
            app.socket.kernel.refresh()  # type: ignore[union-attr]
            assert st.kernel_bytes > PAIRS * 2 * PAYLOAD  # the kernel carried the echo
        for s in streams:  # the client sent PAYLOAD, the server echoed it: each side its share
            assert s.relayed_bytes > PAYLOAD and s.relayed_packets > PAYLOAD // 1500, s
        total_bytes = sum(s.relayed_bytes for s in streams)
        total_packets = sum(s.relayed_packets for s in streams)
        if kernel:
            # a packet the kernel forwards after a pair's last reading (the rest of the loop turn
            # in which it leaves the kernel) is in the socket's totals only
            assert total_packets <= st.relayed_packets and total_packets >= 0.99 * st.relayed_packets
            assert total_bytes <= st.relayed_bytes
        else:
            assert (total_packets, total_bytes) == (st.relayed_packets, st.relayed_bytes)
    finally:
        await app.close()
