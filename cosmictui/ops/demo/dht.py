"""A private DHT of five nodes on 127.0.0.1 for the demo sandbox.

The relay is useful only once it has joined a DHT (without one it keeps retrying, unreachable),
and the demo must work offline, so the sandbox runs its own small network, like hyperdht's
`testnet`: one node that bootstraps from nobody, four more that join it (five, because the
relay's firewall probe asks five nodes; with fewer it sometimes calls itself firewalled). Each is a
`relay.dht.DHTNode` made *persistent* (id = H(its address), id sent in replies), which the
relay's node never is. They answer dht-rpc (PING, FIND_NODE…) and store announces (hyperdht's
persistent records), so the demo relay's key is findable and its monitor shows the announce.

Run as `python -m cosmictui.ops.demo.dht --ready FILE [--port P] [--watch DIR]`: writes
`{"pid", "bootstrap"}` to FILE once up; exits on SIGTERM/SIGINT, when the watched directory
disappears, or after `--idle-exit` seconds without a relay running on `--watch` storage.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import tempfile
import time
from pathlib import Path

from relay.dht.messages import node_id
from relay.dht.node import DHTNode


async def _persistent_node(bootstrap: list[str], port: int) -> DHTNode:
    node = DHTNode(bootstrap=bootstrap, host="127.0.0.1", port=port, firewalled=False)
    try:
        await node.bind()
    except OSError:
        if port == 0:
            raise
        node = DHTNode(bootstrap=bootstrap, host="127.0.0.1", port=0, firewalled=False)
        await node.bind()
    # what dht-rpc's `ephemeral: false` + known host does: id = H(address), sent in replies, and
    # hyperdht's persistent store, so the relay's announce lands and the monitor shows it
    node._become_persistent(node_id(node.local_address()))
    await node.bootstrap()
    return node


async def run(port: int, ready: Path, watch: Path | None, idle_exit: float, count: int = 5) -> None:
    from cosmictui.ops.relayproc import attach

    first = await _persistent_node([], port)
    boot = f"127.0.0.1:{first.local_address()[1]}"
    nodes = [first] + [await _persistent_node([boot], 0) for _ in range(count - 1)]
    fd, tmp = tempfile.mkstemp(prefix=".dht-", dir=ready.parent)
    with os.fdopen(fd, "w") as f:
        json.dump({"pid": os.getpid(), "bootstrap": boot}, f)
    os.replace(tmp, ready)
    print(f"private DHT ready at {boot} ({count} nodes)", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    last_relay = time.monotonic()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 2.0)
        if watch is not None:
            if not watch.parent.exists():
                break
            if attach(str(watch)) is not None:
                last_relay = time.monotonic()
            elif time.monotonic() - last_relay > idle_exit:
                print(f"no relay on {watch} for {idle_exit:g} s: exiting", flush=True)
                break
    for node in nodes:
        await node.close()
    with contextlib.suppress(OSError, ValueError):
        if json.loads(ready.read_text()).get("pid") == os.getpid():
            ready.unlink()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cosmictui.ops.demo.dht", description=__doc__.splitlines()[0])
    p.add_argument("--ready", required=True, type=Path, help="JSON file written once the DHT is up")
    p.add_argument("--port", type=int, default=0, help="UDP port of the bootstrap node (taken: any port)")
    p.add_argument("--watch", type=Path, default=None, help="relay storage directory to watch")
    p.add_argument("--idle-exit", type=float, default=900.0, help="exit after this long without a relay")
    p.add_argument("--nodes", type=int, default=5)
    args = p.parse_args(argv)
    asyncio.run(run(args.port, args.ready, args.watch, args.idle_exit, args.nodes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
