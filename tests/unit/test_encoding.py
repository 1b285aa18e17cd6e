from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.encoding import DecodeError, Reader, Writer, decode
from tests.vectors import load

CE = load("streams")["compact_encoding"]


@pytest.mark.parametrize("codec", ["uint", "uint8", "uint16", "uint24", "uint32", "uint64", "int", "bool", "string"])
def test_scalar_vectors(codec: str) -> None:
    method = {"int": "zigzag_int"}.get(codec, codec)  # ours is not named `int`: it shadowed the builtin
    for v in CE[codec]:
        assert getattr(Writer(), method)(v["value"]).getvalue().hex() == v["hex"]
        r = Reader(bytes.fromhex(v["hex"]))
        assert getattr(r, method)() == v["value"]
        assert r.remaining == 0


def test_buffers_and_arrays() -> None:
    for v in CE["buffer"]:
        assert Writer().buffer(bytes.fromhex(v["value_hex"])).getvalue().hex() == v["hex"]
        assert Reader(bytes.fromhex(v["hex"])).buffer().hex() == v["value_hex"]
    for v in CE["optionalBuffer"]:
        val = v["value_hex"] and bytes.fromhex(v["value_hex"])
        assert Writer().optional_buffer(val).getvalue().hex() == v["hex"]
        out = Reader(bytes.fromhex(v["hex"])).optional_buffer()
        assert (out.hex() if out else None) == v["value_hex"]
    for v in CE["fixed32"] + CE["fixed64"]:
        n = len(v["value_hex"]) // 2
        assert Writer().fixed(bytes.fromhex(v["value_hex"]), n).getvalue().hex() == v["hex"]
    (au,) = CE["array_uint"]
    assert Writer().array(au["value"], Writer.uint).getvalue().hex() == au["hex"]
    assert Reader(bytes.fromhex(au["hex"])).array(Reader.uint) == au["value"]
    (ast,) = CE["array_string"]
    assert Reader(bytes.fromhex(ast["hex"])).array(Reader.string) == ast["value"]


def test_bitfields() -> None:
    for v in CE["bitfield7"]:
        flags = sum(1 << i for i, b in enumerate(v["bits"]) if b)
        assert Writer().bitfield(flags, 7).getvalue().hex() == v["hex"]
        assert Reader(bytes.fromhex(v["hex"])).bitfield(7) == flags
    for v in CE["bitfield9"]:
        flags = sum(1 << i for i, b in enumerate(v["bits"]) if b)
        assert Writer().bitfield(flags, 9).getvalue().hex() == v["hex"]
        assert Reader(bytes.fromhex(v["hex"])).bitfield(9) == flags


def test_addresses() -> None:
    for v in CE["ipv4Address"]:
        addr = (v["value"]["host"], v["value"]["port"])
        assert Writer().ipv4_address(addr).getvalue().hex() == v["hex"]
        assert Reader(bytes.fromhex(v["hex"])).ipv4_address() == addr
    for v in CE["ipv6Address"]:
        addr = (v["value"]["host"], v["value"]["port"])
        assert Writer().ipv6_address(addr).getvalue().hex() == v["hex"]
        assert Reader(bytes.fromhex(v["hex"])).ipv6_address() == (v["decoded"]["host"], v["decoded"]["port"])
    for v in CE["ipAddress"]:
        addr = (v["value"]["host"], v["value"]["port"])
        assert Writer().ip_address(addr).getvalue().hex() == v["hex"]


@given(st.integers(min_value=0, max_value=2**53 - 1))
def test_uint_roundtrip(n: int) -> None:
    assert Reader(Writer().uint(n).getvalue()).uint() == n


@given(st.binary(max_size=64))
def test_random_bytes_only_raise_decode_error(data: bytes) -> None:
    def read_all(r: Reader) -> object:
        return (r.uint(), r.string(), r.array(Reader.ipv4_address), r.ip_address(), r.uint64())

    with contextlib.suppress(DecodeError):
        decode(data, read_all)
