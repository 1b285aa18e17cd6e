"""Our sans-IO `Mux` over our `SecretStream` against npm protomux over npm secret-stream, on TCP.

One Node process (tests/interop/js/mux_peer.js) connects to a Python listener on 127.0.0.1;
both Noise roles are covered. Channels open in both orders, carry handshakes and messages
both ways, batch both ways, get rejected both ways, close both ways, reopen with reused ids,
and close when the stream goes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from relay.core import drain_events
from relay.keys import key_pair
from relay.protomux import (
    Channel,
    ChannelClosed,
    ChannelOpened,
    ChannelRequested,
    Event,
    MessageReceived,
    Mux,
    OpenRejected,
    ProtomuxError,
)
from tests.cores import closed, fed
from tests.interop._mux_peers import NodePeer, SecretConn, Watch, node_peer

pytestmark = pytest.mark.interop

ALPHA_ID = bytes(range(32))
BIG = bytes(i % 251 for i in range(100_000))


class PyMuxPeer:
    """The Python end: one `Mux` on one `SecretConn`, events collected for the test to await."""

    def __init__(self) -> None:
        self.mux = Mux()
        self.events: list[Event] = []
        self.used: set[int] = set()
        self.errors: list[ProtomuxError] = []
        self.watch = Watch()
        self.conn: SecretConn | None = None
        self.connected = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, initiator: bool) -> None:
        self.conn = SecretConn(
            reader,
            writer,
            initiator=initiator,
            key_pair=key_pair(b"\x02" * 32),
            on_message=self.on_message,
            on_close=self.on_close,
        )
        self.connected.set()

    def on_message(self, data: bytes) -> None:
        try:
            self.events += fed(self.mux, data)
        except ProtomuxError as e:
            self.errors.append(e)
            assert self.conn is not None
            self.conn.destroy()
        self.flush()

    def on_close(self, error: Exception | None) -> None:
        self.events += closed(self.mux)
        self.watch.notify()

    def flush(self) -> None:
        self.events += drain_events(self.mux)
        out = self.mux.data_to_send()
        if out and self.conn is not None:
            self.conn.send(out)
        self.watch.notify()

    async def expect(self, cls: type[Event], **fields: Any) -> Any:
        found: list[Event] = []

        def match() -> bool:
            for i, e in enumerate(self.events):
                if i not in self.used and isinstance(e, cls) and all(getattr(e, k) == v for k, v in fields.items()):
                    self.used.add(i)
                    found.append(e)
                    return True
            return False

        await self.watch.until(match)
        return found[0]


async def _connect(node: str, node_initiator: bool) -> tuple[Any, PyMuxPeer, NodePeer, asyncio.Server]:
    py = PyMuxPeer()
    server = await asyncio.start_server(lambda r, w: py.handle(r, w, not node_initiator), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cm = node_peer(node, "mux_peer.js")
    js = await cm.__aenter__()
    await js.call("connect", port=port, initiator=node_initiator, seed="01" * 32)
    await js.expect("connected")
    await asyncio.wait_for(py.connected.wait(), 20)
    assert py.conn is not None
    await asyncio.wait_for(py.conn.opened.wait(), 20)
    return cm, py, js, server


@pytest.mark.parametrize("node_initiator", [True, False], ids=["node-initiator", "python-initiator"])
async def test_interop_protomux_channels_with_node(node: str, node_initiator: bool) -> None:
    cm, py, js, server = await _connect(node, node_initiator)
    try:
        assert py.conn is not None
        assert py.conn.remote_public_key == key_pair(b"\x01" * 32).public_key
        # 1. Python opens first (with a handshake); Node takes it in its pair() hook. An open
        #    that reaches a peer with neither a channel nor a pair() hook is rejected (protomux).
        await js.call("pair", name="alpha", protocol="alpha", id=ALPHA_ID.hex(), types=2, handshake=b"node-hs".hex())
        alpha = py.mux.open_channel("alpha", ALPHA_ID, messages=[None, None], handshake=b"py-hs")
        assert alpha is not None
        py.flush()
        await js.expect("requested", name="alpha")
        ev = await js.expect("open", name="alpha")
        assert bytes.fromhex(ev["handshake"]) == b"py-hs"
        opened = await py.expect(ChannelOpened, channel=alpha)
        assert opened.handshake == b"node-hs"

        # 2. Node opens first; Python waits for it via pair() and accepts on ChannelRequested.
        py.mux.pair("beta")
        await js.call("open", name="beta", protocol="beta", types=1)
        req = await py.expect(ChannelRequested, protocol="beta")
        assert req.id is None
        beta = py.mux.open_channel("beta", messages=[None])
        assert beta is not None
        py.flush()
        await py.expect(ChannelOpened, channel=beta)
        await js.expect("open", name="beta")

        # 3. Node opens first again, with an id; our pair() for the protocol matches any id.
        py.mux.pair("gamma")
        await js.call("open", name="gamma", protocol="gamma", id="ab" * 32, types=3)
        req = await py.expect(ChannelRequested, protocol="gamma")
        assert req.id == b"\xab" * 32
        gamma = py.mux.open_channel("gamma", req.id, messages=[None, None, None])
        assert gamma is not None
        py.flush()
        await js.expect("open", name="gamma")
        await py.expect(ChannelOpened, channel=gamma)

        # 4. Messages both ways on every channel, including a 100 kB one.
        alpha.send(0, b"hello node")
        alpha.send(1, BIG)
        beta.send(0, b"")
        gamma.send(2, b"third type")
        py.flush()
        assert (await js.expect("message", name="alpha", type=0))["hex"] == b"hello node".hex()
        assert bytes.fromhex((await js.expect("message", name="alpha", type=1))["hex"]) == BIG
        assert (await js.expect("message", name="beta", type=0))["hex"] == ""
        assert (await js.expect("message", name="gamma", type=2))["hex"] == b"third type".hex()
        await js.call("send", name="alpha", type=1, hex=BIG[::-1].hex())
        await js.call("send", name="gamma", type=0, hex="00ff")
        assert (await py.expect(MessageReceived, channel=alpha, type=1)).message == BIG[::-1]
        assert (await py.expect(MessageReceived, channel=gamma, type=0)).message == b"\x00\xff"

        # 5. Node batches (cork/uncork) across channels: one secret-stream message, decoded by us.
        before = len(py.conn.raw_messages)
        await js.call("cork")
        items = [
            {"name": "alpha", "type": 0, "hex": "01"},
            {"name": "alpha", "type": 0, "hex": "02"},
            {"name": "beta", "type": 0, "hex": "03"},
            {"name": "gamma", "type": 1, "hex": "04"},
        ]
        await js.call("sendmany", items=items)
        await js.call("uncork")
        got = [await py.expect(MessageReceived, message=bytes([i])) for i in range(1, 5)]
        assert [(m.channel, m.type) for m in got] == [(alpha, 0), (alpha, 0), (beta, 0), (gamma, 1)]
        assert len(py.conn.raw_messages) == before + 1 and py.conn.raw_messages[-1][:2] == b"\x00\x00"

        # 6. We batch: Node decodes our batch, in order, with channel switches.
        py.mux.cork()
        gamma.send(0, b"g1")
        alpha.send(0, b"a1")
        alpha.send(1, b"a2")
        beta.send(0, b"b1")
        py.mux.uncork()
        out = py.mux.data_to_send()
        assert len(out) == 1 and out[0][:2] == b"\x00\x00"
        py.conn.send(out)
        for name, type_, data in [("gamma", 0, b"g1"), ("alpha", 0, b"a1"), ("alpha", 1, b"a2"), ("beta", 0, b"b1")]:
            assert (await js.expect("message", name=name, type=type_))["hex"] == data.hex()

        # 6b. A batch that opens a channel and uses it at once (the `protomux.batch` vector, live).
        await js.call("pair", name="delta", protocol="delta", id="abcd", types=2)
        py.mux.cork()
        delta = py.mux.open_channel("delta", b"\xab\xcd", messages=[None, None])
        assert delta is not None
        delta.send(0, b"first")
        delta.send(1, b"second")
        py.mux.uncork()
        out = py.mux.data_to_send()
        assert len(out) == 1 and out[0][:3] == b"\x00\x00\x00"
        py.conn.send(out)
        await js.expect("open", name="delta")
        assert (await js.expect("message", name="delta", type=0))["hex"] == b"first".hex()
        assert (await js.expect("message", name="delta", type=1))["hex"] == b"second".hex()
        await py.expect(ChannelOpened, channel=delta)

        # 7. Rejects both ways.
        nobody = py.mux.open_channel("nobody-here", messages=[None])
        assert nobody is not None
        py.flush()
        closed = await py.expect(ChannelClosed, channel=nobody)
        assert closed.rejected and closed.is_remote
        await js.call("open", name="stranger", protocol="stranger", types=1)
        rej = await py.expect(OpenRejected, protocol="stranger")
        assert rej.remote_id > 0
        assert (await js.expect("close", name="stranger"))["isRemote"] is True

        # 8. Close both ways, then reopen alpha: ids are reused and pairing works again.
        alpha_local = alpha.local_id
        alpha.close()
        py.flush()
        assert (await js.expect("close", name="alpha"))["isRemote"] is True
        await js.call("close", name="beta")
        assert (await py.expect(ChannelClosed, channel=beta)).is_remote
        assert not alpha.send(0, b"late")
        alpha2 = py.mux.open_channel("alpha", ALPHA_ID, messages=[None, None])
        assert alpha2 is not None
        py.flush()
        await js.expect("requested", name="alpha")  # Node's pair() hook is still registered
        await js.expect("open", name="alpha")
        await py.expect(ChannelOpened, channel=alpha2)
        assert alpha2.local_id in (alpha_local, beta.local_id, nobody.local_id)
        await js.call("send", name="alpha", type=0, hex=b"again".hex())
        assert (await py.expect(MessageReceived, channel=alpha2)).message == b"again"

        # 9. Node destroys the stream: every channel still open closes on our side.
        await js.call("destroy")
        await py.watch.until(lambda: py.mux.destroyed)
        live: list[Channel] = [gamma, delta, alpha2]
        for ch in live:
            assert (await py.expect(ChannelClosed, channel=ch)).is_remote
        assert not py.errors
    finally:
        server.close()
        await cm.__aexit__(None, None, None)
        if py.conn is not None:
            py.conn.writer.close()
