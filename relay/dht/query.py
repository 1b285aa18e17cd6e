"""Iterative Kademlia walk towards a target, as dht-rpc's `lib/query.js` runs it.

Sans-IO: the runtime asks `next_visits()` whom to send the query to, reports each outcome
with `on_reply` / `on_retrying` / `on_failed`, and stops when `finished` is true. The walk
keeps the k XOR-closest responders that proved their id (`closest_replies`), which is
what an announce needs: their ids and tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .messages import Address, node_id
from .rpc import Reply
from .table import K, RoutingTable, xor_compare

DONE = "done"
DOWN = "down"


@dataclass(slots=True)
class Candidate:
    id: bytes
    host: str
    port: int

    @property
    def address(self) -> Address:
        return (self.host, self.port)

    @staticmethod
    def at(addr: Address) -> Candidate:
        """A node known only by address: its id is the one that address must claim."""
        return Candidate(node_id(addr), addr[0], addr[1])


@dataclass(slots=True)
class DownHint:
    """Tell `to` that `down` did not answer (dht-rpc DOWN_HINT)."""

    to: Address
    down: Address


@dataclass
class Query:
    target: bytes
    table: RoutingTable
    bootstrap: list[Address] = field(default_factory=list)
    nodes: list[Address] | None = None
    k: int = K
    concurrency: int = 10
    only_closest_nodes: bool = False

    def __post_init__(self) -> None:
        self.inflight = 0
        self.successes = 0
        self.errors = 0
        self.closest_replies: list[Reply] = []
        self.down_hints: list[DownHint] = []
        self._slow = 0
        self._slowdown = False
        self._seen: dict[Address, object] = {}
        self._pending: list[Candidate] = []
        self._from_table = False
        self._opened = False
        self.finished = False
        self.replies: list[Reply] = []
        if self.nodes:
            for addr in reversed(self.nodes):
                self._add_pending(Candidate.at(addr), None)

    # ------------------------------------------------------------------ seeding

    def _add_from_table(self) -> None:
        if len(self._pending) >= self.k:
            return
        self._from_table = True
        for n in self.table.closest(self.target, self.k - len(self._pending)):
            self._add_pending(Candidate(n.id, n.host, n.port), None)

    def _open(self) -> None:
        self._opened = True
        self._add_from_table()
        if len(self._pending) >= self.k:
            return
        for addr in self.bootstrap:
            self._add_pending(Candidate.at(addr), None)

    def _is_closer(self, id_: bytes) -> bool:
        return (
            len(self.closest_replies) < self.k
            or xor_compare(self.target, id_, self.closest_replies[-1].peer.id or b"") < 0
        )

    def _add_pending(self, node: Candidate, ref: Address | None) -> bool:
        if self.only_closest_nodes and self._opened:
            return False
        refs = self._seen.get(node.address)
        closer = self._is_closer(node.id)
        if refs == DONE:
            return closer
        if refs == DOWN:
            if ref is not None:
                self.down_hints.append(DownHint(ref, node.address))
            return closer
        if isinstance(refs, list):
            if ref is not None:
                refs.append(ref)
            return closer
        if not closer:
            return False
        self._seen[node.address] = [] if ref is None else [ref]
        self._pending.append(node)
        return True

    # ------------------------------------------------------------------ driving

    def next_visits(self) -> list[Candidate]:
        """Who to send the query to now; the caller must report each one's outcome."""
        if not self._opened:
            self._open()
        out: list[Candidate] = []
        while not self.finished:
            concurrency = (3 if self._slowdown else self.concurrency) + self._slow
            while self.inflight < concurrency and self._pending:
                nxt = self._pending.pop()
                if not self._is_closer(nxt.id):
                    continue
                self.inflight += 1
                out.append(nxt)
            if not self._from_table and self.successes == 0 and self.errors == 0:
                self._slowdown = True
            if self._pending:
                return out
            if self.inflight == 0 or (self._slow == self.inflight and len(self.closest_replies) >= self.k):
                if not self._from_table and self.successes < self.k / 4:
                    self._add_from_table()
                    if self._pending:
                        continue
                self.finished = True
            return out
        return out

    def on_retrying(self, slow_already: bool = False) -> None:
        """The request's first timeout passed: it no longer blocks concurrency."""
        if not slow_already:
            self._slow += 1

    def _dec(self, was_slow: bool) -> None:
        if was_slow:
            self._slow -= 1
        self.inflight -= 1

    def on_reply(self, visited: Address, reply: Reply, was_slow: bool = False) -> None:
        self._dec(was_slow)
        self._seen[visited] = DONE
        if self.finished:
            return
        if reply.error == 0:
            self.successes += 1
        else:
            self.errors += 1
        if reply.error == 0 and reply.peer.id is not None and self._is_closer(reply.peer.id):
            self._push_closest(reply)
        for addr in reply.closer_nodes:
            cand = Candidate.at(addr)
            if cand.id == self.table.id:
                continue
            if not self._add_pending(cand, reply.peer.address):
                break
        if not self._from_table and self.successes + self.errors >= self.concurrency:
            self._slowdown = False
        if reply.error == 0:
            self.replies.append(reply)

    def on_failed(self, visited: Address, timed_out: bool, was_slow: bool = False) -> None:
        refs = self._seen.get(visited)
        if timed_out:
            self._seen[visited] = DOWN
            if isinstance(refs, list):
                self.down_hints.extend(DownHint(r, visited) for r in refs)
        self._dec(was_slow)
        self.errors += 1

    def _push_closest(self, reply: Reply) -> None:
        rid = reply.peer.id or b""
        lst = self.closest_replies
        for i, other in enumerate(lst):
            c = xor_compare(self.target, rid, other.peer.id or b"")
            if c == 0:
                return
            if c < 0:
                lst.insert(i, reply)
                break
        else:
            lst.append(reply)
        if len(lst) > self.k:
            lst.pop()

    @property
    def closest_nodes(self) -> list[Address]:
        return [r.peer.address for r in self.closest_replies]

    def take_down_hints(self) -> Iterable[DownHint]:
        hints, self.down_hints = self.down_hints, []
        return hints
