"""Kernel forwarding of established relayed pairs (nftables): their packets never reach Python.

Why: a blind relay's established pair is stateless forwarding. A packet from peer A's address
and port, for relay stream X, goes to peer B's address and port, sent from the relay's port,
with B's stream id. The relay picks each relay stream's id equal to the id of the partner
peer's own stream (`BlindRelayServer`), so the id needs no rewrite: only the IP and UDP
headers change, which nftables rewrites in the prerouting hook before conntrack (`notrack`),
keeping checksums right. One Python relay then costs the kernel's forwarding per packet, not a
wake, two copies and Python work.

What stays in Python: a pair's first packets (until both peers were seen), DESTROY (the
rule skips it, so the relay tears the pair down as before), anything from another address
(`wrong_address`), pairs whose ids differ, pairs with one IPv4 and one IPv6 peer (a dual-stack
socket can relay those; the kernel cannot translate between the two), and pairs whose
destination the kernel would not forward to (IP forwarding of that family off). A delivery
check confirms forwarded packets leave (postrouting) or are delivered (input); if they do not
(a firewall's forward policy, a changed sysctl), the pair goes back to Python
(`fallbacks{undelivered}`).

The table is `inet blind_relay_<port>` (`..._<address>` for a relay bound to one address): one
set of rules, sets and counters per IP family the socket receives (IPv4, and IPv6 on an IPv6 or
dual-stack socket; the IPv6 ones end in `6`). It is made with `flags owner`: the kernel deletes
it with the relay's netlink socket, so a relay that exits or is killed leaves nothing forwarded.

`KernelTable` (`relay.udx.kerneltable`) is the sans-IO part (nft commands and counters in, nothing run; while directions
are in the kernel its `get_timer` says when the counters are read next, once a second, and
`handle_timer` asks for it with `CountersDue`); `KernelForwarder` runs it for one socket through
a `relay.core.Driver`: one nft transaction per loop turn, the totals read into the socket's
stats. Each direction's set element counts its packets too: when the totals moved, those
counters are read (one netlink dump per set, no libnftables) and each delta goes to the relay
stream whose peer sent the packets (`UDXStream.relayed_bytes`); a direction leaving the kernel
has its element read once more first, so a closing stream has its last counts before its close
is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket as _socket
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay.core import Driver

from .forwarding import RelaySocket as UDXSocket
from .forwarding import RelayStream as UDXStream
from .kerneltable import (
    HEADERS,
    IP_FORWARD,
    IPV4,
    IPV6,
    POLL_INTERVAL,
    SCAN_BACKOFF_MAX,
    UNDELIVERED_MIN,
    CountersDue,
    Direction,
    Family,
    KernelTable,
    family_of,
    raw_id,
)
from .nft import NFPROTO_INET, Nft, NftError, element_key, read_counters, read_element_counters

__all__ = [
    "HEADERS",
    "IPV4",
    "IPV6",
    "POLL_INTERVAL",
    "UNDELIVERED_MIN",
    "CountersDue",
    "Direction",
    "Family",
    "KernelForwarder",
    "KernelTable",
    "KernelUnavailable",
    "family_of",
    "forwarding_enabled",
    "raw_id",
    "unavailable_reason",
]

log = logging.getLogger("relay.udx")

Address = tuple[str, int]


class KernelUnavailable(Exception):
    """Kernel forwarding cannot be used here; the message says why (the relay goes on in Python)."""


def forwarding_enabled(path: Path = IP_FORWARD) -> bool:
    """The sysctl at `path` lets this host forward that family's packets between other hosts."""
    try:
        return path.read_text().strip() == "1"
    except OSError:
        return False


def _af(ip: str) -> int:
    return _socket.AF_INET6 if ":" in ip else _socket.AF_INET


def is_local(ip: str) -> bool:
    """One of this host's addresses (a socket can bind to it without IP_FREEBIND)."""
    s = _socket.socket(_af(ip), _socket.SOCK_DGRAM)
    try:
        s.bind((ip, 0))
        return True
    except OSError:
        return False
    finally:
        s.close()


def source_for(ip: str) -> str:
    """The source address the kernel picks to send to `ip` (nothing is sent)."""
    s = _socket.socket(_af(ip), _socket.SOCK_DGRAM)
    try:
        s.connect((ip, 9))
        return str(s.getsockname()[0])
    finally:
        s.close()


def unavailable_reason(e: NftError) -> str:
    """Why nftables could not be had, on one line that names the fix."""
    text = " ".join(str(e).split())
    if "Operation not permitted" in text:
        return (
            "the relay lacks CAP_NET_ADMIN, which its nftables table needs (run it as root, or as the "
            "unit `blind-relay --systemd-unit --kernel-forwarding` prints, which grants it)"
        )
    if "libnftables" in text:
        return text
    return f"nftables refused the relay's table: {text}"


@dataclass(slots=True)
class _Counted:
    """A direction's element counter as far as it was attributed to `stream`."""

    stream: UDXStream
    set_name: str
    headers: int
    packets: int = 0
    bytes: int = 0


def _element_of(d: Direction) -> bytes:
    return element_key(d.src[0], d.src[1], d.stream_id)


class KernelForwarder:
    """Runs a `KernelTable` for one UDX socket (IPv4, IPv6 or dual-stack). Offers and withdrawals
    take effect at the end of the loop turn that made them (one nft transaction for all of them)."""

    def __init__(self, sock: UDXSocket, nft: Nft | None = None) -> None:
        host, port = sock.address[:2]
        self.sock = sock
        # an IPv6 socket of this runtime is dual-stack (IPV6_V6ONLY off): both families reach it
        families = (IPV4, IPV6) if sock.family == _socket.AF_INET6 else (IPV4,)
        self.table = KernelTable(port, host, families)
        try:
            self.nft = nft or Nft()
            for family in ("ip", "inet"):  # a table left by an earlier relay on this port
                with contextlib.suppress(NftError):
                    self.nft.run(f"delete table {family} {self.table.name}")
            self.nft.run(self.table.setup_script())
        except NftError as e:
            raise KernelUnavailable(unavailable_reason(e)) from e
        self.loop = asyncio.get_running_loop()
        self._by_stream: dict[int, tuple[str, int, int]] = {}
        #: per direction in the kernel, by its element's key bytes: the relay stream whose peer
        #: sends its packets, its set, its header bytes per packet and the element counter's
        #: (packets, bytes) when last read (what was attributed to the stream so far)
        self._counted: dict[bytes, _Counted] = {}
        #: stream id -> (its peer, its partner's peer) for which it must stay in Python
        self._banned: dict[int, tuple[Address, Address]] = {}
        #: stream id -> the relay stream it forwards to (whose direction is the pair's other way)
        self._partner: dict[int, int] = {}
        self._flush_handle: asyncio.Handle | None = None
        #: runs the table's poll deadline (relay.core)
        self.driver: Driver[CountersDue] = Driver(self.table, self.loop, on_event=self._poll)
        self._via: dict[str, tuple[str, bool]] = {}
        self._scan_backoff = POLL_INTERVAL
        self._next_scan = 0.0
        self._hinted: set[str] = set()
        self.skipped: Counter[str] = Counter()
        self.fallbacks: Counter[str] = Counter()
        self.errors = 0
        self.closed = False

    # -- what the runtime calls ---------------------------------------------------------------

    def offer(self, s: UDXStream, t: UDXStream) -> None:
        """`s` relays to `t` and both know their peers: put that direction in the kernel if it can go."""
        src, dst = s.remote_addr, t.remote_addr
        if self.closed or s.id in self._by_stream or src is None or dst is None:
            return
        if self._banned.get(s.id) == (src, dst):
            return
        why = None
        fam = family_of(src[0])
        if s.id != t.remote_id:
            why = "ids_differ"
        elif family_of(dst[0]) is not fam:
            why = "mixed_families"
        elif fam not in self.table.families:
            why = f"no_{fam.name}"
        via, local = self._route(dst[0]) if why is None else ("", False)
        if why is None and not local and not forwarding_enabled(fam.forwarding):
            why = "forwarding_off"
            if fam.name not in self._hinted:
                self._hinted.add(fam.name)
                log.warning(
                    "udx: %spairs between other hosts stay in Python: %s is 0 "
                    "(sysctl -w %s=1 lets the kernel forward them)",
                    "IPv6 " if fam is IPV6 else "",
                    fam.sysctl,
                    fam.sysctl,
                )
        if why is not None:
            self.skipped[why] += 1
            self._banned[s.id] = (src, dst)
            return
        d = Direction((src[0], src[1]), s.id, (dst[0], dst[1]), via)
        if self.table.offer(d):
            self._by_stream[s.id] = d.key
            self._counted[_element_of(d)] = _Counted(s, KernelTable.set_of(d), fam.headers)
            self._partner[s.id] = t.id
            self._schedule()

    def withdraw(self, s: UDXStream, *, forget: bool = False) -> None:
        """`s`'s direction leaves the kernel (an address changes, or with `forget` it closes)."""
        if forget:
            self._banned.pop(s.id, None)
        self._partner.pop(s.id, None)
        key = self._by_stream.pop(s.id, None)
        if key is not None:
            self._settle(key)
            self.table.withdraw(key)
            self._schedule()

    def refresh(self) -> None:
        """Bring the socket's relayed/kernel counters up to date now (they are read once a second)."""
        if self.closed:
            return
        try:
            self._read_totals()
        except NftError as e:
            self._error("reading counters", e)

    def stats(self) -> dict[str, Any]:
        by_family = Counter(d.family.name for d in self.table.directions.values())
        return {
            "enabled": not self.closed,
            "table": f"inet {self.table.name}",
            "families": [f.name for f in self.table.families],
            "directions": len(self.table.directions),
            "directions_by_family": {f.name: by_family[f.name] for f in self.table.families},
            "packets": self.sock.stats.kernel_packets,
            "bytes": self.sock.stats.kernel_bytes,
            "skipped": dict(self.skipped),
            "fallbacks": dict(self.fallbacks),
            "errors": self.errors,
        }

    def close(self) -> None:
        """Read the last counters and drop the table (the kernel would on exit anyway)."""
        if self.closed:
            return
        with contextlib.suppress(NftError):
            self._read_totals(every_direction=True)
        self.closed = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self.driver.close()
        with contextlib.suppress(NftError):
            self.nft.run(f"delete table inet {self.table.name}")

    # -- driving the table ----------------------------------------------------------------------

    def _route(self, ip: str) -> tuple[str, bool]:
        got = self._via.get(ip)
        if got is None:
            if len(self._via) >= 4096:  # peers come and go: the routes are cheap to look up again
                self._via.clear()
            local = is_local(ip)
            via = self.table.host or source_for(ip)
            got = self._via[ip] = (via, local)
        return got

    def _schedule(self) -> None:
        if self._flush_handle is None and not self.closed:
            self._flush_handle = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        """One nft transaction for this loop turn's changes (one by one if the batch is refused)."""
        self._flush_handle = None
        changes = self.table.take_changes()
        if not changes:
            return
        try:
            self.nft.run("\n".join(c.script for c in changes))
        except NftError:
            for c in changes:
                try:
                    self.nft.run(c.script)
                except NftError as e:
                    self._error("offering a pair" if c.add else "withdrawing a pair", e)
                    if c.add:
                        self.table.forget(c)
                        self._by_stream.pop(c.direction.stream_id, None)
                        self._counted.pop(_element_of(c.direction), None)
        self.table.watch(self.driver.now())
        self.driver.arm()

    def _poll(self, _due: CountersDue) -> None:
        """Once a second while pairs are in the kernel: the totals, and when they say packets
        went missing, which pairs lost them (that listing is per pair: backed off while it finds
        none, up to SCAN_BACKOFF_MAX)."""
        if self.closed:
            return
        try:
            self._read_totals()
            if self.table.missing < UNDELIVERED_MIN:
                self._scan_backoff = POLL_INTERVAL
            elif self.driver.now() >= self._next_scan:
                t = self.table.name
                pairs: dict[str, Any] = {"nftables": []}
                delivered: dict[str, Any] = {"nftables": []}
                for f in self.table.families:
                    pairs["nftables"] += self.nft.query(f"list set inet {t} pairs{f.suffix}").get("nftables", [])
                    delivered["nftables"] += self.nft.query(f"list set inet {t} delivered{f.suffix}").get(
                        "nftables", []
                    )
                lost = self.table.lost(pairs, delivered)
                # the listing counts over each pair's life: what it did not blame on one pair
                # (a few strays spread over many) is not counted twice
                self.table.missing = 0
                if lost:
                    self._fall_back(lost)
                    self._flush()
                else:
                    self._scan_backoff = min(SCAN_BACKOFF_MAX, 2 * self._scan_backoff)
                self._next_scan = self.driver.now() + self._scan_backoff
        except NftError as e:
            self._error("reading counters", e)
        self.table.watch(self.driver.now())

    def _fall_back(self, lost: list[Direction]) -> None:
        """Both ways of each pair with a lost direction go back to Python: the other way crosses
        the same host (its forward policy, its sysctls), and left in the kernel it would lose the
        ACKs of what Python now forwards, stalling the pair for another backed-off timeout."""
        for d in lost:
            if self._banned.get(d.stream_id) == (d.src, d.dst):
                continue  # already taken back with its partner
            log.warning(
                "udx: the kernel did not deliver a relayed pair's packets to %s:%d (a firewall's forward"
                " policy?); that pair is forwarded in Python again",
                *d.dst,
            )
            self.fallbacks["undelivered"] += 1
            partner = self._partner.pop(d.stream_id, None)
            for sid, src, dst in ((d.stream_id, d.src, d.dst), (partner, d.dst, d.src)):
                if sid is None:
                    continue
                self._banned[sid] = (src, dst)
                key = self._by_stream.pop(sid, None)
                if key is not None:
                    self._partner.pop(sid, None)
                    self._settle(key)
                    self.table.withdraw(key)

    def _read_totals(self, *, every_direction: bool = False) -> None:
        """The totals into the socket's stats; when they moved (or `every_direction`), each
        direction's element counter too, its delta to the relay stream whose peer sent it. The
        element counters are read after the totals, so totals that did not move since the last
        reading mean no element did since that reading either."""
        now = read_counters(self.table.name, NFPROTO_INET)
        if not self.table.counter_names() <= set(now):
            raise NftError(f"the relay's nftables table {self.table.name} or its counters are gone")
        packets, payload = self.table.totals(now)
        st = self.sock.stats
        st.kernel_packets += packets
        st.kernel_bytes += payload
        st.relayed_packets += packets
        st.relayed_bytes += payload
        if self._counted and (packets or every_direction):
            for name in {c.set_name for c in self._counted.values()}:
                self._attribute(read_element_counters(self.table.name, name, NFPROTO_INET))

    def _attribute(self, read: dict[bytes, tuple[int, int]]) -> None:
        """Element counters as read: each known direction's delta to its stream."""
        for ekey, (p, b) in read.items():
            c = self._counted.get(ekey)
            if c is None or (p == c.packets and b == c.bytes):
                continue
            dp, db = p - c.packets, b - c.bytes
            c.packets, c.bytes = p, b
            if dp > 0:
                c.stream.add_relayed(dp, db - c.headers * dp)

    def _settle(self, key: tuple[str, int, int]) -> None:
        """A direction leaves the kernel: the last of its element's counter to its stream now,
        before the stream's close is reported (what the kernel forwards after this, up to the end
        of this loop turn, is only in the socket's totals)."""
        d = self.table.directions.get(key)
        if d is None:
            return
        ekey = _element_of(d)
        c = self._counted.get(ekey)
        if c is None:
            return
        try:
            self._attribute(read_element_counters(self.table.name, c.set_name, NFPROTO_INET, keys=[ekey]))
        except NftError as e:
            self._error("reading a pair's counter", e)
        finally:
            self._counted.pop(ekey, None)

    def _error(self, what: str, e: NftError) -> None:
        self.errors += 1
        if self.errors <= 3:
            log.warning("udx: nftables failed %s: %s", what, e)
