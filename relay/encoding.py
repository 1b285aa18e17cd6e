"""compact-encoding, the byte layout every Holepunch layer shares.

Nothing on the wire is self-describing, so each message is read field by field with a
`Reader` and written with a `Writer`. Every decoding failure, whatever its cause, is a
`DecodeError`: callers that face the network catch exactly one type.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

MAX_SAFE_INTEGER = 2**53 - 1
MAX_ARRAY = 0x100000

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U32BE = struct.Struct(">I")
_U64BE = struct.Struct(">Q")
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")


class DecodeError(ValueError):
    """The peer sent bytes that do not decode as the expected message."""


class Reader:
    """Reads compact-encoded fields from `data[start:end]`; trailing bytes are ignored."""

    __slots__ = ("data", "end", "pos")

    def __init__(self, data: bytes | bytearray | memoryview, start: int = 0, end: int | None = None) -> None:
        self.data = bytes(data) if not isinstance(data, bytes) else data
        self.pos = start
        self.end = len(self.data) if end is None else end

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise DecodeError(f"out of bounds: need {n} bytes at offset {self.pos}, have {self.end - self.pos}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def uint8(self) -> int:
        if self.pos >= self.end:
            raise DecodeError(f"out of bounds: need 1 byte at offset {self.pos}")
        v = self.data[self.pos]
        self.pos += 1
        return v

    def uint16(self) -> int:
        return _U16.unpack(self._take(2))[0]

    def uint24(self) -> int:
        b = self._take(3)
        return b[0] | b[1] << 8 | b[2] << 16

    def uint32(self) -> int:
        return _U32.unpack(self._take(4))[0]

    def uint64(self) -> int:
        v = _U64.unpack(self._take(8))[0]
        if v > MAX_SAFE_INTEGER:
            raise DecodeError(f"uint64 {v} is above 2^53-1")
        return v

    def uint32be(self) -> int:
        return _U32BE.unpack(self._take(4))[0]

    def uint64be(self) -> int:
        return _U64BE.unpack(self._take(8))[0]

    def uint(self) -> int:
        a = self.uint8()
        if a <= 0xFC:
            return a
        if a == 0xFD:
            return self.uint16()
        if a == 0xFE:
            return self.uint32()
        return self.uint64()

    def zigzag_int(self) -> int:
        """compact-encoding `int` (zigzag varint); not named `int` so the builtin stays visible here."""
        return _unzigzag(self.uint())

    def bool(self) -> bool:
        return self.uint8() == 1

    def float32(self) -> float:
        return _F32.unpack(self._take(4))[0]

    def float64(self) -> float:
        return _F64.unpack(self._take(8))[0]

    def fixed(self, n: int) -> bytes:
        return self._take(n)

    def fixed32(self) -> bytes:
        return self._take(32)

    def fixed64(self) -> bytes:
        return self._take(64)

    def raw(self) -> bytes:
        return self._take(self.end - self.pos)

    def buffer(self) -> bytes:
        return self._take(self.uint())

    def optional_buffer(self) -> bytes | None:
        b = self.buffer()
        return b or None

    def string(self) -> str:
        b = self.buffer()
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DecodeError(f"string is not valid UTF-8: {e}") from None

    def array(self, item: Callable[[Reader], T]) -> list[T]:
        n = self.uint()
        if n > MAX_ARRAY:
            raise DecodeError(f"array of {n} items is too long")
        return [item(self) for _ in range(n)]

    def bitfield(self, length: int) -> int:
        """Decode `compact-encoding-bitfield(length)` as an int, bit i = flag i."""
        first = self.uint8()
        if first <= 0xFC:
            return first
        width = {0xFD: 2, 0xFE: 4, 0xFF: 8}[first]
        return int.from_bytes(self._take(width), "little")

    def ipv4(self) -> str:
        b = self._take(4)
        return f"{b[0]}.{b[1]}.{b[2]}.{b[3]}"

    def ipv6(self) -> str:
        b = self._take(16)
        return ":".join(f"{(b[i] << 8) | b[i + 1]:x}" for i in range(0, 16, 2))

    def ipv4_address(self) -> tuple[str, int]:
        host = self.ipv4()
        return host, self.uint16()

    def ipv6_address(self) -> tuple[str, int]:
        host = self.ipv6()
        return host, self.uint16()

    def ip_address(self) -> tuple[str, int]:
        family = self.uint8()
        host = self.ipv4() if family == 4 else self.ipv6()
        return host, self.uint16()


class Writer:
    """Builds a compact-encoded message; `bytes(writer)` or `.getvalue()` gives the result."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def getvalue(self) -> bytes:
        return bytes(self.buf)

    def __bytes__(self) -> bytes:
        return bytes(self.buf)

    def uint8(self, v: int) -> Writer:
        self.buf.append(v)
        return self

    def uint16(self, v: int) -> Writer:
        self.buf += _U16.pack(v)
        return self

    def uint24(self, v: int) -> Writer:
        self.buf += bytes((v & 0xFF, (v >> 8) & 0xFF, (v >> 16) & 0xFF))
        return self

    def uint32(self, v: int) -> Writer:
        self.buf += _U32.pack(v)
        return self

    def uint64(self, v: int) -> Writer:
        if not 0 <= v <= MAX_SAFE_INTEGER:
            raise ValueError(f"uint64 {v} out of range")
        self.buf += _U64.pack(v)
        return self

    def uint32be(self, v: int) -> Writer:
        self.buf += _U32BE.pack(v)
        return self

    def uint64be(self, v: int) -> Writer:
        self.buf += _U64BE.pack(v)
        return self

    def uint(self, v: int) -> Writer:
        if v < 0 or v > MAX_SAFE_INTEGER:
            raise ValueError(f"uint {v} out of range")
        if v <= 0xFC:
            self.buf.append(v)
        elif v <= 0xFFFF:
            self.buf.append(0xFD)
            self.buf += _U16.pack(v)
        elif v <= 0xFFFFFFFF:
            self.buf.append(0xFE)
            self.buf += _U32.pack(v)
        else:
            self.buf.append(0xFF)
            self.buf += _U64.pack(v)
        return self

    def zigzag_int(self, v: int) -> Writer:
        """compact-encoding `int` (zigzag varint); see `Reader.zigzag_int`."""
        return self.uint(2 * v if v >= 0 else -2 * v - 1)

    def bool(self, v: bool) -> Writer:
        self.buf.append(1 if v else 0)
        return self

    def float32(self, v: float) -> Writer:
        self.buf += _F32.pack(v)
        return self

    def float64(self, v: float) -> Writer:
        self.buf += _F64.pack(v)
        return self

    def fixed(self, b: bytes, n: int) -> Writer:
        if len(b) != n:
            raise ValueError(f"fixed({n}) got {len(b)} bytes")
        self.buf += b
        return self

    def fixed32(self, b: bytes) -> Writer:
        return self.fixed(b, 32)

    def fixed64(self, b: bytes) -> Writer:
        return self.fixed(b, 64)

    def raw(self, b: bytes) -> Writer:
        self.buf += b
        return self

    def buffer(self, b: bytes | None) -> Writer:
        if not b:
            self.buf.append(0)
            return self
        self.uint(len(b))
        self.buf += b
        return self

    optional_buffer = buffer

    def string(self, s: str) -> Writer:
        return self.buffer(s.encode("utf-8")) if s else self.uint8(0)

    def array(self, items: Sequence[T], item: Callable[[Writer, T], object]) -> Writer:
        self.uint(len(items))
        for x in items:
            item(self, x)
        return self

    def bitfield(self, value: int, length: int) -> Writer:
        """Encode flags (bit i = flag i) as `compact-encoding-bitfield(length)`."""
        width = 1 if length <= 8 else 2 if length <= 16 else 4 if length <= 32 else 8
        if width == 1:
            self.buf.append(value & 0xFF)
        else:
            self.buf.append({2: 0xFD, 4: 0xFE, 8: 0xFF}[width])
            self.buf += value.to_bytes(width, "little")
        return self

    def ipv4(self, host: str) -> Writer:
        parts = host.split(".")
        if len(parts) != 4:
            raise ValueError(f"not an IPv4 address: {host!r}")
        self.buf += bytes(int(p) for p in parts)
        return self

    def ipv6(self, host: str) -> Writer:
        head, _, tail = host.partition("::")
        hs = [g for g in head.split(":") if g] if head else []
        ts = [g for g in tail.split(":") if g] if tail else []
        groups = hs + ["0"] * (8 - len(hs) - len(ts)) + ts if "::" in host else hs
        if len(groups) != 8:
            raise ValueError(f"not an IPv6 address: {host!r}")
        for g in groups:
            self.buf += int(g, 16).to_bytes(2, "big")
        return self

    def ipv4_address(self, addr: tuple[str, int]) -> Writer:
        return self.ipv4(addr[0]).uint16(addr[1])

    def ipv6_address(self, addr: tuple[str, int]) -> Writer:
        return self.ipv6(addr[0]).uint16(addr[1])

    def ip_address(self, addr: tuple[str, int]) -> Writer:
        host, port = addr
        if ":" in host:
            return self.uint8(6).ipv6(host).uint16(port)
        return self.uint8(4).ipv4(host).uint16(port)


def _unzigzag(n: int) -> int:
    return n >> 1 if n & 1 == 0 else -((n + 1) >> 1)


def decode(data: bytes, read: Callable[[Reader], T]) -> T:
    """Decode one message with `read`, turning any stray failure into `DecodeError`."""
    try:
        return read(Reader(data))
    except DecodeError:
        raise
    except (IndexError, KeyError, ValueError, struct.error, TypeError) as e:
        raise DecodeError(str(e)) from None
