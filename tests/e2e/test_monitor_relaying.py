"""The monitor while a real Node hyperdht pair relays through a real relay: the rates move.

Node peers from npm (`tests/interop/js/relay_peers.js`, relayThrough = our relay) on the
service's loopback testnet; the relay is `python -m relay` started as the wizard starts it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from cosmictui.monitor_app import MonitorApp
from cosmictui.ops.metrics.client import RelayState, Target
from cosmictui.widgets.monitor_graphs import TimePlot
from tests.e2e._monitor_relay import MonitoredRelay
from tests.e2e.test_monitor_live import facts_text, until
from tests.interop._relay_net import Testnet, run_peers

PAYLOAD = 1_000_000


async def test_monitor_rates_move_when_a_real_node_pair_relays(node: str, tmp_path: Path) -> None:
    with Testnet(node, 4) as tn:
        relay = MonitoredRelay(tmp_path / "store", tn.bootstrap).start()
        try:
            app = MonitorApp([Target(storage=relay.storage)], interval=0.25)
            async with app.run_test(size=(120, 36)) as pilot:
                screen = app.screen
                w = screen.watches[0]
                await until(pilot, lambda: w.state is RelayState.UP and w.rates is not None, "relay up, rates")
                assert w.last is not None
                relayed0 = w.last.get("blind_relay_relayed_bytes_total") or 0.0
                matched0 = w.last.get("blind_relay_pairings_matched") or 0.0
                assert max(v for _, v in w.history["relayed_bps"]) == 0.0  # idle before the pair

                res = await asyncio.to_thread(
                    run_peers, node, tn.bootstrap, relay.key, int(relay.runtime["port"]), "client", size=PAYLOAD
                )
                assert res.all_ok, (res.summary, res.stderr[-2000:])
                assert all(p["relayed"] for p in res.pairs)

                def relayed() -> float:
                    return (w.last.get("blind_relay_relayed_bytes_total") or 0.0) if w.last else 0.0

                # the echo went out and back through the relay: the monitor's counters saw it all
                await until(pilot, lambda: relayed() - relayed0 >= 2 * PAYLOAD, "relayed bytes counted")
                assert (w.last.get("blind_relay_pairings_matched") or 0) == matched0 + 1
                # ...and differenced them into rates: bytes/s and packets/s moved, in and out
                peak = {k: max(v for _, v in w.history[k]) for k in ("relayed_bps", "in_bps", "out_bps", "in_pps")}
                assert all(v > 0 for v in peak.values()), peak
                # the traffic graph carries those numbers
                traffic = screen.query_one("#plot-traffic", TimePlot)
                screen.refresh_view()
                assert max(v for s in traffic.series for _, v in s.points) > 0
                await until(pilot, lambda: "0 active  0 pending" in facts_text(screen), "pair closed again")
        finally:
            relay.stop()
