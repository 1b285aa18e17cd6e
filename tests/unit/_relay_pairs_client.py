"""Peers in a process of their own that pair through a relay and relay a message each way.

    python -m tests.unit._relay_pairs_client RELAY_KEY_HEX PORT PAIRS

Each pair: two blind-relay sessions (the Python hyperdht client's `pair_through_relay`, straight
to the relay at 127.0.0.1:PORT), two raw UDX streams connected to the relay streams it matched,
"ping" one way and "pong" the other. Prints "relayed" once every pair did, then reads one line:
"close" ends every session and stream gracefully, "kill" exits at once (the relay hears nothing,
as from a peer that lost power). Its own process, so that a test's garbage collection counts the
relay's objects only.
"""

from __future__ import annotations

import asyncio
import os
import sys

from relay.dht import DHTNode
from relay.dht.client import connect
from relay.dht.relaying import RelayPairing, pair_through_relay
from relay.udx import UDX, UDXStream


async def main(key: bytes, port: int, pairs: int) -> None:
    udx = UDX()
    node = DHTNode(udx=udx, bootstrap=[], host="127.0.0.1")
    await node.bind()

    async def via(*args: object, **kwargs: object) -> object:
        return await connect(*args, relay_addresses=[("127.0.0.1", port)], **kwargs)  # type: ignore[arg-type]

    held: list[tuple[RelayPairing, UDXStream]] = []
    for i in range(pairs):
        token = os.urandom(32)
        ids = (1000 + 2 * i, 1001 + 2 * i)
        a, b = await asyncio.gather(
            *(pair_through_relay(node, key, token, n == 0, ids[n], connect=via) for n in range(2))  # type: ignore[arg-type]
        )
        sa, sb = udx.create_stream(ids[0]), udx.create_stream(ids[1])
        sa.connect(a.socket, a.remote_id, a.relay_address)
        sb.connect(b.socket, b.remote_id, b.relay_address)
        sa.write(b"ping")  # each side's first packet teaches its relay stream where it is
        sb.write(b"pong")
        assert (await sb.read(), await sa.read()) == (b"ping", b"pong")
        held += [(a, sa), (b, sb)]
    print("relayed", flush=True)
    what = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if what.strip() == "kill":
        os._exit(0)
    for pairing, stream in held:
        stream.end()
        pairing.close()
    await asyncio.gather(*(s.wait_closed() for _, s in held))
    await asyncio.gather(*(p.conn.secret_stream.wait_closed() for p, _ in held))


if __name__ == "__main__":
    asyncio.run(main(bytes.fromhex(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
