"""UDX packet codec against the captures of the real udx-native (vectors/udx.json)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.udx import packet
from relay.udx.packet import DATA, DESTROY, END, HEARTBEAT, MESSAGE, SACK, UDXError, decode, encode
from tests.vectors import load

VECTORS = load("udx")
ALL_PACKETS = [(s["name"], p) for s in VECTORS["scenarios"] for p in s["packets"]]


@pytest.mark.parametrize(("scenario", "pkt"), ALL_PACKETS, ids=[f"{n}-{p['i']}" for n, p in ALL_PACKETS])
def test_udx_decodes_every_captured_packet(scenario: str, pkt: dict) -> None:
    raw = bytes.fromhex(pkt["hex"])
    d = pkt["decoded"]
    p = decode(raw)
    assert p.type == int(d["type"], 16)
    assert p.data_offset == d["data_offset"]
    assert p.id == d["stream_id"]
    assert p.rwnd == d["rwnd"]
    assert p.seq == d["seq"]
    assert p.ack == d["ack"]
    blocks = [(b["start"], b["end_exclusive"]) for b in d.get("sack_blocks", [])]
    assert list(p.sacks) == blocks
    if not p.type & SACK:
        assert len(p.payload) == d["payload_length"]
        if d.get("payload_ascii"):
            assert p.payload.decode("latin-1") == d["payload_ascii"]
    # re-encoding yields the captured bytes (padding is zeros, as libudx writes it)
    again = encode(p.type, p.id, p.rwnd, p.seq, p.ack, b"" if p.type & SACK else p.payload, p.sacks, p.data_offset)
    assert again == raw


def test_udx_header_example_from_reference() -> None:
    raw = encode(DATA, 0xAABBCCDD, 4194304, 0, 0, b"hello")
    assert raw.hex() == "ff010100ddccbbaa0000400000000000000000006865" + "6c6c6f"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"", "shorter"),
        (b"\xff\x01" + bytes(17), "shorter"),
        (b"\xfe\x01" + bytes(18), "not UDX"),
        (b"\xff\x02" + bytes(18), "not UDX"),
        (b"\xff\x01\x01\x05" + bytes(16) + b"abc", "data_offset"),
    ],
)
def test_udx_rejects_malformed_datagrams(raw: bytes, why: str) -> None:
    with pytest.raises(UDXError, match=why) as e:
        decode(raw)
    assert e.value.code == "EBADPACKET"


def test_udx_sack_area_length_from_data_offset() -> None:
    raw = encode(SACK, 1, 10, 0, 1, sacks=[(2, 4)]) + b"tail"
    p = decode(bytes(raw[:3]) + b"\x08" + raw[4:])  # data_offset 8: one block, then payload
    assert p.sacks == ((2, 4),)
    assert p.payload == b"tail"


def test_udx_serial_arithmetic_wraps() -> None:
    assert packet.seq_lt(0xFFFFFFFF, 0)
    assert not packet.seq_lt(0, 0xFFFFFFFF)
    assert packet.seq_diff(1, 0xFFFFFFFF) == 2
    assert packet.seq_diff(0xFFFFFFFF, 1) == -2


def test_udx_flag_names() -> None:
    assert packet.flag_names(DATA | END) == ["DATA", "END"]
    assert packet.flag_names(0) == ["ACK"]
    assert packet.flag_names(MESSAGE | DESTROY | HEARTBEAT) == ["MESSAGE", "DESTROY", "HEARTBEAT"]


@given(st.binary(max_size=300))
def test_udx_decode_random_bytes_raises_only_udx_error(raw: bytes) -> None:
    try:
        p = decode(raw)
    except UDXError:
        return
    assert len(raw) >= 20 and raw[:2] == b"\xff\x01"
    assert p.id == int.from_bytes(raw[4:8], "little")


@given(
    st.integers(0, 0x3F),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.binary(max_size=64),
)
def test_udx_encode_decode_roundtrip(type_: int, id_: int, rwnd: int, seq: int, ack: int, payload: bytes) -> None:
    type_ &= ~SACK
    p = decode(encode(type_, id_, rwnd, seq, ack, payload))
    assert (p.type, p.id, p.rwnd, p.seq, p.ack, p.payload) == (type_, id_, rwnd, seq, ack, payload)
