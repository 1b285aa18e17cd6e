"""relay.secretstream against the byte streams @hyperswarm/secret-stream 6.9.2 wrote."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.keys import key_pair
from relay.noise import NoiseHandshake
from relay.secretstream import (
    MAX_MESSAGE,
    NS_INITIATOR,
    NS_RESPONDER,
    NS_SEND,
    Closed,
    Ended,
    FrameTooLarge,
    HandshakeResult,
    Message,
    Opened,
    SecretStream,
    SecretStreamError,
    stream_id,
)
from tests.vectors import load

V = load("streams")
FH = V["secret_stream"]["from_handshake"]
XX = V["secret_stream"]["xx_standalone"]
IK = V["noise"]["ik"]


def _kp(hexseed: str):
    return key_pair(bytes.fromhex(hexseed))


def _frames(stream: SecretStream) -> list[bytes]:
    """Split what a stream wants to send into frames (each u24le-prefixed)."""
    data = stream.data_to_send()
    out = []
    while data:
        n = int.from_bytes(data[:3], "little")
        out.append(data[: 3 + n])
        data = data[3 + n :]
    return out


def _messages(stream: SecretStream) -> list[bytes]:
    return [e.data for e in stream.events() if isinstance(e, Message)]


def _handoff_pair() -> tuple[SecretStream, SecretStream]:
    ini_kp, res_kp = _kp(IK["initiator"]["static_seed"]), _kp(IK["responder"]["static_seed"])
    h = bytes.fromhex(FH["handshake_hash"])
    ini = SecretStream(
        True,
        handshake=HandshakeResult(
            bytes.fromhex(FH["initiator"]["tx"]),
            bytes.fromhex(FH["initiator"]["rx"]),
            h,
            ini_kp.public_key,
            res_kp.public_key,
        ),
    )
    res = SecretStream(
        False,
        handshake=HandshakeResult(
            bytes.fromhex(FH["responder"]["tx"]),
            bytes.fromhex(FH["responder"]["rx"]),
            h,
            res_kp.public_key,
            ini_kp.public_key,
        ),
    )
    ini._force_header(bytes.fromhex(FH["initiator"]["secretstream_header"]))
    res._force_header(bytes.fromhex(FH["responder"]["secretstream_header"]))
    return ini, res


def test_stream_ids_and_namespaces() -> None:
    h = bytes.fromhex(FH["handshake_hash"])
    assert stream_id(h, True).hex() == FH["initiator"]["stream_id"]
    assert stream_id(h, False).hex() == FH["responder"]["stream_id"]
    ns = V["keys"]["namespace"][0]["out"]
    assert [NS_INITIATOR.hex(), NS_RESPONDER.hex(), NS_SEND.hex()] == ns
    fin = IK["hyperdht_final"]
    assert stream_id(h, False).hex() == fin["initiator_remoteId"]
    assert stream_id(h, True).hex() == fin["responder_remoteId"]


def test_from_handshake_wire_matches_vectors() -> None:
    ini, res = _handoff_pair()
    ini.start(0.0)
    res.start(0.0)
    sides = {"initiator": ini, "responder": res}
    peers = {"initiator": res, "responder": ini}
    wire = FH["wire"]
    # headers go out on start, before any message
    assert [f.hex() for f in _frames(ini)] == [wire[0]["hex"]]
    assert [f.hex() for f in _frames(res)] == [wire[1]["hex"]]
    for ev, s in ((ini.next_event(), ini), (res.next_event(), res)):
        assert isinstance(ev, Opened) and ev.handshake_hash.hex() == FH["handshake_hash"]
        assert ev.remote_public_key == s.remote_public_key
    res.receive(bytes.fromhex(wire[0]["hex"]), 0.0)
    ini.receive(bytes.fromhex(wire[1]["hex"]), 0.0)
    for sent, frame in zip(FH["plaintext_sent"], wire[2:], strict=True):
        sender = sides[sent["from"]]
        sender.send(sent["utf8"].encode())
        out = sender.data_to_send()
        assert out.hex() == frame["hex"]
        peers[sent["from"]].receive(out, 0.0)
    assert [m.hex() for m in _messages(res)] == FH["responder_received_hex"]
    assert [m.hex() for m in _messages(ini)] == FH["initiator_received_hex"]


def test_handoff_from_completed_noise_handshake() -> None:
    a, b = key_pair(), key_pair()
    ni = NoiseHandshake("IK", True, a, remote_static=b.public_key)
    nr = NoiseHandshake("IK", False, b)
    ni.recv(_ik(ni, nr))
    ini, res = SecretStream(True, handshake=ni), SecretStream(False, handshake=nr)
    _run(ini, res)
    assert ini.remote_public_key == b.public_key and res.remote_public_key == a.public_key
    ini.send(b"via hyperdht")
    res.receive(ini.data_to_send(), 1.0)
    assert _messages(res) == [b"via hyperdht"]


def _ik(ni: NoiseHandshake, nr: NoiseHandshake) -> bytes:
    nr.recv(ni.send(b"p1"))
    return nr.send(b"p2")


def test_xx_standalone_wire_matches_vectors() -> None:
    ini = SecretStream(True, key_pair=_kp(XX["initiator"]["static_seed"]))
    res = SecretStream(False, key_pair=_kp(XX["responder"]["static_seed"]))
    ini._force_ephemeral(_kp(XX["initiator"]["ephemeral_seed"]))
    res._force_ephemeral(_kp(XX["responder"]["ephemeral_seed"]))
    ini._force_header(b"\xc3" * 24)
    res._force_header(b"\xd4" * 24)
    ini.start(0.0)
    res.start(0.0)
    wire = [w["hex"] for w in XX["wire"]]
    got: list[str] = []
    ini.send(b"hello")  # written before the handshake: buffered, sent after the header
    f = _frames(ini)
    got += [x.hex() for x in f]
    res.receive(b"".join(f), 0.0)
    f = _frames(res)
    got += [x.hex() for x in f]
    ini.receive(b"".join(f), 0.0)
    f = _frames(ini)
    got += [x.hex() for x in f]
    res.receive(b"".join(f), 0.0)
    got += [x.hex() for x in _frames(res)]
    # order on the wire: msg1, msg2, msg3+header+hello (initiator), header (responder)
    assert got == [wire[0], wire[1], wire[2], wire[3], wire[5], wire[4]]
    assert [m.hex() for m in _messages(res)] == XX["responder_received_hex"]
    for s, side in ((ini, "initiator"), (res, "responder")):
        assert s.public_key.hex() == XX[side]["publicKey"]
        assert s.remote_public_key.hex() == XX[side]["remotePublicKey"]
        assert s.handshake_hash.hex() == XX[side]["handshakeHash"]


def test_unordered_send_keys_and_envelope() -> None:
    ini, res = _handoff_pair()
    ini.start(0.0)
    res.start(0.0)
    keys = FH["unordered_send_keys"]
    assert ini._send_key.hex() == keys["initiator_encrypt_responder_decrypt"] == res._recv_key.hex()
    assert res._send_key.hex() == keys["responder_encrypt_initiator_decrypt"] == ini._recv_key.hex()
    ex = FH["unordered_message_example"]
    ini._counter = bytearray.fromhex(ex["counter_before_increment_hex"])
    env = ini.send_unordered(ex["plaintext_utf8"].encode())
    assert env.hex() == ex["envelope"]
    assert res.receive_unordered(env) == b"ping"
    assert res.receive_unordered(env[:23]) is None
    assert res.receive_unordered(env[:-1] + bytes([env[-1] ^ 1])) is None
    assert ini.receive_unordered(env) is None  # own key does not open it


def _pump(a: SecretStream, b: SecretStream, now: float = 0.0) -> None:
    for _ in range(10):
        da, db = a.data_to_send(), b.data_to_send()
        if not da and not db:
            return
        if da:
            b.receive(da, now)
        if db:
            a.receive(db, now)


def _run(ini: SecretStream, res: SecretStream) -> None:
    ini.start(0.0)
    res.start(0.0)
    _pump(ini, res)


def test_random_xx_with_byte_by_byte_delivery() -> None:
    a, b = key_pair(), key_pair()
    ini, res = SecretStream(True, key_pair=a), SecretStream(False, key_pair=b)
    ini.start(0.0)
    res.start(0.0)
    msgs = [b"", b"x", bytes(range(256)) * 300, b"last"]
    for m in msgs:
        ini.send(m)
    for _ in range(10):
        for src, dst in ((ini, res), (res, ini)):
            for byte in src.data_to_send():
                dst.receive(bytes([byte]), 0.0)
    assert _messages(res) == msgs
    assert res.remote_public_key == a.public_key and ini.remote_public_key == b.public_key
    assert not ini.closed and not res.closed


def test_many_frames_in_one_chunk_and_memoryview_input() -> None:
    ini, res = _handoff_pair()
    _run(ini, res)
    for i in range(50):
        ini.send(str(i).encode())
    res.receive(memoryview(bytearray(ini.data_to_send())), 0.0)
    assert _messages(res) == [str(i).encode() for i in range(50)]


def test_send_takes_any_bytes_like_message_whole() -> None:
    """bytearray and memoryviews (also of wider items, sliced) arrive byte for byte."""
    from array import array

    ini, res = _handoff_pair()
    _run(ini, res)
    wide = array("H", [1, 2, 0xFFFF])
    msgs = [bytearray(b"ba"), memoryview(b"0123456789")[2:5], memoryview(wide)]
    for m in msgs:
        ini.send(m)
    res.receive(ini.data_to_send(), 0.0)
    assert _messages(res) == [b"ba", b"234", wide.tobytes()]
    assert ini.raw_bytes_written == res.raw_bytes_read


def _opened_pair() -> tuple[SecretStream, SecretStream]:
    ini, res = SecretStream(True), SecretStream(False)
    _run(ini, res)
    list(ini.events())
    list(res.events())
    return ini, res


def test_tampered_frame_destroys_with_clear_error() -> None:
    ini, res = _opened_pair()
    ini.send(b"good")
    res.receive(ini.data_to_send(), 0.0)
    assert _messages(res) == [b"good"]
    ini.send(b"evil")
    frame = bytearray(ini.data_to_send())
    frame[5] ^= 0x40
    res.receive(bytes(frame), 0.0)
    evs = list(res.events())
    assert len(evs) == 1 and isinstance(evs[0], Closed)
    assert isinstance(evs[0].error, SecretStreamError) and "authentication" in str(evs[0].error)
    assert res.closed and res.error is evs[0].error
    res.receive(b"more bytes", 0.0)  # ignored, no raise
    assert res.next_event() is None
    with pytest.raises(SecretStreamError):
        res.send(b"x")
    # the other end is untouched
    assert not ini.closed
    ini.send(b"still fine")


def test_errors_mid_chunk_leave_no_dangling_buffers_for_the_collector() -> None:
    """Regression (d0ca4be): an error while decrypting must not keep a view of the chunk alive.

    The cffi version crashed a later GC when the error's traceback kept a C view of the
    received chunk in a cycle with the stream. Now: after a failed decrypt the caller's buffer
    has no export left (it can be resized: neither the stream, its error, nor a traceback
    holds a view of it), and collecting streams caught in cycles is safe. Covers the
    whole-frame-in-chunk path (bad MAC), a too-short frame, and a bad MAC on a frame that
    arrived split across two chunks (the partial-frame path).
    """
    import gc

    for tamper in ("mac", "short", "split"):
        for _ in range(10):
            ini, res = _opened_pair()
            ini.send(b"ok" * 10)
            ini.send(b"bad" * 10)
            wire = bytearray(ini.data_to_send())
            if tamper == "short":
                wire += b"\x02\x00\x00ab"
            else:
                wire[-5] ^= 1
            chunk = memoryview(wire)
            if tamper == "split":
                cut = len(wire) - 10
                res.receive(chunk[:cut], 0.0)
                res.receive(chunk[cut:], 0.0)
            else:
                res.receive(chunk, 0.0)
            assert isinstance(res.error, SecretStreamError), tamper
            assert _messages(res)[0] == b"ok" * 10
            chunk.release()
            wire += b"x"  # BufferError if anything still views the chunk
            res._out.append(res)  # type: ignore[arg-type]  # put the stream in a cycle
            del ini, res, wire, chunk
        gc.collect()


def test_bad_header_and_short_frames() -> None:
    ini, res = SecretStream(True), SecretStream(False)
    ini.start(0.0)
    res.start(0.0)
    res.receive(ini.data_to_send(), 0.0)
    ini.receive(res.data_to_send(), 0.0)
    out = bytearray(ini.data_to_send())  # msg3 + header
    out[-30] ^= 1  # inside the stream id of the header
    res.receive(bytes(out), 0.0)
    ev = next(e for e in res.events() if isinstance(e, Closed))
    assert "Invalid header received" in str(ev.error)

    ini, res = _opened_pair()
    res.receive(b"\x05\x00\x00hello", 0.0)
    assert "Invalid message received" in str(res.error)

    h = _rand_handshake()
    res = SecretStream(False, handshake=h[1])
    res.start(0.0)
    res.receive(b"\x05\x00\x00hello", 0.0)
    assert "Invalid header message received" in str(res.error)


def test_noise_failure_inside_stream() -> None:
    res = SecretStream(False)
    res.start(0.0)
    res.receive(b"\x05\x00\x00short", 0.0)
    assert res.closed and "Noise handshake failed" in str(res.error)


def test_keep_alive_and_timeout_timers() -> None:
    ini = SecretStream(True, keep_alive=5.0, timeout=12.0)
    res = SecretStream(False, keep_alive=5.0)
    ini.start(100.0)
    res.start(100.0)
    _pump(ini, res, 100.0)
    list(res.events())
    assert ini.get_timer() == 105.0
    ini.send(b"data", now=103.0)
    assert ini.get_timer() == 108.0
    data_frame = ini.data_to_send()
    assert len(data_frame) == 3 + 4 + 17
    res.receive(data_frame, 103.0)
    assert _messages(res) == [b"data"]
    ini.handle_timer(105.0)  # not due any more: nothing sent
    assert ini.data_to_send() == b""
    ini.handle_timer(108.0)
    ka = ini.data_to_send()
    assert len(ka) == 20  # an empty message: u24 + 17 bytes
    res.receive(ka, 108.0)
    assert list(res.events()) == []  # keep-alive filters empty messages
    ini.receive(res.data_to_send() or b"", 109.0)
    assert ini.get_timer() == 113.0
    ini.handle_timer(121.0)
    assert ini.closed and "timed out" in str(ini.error)
    assert ini.get_timer() is None


def test_end_both_ways_closes_cleanly() -> None:
    ini, res = _opened_pair()
    ini.send(b"bye")
    ini.end()
    assert ini.take_eof() and not ini.take_eof()
    res.receive(ini.data_to_send(), 0.0)
    res.receive_eof(0.0)
    assert list(res.events()) == [Message(b"bye"), Ended()]
    res.end()
    assert list(res.events()) == [Closed(None)]
    ini.receive_eof(0.0)
    assert list(ini.events()) == [Ended(), Closed(None)]
    with pytest.raises(SecretStreamError):
        ini.send(b"late")


def test_end_before_handshake_flushes_then_eof() -> None:
    ini, res = SecretStream(True), SecretStream(False)
    ini.start(0.0)
    ini.send(b"queued")
    ini.end()
    assert not ini.take_eof()
    res.start(0.0)
    _pump(ini, res)
    assert ini.take_eof()
    assert _messages(res) == [b"queued"]


def test_connection_closed_before_setup_is_an_error() -> None:
    s = SecretStream(True)
    s.start(0.0)
    s.connection_closed(None)
    assert isinstance(s.error, SecretStreamError)
    _ini, res = _opened_pair()
    res.connection_closed(ConnectionResetError("reset"))
    assert "reset" in str(res.error)


@pytest.mark.parametrize("split", [None, 1, 2, 3, 5])
def test_frame_over_max_frame_ends_the_stream_before_buffering_it(split: int | None) -> None:
    ini, res = _opened_pair()
    res.max_frame = 1024
    ini.send(b"x" * (1024 - 17))  # exactly at the limit: fine
    res.receive(ini.data_to_send(), 0.0)
    assert _messages(res) == [b"x" * (1024 - 17)]
    announce = (16 * 1024 * 1024 - 1).to_bytes(3, "little") + b"\0" * 4096  # 16 MiB announced, never sent
    if split is None:
        res.receive(announce, 0.0)
    else:
        res.receive(announce[:split], 0.0)
        res.receive(announce[split:], 0.0)
    evs = list(res.events())
    assert len(evs) == 1 and isinstance(evs[0], Closed)
    assert isinstance(evs[0].error, FrameTooLarge) and "limit of 1024" in str(evs[0].error)
    assert len(res._partial) <= 8
    res.receive(b"\0" * 65536, 0.0)  # closed: nothing more is kept
    assert len(res._partial) <= 8


def test_oversized_send_is_refused_without_killing_stream() -> None:
    ini, _ = _opened_pair()

    class Big:
        def __len__(self) -> int:
            return MAX_MESSAGE + 1

    with pytest.raises(SecretStreamError, match="too large"):
        ini.send(Big())  # type: ignore[arg-type]
    assert not ini.closed


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300), st.booleans(), st.integers(1, 64))
def test_random_bytes_only_ever_close_with_secretstream_error(data: bytes, initiator: bool, chunk: int) -> None:
    s = SecretStream(initiator)
    s.start(0.0)
    s.data_to_send()
    for i in range(0, len(data), chunk):
        s.receive(data[i : i + chunk], 0.0)  # must never raise
    for ev in s.events():
        if isinstance(ev, Closed):
            assert isinstance(ev.error, SecretStreamError)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_truncated_or_mutated_traffic_raises_nothing_and_reports_secretstream_error(data: st.DataObject) -> None:
    h = _rand_handshake()
    ini, res = SecretStream(True, handshake=h[0]), SecretStream(False, handshake=h[1])
    ini.start(0.0)
    res.start(0.0)
    for m in data.draw(st.lists(st.binary(max_size=40), max_size=4)):
        ini.send(m)
    wire = bytearray(ini.data_to_send())
    cut = data.draw(st.integers(0, len(wire)))
    wire = wire[:cut]
    if wire and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(wire) - 1))
        wire[i] ^= 1 << data.draw(st.integers(0, 7))
    res.receive(bytes(wire), 0.0)
    res.receive_eof(0.0)
    for ev in res.events():
        if isinstance(ev, Closed):
            assert ev.error is None or isinstance(ev.error, SecretStreamError)


_HS_CACHE: list[tuple[HandshakeResult, HandshakeResult]] = []


def _rand_handshake() -> tuple[HandshakeResult, HandshakeResult]:
    if not _HS_CACHE:
        a, b = key_pair(), key_pair()
        ni, nr = NoiseHandshake("IK", True, a, remote_static=b.public_key), NoiseHandshake("IK", False, b)
        ni.recv(_ik(ni, nr))
        _HS_CACHE.append((HandshakeResult.from_noise(ni), HandshakeResult.from_noise(nr)))
    return _HS_CACHE[0]


# --- asyncio driver (Python ↔ Python on 127.0.0.1) ---------------------------------------------


async def test_aio_echo_from_callback_keeps_event_order() -> None:
    """A callback that sends while events are delivered must not reorder delivery."""
    import asyncio

    from relay.secretstream_aio import SecretStreamProtocol, connect, serve

    seen: list[bytes] = []

    def on_conn(proto: SecretStreamProtocol) -> None:
        def on_event(ev: object) -> None:
            if isinstance(ev, Message):
                seen.append(ev.data)
                proto.send(b"echo:" + ev.data)
            elif isinstance(ev, Ended):
                proto.end()

        proto.on_event = on_event

    server = await serve("127.0.0.1", 0, on_conn)
    try:
        port = server.sockets[0].getsockname()[1]
        client = await connect("127.0.0.1", port)
        await asyncio.wait_for(client.opened, 10)
        for i in range(20):
            client.send(str(i).encode())
        client.end()
        got = [m async for m in client]
        assert seen == [str(i).encode() for i in range(20)]
        assert got == [b"echo:" + str(i).encode() for i in range(20)]
        assert await asyncio.wait_for(client.wait_closed(), 10) is None
    finally:
        server.close()
        await server.wait_closed()


async def test_aio_timeout_and_keep_alive_timers() -> None:
    import asyncio

    from relay.secretstream_aio import SecretStreamProtocol, connect, serve

    accepted: asyncio.Queue[SecretStreamProtocol] = asyncio.Queue()
    # server: keep empty messages visible so the test can count keep-alives
    server = await serve("127.0.0.1", 0, accepted.put_nowait, timeout=0.3, filter_empty=False)
    try:
        port = server.sockets[0].getsockname()[1]
        # a raw TCP peer that never speaks: the server's idle timeout destroys the stream
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        silent = await asyncio.wait_for(accepted.get(), 10)
        err = await asyncio.wait_for(silent.wait_closed(), 10)
        assert isinstance(err, SecretStreamError) and "timed out" in str(err)
        assert await asyncio.wait_for(reader.read(), 10) == b""  # and the socket was closed
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    # keep-alive: an idle client sends empty messages on its own
    server = await serve("127.0.0.1", 0, accepted.put_nowait, filter_empty=False)
    try:
        port = server.sockets[0].getsockname()[1]
        client = await connect("127.0.0.1", port, keep_alive=0.05)
        proto = await asyncio.wait_for(accepted.get(), 10)
        for _ in range(4):
            assert await asyncio.wait_for(proto.recv(), 10) == b""
        assert not proto.stream.closed and not client.stream.closed
        client.destroy()
        assert await asyncio.wait_for(proto.recv(), 10) is None  # the peer's FIN ends the stream
        proto.end()
        assert await asyncio.wait_for(proto.wait_closed(), 10) is None
    finally:
        server.close()
        await server.wait_closed()
