"""The Python side of benchmarks/udx_forward.py: relay.udx's relay_to, set up as blind-relay does it.

Run as its own process (so its CPU time is measured alone):
    python benchmarks/udx_relay_py.py <peer A id> <peer D id> [--profile FILE] [--loop uvloop|asyncio]
    python benchmarks/udx_relay_py.py '[[aId, dId], ...]'   (many pairs)
    ... --kernel   (established pairs forwarded by nftables: relay.udx.kernel; needs root)
Prints {"event": "ready", "port", "rb", "rc", "pairs"}; reads "stats" / EOF on stdin.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from relay.udx import UDX, UDXSocket, UDXStream


def firewall_for(peer_id: int):  # type: ignore[no-untyped-def]
    def firewall(stream: UDXStream, socket: UDXSocket, addr: tuple[str, int]) -> bool:
        stream.connect(socket, peer_id, addr)
        return False

    return firewall


async def main(wanted: list[tuple[int, int]], kernel: bool = False) -> None:
    udx = UDX()
    sock = await udx.create_socket("127.0.0.1", 0)
    if kernel:
        sock.enable_kernel_forwarding()
    pairs = []
    for a_id, d_id in wanted:
        # as the blind relay picks them: each relay stream's id is its partner peer's own id
        rb = udx.create_stream(d_id if udx.id_free(d_id) else None, firewall=firewall_for(a_id))
        rc = udx.create_stream(a_id if udx.id_free(a_id) else None, firewall=firewall_for(d_id))
        rb.relay_to(rc)
        rc.relay_to(rb)
        pairs.append((rb.id, rc.id))
    rb_id, rc_id = pairs[0]
    print(json.dumps({"event": "ready", "port": sock.port, "rb": rb_id, "rc": rc_id, "pairs": pairs}), flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        if line.strip() == b"stats":
            if sock.kernel is not None:
                sock.kernel.refresh()
            st = sock.stats
            out = {
                "event": "stats",
                "received_packets": st.received_packets,
                "received_bytes": st.received_bytes,
                "sent_packets": st.sent_packets,
                "sent_bytes": st.sent_bytes,
                "relayed_packets": st.relayed_packets,
                "dropped_packets": st.dropped_packets,
                "gso_sends": st.gso_sends,
                "gso_segments": st.gso_segments,
                "gro_buffers": st.gro_buffers,
                "gro_segments": st.gro_segments,
                "holds": st.holds,
                "reads": st.reads,
                "offload": sock.offload(),
                "kernel": sock.kernel.stats() if sock.kernel is not None else None,
            }
            print(json.dumps(out), flush=True)
    udx.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("a_id", help="peer A's stream id, or a JSON list [[aId, dId], ...]")
    ap.add_argument("d_id", type=int, nargs="?")
    ap.add_argument("--profile")
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    ap.add_argument("--kernel", action="store_true", help="forward established pairs in the kernel (nftables)")
    args = ap.parse_args()
    factory = None
    if args.loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    # CPU time (user+sys of this thread), so the event loop's idle epoll_wait does not count
    prof = cProfile.Profile(time.thread_time) if args.profile else None
    if prof is not None:
        prof.enable()
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            if args.a_id.startswith("["):
                wanted = [(int(a), int(d)) for a, d in json.loads(args.a_id)]
            else:
                wanted = [(int(args.a_id), int(args.d_id))]
            runner.run(main(wanted, args.kernel))
    finally:
        if prof is not None:
            prof.disable()
            prof.dump_stats(args.profile)
