"""The memory budget holds against real attackers: a `blind-relay` process at half the default
budget (`--memory-budget 100`) with caps far above what fits in it (so only the RSS check can hold
it), the worst mix from real Node hyperdht peers on several addresses (2,000 sessions held with
keep-alive self-pairs, each parking out-of-order packets and an incomplete frame; self-pairing
with early packets; pending tokens re-sent; out-of-order parking; 16 MiB frames). The relay's
peak resident set (the kernel's VmHWM) stays within the budget, it says it was full and counts
what it refused or shed for it, a pair that carries traffic is never shed, and nothing in the relay
failed (no traceback in its log). It runs on glibc's malloc, as the program always does unless
told otherwise, so what a burst frees can go back. (Legitimate pairs
beside such a mix are measured at the default budget by benchmarks/memory_mix.py.) Waits are on
the relay's counters; nothing depends on speed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.service.memory import MB
from tests.interop._capacity_peers import CapacityPeers
from tests.interop._relay_net import Testnet
from tests.interop._relay_proc import RelayProcess
from tests.interop.test_interop_relay_attacks import Attack, metrics, wait_until

pytestmark = [pytest.mark.interop, pytest.mark.timeout(300)]

BUDGET = 100 * MB
#: sessions the hoarders ask for: more than fits beside the rest at this budget (~1,500), so the
#: budget is reached whatever the allocator's overhead; the attack reports itself in place once
#: all were asked for, so this sets the test's time (2,000: 10.7 s at load 1.4, peak 78.8 MB;
#: 3,000 took 44.5 s at load 3-5)
HOLD = 2000


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[Testnet]:
    with Testnet(node, size=4) as tn:
        yield tn


def vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def test_interop_the_worst_mix_at_a_small_budget_stays_within_it(node: str, testnet: Testnet, tmp_path: Path) -> None:
    args = (
        *("--memory-budget", str(BUDGET // MB)),
        # caps as a 200 MB relay has them and handshakes let through fast: only RSS can bind
        *("--max-sessions", "8192", "--max-active-pairs", "4096", "--max-pending", "8192"),
        *("--handshake-budget", "2000", "--handshakes-per-address", "5000", "--busy-address-sessions", "100000"),
    )
    hold_hosts = [f"127.0.0.{i}" for i in range(6, 10)]
    parts = [
        {"attack": "selfpair", "sessions": 1, "pairs": 1000, "interval": 5000, "early": 8, "hosts": ["127.0.0.2"]},
        {"attack": "pending", "sessions": 16, "pairs": 64, "interval": 1000, "hosts": ["127.0.0.3"]},
        {"attack": "bigframe", "sessions": 2, "frame": (1 << 24) - 1, "send": 1 << 20, "hosts": ["127.0.0.4"]},
        {"attack": "ooo", "sessions": 8, "packets": 1000, "hosts": ["127.0.0.5"]},
        {
            "attack": "hold",
            "sessions": HOLD,
            "keep": 3000,
            "ooo": 100,
            "frame": 1024,
            "frameSend": 768,
            "parallel": 256,
            "hosts": hold_hosts,
        },
    ]
    with RelayProcess(tmp_path / "store", *args, "--log-level", "warning", bootstrap=testnet.bootstrap) as r:
        r.start()
        assert r.key is not None and r.proc is not None, r.stderr
        st = r.stats()
        assert st["memory"]["budget_bytes"] == BUDGET and st["memory"]["full"] is False
        assert st["memory"]["allocator"] == "malloc"
        hosts = {"worker_host": "127.0.0.20", "job_hosts": ["127.0.0.21"]}
        with CapacityPeers(node, testnet.bootstrap, r.key, r.port, **hosts) as live:
            # a relayed connection carrying traffic before the attack: it must outlive it
            assert live.open(1).ok == 1 and live.echo()["ok"] == 1
            with Attack(node, testnet, r, "combined", parts=parts):

                def full_and_pushed_back() -> bool:
                    m = r.stats()["memory"]
                    return m["times_full"] >= 1 and m["rss_bytes"] > 0

                wait_until(full_and_pushed_back, timeout=180, what="the memory budget reached")
                s = r.stats()
                m = metrics(r)
                assert live.echo()["ok"] == 1 and live.status()["closed"] == 0  # never shed
                peak = vm_hwm(r.proc.pid)
        print(f"peak RSS {peak / MB:.1f} MB, budget {BUDGET / MB:.0f} MB")
        assert peak <= BUDGET, f"peak RSS {peak / MB:.1f} MB over the {BUDGET / MB:.0f} MB budget"
        mem = s["memory"]
        assert mem["peak_rss_bytes"] <= BUDGET and mem["budget_bytes"] == BUDGET
        # full: newcomers took idle or silent holders' places, or were refused, all counted
        took_places = s["shed"]["sessions"] + s["shed"]["active_pairs"] + s["shed"]["pending_total"]
        refused = mem["refused_sessions"] + s["refusals"]["memory_pairs"]
        assert took_places + refused > 0, (s["shed"], s["refusals"], mem)
        assert s["limits"]["rejected"]["memory"] == refused
        assert m["blind_relay_memory_budget_bytes"] == BUDGET
        assert m["blind_relay_limit_rejections_total{limit=memory}"] == refused
        assert s["capacity"]["sessions"] < HOLD  # the hoard did not all fit: the caps alone would have let it
        assert r.proc.poll() is None and "Traceback" not in r.stderr, r.stderr[-3000:]
