"""@hyperswarm/secret-stream 6.9.2 ↔ relay.secretstream over TCP on 127.0.0.1, both roles."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

from relay.keys import key_pair
from relay.noise import NoiseHandshake
from relay.secretstream import HandshakeResult, SecretStreamError
from relay.secretstream_aio import SecretStreamProtocol, connect, serve
from tests.interop._streams_node import SAFETY_TIMEOUT, NodeLines, node_script

pytestmark = pytest.mark.interop

ONE_MB = 1 << 20
SIZES = [7, 65536, 1, 250000, 0, 3000, 99999]


async def _send_all(proto: SecretStreamProtocol, total: int) -> tuple[str, int]:
    data = os.urandom(total)
    view = memoryview(data)
    off = i = messages = 0
    while off < total:
        n = min(SIZES[i % len(SIZES)], total - off)
        i += 1
        proto.send(view[off : off + n])
        messages += 1
        off += n
        await proto.drain()
    proto.end()
    return hashlib.sha256(data).hexdigest(), messages


async def _recv_all(proto: SecretStreamProtocol) -> tuple[str, int, int]:
    h = hashlib.sha256()
    n = count = 0
    async for msg in proto:
        h.update(msg)
        n += len(msg)
        count += 1
    return h.hexdigest(), n, count


async def _exchange(proto: SecretStreamProtocol, peer: NodeLines, total: int) -> None:
    """Both directions at once; hashes and message counts must agree with Node's."""
    (sent_sha, sent_msgs), (got_sha, got_bytes, got_msgs) = await asyncio.wait_for(
        asyncio.gather(_send_all(proto, total), _recv_all(proto)), SAFETY_TIMEOUT
    )
    node_sent = await peer.expect("event", "sent")
    node_received = await peer.expect("event", "received")
    assert (got_sha, got_bytes, got_msgs) == (node_sent["sha256"], node_sent["bytes"], node_sent["messages"])
    assert (node_received["sha256"], node_received["bytes"]) == (sent_sha, total)
    # an empty message reaches Node too (no keep-alive filtering on either side)
    assert node_received["messages"] == sent_msgs
    assert await asyncio.wait_for(proto.wait_closed(), SAFETY_TIMEOUT) is None
    await peer.expect("event", "close")


async def test_interop_secretstream_python_initiator_node_responder(node: str) -> None:
    py_kp, node_seed = key_pair(), os.urandom(32)
    opts = {"mode": "server", "seed": node_seed.hex(), "sendBytes": ONE_MB}
    async with node_script(node, "streams_secretstream_peer.js", opts) as peer:
        listening = await peer.expect("event", "listening")
        assert listening["publicKey"] == key_pair(node_seed).public_key.hex()
        proto = await connect("127.0.0.1", listening["port"], key_pair=py_kp)
        opened = await asyncio.wait_for(proto.opened, SAFETY_TIMEOUT)
        node_open = await peer.expect("event", "open")
        assert opened.remote_public_key.hex() == listening["publicKey"]
        assert node_open["remotePublicKey"] == py_kp.public_key.hex()
        assert node_open["handshakeHash"] == opened.handshake_hash.hex()
        await _exchange(proto, peer, ONE_MB)


async def test_interop_secretstream_node_initiator_python_responder(node: str) -> None:
    py_kp, node_seed = key_pair(), os.urandom(32)
    accepted: asyncio.Queue[SecretStreamProtocol] = asyncio.Queue()
    server = await serve("127.0.0.1", 0, accepted.put_nowait, key_pair=py_kp)
    try:
        port = server.sockets[0].getsockname()[1]
        opts = {"mode": "client", "port": port, "seed": node_seed.hex(), "sendBytes": ONE_MB}
        async with node_script(node, "streams_secretstream_peer.js", opts) as peer:
            proto = await asyncio.wait_for(accepted.get(), SAFETY_TIMEOUT)
            opened = await asyncio.wait_for(proto.opened, SAFETY_TIMEOUT)
            node_open = await peer.expect("event", "open")
            assert opened.remote_public_key == key_pair(node_seed).public_key
            assert node_open["remotePublicKey"] == py_kp.public_key.hex()
            assert node_open["publicKey"] == opened.remote_public_key.hex()
            assert node_open["handshakeHash"] == opened.handshake_hash.hex()
            await _exchange(proto, peer, ONE_MB)
            assert await peer.wait_exit() == 0
    finally:
        server.close()
        await server.wait_closed()


async def test_interop_secretstream_tampered_frame_from_node_kills_only_that_stream(node: str) -> None:
    py_kp = key_pair()
    accepted: asyncio.Queue[SecretStreamProtocol] = asyncio.Queue()
    server = await serve("127.0.0.1", 0, accepted.put_nowait, key_pair=py_kp)
    try:
        port = server.sockets[0].getsockname()[1]
        bad = {"mode": "client", "port": port, "seed": os.urandom(32).hex(), "sendBytes": 0, "tamper": True}
        good = {"mode": "client", "port": port, "seed": os.urandom(32).hex(), "sendBytes": 5000}
        async with (
            node_script(node, "streams_secretstream_peer.js", good) as good_peer,
            node_script(node, "streams_secretstream_peer.js", bad) as bad_peer,
        ):
            protos = [await asyncio.wait_for(accepted.get(), SAFETY_TIMEOUT) for _ in range(2)]
            await bad_peer.expect("event", "open")
            await good_peer.expect("event", "open")
            opened = [await asyncio.wait_for(p.opened, SAFETY_TIMEOUT) for p in protos]
            bad_pk = bytes.fromhex((await _open_line(bad_peer))["publicKey"])
            victim = protos[[o.remote_public_key for o in opened].index(bad_pk)]
            other = protos[1 - protos.index(victim)]
            error = await asyncio.wait_for(victim.wait_closed(), SAFETY_TIMEOUT)
            assert isinstance(error, SecretStreamError) and "authentication" in str(error)
            await bad_peer.expect("event", "close")
            # the other connection on the same server is unharmed and completes normally
            await _exchange(other, good_peer, 5000)
    finally:
        server.close()
        await server.wait_closed()


async def _open_line(peer: NodeLines) -> dict:
    return next(line for line in peer.lines if line.get("event") == "open")


async def test_interop_secretstream_tampered_frame_to_node_is_rejected(node: str) -> None:
    node_seed = os.urandom(32)
    opts = {"mode": "server", "seed": node_seed.hex(), "sendBytes": 0}
    async with node_script(node, "streams_secretstream_peer.js", opts) as peer:
        listening = await peer.expect("event", "listening")
        proto = await connect("127.0.0.1", listening["port"])
        await asyncio.wait_for(proto.opened, SAFETY_TIMEOUT)
        await peer.expect("event", "open")
        # flip one bit in the next encrypted frame before it reaches the wire
        proto.stream.send(b"this one is tampered")
        frame = bytearray(proto.stream.data_to_send())
        frame[10] ^= 0x04
        proto.transport.write(bytes(frame))
        err = await peer.expect("event", "error")
        assert "pull failed" in err["message"]  # sodium-secretstream's verification failure
        closed = await peer.expect("event", "close")
        assert (closed["messagesIn"], closed["bytesIn"]) == (0, 0)  # nothing of the forged frame delivered


async def test_interop_secretstream_handshake_handed_over_like_hyperdht(node: str) -> None:
    """hyperdht path: IK done elsewhere, both sides start straight with their headers."""
    a, b = key_pair(), key_pair()
    ini = NoiseHandshake("IK", True, a, remote_static=b.public_key)
    res = NoiseHandshake("IK", False, b)
    res.recv(ini.send(b"client"))
    ini.recv(res.send(b"server"))
    node_hs = {
        "tx": res.tx.hex(), "rx": res.rx.hex(), "hash": res.hash.hex(),
        "publicKey": b.public_key.hex(), "remotePublicKey": a.public_key.hex(),
    }  # fmt: skip
    opts = {"mode": "server", "seed": b.seed.hex(), "sendBytes": 200_000, "handshake": node_hs}
    async with node_script(node, "streams_secretstream_peer.js", opts) as peer:
        listening = await peer.expect("event", "listening")
        proto = await connect("127.0.0.1", listening["port"], handshake=HandshakeResult.from_noise(ini))
        opened = await asyncio.wait_for(proto.opened, SAFETY_TIMEOUT)
        node_open = await peer.expect("event", "open")
        assert opened.remote_public_key == b.public_key
        assert node_open["remotePublicKey"] == a.public_key.hex()
        assert node_open["handshakeHash"] == ini.hash.hex()
        await _exchange(proto, peer, 200_000)


async def test_interop_secretstream_ik_pattern_inside_stream_both_roles(node: str) -> None:
    """secret-stream's `pattern: 'IK'` option: the initiator must know the responder key."""
    py_kp, node_seed = key_pair(), os.urandom(32)
    node_pk = key_pair(node_seed).public_key
    # Python initiator → Node responder
    opts = {"mode": "server", "seed": node_seed.hex(), "sendBytes": 50_000, "pattern": "IK"}
    async with node_script(node, "streams_secretstream_peer.js", opts) as peer:
        listening = await peer.expect("event", "listening")
        proto = await connect("127.0.0.1", listening["port"], key_pair=py_kp, pattern="IK", remote_public_key=node_pk)
        opened = await asyncio.wait_for(proto.opened, SAFETY_TIMEOUT)
        node_open = await peer.expect("event", "open")
        assert opened.remote_public_key == node_pk
        assert node_open["remotePublicKey"] == py_kp.public_key.hex()
        assert node_open["handshakeHash"] == opened.handshake_hash.hex()
        await _exchange(proto, peer, 50_000)
    # Node initiator → Python responder
    accepted: asyncio.Queue[SecretStreamProtocol] = asyncio.Queue()
    server = await serve("127.0.0.1", 0, accepted.put_nowait, key_pair=py_kp, pattern="IK")
    try:
        port = server.sockets[0].getsockname()[1]
        opts = {
            "mode": "client", "port": port, "seed": node_seed.hex(), "sendBytes": 50_000,
            "pattern": "IK", "remotePublicKey": py_kp.public_key.hex(),
        }  # fmt: skip
        async with node_script(node, "streams_secretstream_peer.js", opts) as peer:
            proto = await asyncio.wait_for(accepted.get(), SAFETY_TIMEOUT)
            opened = await asyncio.wait_for(proto.opened, SAFETY_TIMEOUT)
            node_open = await peer.expect("event", "open")
            assert opened.remote_public_key == node_pk
            assert node_open["handshakeHash"] == opened.handshake_hash.hex()
            await _exchange(proto, peer, 50_000)
    finally:
        server.close()
        await server.wait_closed()
