"""Kademlia routing table and NAT sampler, as kademlia-routing-table and nat-sampler do them.

Both are plain data structures: no clock, no sockets. The node decides when to add, ping
and evict; these only answer "where does this id go" and "what is my public address".
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field

from .messages import Address

K = 20


@dataclass(slots=True, eq=False)
class Node:
    """A routing-table entry; ticks are the node's 5 s maintenance ticks."""

    id: bytes
    host: str
    port: int
    to: Address | None = None
    sampled: int = 0
    added: int = 0
    pinged: int = 0
    seen: int = 0
    down_hints: int = 0

    @property
    def address(self) -> Address:
        return (self.host, self.port)


def prefix_length(a: bytes, b: bytes) -> int:
    """Number of leading bits a and b share (255 when equal, like the JS table's last row)."""
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            return i * 8 + 8 - (x ^ y).bit_length()
    return len(a) * 8 - 1


def xor_compare(target: bytes, a: bytes, b: bytes) -> int:
    """Negative when a is XOR-closer to target than b (dht-rpc query `_compare`)."""
    for t, x, y in zip(target, a, b, strict=True):
        if x != y:
            return (t ^ x) - (t ^ y)
    return 0


@dataclass(slots=True)
class Row:
    index: int
    nodes: list[Node] = field(default_factory=list)
    ids: list[bytes] = field(default_factory=list)


class RoutingTable:
    """256 rows by shared-prefix length, each at most k nodes sorted by id."""

    def __init__(self, id: bytes, k: int = K) -> None:
        self.id = id
        self.k = k
        self.size = 0
        self.rows: list[Row | None] = [None] * (len(id) * 8)

    def _row_index(self, id: bytes) -> int:
        return prefix_length(id, self.id)

    def add(self, node: Node) -> bool | Row:
        """Insert or replace. Returns True on success, the full Row when there was no room
        (the caller may ping the row's oldest node and swap), never raises."""
        i = self._row_index(node.id)
        row = self.rows[i]
        if row is None:
            row = self.rows[i] = Row(i)
        j = bisect_left(row.ids, node.id)
        if j < len(row.ids) and row.ids[j] == node.id:
            row.nodes[j] = node
            return True
        if len(row.nodes) >= self.k:
            return row
        row.ids.insert(j, node.id)
        row.nodes.insert(j, node)
        self.size += 1
        return True

    def _find(self, id: bytes) -> tuple[Row, int] | None:
        """Where `id` sits: its row and its index there, or None when it is not in the table."""
        row = self.rows[self._row_index(id)]
        if row is None:
            return None
        j = bisect_left(row.ids, id)
        return (row, j) if j < len(row.ids) and row.ids[j] == id else None

    def remove(self, id: bytes) -> bool:
        found = self._find(id)
        if found is None:
            return False
        row, j = found
        del row.ids[j]
        del row.nodes[j]
        self.size -= 1
        return True

    def get(self, id: bytes) -> Node | None:
        found = self._find(id)
        return found[0].nodes[found[1]] if found is not None else None

    def has(self, id: bytes) -> bool:
        return self.get(id) is not None

    def random(self) -> Node | None:
        if self.size == 0:
            return None
        n = random.randrange(self.size)
        for row in self.rows:
            if row is None:
                continue
            if n < len(row.nodes):
                return row.nodes[n]
            n -= len(row.nodes)
        return None

    def closest(self, target: bytes, k: int | None = None) -> list[Node]:
        """The table's approximation of the k closest: the target's row, then shorter
        prefixes, then longer ones (kademlia-routing-table `closest`)."""
        k = self.k if k is None else k
        out: list[Node] = []
        d = self._row_index(target)
        for i in [*range(d, -1, -1), *range(d + 1, len(self.rows))]:
            if len(out) >= k:
                break
            row = self.rows[i]
            if row is not None:
                out.extend(row.nodes[: k - len(out)])
        return out

    def __iter__(self) -> Iterator[Node]:
        for row in self.rows:
            if row is not None:
                yield from row.nodes

    def __len__(self) -> int:
        return self.size


@dataclass(slots=True)
class _Sample:
    host: str
    port: int
    hits: int = 1


class NatSampler:
    """Votes on our public (host, port) from the `to` fields peers report back.

    Same ring of 16 (host, port) + 16 host-only samples and the same threshold as the npm
    nat-sampler, so we reach the same conclusion from the same replies."""

    def __init__(self) -> None:
        self.host: str | None = None
        self.port = 0
        self.size = 0
        self._a: _Sample | None = None
        self._b: _Sample | None = None
        self._threshold = 0
        self._top = 0
        self._samples: list[_Sample] = []

    def add(self, host: str, port: int) -> int:
        a = self._bump(host, port, 2)
        b = self._bump(host, 0, 1)
        if len(self._samples) < 32:
            self.size += 1
            s = self.size
            self._threshold = s - (0 if s < 4 else 1 if s < 8 else 2 if s < 12 else 3)
            self._samples += [a, b]
            self._top += 2
        else:
            if self._top == 32:
                self._top = 0
            self._samples[self._top].hits -= 1
            self._samples[self._top] = a
            self._top += 1
            self._samples[self._top].hits -= 1
            self._samples[self._top] = b
            self._top += 1
        if self._a is None or self._a.hits < a.hits:
            self._a = a
        if self._b is None or self._b.hits < b.hits:
            self._b = b
        if self._a.hits >= self._threshold:
            self.host, self.port = self._a.host, self._a.port
        elif self._b.hits >= self._threshold:
            self.host, self.port = self._b.host, 0
        else:
            self.host, self.port = None, 0
        return a.hits

    def _bump(self, host: str, port: int, inc: int) -> _Sample:
        for i in range(4):
            j = (self._top - inc - 2 * i) & 31
            if j >= len(self._samples):
                return _Sample(host, port)
            s = self._samples[j]
            if s.port == port and s.host == host:
                s.hits += 1
                return s
        return _Sample(host, port)
