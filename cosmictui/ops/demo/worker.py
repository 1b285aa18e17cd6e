"""The demo sandbox's worker: every job it created is a real pair of peers meeting through a relay.

Started (detached) by the sandbox's `task restart`, with the relays the restart applied. For
each job that carries relay keys and is not finished, the worker listens offering the job's
relay (`relay_through`, punching off: the cluster network is blocked) and the job's agent
connects to it, punching off too, so the relay is the only path. Each job's two peers keep their
key pairs for the job's life (derived from the sandbox and the job id), so a reconnect after a
restart is a key the relay saw before, as a real job's. The job leaves `Creating` only when the
agent's connection echoes and came through the relay (a job created while the sandbox's
`direct_jobs` is set connects directly instead, as on a network that does not block it); then
the agent "keeps updating" by sending over it every few seconds, and each echo bumps the job's
last update. When the relay is down the job says why it waits, and the pair is tried again.
Jobs without a relay key (created before the restart) are left alone: they stay stuck.

Run as `python -m cosmictui.ops.demo.worker --state FILE --bootstrap HOST:PORT[,...]`. It
exits on SIGTERM/SIGINT, when the state file goes away or names another worker (a newer
restart), or after `--idle-exit` seconds without a relay running on the sandbox storage.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from relay.dht import Connection, DHTError, DHTNode, HyperDHTServer
from relay.dht.client import connect
from relay.keys import KeyPair, decode_id, key_pair
from relay.udx import UDX

HEARTBEAT = 2.0  # seconds between the agent's updates over its connection
RETRY = 3.0  # seconds before a failed pair is tried again
SCAN = 0.5  # how often the worker looks at the job list
STARTUP_GRACE = 10.0
FINAL = ("Completed", "Failed")

log = logging.getLogger("cosmictui.sandbox_worker")


def _update(state_file: Path, job_id: str, **fields: Any) -> bool:
    """Change one job under the sandbox's state lock; False when the job is gone."""
    from cosmictui.ops.demo.sandbox import _locked

    with _locked(state_file) as state:
        for job in state["jobs"]:
            if job["id"] == job_id:
                job.update(fields)
                return True
    return False


def job_keys(secret: bytes, job_id: str) -> tuple[KeyPair, KeyPair]:
    """The worker's and the agent's key pairs of one job: the same for the job's whole life."""
    return tuple(  # type: ignore[return-value]
        key_pair(hashlib.blake2b(f"{role}:{job_id}".encode(), key=secret[-64:], digest_size=32).digest())
        for role in ("worker", "agent")
    )


class Worker:
    def __init__(self, state_file: Path, bootstrap: list[str]) -> None:
        self.state_file = state_file
        self.udx = UDX()
        self.worker_node = DHTNode(bootstrap=list(bootstrap), host="127.0.0.1", udx=self.udx)
        self.agent_node = DHTNode(bootstrap=list(bootstrap), host="127.0.0.1", udx=self.udx)
        self.pairs: dict[str, asyncio.Task[None]] = {}
        self.stop = asyncio.Event()
        self.secret = str(state_file.resolve()).encode()
        self.direct: dict[str, bool] = {}

    async def run(self, idle_exit: float) -> None:
        from cosmictui.ops.relayproc import attach

        started = time.monotonic()
        await asyncio.gather(self.worker_node.bootstrap(), self.agent_node.bootstrap())
        last_relay = time.monotonic()
        while not self.stop.is_set():
            try:
                state = json.loads(self.state_file.read_text("utf-8"))
            except (OSError, ValueError):
                break  # the sandbox is gone
            if state.get("worker", {}).get("pid") != os.getpid() and time.monotonic() - started > STARTUP_GRACE:
                break  # a newer restart replaced us (at first the restart may not have saved our pid yet)
            jobs = {j["id"]: j for j in state.get("jobs", [])}
            if isinstance(state.get("secret"), str):
                self.secret = state["secret"].encode()
            self.direct = {jid: bool(j.get("direct")) for jid, j in jobs.items()}
            for job_id, job in jobs.items():
                if job.get("relays") and job.get("status") not in FINAL and job_id not in self.pairs:
                    self.pairs[job_id] = asyncio.ensure_future(self.pair(job_id, list(job["relays"])))
            for job_id in [j for j in self.pairs if j not in jobs]:
                self.pairs.pop(job_id).cancel()  # deleted
            if any(attach(s) is not None for s in state.get("relay_storages", [])):
                last_relay = time.monotonic()
            elif time.monotonic() - last_relay > idle_exit:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), SCAN)

    async def pair(self, job_id: str, relays: list[str]) -> None:
        """Keep one job's agent connected to the worker through one of its relays."""
        while True:
            why = "no relay key"
            if len(self.agent_node.table) == 0:
                why = "the worker cannot reach the DHT (no bootstrap node answered)"
                relays_now: list[str] = []
            else:
                relays_now = relays
            for key in relays_now:
                try:
                    relay_pk = decode_id(key)
                except ValueError:
                    why = f"relay key {key[:8]}… is not a valid key"
                    continue
                try:
                    await self.session(job_id, key, relay_pk)
                    why = f"lost the connection through relay {key[:8]}…"
                except DHTError as e:
                    why = f"no connection through relay {key[:8]}…: {e}"
                except (ConnectionError, TimeoutError) as e:
                    why = f"the connection through relay {key[:8]}… broke: {e or type(e).__name__}"
            if not _update(self.state_file, job_id, message=f"waiting: {why}"):
                return
            await asyncio.sleep(RETRY)

    async def session(self, job_id: str, key: str, relay_pk: bytes) -> None:
        """One worker server + one agent connection, punching off, through the relay."""

        async def echo(conn: Connection) -> None:
            with contextlib.suppress(Exception):
                async for msg in conn.secret_stream:
                    conn.secret_stream.send(msg)

        # Each job's two peers keep their keys for the job's life (a reconnect after a restart is the
        # same job to the relay: keys it saw before); a direct job's network is not blocked.
        kp, agent_kp = job_keys(self.secret, job_id)
        direct = self.direct.get(job_id, False)
        server = HyperDHTServer(
            self.worker_node,
            kp,
            echo,
            holepunch=direct,
            share_local_address=direct,
            relay_through=None if direct else relay_pk,
        )
        conn: Connection | None = None
        try:
            await server.listen()
            conn = await connect(self.agent_node, kp.public_key, key_pair=agent_kp, punch=direct, timeout=20)
            if direct and conn.relayed:
                raise DHTError("a direct job's agent went through a relay", "RELAYED")
            if not direct and not conn.relayed:
                raise DHTError("the agent reached the worker without the relay", "NOT_RELAYED")
            ss = conn.secret_stream
            addr = conn.remote_address
            where = f"{addr[0]}:{addr[1]}" if addr else "?"
            first = True
            while True:
                beat = f"job {job_id} update {time.time():.3f}".encode()
                ss.send(beat)
                back = await asyncio.wait_for(ss.recv(), 15)
                if back is None:
                    raise ConnectionError("the worker closed the connection")
                if back != beat:
                    raise ConnectionError("the echo came back altered")
                fields: dict[str, Any] = {"updated_at": time.time()}
                if first:
                    how = (
                        f"connected directly, not through a relay (agent ⇄ worker at {where})"
                        if direct
                        else f"connected through relay {key[:8]}… (agent ⇄ worker relayed at {where})"
                    )
                    fields |= {"status": "Running", "message": how}
                    first = False
                if not _update(self.state_file, job_id, **fields):
                    return
                await asyncio.sleep(HEARTBEAT)
        finally:
            if conn is not None:
                conn.destroy()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.close(), 5)

    async def close(self) -> None:
        for t in self.pairs.values():
            t.cancel()
        await asyncio.gather(*self.pairs.values(), return_exceptions=True)
        for n in (self.agent_node, self.worker_node):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(n.close(), 5)
        self.udx.close()


async def run(state_file: Path, bootstrap: list[str], idle_exit: float) -> None:
    w = Worker(state_file, bootstrap)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, w.stop.set)
    try:
        await w.run(idle_exit)
    finally:
        await w.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cosmictui.ops.demo.worker", description=__doc__.splitlines()[0])
    p.add_argument("--state", required=True, type=Path, help="the sandbox's state file")
    p.add_argument("--bootstrap", required=True, help="DHT bootstrap nodes, HOST:PORT[,...]")
    p.add_argument("--idle-exit", type=float, default=900.0, help="exit after this long without a relay")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    asyncio.run(run(args.state, [b for b in args.bootstrap.split(",") if b], args.idle_exit))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
