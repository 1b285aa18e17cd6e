"""UDX packet codec: the 20-byte little-endian header, type flags and SACK blocks.

Kept apart from the stream logic (as aioquic keeps `packet.py` apart from the connection) so
the decoders can be property-tested alone and the relay's hot path can peek at the few bytes
it needs without building objects.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = 0xFF
VERSION = 0x01
HEADER_SIZE = 20

DATA = 0x01
END = 0x02
SACK = 0x04
MESSAGE = 0x08
DESTROY = 0x10
HEARTBEAT = 0x20

MAX_SACKS = 50
DEFAULT_RWND = 4194304
MTU_BASE = 1200
IPV4_OVERHEAD = 48
IPV6_OVERHEAD = 68
#: Node's receive buffer per datagram; longer datagrams are truncated by the receiver.
MAX_DATAGRAM = 2048

U32 = 0xFFFFFFFF

_HEADER = struct.Struct("<BBBBIIII")
_SACK_BLOCK = struct.Struct("<II")


class UDXError(Exception):
    """Everything that goes wrong in the UDX layer: bad packets, resets, timeouts.

    `code` mirrors the errno-like names udx-native reports (`ECONNRESET`, `ETIMEDOUT`, ...)
    so callers can tell a peer's reset from a local cancel.
    """

    def __init__(self, message: str, code: str = "EUDX") -> None:
        super().__init__(message)
        self.code = code


def seq_diff(a: int, b: int) -> int:
    """Signed 32-bit serial difference `a - b`, as libudx's `seq_diff`."""
    d = (a - b) & U32
    return d - 0x100000000 if d & 0x80000000 else d


def seq_lt(a: int, b: int) -> bool:
    return ((a - b) & U32) >= 0x80000000


def max_payload(mtu: int = MTU_BASE, ipv6: bool = False) -> int:
    """Stream bytes per packet: what libudx's `udx__max_payload` allows at this MTU."""
    return mtu - (IPV6_OVERHEAD if ipv6 else IPV4_OVERHEAD)


def is_udx(data: bytes | bytearray | memoryview) -> bool:
    """Header shape check only; whether the id is ours is the socket's business."""
    return len(data) >= HEADER_SIZE and data[0] == MAGIC and data[1] == VERSION


def peek_id(data: bytes | bytearray | memoryview) -> int:
    return int.from_bytes(data[4:8], "little")


@dataclass(frozen=True, slots=True)
class Packet:
    """One decoded UDX datagram. `payload` excludes padding and SACK area."""

    type: int
    data_offset: int
    id: int
    rwnd: int
    seq: int
    ack: int
    sacks: tuple[tuple[int, int], ...] = ()
    payload: bytes = b""

    def encode(self) -> bytes:
        return encode(self.type, self.id, self.rwnd, self.seq, self.ack, self.payload, self.sacks, self.data_offset)


def encode_header(type_: int, id_: int, rwnd: int, seq: int, ack: int, data_offset: int = 0) -> bytes:
    return _HEADER.pack(MAGIC, VERSION, type_, data_offset, id_ & U32, rwnd & U32, seq & U32, ack & U32)


def encode(
    type_: int,
    id_: int,
    rwnd: int,
    seq: int,
    ack: int,
    payload: bytes = b"",
    sacks: tuple[tuple[int, int], ...] | list[tuple[int, int]] = (),
    padding: int = 0,
) -> bytes:
    """Build a datagram. SACK blocks go right after the header (data_offset 0, as libudx)."""
    head = _HEADER.pack(MAGIC, VERSION, type_, padding, id_ & U32, rwnd & U32, seq & U32, ack & U32)
    if sacks:
        head += b"".join(_SACK_BLOCK.pack(s & U32, e & U32) for s, e in sacks)
    elif padding:
        head += bytes(padding)
    return head + payload if payload else head


def decode(data: bytes | bytearray | memoryview) -> Packet:
    """Parse one datagram the way libudx's `process_packet` does; `UDXError` if it is not UDX."""
    n = len(data)
    if n < HEADER_SIZE:
        raise UDXError(f"datagram of {n} bytes is shorter than the {HEADER_SIZE}-byte UDX header", "EBADPACKET")
    magic, version, type_, off, id_, rwnd, seq, ack = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        raise UDXError(f"not UDX: magic/version {magic:#04x}/{version:#04x}", "EBADPACKET")
    rest = n - HEADER_SIZE
    sacks: tuple[tuple[int, int], ...] = ()
    if type_ & SACK:
        sack_len = off if 0 < off < rest else rest
        count = min(sack_len // 8, MAX_SACKS * 4)
        sacks = tuple(_SACK_BLOCK.unpack_from(data, HEADER_SIZE + 8 * i) for i in range(count))
    if off:
        if off > rest:
            raise UDXError(f"data_offset {off} runs past the end of a {n}-byte datagram", "EBADPACKET")
        payload = bytes(data[HEADER_SIZE + off :])
    else:  # libudx: without data_offset everything after the header is payload, SACK area too
        payload = bytes(data[HEADER_SIZE:])
    return Packet(type_, off, id_, rwnd, seq, ack, sacks, payload)


def flag_names(type_: int) -> list[str]:
    names = [name for bit, name in _NAMES if type_ & bit]
    return names or ["ACK"]


_NAMES = (
    (DATA, "DATA"),
    (END, "END"),
    (SACK, "SACK"),
    (MESSAGE, "MESSAGE"),
    (DESTROY, "DESTROY"),
    (HEARTBEAT, "HEARTBEAT"),
)
