"""Our own public address as the DHT sees it, learned so that no single host can move it.

Sans-IO. dht-rpc samples the `to` field of every message with a valid id, requests included,
in a ring where each message is one vote (nat-sampler): 80 PINGs from one host claiming a fake
address moved our address, and handshake replies then advertised the attacker's address first.
Here a vote is only the `to` of a *reply to one of our own requests* (the driver feeds only
those), one vote per reporting host (its latest claim), and:

- the first address is adopted once a strict majority of the hosts heard from agree on it,
  at least `MIN_HOSTS` of them. Until our first walk has ended (`settle()`), nothing less
  will do: the first reply used to decide alone, so whichever node answered first (a hostile
  one our bootstrap node named, say) set the address every later move had to be checked
  against. After the walk, a majority of every host that answered is enough (a loopback
  testnet is a single host, and nobody else can be asked);
- a different address that wins the vote later is only a *candidate*: the hosts that
  confirmed the current address (its witnesses) are asked again (`take_rechecks()`, the
  driver PINGs them), and the address moves only if most witnesses that answer now see the
  candidate too, or none of them answers any more (we really are elsewhere). An attacker who
  cannot make our old witnesses lie cannot move it.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

from .messages import Address

MIN_HOSTS = 3
MAX_HOSTS = 64  # reporting hosts remembered (least recently heard dropped first)
MAX_RECHECKS = 5


class OwnAddress:
    """The voted public (host, port) for one socket; `host`/`port` as NatSampler's."""

    def __init__(self) -> None:
        self.host: str | None = None
        self.port = 0
        self.moves = 0  # times a verified candidate replaced an established address
        self.refused = 0  # candidates the witnesses did not confirm
        self._votes: OrderedDict[str, Address] = OrderedDict()  # reporter host -> its latest claim
        self._reporters: dict[str, Address] = {}  # reporter host -> the address that answered
        self._witnesses: set[str] = set()
        self.candidate: Address | None = None
        self._refused: Address | None = None  # last candidate the witnesses did not confirm
        self._rechecks: dict[str, Address | None] = {}  # witness host -> fresh claim (None: waiting)
        self._to_ask: list[Address] = []
        self.settled = False  # our first walk has ended: the hosts heard from are all we will get soon

    @property
    def address(self) -> Address | None:
        return (self.host, self.port) if self.host is not None else None

    @classmethod
    def adopted(cls, address: Address, witnesses: dict[str, Address]) -> OwnAddress:
        """An address just proven by a reachability check; `witnesses`: host -> node that saw it."""
        own = cls()
        own.settled = True
        own.host, own.port = address
        for host, reporter in witnesses.items():
            own._votes[host] = address
            own._reporters[host] = reporter
            own._witnesses.add(host)
        return own

    def add(self, reporter: Address, claimed: Address) -> None:
        """A reply from `reporter` to one of our requests says it saw us at `claimed`."""
        host = reporter[0]
        if host in self._rechecks and self._rechecks[host] is None:
            self._rechecks[host] = claimed
        self._votes.pop(host, None)
        self._votes[host] = claimed
        self._reporters[host] = reporter
        while len(self._votes) > MAX_HOSTS:
            old, _ = self._votes.popitem(last=False)
            self._reporters.pop(old, None)
            self._witnesses.discard(old)
        self._evaluate()

    def settle(self) -> None:
        """Our first walk ended: from now on the first address may come from fewer than
        MIN_HOSTS hosts, if they are all that answered."""
        if not self.settled:
            self.settled = True
            self._evaluate()

    def recheck_failed(self, reporter: Address) -> None:
        """A witness did not answer the recheck PING."""
        if self._rechecks.get(reporter[0], False) is None:
            del self._rechecks[reporter[0]]
            self._votes.pop(reporter[0], None)
            self._witnesses.discard(reporter[0])
        self._evaluate()

    def take_rechecks(self) -> list[Address]:
        """Witnesses the driver must PING now (once per candidate)."""
        out, self._to_ask = self._to_ask, []
        return out

    def _winner(self) -> Address | None:
        if not self._votes:
            return None
        (best, n), *_ = Counter(self._votes.values()).most_common(1)
        hosts = len(self._votes)
        if n < (min(MIN_HOSTS, hosts) if self.settled else MIN_HOSTS) or 2 * n <= hosts:
            return None
        return best

    def _supporters(self, address: Address) -> set[str]:
        return {h for h, a in self._votes.items() if a == address}

    def _evaluate(self) -> None:
        best = self._winner()
        current = self.address
        if current is None:
            if best is not None:
                self.host, self.port = best
                self._witnesses = self._supporters(best)
            return
        self._witnesses |= self._supporters(current)
        if best is None or best == current:
            if self.candidate is not None and not self._rechecks_pending():
                self._end_recheck(move=False)
            return
        if best == self._refused and not self._witnesses & self._supporters(best):
            return  # already refused, and still no witness of ours sees it
        if best != self.candidate:
            self.candidate = best
            witnesses = sorted(self._witnesses - self._supporters(best))[:MAX_RECHECKS]
            self._rechecks = {h: None for h in witnesses}
            self._to_ask = [self._reporters[h] for h in witnesses if h in self._reporters]
        if self._rechecks_pending():
            return
        answered = [a for a in self._rechecks.values() if a is not None]
        confirmed = sum(1 for a in answered if a == best)
        self._end_recheck(move=not answered or 2 * confirmed > len(answered))

    def _rechecks_pending(self) -> bool:
        return any(a is None for a in self._rechecks.values())

    def _end_recheck(self, move: bool) -> None:
        best = self.candidate
        self.candidate = None
        self._rechecks = {}
        self._to_ask = []
        if move and best is not None:
            self.host, self.port = best
            self._witnesses = self._supporters(best)
            self._refused = None
            self.moves += 1
        else:
            self._refused = best
            self.refused += 1
