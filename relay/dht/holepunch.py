"""Server-side holepunching state, sans-IO (`hyperdht/lib/nat.js`, `holepuncher.js`).

Used only when we cannot claim OPEN: a fresh socket samples its NAT mapping from the `to`
fields of PINGs to a few DHT nodes (`NatAnalyzer`), its mapping goes to the client through
the routed handshake reply, and `PunchState` tracks the client's holepunch rounds (its
firewall, addresses, whether it is punching) and decides our answers. Only consistent
NATs on both sides are punched (1-byte probes every second, up to 10 tries); random NATs
are refused, which hyperdht signals with an abort.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .messages import Address, Firewall

MIN_SAMPLES = 4
PROBE_TRIES = 10
PROBE_INTERVAL = 1.0
HOLEPUNCH = b"\x00"


@dataclass(slots=True)
class Sample:
    host: str
    port: int
    hits: int = 1


def _add_sample(samples: list[Sample], host: str, port: int) -> None:
    for i, s in enumerate(samples):
        if s.host == host and s.port == port:
            s.hits += 1
            while i > 0 and samples[i - 1].hits < s.hits:  # keep most-hit first
                samples[i - 1], samples[i] = samples[i], samples[i - 1]
                i -= 1
            return
    samples.append(Sample(host, port))


class NatAnalyzer:
    """Classifies a socket's NAT from how DHT nodes saw it (hyperdht `Nat`)."""

    def __init__(self, firewalled: bool = True, min_samples: int = MIN_SAMPLES) -> None:
        self.firewalled = firewalled
        self.min_samples = min_samples
        self.firewall = Firewall.UNKNOWN if firewalled else Firewall.OPEN
        self.addresses: list[Address] | None = None
        self.sampled = 0
        self.frozen = False
        self.done = not firewalled  # "analyzing" resolved
        self._full: list[Sample] = []
        self._hosts: list[Sample] = []
        self._seen: set[Address] = set()

    def add(self, mapped: Address, sender: Address) -> None:
        """One reply: `mapped` is our address as `sender` saw it (one sample per sender)."""
        if sender in self._seen:
            return
        self._seen.add(sender)
        _add_sample(self._hosts, mapped[0], 0)
        _add_sample(self._full, mapped[0], mapped[1])
        self.sampled += 1
        if (self.sampled >= 3 or not self.firewalled) and not self.frozen:
            self._update()
        if self.firewall in (Firewall.CONSISTENT, Firewall.OPEN) or self.sampled >= self.min_samples:
            self.done = True

    def give_up(self) -> None:
        """Sampling ran out of nodes or time: stop waiting with what we have."""
        self.done = True

    def freeze(self) -> None:
        self.frozen = True

    def _update(self) -> None:
        if not self.firewalled:
            self.firewall = Firewall.OPEN
        elif self.sampled >= 3:
            top = self._full[0].hits
            if top >= 3:
                self.firewall = Firewall.CONSISTENT
            elif top == 1 or (len(self._hosts) == 1 and self.sampled > 3):
                self.firewall = Firewall.RANDOM
            elif len(self._hosts) > 1 and self._full[1].hits > 1:
                self.firewall = Firewall.CONSISTENT
            elif self.sampled > 4:
                self.firewall = Firewall.RANDOM
        if self.firewall == Firewall.UNKNOWN:
            self.addresses = None
        elif self.firewall == Firewall.RANDOM:
            self.addresses = [(self._hosts[0].host, self._hosts[0].port)]
        elif self.firewall == Firewall.CONSISTENT:
            out: list[Address] = []
            for s in self._full:
                if s.hits >= 2 or len(out) < 2:
                    out.append((s.host, s.port))
            self.addresses = out


@dataclass(slots=True)
class RemoteAddress:
    host: str
    port: int
    verified: bool = False

    @property
    def address(self) -> Address:
        return (self.host, self.port)


@dataclass
class PunchState:
    """Our view of one client's holepunch rounds."""

    nat: NatAnalyzer
    remote_firewall: int = Firewall.UNKNOWN
    remote_addresses: list[RemoteAddress] = field(default_factory=list)
    remote_holepunching: bool = False
    punching: bool = False
    connected: bool = False
    tries: int = 0

    def update_remote(
        self, punching: bool, firewall: int, addresses: list[Address] | None, verified: str | None
    ) -> None:
        known = {a.host for a in self.remote_addresses if a.verified}
        self.remote_addresses = [RemoteAddress(h, p, verified == h or h in known) for h, p in (addresses or [])]
        self.remote_firewall = firewall
        self.remote_holepunching = punching

    def stable(self) -> bool:
        """hyperdht `_unstable` negated: we know our NAT, and not both sides are random."""
        fw = self.nat.firewall
        if fw == Firewall.UNKNOWN:
            return False
        return not (self.remote_firewall >= Firewall.RANDOM and fw >= Firewall.RANDOM)

    def can_punch(self) -> bool:
        """Only consistent↔consistent (OPEN counts as consistent): no birthday attacks here."""
        local = Firewall.CONSISTENT if self.nat.firewall == Firewall.OPEN else self.nat.firewall
        remote = Firewall.CONSISTENT if self.remote_firewall == Firewall.OPEN else self.remote_firewall
        return bool(self.remote_addresses) and local == Firewall.CONSISTENT and remote == Firewall.CONSISTENT

    def probe_targets(self) -> list[Address]:
        """Addresses for the next probe round: verified ones every round, the rest every 4th."""
        self.tries += 1
        return [a.address for a in self.remote_addresses if a.verified or (self.tries & 3) == 0]

    def more_tries(self) -> bool:
        return self.punching and not self.connected and self.tries < PROBE_TRIES
