"""Kernel forwarding's sans-IO part: which relayed directions are in the kernel, as nft commands
and counter arithmetic (`KernelTable`), nothing run. `relay.udx.kernel.KernelForwarder` runs it.

Sans-IO: nft commands, counters and the poll's deadline out (`take_changes`, `totals`, `lost`,
`get_timer`/`handle_timer`/`next_event`: `CountersDue` once a second while any direction is in
the kernel); counters and `now` in. Why the table looks as it does: `relay.udx.kernel`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

Address = tuple[str, int]
#: bytes the kernel counts per IPv4 packet that the relay's own counters do not (IPv4 + UDP headers)
HEADERS = 28
#: counters are read this often (seconds) while pairs are forwarded in the kernel
POLL_INTERVAL = 1.0
#: the per-pair listing that finds a losing pair runs at most this often while it finds none
SCAN_BACKOFF_MAX = 64.0
#: a delivery check fails when this many packets matched since the last one that left. Low on
#: purpose: a stalled sender retransmits on a doubling timer (1, 2, 4 s ...), and a wrong verdict
#: only costs CPU (the pair is forwarded in Python, as without the kernel path)
UNDELIVERED_MIN = 3
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
IP6_FORWARD = Path("/proc/sys/net/ipv6/conf/all/forwarding")


@dataclass(frozen=True, slots=True)
class Family:
    """How one IP family reads in the `inet` table: its nft keyword, the suffix of its sets and
    counters, the header bytes its counters include, and the sysctl that lets it be forwarded."""

    name: str
    nft: str
    suffix: str
    headers: int
    forwarding: Path
    sysctl: str

    def counters(self) -> tuple[str, str, str]:
        return (f"local{self.suffix}", f"remote{self.suffix}", f"delivered{self.suffix}")


IPV4 = Family("ipv4", "ip", "", HEADERS, IP_FORWARD, "net.ipv4.ip_forward")
IPV6 = Family("ipv6", "ip6", "6", 48, IP6_FORWARD, "net.ipv6.conf.all.forwarding")


def family_of(ip: str) -> Family:
    return IPV6 if ":" in ip else IPV4


def raw_id(stream_id: int) -> int:
    """The stream id as nftables reads it: UDX stores it little-endian, a raw payload match is
    big-endian (the byte swap is its own inverse: it also turns nft's number back into the id)."""
    return int.from_bytes((stream_id & 0xFFFFFFFF).to_bytes(4, "little"), "big")


@dataclass(frozen=True, slots=True)
class Direction:
    """One way of one relayed pair: packets from `src` for relay stream `stream_id` go to `dst`,
    sent as from `via` (the relay's address as `dst` sees it, the source the kernel picks)."""

    src: Address
    stream_id: int
    dst: Address
    via: str

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.src[0], self.src[1], self.stream_id)

    @property
    def family(self) -> Family:
        return family_of(self.src[0])

    @property
    def delivery(self) -> tuple[str, str, int] | None:
        """The delivery check's key, or None when A's address is the relay's own (loopback):
        then the rewritten packet looks like one the relay sends itself, and needs no new source."""
        if self.src[0] == self.via:
            return None
        return (self.src[0], self.dst[0], self.dst[1])


def _pair_elem(d: Direction) -> str:
    return f"{d.src[0]} . {d.src[1]} . {raw_id(d.stream_id):#x}"


def _delivery_elem(k: tuple[str, str, int]) -> str:
    return f"{k[0]} . {k[1]} . {k[2]}"


@dataclass(slots=True)
class CountersDue:
    """Read the counters now (`KernelTable.handle_timer` at the poll's time)."""


@dataclass(slots=True)
class Change:
    """One offer or withdrawal as nft commands; a failed offer is forgotten (its pair stays in Python)."""

    add: bool
    direction: Direction
    script: str


class KernelTable:
    """The nftables state for one relay port: which directions are in the kernel, the totals.

    Totals come from three named counters (`local`, `remote`: packets the rule forwarded;
    `delivered`: remote ones seen after every filter of the host), read straight from the kernel
    (`relay.udx.nft.read_counters`, ~50-150 us). Any libnftables listing costs ~0.4 s with 8,192
    directions in the table (it loads every element first), so per-pair counters are listed only
    to find which pair is losing packets (`lost`), when the totals say one is.
    """

    def __init__(self, port: int, host: str | None = None, families: tuple[Family, ...] = (IPV4,)) -> None:
        self.port = port
        if host is not None and host.startswith("::ffff:") and "." in host:
            host = host[len("::ffff:") :]  # an IPv4 address on an IPv6 socket
        self.host = host if host not in (None, "", "0.0.0.0", "::") else None
        #: the families whose packets reach the socket (a socket bound to one address: its own)
        self.families = (family_of(self.host),) if self.host else families
        # two relays may share a port on different addresses: each gets its own table
        tail = self.host.replace(".", "_").replace(":", "_") if self.host else ""
        self.name = f"blind_relay_{port}" + (f"_{tail}" if tail else "")
        self.directions: dict[tuple[str, int, int], Direction] = {}
        self._delivery_refs: Counter[tuple[str, str, int]] = Counter()
        self._changes: list[Change] = []
        self._totals: dict[str, tuple[int, int]] = {}
        #: remote packets forwarded but not (yet) seen delivered, since the last per-pair listing
        self.missing = 0
        #: when the counters are read next (None while no direction is in the kernel)
        self.poll_at: float | None = None
        self._due: list[CountersDue] = []

    # -- the poll, a deadline ------------------------------------------------------------------

    def watch(self, now: float) -> None:
        """After a change or a reading: the next reading POLL_INTERVAL from `now` while any
        direction is in the kernel, none once the last has left."""
        if not self.directions:
            self.poll_at = None
        elif self.poll_at is None:
            self.poll_at = now + POLL_INTERVAL

    def get_timer(self) -> float | None:
        return self.poll_at

    def handle_timer(self, now: float) -> None:
        if self.poll_at is not None and now >= self.poll_at:
            self.poll_at = None
            self._due.append(CountersDue())

    def next_event(self) -> CountersDue | None:
        return self._due.pop() if self._due else None

    def setup_script(self) -> str:
        """The table: per family, lookups by (source, port, stream id) and the rules that rewrite headers."""
        t = self.name
        lines = [f"table inet {t} {{", "  flags owner"]
        pre: list[str] = []
        after: list[str] = []
        for f in self.families:
            x, sfx, p = f.nft, f.suffix, self.port
            key = f"{x} saddr . udp sport . @th,96,32"
            dkey = f"{x} saddr . {x} daddr . udp dport"
            daddr = f"{x} daddr {self.host} " if self.host else ""
            # UDX magic+version, DESTROY clear (Python sees it and tears the pair down)
            match = f"{daddr}udp dport {p} @th,64,16 0xff01 @th,80,8 & 0x10 == 0 {key}"
            rewrite = (
                f"notrack {x} daddr set {key} map @pair_daddr{sfx} udp dport set {key} map @pair_dport{sfx} "
                f"udp sport set {p}"
            )
            local, remote, delivered = f.counters()
            lines += [
                *(f"  counter {c} {{ }}" for c in f.counters()),
                # every direction's element counts its packets: each relay stream's share of what
                # the kernel forwarded (and, for remote ones, which pair loses packets)
                f"  set pairs{sfx} {{ typeof {key}; counter; }}",
                f"  set pairs_local{sfx} {{ typeof {key}; counter; }}",
                f"  map pair_daddr{sfx} {{ typeof {key} : {x} daddr; }}",
                f"  map pair_dport{sfx} {{ typeof {key} : udp dport; }}",
                f"  set delivered{sfx} {{ typeof {dkey}; counter; }}",
                f"  map delivery_saddr{sfx} {{ typeof {dkey} : {x} saddr; }}",
            ]
            pre += [
                f'    {match} @pairs_local{sfx} counter name "{local}" {rewrite}',
                f'    {match} @pairs{sfx} counter name "{remote}" {rewrite}',
            ]
            after.append(
                f'    udp sport {p} {dkey} @delivered{sfx} counter name "{delivered}" {x} saddr set {dkey} map '
                f"@delivery_saddr{sfx}"
            )
        lines += [
            "  chain pre {",
            "    type filter hook prerouting priority raw; policy accept;",
            *pre,
            "  }",
            # after every filter of the host: what is counted here really left / was delivered
            *(
                f"  chain {name} {{\n    type filter hook {hook} priority 300; policy accept;\n"
                + "\n".join(after)
                + "\n  }"
                for name, hook in (("post", "postrouting"), ("local_in", "input"))
            ),
            "}",
        ]
        return "\n".join(lines)

    def counter_names(self) -> set[str]:
        return {c for f in self.families for c in f.counters()}

    @staticmethod
    def set_of(d: Direction) -> str:
        """The set whose element for `d` the rule matches (and counts)."""
        return KernelTable._set_of(d)

    @staticmethod
    def _set_of(d: Direction) -> str:
        return ("pairs_local" if d.delivery is None else "pairs") + d.family.suffix

    def offer(self, d: Direction) -> bool:
        """Put a direction in the kernel (False: it is there already)."""
        if d.key in self.directions:
            return False
        t, sfx = self.name, d.family.suffix
        e = _pair_elem(d)
        cmds = [
            f"add element inet {t} pair_daddr{sfx} {{ {e} : {d.dst[0]} }}",
            f"add element inet {t} pair_dport{sfx} {{ {e} : {d.dst[1]} }}",
        ]
        dk = d.delivery
        if dk is not None:
            if self._delivery_refs[dk] == 0:
                de = _delivery_elem(dk)
                cmds += [
                    f"add element inet {t} delivery_saddr{sfx} {{ {de} : {d.via} }}",
                    f"add element inet {t} delivered{sfx} {{ {de} }}",
                ]
            self._delivery_refs[dk] += 1
        # last: the rule matches once its maps are set
        cmds.append(f"add element inet {t} {self._set_of(d)} {{ {e} }}")
        self.directions[d.key] = d
        self._changes.append(Change(True, d, "\n".join(cmds)))
        return True

    def withdraw(self, key: tuple[str, int, int]) -> Direction | None:
        """Take a direction out of the kernel (its packets reach Python again)."""
        d = self.directions.pop(key, None)
        if d is None:
            return None
        t, sfx = self.name, d.family.suffix
        e = _pair_elem(d)
        cmds = [
            f"delete element inet {t} {self._set_of(d)} {{ {e} }}",  # first: no packet half-rewritten
            f"delete element inet {t} pair_daddr{sfx} {{ {e} }}",
            f"delete element inet {t} pair_dport{sfx} {{ {e} }}",
        ]
        dk = d.delivery
        if dk is not None and self._unref(dk):
            de = _delivery_elem(dk)
            cmds += [
                f"delete element inet {t} delivered{sfx} {{ {de} }}",
                f"delete element inet {t} delivery_saddr{sfx} {{ {de} }}",
            ]
        self._changes.append(Change(False, d, "\n".join(cmds)))
        return d

    def _unref(self, dk: tuple[str, str, int]) -> bool:
        """One direction fewer uses this delivery key; True when it was the last."""
        self._delivery_refs[dk] -= 1
        if self._delivery_refs[dk] > 0:
            return False
        del self._delivery_refs[dk]
        return True

    def forget(self, change: Change) -> None:
        """An offer the kernel refused: its books are undone (the pair stays in Python)."""
        if change.add and self.directions.get(change.direction.key) == change.direction:
            self.directions.pop(change.direction.key)
            dk = change.direction.delivery
            if dk is not None:
                self._unref(dk)

    def take_changes(self) -> list[Change]:
        out, self._changes = self._changes, []
        return out

    def totals(self, now: dict[str, tuple[int, int]]) -> tuple[int, int]:
        """New packets and payload bytes the kernel forwarded since the last reading, from the
        named counters {name: (packets, bytes)}; adds what left the rule for another host but
        was not seen leaving to `missing`."""
        packets = payload = 0
        for f in self.families:
            delta = {}
            for name in f.counters():
                p, b = now.get(name, (0, 0))
                p0, b0 = self._totals.get(name, (0, 0))
                if p < p0 or b < b0:  # a new table: its counters started again
                    p0 = b0 = 0
                self._totals[name] = (p, b)
                delta[name] = (p - p0, b - b0)
            local, remote, delivered = (delta[c] for c in f.counters())
            packets += local[0] + remote[0]
            payload += local[1] + remote[1] - f.headers * (local[0] + remote[0])
            # signed: a packet counted by `remote` just before the listing and by `delivered` just
            # after shows up one reading early or late, and evens out
            self.missing += remote[0] - delivered[0]
        return packets, payload

    def lost(self, pairs_doc: dict[str, Any], delivered_doc: dict[str, Any]) -> list[Direction]:
        """The directions whose packets the rule forwarded but that never left: per delivery key,
        UNDELIVERED_MIN more matched (over the elements' lives) than were delivered."""
        sent: Counter[tuple[str, str, int]] = Counter()
        for key, p in _elements(pairs_doc):
            d = self.directions.get((str(key[0]), int(key[1]), raw_id(int(key[2]))))
            if d is not None and d.delivery is not None:
                sent[d.delivery] += p
        delivered = {(str(k[0]), str(k[1]), int(k[2])): p for k, p in _elements(delivered_doc)}
        bad = {dk for dk, n in sent.items() if n - delivered.get(dk, 0) >= UNDELIVERED_MIN}
        return [d for d in self.directions.values() if d.delivery in bad]


def _elements(doc: dict[str, Any]) -> list[tuple[list[Any], int]]:
    """(key parts, packets) of every element of a `list set` JSON document (keys of 3 parts)."""
    out: list[tuple[list[Any], int]] = []
    for item in doc.get("nftables", []):
        s = item.get("set") if isinstance(item, dict) else None
        if not isinstance(s, dict):
            continue
        for el in s.get("elem", []):
            inner = el.get("elem", el) if isinstance(el, dict) else None
            if not isinstance(inner, dict):
                continue
            val = inner.get("val")
            parts = val.get("concat") if isinstance(val, dict) else None
            ctr = inner.get("counter") or {}
            if isinstance(parts, list) and len(parts) == 3:
                out.append((parts, int(ctr.get("packets", 0))))
    return out


if TYPE_CHECKING:
    from relay.core import DrivenCore

    # mypy checks the core against relay.core's contract here (never run: the guard sees no asyncio)
    def _conforms(core: KernelTable) -> DrivenCore[CountersDue]:
        return core
