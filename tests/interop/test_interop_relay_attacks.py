"""Issue #13's attacks on the Python relay, by real Node hyperdht peers from other loopback hosts.

Each test starts `python -m relay` with its limits scaled down (the same fair-share code, smaller
numbers, so an attack takes seconds), puts an attack from `js/relay_attack.js` in place from
127.0.0.2+ and, while it holds, asserts that a legitimate pair from 127.0.0.1 (`js/relay_peers.js`)
still relays, that the relay stays under the operator page's 200 MB, and that what the relay shed
is counted by cause in `/metrics`. Waits are on the relay's own counters, never on time.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.interop._relay_net import INTEROP, Testnet, run_peers
from tests.interop._relay_proc import RelayProcess

pytestmark = [pytest.mark.interop, pytest.mark.timeout(240)]

RSS_BUDGET = 200 * 2**20  # the operator page's figure for blind-relay-service
ATTACK_HOSTS = [f"127.0.0.{i}" for i in range(2, 6)]


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[Testnet]:
    with Testnet(node, size=4) as tn:
        yield tn


def metrics(r: RelayProcess) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(r.get("/metrics").decode()):
        for s in fam.samples:
            key = s.name if not s.labels else f"{s.name}{{{','.join(f'{k}={v}' for k, v in s.labels.items())}}}"
            out[key] = s.value
    return out


def wait_until(cond: Callable[[], bool], timeout: float = 90.0, what: str = "condition") -> None:
    """Poll a condition (the timeout is a safety net only: the condition is what we wait on)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached")
        time.sleep(0.1)


class Attack:
    """`js/relay_attack.js` held in place until the block ends; `ready` is its first report."""

    def __init__(self, node: str, testnet: Testnet, relay: RelayProcess, attack: str, **opts: Any) -> None:
        args = {"bootstrap": testnet.bootstrap.split(","), "relay": relay.key, "attack": attack, **opts}
        args.setdefault("hosts", ATTACK_HOSTS)
        self.argv = [node, "js/relay_attack.js", json.dumps(args)]
        self.proc: subprocess.Popen[str] | None = None
        self.ready: dict[str, Any] = {}
        self.done: dict[str, Any] = {}

    def __enter__(self) -> Attack:
        self.proc = subprocess.Popen(
            self.argv, cwd=INTEROP, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"relay_attack.js exited: {self.proc.wait(10)} {self.proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
        self.ready = json.loads(line)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        try:
            out, _ = self.proc.communicate(timeout=30)  # closes stdin: the attack stops
            self.done = next((json.loads(ln) for ln in out.splitlines() if ln.startswith("{")), {})
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def assert_legit_pair_relays(node: str, testnet: Testnet, r: RelayProcess, timeout_ms: int = 60_000) -> None:
    res = run_peers(node, testnet.bootstrap, r.key or "", r.port, "client", size=50_000, timeout_ms=timeout_ms)
    assert res.all_ok, (res.pairs, res.summary, res.stderr[-2000:], r.stderr[-3000:])
    p = res.pairs[0]
    assert p["relayed"] and p["clientRemotePort"] == r.port and p["serverRemotePort"] == r.port, p


def assert_healthy(r: RelayProcess) -> None:
    assert r.proc is not None and r.proc.poll() is None, r.stderr[-3000:]
    assert r.stats()["memory"]["rss_bytes"] < RSS_BUDGET
    assert "Traceback" not in r.stderr


def start_relay(tmp_path: Path, testnet: Testnet, *args: str) -> RelayProcess:
    r = RelayProcess(tmp_path / "store", *args, bootstrap=testnet.bootstrap)
    r.start()
    assert r.key is not None, r.stderr
    return r


def test_attack_one_session_self_pairing_cannot_take_the_active_pairs_cap(
    node: str, testnet: Testnet, tmp_path: Path
) -> None:
    """One session pairs 600 tokens with itself (issue: 8,192-pair cap filled, 0/4 legit pairs).
    At the cap the hog loses its own silent pairs, never the newcomer; the legit pair relays."""
    with (
        start_relay(tmp_path, testnet, "--max-active-pairs", "64") as r,
        Attack(node, testnet, r, "selfpair", sessions=1, pairs=600, hosts=["127.0.0.2"]) as a,
    ):
        assert a.ready["opened"] == 1
        wait_until(lambda: metrics(r)["blind_relay_pairings_matched"] >= 600, what="600 self-pairs matched")
        m = metrics(r)
        assert m["blind_relay_pairings_active"] <= 64
        assert m["blind_relay_shed_total{cause=active_pairs}"] >= 600 - 64
        assert_legit_pair_relays(node, testnet, r)
        assert metrics(r)["blind_relay_pairings_active"] <= 64
        assert_healthy(r)


def test_attack_silent_self_pairs_are_reaped_then_the_idle_session_closed(
    node: str, testnet: Testnet, tmp_path: Path
) -> None:
    """The same hog without any cap in reach: its pairs never carry a packet, so they are reaped,
    and its session, now pairing nothing, is closed."""
    args = ("--silent-pair-timeout", "1", "--session-idle-timeout", "5")
    with (
        start_relay(tmp_path, testnet, *args) as r,
        Attack(node, testnet, r, "selfpair", sessions=1, pairs=200, hosts=["127.0.0.2"]),
    ):
        wait_until(lambda: metrics(r)["blind_relay_sessions_closed"] >= 1, what="the session closed")
        m = metrics(r)
        assert m["blind_relay_shed_total{cause=idle_session}"] == 1
        assert m["blind_relay_pairings_matched"] == 200 and m["blind_relay_streams_opened"] == 400
        assert m["blind_relay_shed_total{cause=silent_pair}"] == 200 and m["blind_relay_pairings_active"] == 0
        assert m["blind_relay_sessions_accepted"] == 1
        assert_healthy(r)


def test_attack_sessions_from_one_host_resending_pending_tokens_cannot_hold_the_pending_cap(
    node: str, testnet: Testnet, tmp_path: Path
) -> None:
    """20 sessions from one host keep 64 pending tokens each, re-sent every 0.5 s, against a
    256-token total cap (issue: 130 sessions held the 8,192 cap, 0/6 legit pairs)."""
    with (
        start_relay(tmp_path, testnet, "--max-pending", "256") as r,
        Attack(node, testnet, r, "pending", sessions=20, pairs=64, interval=500, hosts=["127.0.0.2"]) as a,
    ):
        assert a.ready["opened"] == 20
        wait_until(lambda: metrics(r)["blind_relay_shed_total{cause=pending_total}"] >= 1000, what="sheds")
        assert metrics(r)["blind_relay_pairings_pending"] <= 256
        for _ in range(2):
            assert_legit_pair_relays(node, testnet, r)
        assert_healthy(r)


def test_attack_one_host_holding_sessions_cannot_lock_out_a_newcomer(
    node: str, testnet: Testnet, tmp_path: Path
) -> None:
    """One host opens 40 sessions and holds them with keep-alives at a 40-session cap (issue:
    4,096 sessions refused everyone else until it left): the newcomer's sessions push out the
    host's idlest ones."""
    with (
        start_relay(tmp_path, testnet, "--max-sessions", "40") as r,
        Attack(node, testnet, r, "hold", sessions=40, hosts=["127.0.0.2"]) as a,
    ):
        assert a.ready["opened"] == 40
        wait_until(lambda: metrics(r)["blind_relay_sessions_opened"] >= 40, what="40 sessions")
        assert_legit_pair_relays(node, testnet, r)
        m = metrics(r)
        assert m["blind_relay_shed_total{cause=sessions}"] >= 2
        assert m["blind_relay_sessions_opened"] - m["blind_relay_sessions_closed"] <= 40
        assert_healthy(r)


def test_attack_held_idle_sessions_are_closed(node: str, testnet: Testnet, tmp_path: Path) -> None:
    with (
        start_relay(tmp_path, testnet, "--session-idle-timeout", "1") as r,
        Attack(node, testnet, r, "hold", sessions=12),
    ):
        wait_until(lambda: metrics(r)["blind_relay_shed_total{cause=idle_session}"] >= 12, what="12 reaped")
        m = metrics(r)
        assert m["blind_relay_sessions_closed"] == m["blind_relay_sessions_accepted"] == 12
        assert_healthy(r)


def test_attack_never_completing_16mib_control_frames_end_their_sessions(
    node: str, testnet: Testnet, tmp_path: Path
) -> None:
    """A dozen sessions announce a 16 MiB control frame and send 1 MiB of it (issue: RSS 35 -> 266 MB).
    Default limits: each session ends at the frame's 3-byte header, nothing of it is kept."""
    with start_relay(tmp_path, testnet) as r, Attack(node, testnet, r, "bigframe", sessions=12, send=1 << 20) as a:
        assert a.ready["opened"] == 12
        key = "blind_relay_limit_rejections_total{limit=control_frame}"
        wait_until(lambda: metrics(r)[key] >= 12, what="12 sessions ended")
        wait_until(lambda: metrics(r)["blind_relay_sessions_closed"] >= 12, what="12 closed")
        assert_legit_pair_relays(node, testnet, r)
        assert_healthy(r)


FLOOD_HOSTS = [f"127.0.0.{i}" for i in range(10, 74)]


def test_attack_handshake_flood_from_many_hosts_lets_a_new_address_in(
    node: str, testnet: Testnet, tmp_path: Path
) -> None:
    """Valid handshakes from 64 hosts at 500/s, as in the issue (64 sources at 500/s pinned the
    cap, legit setup 50 ms -> 3.7-6.9 s, and one legit pair in four was lost: the Noise work ran
    in the socket's read callback, so the 4 MB receive queue became a 10 s FIFO in front of
    everyone). New handshakes now wait in a fair backlog between socket reads, a new address
    first; busy hosts wait behind the budget before any crypto. Two legitimate pairs, one after
    the other, from a host with no sessions, relay while the flood goes on."""
    # a budget of 1/s: the flood (500 handshakes started a second, however slowly they arrive)
    # is over it whatever the machine's speed, so hosts holding 4+ sessions must wait. The cap
    # is reached (64 x 4 > 200) and sheds from the heaviest host; it stays above 2 per flood
    # host, because at the cap the shedding levels every host down to cap / hosts sessions, and
    # below 2 the legit pair's host (2 sessions) would be the heaviest and lose one mid-echo
    args = ("--max-sessions", "200", "--busy-address-sessions", "4", "--handshake-budget", "1")
    with (
        start_relay(tmp_path, testnet, *args) as r,
        Attack(node, testnet, r, "handshakes", rate=500, seconds=60, hosts=FLOOD_HOSTS) as a,
    ):
        assert a.ready["ready"]
        busy = "blind_relay_limit_rejections_total{limit=handshakes_busy}"
        wait_until(lambda: metrics(r)[busy] > 0, what="busy hosts made to wait")
        wait_until(lambda: r.stats()["handshakes"]["accepted"] >= 100, what="100 flood handshakes answered")
        for _ in range(2):
            assert_legit_pair_relays(node, testnet, r, timeout_ms=20_000)  # while the flood goes on
        m = metrics(r)
        assert m["blind_relay_sessions_opened"] - m["blind_relay_sessions_closed"] <= 200
        assert m["blind_relay_shed_total{cause=sessions}"] > 0
        hs = r.stats()["handshakes"]
        assert hs["backlog"] <= 512 and hs["accepted"] >= 100, hs
        assert_healthy(r)
    assert a.done.get("opened", 0) >= 100, a.done  # the flood really went on


def test_attack_out_of_order_packets_on_control_streams_are_bounded(
    node: str, testnet: Testnet, tmp_path: Path
) -> None:
    """A dozen sessions each park 2,000 out-of-order 1,200-byte packets above a gap they never fill
    (issue: with the 16 MiB frames, RSS 35 -> 266 MB). Default limits: each control stream holds at
    most its small reorder budget; the rest is dropped and counted (`dropped{reorder_limit}`).

    The 29 MB arrive in one burst, so on a loaded box the kernel drops part of it at the relay's
    socket before the relay reads it (949 of 24,000 in one run beside two busy cores; a full suite
    once dropped more than half). Those never reach a counter of ours, so the accounting adds the
    kernel's own count: every packet is then dropped by one of the two, except the ~3 each stream
    may hold (a bound of 3; its 1 KiB reorder budget holds no 1,328-byte charge at all)."""
    with start_relay(tmp_path, testnet) as r, Attack(node, testnet, r, "ooo", sessions=12, packets=2000) as a:
        assert a.ready["opened"] == 12
        held_at_most = 12 * 3

        def accounted() -> bool:
            return r.stats()["dropped"].get("reorder_limit", 0) + r.kernel_drops() >= 12 * 2000 - held_at_most

        wait_until(accounted, what="every out-of-order packet dropped, by the relay or the kernel")
        assert r.stats()["dropped"]["reorder_limit"] > 0
        assert_legit_pair_relays(node, testnet, r)
        assert_healthy(r)


def test_attack_everything_at_once_from_many_hosts_at_scaled_caps(node: str, testnet: Testnet, tmp_path: Path) -> None:
    """The attacks above at the same time, from 13 hosts, against caps scaled down together (the
    full-size run at the default caps is `benchmarks/attacks.py --only combined`): self-pairing past
    the active-pairs cap with early packets, sessions re-sending pending tokens past the pending cap,
    sessions held to the session cap (each pairing to stay busy, parking out-of-order packets and
    leaving a frame incomplete), 16 MiB frames, out-of-order parking. A newcomer still relays."""
    hosts = [f"127.0.0.{i}" for i in range(6, 14)]
    parts = [
        {"attack": "selfpair", "sessions": 1, "pairs": 300, "interval": 3000, "early": 8, "hosts": ["127.0.0.2"]},
        {"attack": "pending", "sessions": 8, "pairs": 64, "interval": 500, "hosts": ["127.0.0.3"]},
        {"attack": "bigframe", "sessions": 2, "frame": (1 << 24) - 1, "send": 1 << 20, "hosts": ["127.0.0.4"]},
        {"attack": "ooo", "sessions": 4, "packets": 500, "hosts": ["127.0.0.5"]},
        {"attack": "hold", "sessions": 48, "keep": 2000, "ooo": 50, "frame": 1024, "frameSend": 768, "hosts": hosts},
    ]
    # 63 attack sessions, 2 of which (the 16 MiB frames) are ended: 61 held at a 61-session cap
    args = ("--max-sessions", "61", "--max-active-pairs", "64", "--max-pending", "256")
    with start_relay(tmp_path, testnet, *args) as r, Attack(node, testnet, r, "combined", parts=parts) as a:
        assert a.ready["opened"] == 63
        m: dict[str, float] = {}

        def all_caps_bit() -> bool:
            m.update(metrics(r))
            return (
                m["blind_relay_shed_total{cause=active_pairs}"] >= 300 - 64
                and m["blind_relay_shed_total{cause=pending_total}"] > 0
                and m["blind_relay_limit_rejections_total{limit=control_frame}"] >= 2
                and r.stats()["dropped"].get("reorder_limit", 0) >= 4 * 400
            )

        wait_until(all_caps_bit, what="every cap reached")
        assert m["blind_relay_pairings_active"] <= 64 and m["blind_relay_pairings_pending"] <= 256
        wait_until(lambda: metrics(r)["blind_relay_sessions_closed"] >= 2, what="the 16 MiB frames ended")
        shed = metrics(r)["blind_relay_shed_total{cause=sessions}"]
        assert_legit_pair_relays(node, testnet, r)
        m = metrics(r)
        assert m["blind_relay_shed_total{cause=sessions}"] > shed  # the newcomer's sessions pushed others out
        assert m["blind_relay_sessions_opened"] - m["blind_relay_sessions_closed"] <= 61
        assert_healthy(r)
