"""npm blind-relay `Client`s pairing through our `BlindRelayServer`, over our `SecretStream` + `Mux`.

Two Node clients (tests/interop/js/blind_clients.js: npm blind-relay 1.6.1 on npm protomux on
npm @hyperswarm/secret-stream) each make their own TCP connection to a Python listener on
127.0.0.1, exactly as hyperdht talks to a relay once the connection exists: channel
`blind-relay` with id = the client's public key. We check the ids each side gets, what the
runtime is told, and the npm stats through match, unpair (pending and active) and session close.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from relay.blindrelay import (
    BlindRelayError,
    BlindRelayServer,
    BlindRelaySession,
    DestroyStream,
    PairingMatched,
    RelayEvent,
)
from relay.core import drain_events
from relay.keys import key_pair
from relay.secretstream import Opened
from tests.cores import fed
from tests.interop._mux_peers import SecretConn, Watch, node_peer

pytestmark = pytest.mark.interop

SEED_A = "01" * 32
SEED_B = "03" * 32
TOKEN = "5a" * 32
TOKEN2 = "77" * 32
TOKEN3 = "88" * 32
TOKEN4 = "99" * 32


class PyRelay:
    """The Python relay end: one `BlindRelayServer`, one `SecretConn` per accepted TCP connection."""

    def __init__(self, **server_kwargs: Any) -> None:
        self.server = BlindRelayServer(**server_kwargs)
        self.key = key_pair(b"\x09" * 32)
        self.conns: dict[BlindRelaySession, SecretConn] = {}
        self.events: list[RelayEvent] = []
        self.errors: list[BlindRelayError] = []
        self.watch = Watch()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        holder: dict[str, BlindRelaySession] = {}

        def on_open(ev: Opened) -> None:
            session = self.server.accept(id=ev.remote_public_key)
            holder["session"] = session
            self.conns[session] = conn
            self.pump()

        def on_message(data: bytes) -> None:
            try:
                fed(holder["session"], data, time.monotonic())
            except BlindRelayError as e:
                self.errors.append(e)
                conn.destroy()
            self.pump()

        def on_close(error: Exception | None) -> None:
            if "session" in holder:
                holder["session"].connection_closed()
            self.pump()

        conn = SecretConn(
            reader,
            writer,
            initiator=False,
            key_pair=self.key,
            on_message=on_message,
            on_open=on_open,
            on_close=on_close,
        )

    def pump(self) -> None:
        """What the service runtime does after every input: take events, then write output."""
        self.events += drain_events(self.server)
        for session, msgs in self.server.data_to_send():
            self.conns[session].send(msgs)
        self.watch.notify()

    async def until(self, **stats: int) -> None:
        s = self.server.stats
        try:
            await self.watch.until(lambda: all(getattr(s, k) == v for k, v in stats.items()))
        except TimeoutError:
            raise AssertionError(f"stats never reached {stats}: {s}") from None


async def test_interop_blind_pairing_with_node_clients(node: str) -> None:
    relay = PyRelay()
    server = await asyncio.start_server(relay.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pk_a = key_pair(bytes.fromhex(SEED_A)).public_key
    pk_b = key_pair(bytes.fromhex(SEED_B)).public_key
    try:
        async with node_peer(node, "blind_clients.js") as js:
            await js.call("connect", name="A", port=port, seed=SEED_A)
            await js.call("connect", name="B", port=port, seed=SEED_B)
            # The Node clients only report `open` if our channel's id is their public key.
            assert (await js.expect("open", name="A"))["publicKey"] == pk_a.hex()
            await js.expect("open", name="B")
            await relay.until(sessions_accepted=2, sessions_opened=2)
            by_key = {s.id: s for s in relay.conns}
            assert set(by_key) == {pk_a, pk_b}

            # Match: A is the initiator (its raw stream id 7), B is not (id 8).
            await js.call("pair", name="A", initiator=True, token=TOKEN, id=7)
            await relay.until(pairings_requested=1, pairings_pending=1)
            await js.call("pair", name="B", initiator=False, token=TOKEN, id=8)
            pair_a = await js.expect("pair", name="A")
            pair_b = await js.expect("pair", name="B")
            matched = [e for e in relay.events if isinstance(e, PairingMatched)]
            assert len(matched) == 1 and matched[0].token.hex() == TOKEN
            non_init, init = matched[0].links
            assert (init.session, init.is_initiator, init.remote_stream_id) == (by_key[pk_a], True, 7)
            assert (non_init.session, non_init.is_initiator, non_init.remote_stream_id) == (by_key[pk_b], False, 8)
            assert init.stream_id != non_init.stream_id
            # Each client is told the id of the relay stream we allocated for it.
            assert (pair_a["isInitiator"], pair_a["localId"], pair_a["remoteId"]) == (True, 7, init.stream_id)
            assert (pair_b["isInitiator"], pair_b["localId"], pair_b["remoteId"]) == (False, 8, non_init.stream_id)
            await relay.until(
                pairings_requested=2,
                pairings_matched=1,
                pairings_pending=0,
                pairings_active=1,
                streams_opened=2,
            )

            # Unpair while pending: cancelled, nothing to destroy.
            await js.call("pair", name="A", initiator=True, token=TOKEN2, id=9)
            await relay.until(pairings_pending=1, pairings_requested=3)
            await js.call("unpair", name="A", token=TOKEN2)
            await relay.until(pairings_pending=0, pairings_cancelled=1)
            assert "cancelled" in (await js.expect("request-error", name="A", token=TOKEN2))["message"].lower()

            # Unpair an active pairing: both relay streams must be destroyed by the runtime.
            await js.call("unpair", name="B", token=TOKEN)
            await relay.until(pairings_cancelled=2, pairings_active=0, streams_closed=2)
            destroyed = {e.stream_id for e in relay.events if isinstance(e, DestroyStream)}
            assert destroyed == {init.stream_id, non_init.stream_id}

            # A session closing with a token pending cancels it.
            await js.call("pair", name="B", initiator=False, token=TOKEN3, id=10)
            await relay.until(pairings_pending=1, pairings_requested=4)
            await js.call("destroy", name="B")
            await js.expect("stream-close", name="B")
            await relay.until(sessions_closed=1, pairings_cancelled=3, pairings_pending=0)

            # A graceful end from A, with a token pending: the session closes and cancels it.
            await js.call("pair", name="A", initiator=True, token=TOKEN4, id=11)
            await relay.until(pairings_pending=1, pairings_requested=5)
            await js.call("end", name="A")
            await relay.until(sessions_closed=2, pairings_cancelled=4, pairings_pending=0)
            s = relay.server.stats
            assert (s.pairings_matched, s.streams_opened, s.streams_closed, s.streams_errors) == (1, 2, 2, 0)
            assert not relay.errors
            assert list(relay.server.sessions) == []
    finally:
        server.close()
        for conn in relay.conns.values():
            conn.writer.close()
