"""Pairing a raw UDX stream through a blind relay (hyperdht's `relayThrough`), client side.

`pair_through_relay` connects to the relay over the DHT (`relay.dht.client.connect`), opens the
blind-relay channel (`relay.dht.blindclient`, sans-IO) and sends `pair` with the token both peers
learned from the handshake; the relay's answer is the stream id to connect the raw stream to.
`RelayPairing` keeps the relay connection open while the pair lives.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from relay.core import drain_events
from relay.keys import KeyPair, encode_id
from relay.secretstream import SecretStreamError

from .blindclient import BlindRelayClient, Paired, RelayChannelClosed
from .calls import ConnectTrace
from .connection import Connection
from .messages import Address, DHTError

if TYPE_CHECKING:
    from .node import DHTNode

#: `connect(node, public_key, *, key_pair, timeout, keep_alive)`: `relay.dht.client.connect`
Connect = Callable[..., Awaitable[Connection]]

RELAY_TIMEOUT = 15.0  # hyperdht: relayTimeout 15000 ms
RELAY_KEEP_ALIVE = 5.0  # hyperdht: relayKeepAlive 5000 ms


def _key_text(key: bytes) -> str:
    return encode_id(key) if len(key) == 32 else key.hex()


class RelayPairing:
    """A matched pairing: the connection to the relay (kept open while the pair lives) and
    where our raw stream must send (`socket`, `relay_address`, `remote_id`)."""

    def __init__(self, relay_key: bytes, conn: Connection, remote_id: int, node: DHTNode) -> None:
        self.node = node
        self.relay_key = relay_key
        self.conn = conn
        self.remote_id = remote_id
        self.on_lost: Any = None
        self._reader: asyncio.Task[None] | None = None
        self.closed = False

    @property
    def socket(self) -> Any:
        return self.conn.stream.socket

    @property
    def relay_address(self) -> Address:
        addr = self.conn.stream.remote_addr
        assert addr is not None
        return addr

    def _keep_reading(self, client: BlindRelayClient) -> None:
        async def read() -> None:
            with contextlib.suppress(Exception):
                while (msg := await self.conn.secret_stream.recv()) is not None:
                    client.receive(msg, self.node._now())
                    drain_events(client)  # later replies change nothing here
            if not self.closed:
                self.closed = True
                if self.on_lost is not None:
                    self.on_lost()

        self._reader = asyncio.ensure_future(read())

    def close(self) -> None:
        """The relayed stream is done (or another path won): end the relay connection."""
        self.closed = True
        if self._reader is not None:
            self._reader.cancel()
        with contextlib.suppress(SecretStreamError):
            self.conn.close()
        stream = self.conn.stream
        if not stream.closed:
            # end() flushes our close; destroy soon after in case the relay never answers
            self.node.after(2.0, lambda: None if stream.closed else stream.destroy())


async def pair_through_relay(
    node: DHTNode,
    relay_key: bytes,
    token: bytes,
    is_initiator: bool,
    stream_id: int,
    *,
    connect: Connect,
    key_pair: KeyPair | None = None,
    timeout: float = RELAY_TIMEOUT,
    trace: ConnectTrace | None = None,
) -> RelayPairing:
    """Connect to the relay, `pair` our raw stream `stream_id` under `token`, wait for the
    relay's stream id (`connect`: how to reach the relay over the DHT, `relay.dht.client.connect`).
    Raises DHTError("RELAY_ABORTED") with the reason."""
    name = _key_text(relay_key)
    try:
        conn = await connect(node, relay_key, key_pair=key_pair, timeout=timeout, keep_alive=RELAY_KEEP_ALIVE)
    except DHTError as e:
        raise DHTError(f"cannot reach relay {name}: {e}", "RELAY_ABORTED") from None
    if trace is not None:
        trace.mark("relay_connected", node._now(), "pairing")
    client = BlindRelayClient(id=(key_pair.public_key if key_pair else conn.handshake.public_key))
    proto = conn.secret_stream

    def flush() -> None:
        for m in client.data_to_send():
            proto.send(m)

    async def wait_paired() -> int:
        client.pair(is_initiator, token, stream_id)
        flush()
        while True:
            msg = await proto.recv()
            if msg is None:
                raise DHTError(f"relay {name} closed the connection before pairing", "RELAY_ABORTED")
            client.receive(msg, node._now())
            while (ev := client.next_event()) is not None:
                if isinstance(ev, Paired):
                    flush()
                    return ev.remote_id
                if isinstance(ev, RelayChannelClosed):
                    raise DHTError(f"relay {name} closed the blind-relay channel (refused?)", "RELAY_ABORTED")
            flush()

    try:
        remote_id = await asyncio.wait_for(wait_paired(), timeout)
    except TimeoutError:
        conn.destroy()
        raise DHTError(f"relay {name} did not match the pairing within {timeout:g}s", "RELAY_ABORTED") from None
    except (SecretStreamError, Exception) as e:
        conn.destroy()
        if isinstance(e, DHTError):
            raise
        raise DHTError(f"relay {name} broke the pairing: {e}", "RELAY_ABORTED") from None
    if trace is not None:
        trace.mark("paired", node._now(), "secret stream")
    pairing = RelayPairing(relay_key, conn, remote_id, node)
    pairing._keep_reading(client)
    return pairing
