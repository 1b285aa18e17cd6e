"""Our Python hyperdht client (relay.dht.client) in a LAN namespace: connect through a relay, echo.

usage (inside the LAN's namespace): python py_client.py '{"bootstrap": [...], "key": hex, "relay": z32, "bytes": n}'
Prints one JSON line: {ok, relayed, remote, error?}.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from relay.dht import DHTNode
from relay.dht.client import connect
from relay.keys import decode_id
from relay.udx import UDX


async def main(opts: dict[str, Any]) -> dict[str, Any]:
    udx = UDX()
    node = DHTNode(bootstrap=opts["bootstrap"], udx=udx)
    try:
        await asyncio.wait_for(node.bootstrap(), 30)
        relay = decode_id(opts["relay"]) if opts.get("relay") else None
        conn = await connect(node, bytes.fromhex(opts["key"]), relay_through=relay, punch=False, timeout=30)
        try:
            data = os.urandom(opts["bytes"])
            ss = conn.secret_stream

            async def send() -> None:
                for i in range(0, len(data), 60_000):
                    ss.send(data[i : i + 60_000])
                    await ss.drain()

            sender = asyncio.ensure_future(send())
            got = bytearray()
            while len(got) < len(data):
                msg = await asyncio.wait_for(ss.recv(), 60)
                if msg is None:
                    break
                got += msg
            await sender
            remote = conn.remote_address
            where = {"host": remote[0], "port": remote[1]} if remote else None
            return {"ok": bytes(got) == data, "relayed": conn.relayed, "remote": where}
        finally:
            conn.destroy()
    except Exception as e:  # the test prints what failed
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    finally:
        await node.close()
        udx.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))), flush=True)
