"""Noise XX and IK against the real noise-handshake 4.2 + noise-curve-ed, both roles, live keys."""

from __future__ import annotations

import os

import pytest

from relay.keys import key_pair, namespace
from relay.noise import NoiseError, NoiseHandshake
from tests.interop._streams_node import NodeLines, node_script

pytestmark = pytest.mark.interop

NS_PEER_HANDSHAKE = namespace("hyperswarm/dht", [0])[0]
MESSAGES = {"XX": 3, "IK": 2}


async def _start(node: str, pattern: str, node_initiator: bool, seed: bytes, remote: bytes | None, prologue: bytes):
    opts = {"pattern": pattern, "initiator": node_initiator, "seed": seed.hex(), "prologue": prologue.hex()}
    if remote is not None:
        opts["remoteStatic"] = remote.hex()
    return node_script(node, "streams_noise_peer.js", opts)


async def _node_send(peer: NodeLines, payload: bytes) -> bytes:
    peer.send({"send": payload.hex()})
    line = await peer.next()
    assert "msg" in line, line
    return bytes.fromhex(line["msg"])


async def _node_recv(peer: NodeLines, message: bytes) -> dict:
    peer.send({"recv": message.hex()})
    return await peer.next()


@pytest.mark.parametrize("pattern", ["XX", "IK"])
@pytest.mark.parametrize("python_initiator", [True, False], ids=["python-initiator", "python-responder"])
async def test_interop_noise_handshake_with_noise_handshake_package(
    node: str, pattern: str, python_initiator: bool
) -> None:
    py_kp = key_pair()
    node_seed = os.urandom(32)
    node_pk = key_pair(node_seed).public_key
    prologue = NS_PEER_HANDSHAKE if pattern == "IK" else b""
    # IK: the initiator knows the responder's static key up front
    node_remote = py_kp.public_key if (pattern == "IK" and not python_initiator) else None
    py_remote = node_pk if (pattern == "IK" and python_initiator) else None
    py = NoiseHandshake(pattern, python_initiator, py_kp, remote_static=py_remote, prologue=prologue)  # type: ignore[arg-type]
    async with await _start(node, pattern, not python_initiator, node_seed, node_remote, prologue) as peer:
        first = await peer.next()
        assert first["publicKey"] == node_pk.hex()
        node_complete = None
        for i in range(MESSAGES[pattern]):
            payload = os.urandom(1 + i * 37)
            python_sends = (i % 2 == 0) == python_initiator
            if python_sends:
                line = await _node_recv(peer, py.send(payload))
                assert line.get("payload") == payload.hex(), line
            else:
                assert py.recv(await _node_send(peer, payload)) == payload
            if i == MESSAGES[pattern] - 1:
                node_complete = await peer.expect("complete")
        assert py.complete and node_complete is not None
        assert py.hash.hex() == node_complete["hash"]
        assert py.tx.hex() == node_complete["rx"] and py.rx.hex() == node_complete["tx"]
        assert py.remote_static == node_pk
        assert node_complete["rs"] == py_kp.public_key.hex()


async def test_interop_noise_tampered_messages_rejected_both_ways(node: str) -> None:
    py_kp, node_seed = key_pair(), os.urandom(32)
    node_pk = key_pair(node_seed).public_key
    # Python initiator → Node responder: Node must refuse a flipped bit in IK message 1
    py = NoiseHandshake("IK", True, py_kp, remote_static=node_pk, prologue=NS_PEER_HANDSHAKE)
    async with await _start(node, "IK", False, node_seed, None, NS_PEER_HANDSHAKE) as peer:
        await peer.next()
        msg = bytearray(py.send(b"payload"))
        msg[40] ^= 0x01
        line = await _node_recv(peer, bytes(msg))
        assert "error" in line, line
    # Node initiator → Python responder: we must refuse a flipped bit in IK message 1
    async with await _start(node, "IK", True, node_seed, py_kp.public_key, NS_PEER_HANDSHAKE) as peer:
        await peer.next()
        msg = bytearray(await _node_send(peer, b"payload"))
        msg[-1] ^= 0x80
        res = NoiseHandshake("IK", False, py_kp, prologue=NS_PEER_HANDSHAKE)
        with pytest.raises(NoiseError, match="authentication"):
            res.recv(bytes(msg))
        # the untouched message still works on a fresh state: nothing else was harmed
        msg[-1] ^= 0x80
        assert NoiseHandshake("IK", False, py_kp, prologue=NS_PEER_HANDSHAKE).recv(bytes(msg)) == b"payload"
