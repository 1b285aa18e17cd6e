"""Per-message cost of `relay.secretstream` (encrypt and decrypt), in memory, no sockets.

    python3 benchmarks/streams_messages.py [--repeat 15] [--baseline GIT_REV]

Two `SecretStream` ends are set up from a hand-over (as hyperdht does), then for 100 B,
1180 B (one UDX payload) and 64 KiB messages it times:

- send: `send(m)` + `data_to_send()` per message (one frame out),
- recv: `receive(frame, now)` + draining the `Message` event, one frame per chunk (what a
  socket read usually hands over),
- recv×64: 64 frames per `receive` chunk (a busy stream's read).

Times are this process's CPU time (`time.process_time`: other jobs on a shared box do not
count), best of --repeat runs. With `--baseline REV`, `relay/secretstream.py` as of that git
revision is loaded next to the current one and the two are timed in alternation in the same
run, with the ratio current/baseline (lower is better for µs). Not a test: numbers depend on
the box.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from relay import secretstream as current  # noqa: E402
from relay.keys import key_pair  # noqa: E402

SIZES = ((100, 5_000), (1180, 5_000), (64 * 1024, 300))
BATCH = 64


def load_revision(rev: str) -> ModuleType:
    """`relay/secretstream.py` as of git revision `rev`, imported under another name."""
    src = subprocess.run(
        ["git", "show", f"{rev}:relay/secretstream.py"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    fd, path = tempfile.mkstemp(suffix=".py", prefix="secretstream_baseline_")
    with os.fdopen(fd, "wb") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("secretstream_baseline", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["secretstream_baseline"] = mod
    spec.loader.exec_module(mod)
    os.unlink(path)
    return mod


def opened_pair(ss: ModuleType) -> tuple[object, object]:
    """Two ends keyed like a hyperdht hand-over, headers exchanged, events drained."""
    a, b = key_pair(), key_pair()
    k1, k2, h = os.urandom(32), os.urandom(32), os.urandom(64)
    ini = ss.SecretStream(True, handshake=ss.HandshakeResult(k1, k2, h, a.public_key, b.public_key))
    res = ss.SecretStream(False, handshake=ss.HandshakeResult(k2, k1, h, b.public_key, a.public_key))
    ini.start(0.0)
    res.start(0.0)
    res.receive(ini.data_to_send(), 0.0)
    ini.receive(res.data_to_send(), 0.0)
    list(ini.events())
    list(res.events())
    return ini, res


def run_once(ss: ModuleType, size: int, count: int) -> tuple[float, float, float]:
    """Seconds for `count` sends, `count` one-frame receives, `count` batched receives."""
    msg = os.urandom(size)
    message_type = ss.Message

    ini, res = opened_pair(ss)
    send, take = ini.send, ini.data_to_send
    frames = [b""] * count
    t0 = time.process_time()
    for i in range(count):
        send(msg)
        frames[i] = take()
    t_send = time.process_time() - t0

    receive, events = res.receive, res._events
    got = 0
    t0 = time.process_time()
    for f in frames:
        receive(f, 0.0)
        while events:
            if type(events.popleft()) is message_type:
                got += 1
    t_recv = time.process_time() - t0
    assert got == count and not res.closed, "receiver lost messages"

    ini, res = opened_pair(ss)
    for _ in range(count):
        ini.send(msg)
    wire = ini.data_to_send()
    step = (3 + size + ss.ABYTES) * BATCH
    chunks = [wire[i : i + step] for i in range(0, len(wire), step)]
    receive, events = res.receive, res._events
    got = 0
    t0 = time.process_time()
    for c in chunks:
        receive(c, 0.0)
        while events:
            if type(events.popleft()) is message_type:
                got += 1
    t_batch = time.process_time() - t0
    assert got == count and not res.closed, "receiver lost messages"
    return t_send, t_recv, t_batch


def measure(impls: list[ModuleType], size: int, count: int, repeat: int) -> list[list[float]]:
    """Best times per implementation; runs alternate between them so both see the same load."""
    best = [[float("inf")] * 3 for _ in impls]
    for _ in range(repeat):
        for b, mod in zip(best, impls, strict=True):
            for i, t in enumerate(run_once(mod, size, count)):
                b[i] = min(b[i], t)
    return best


def fmt_size(n: int) -> str:
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--baseline", metavar="GIT_REV", help="also time relay/secretstream.py as of this revision")
    args = ap.parse_args()

    impls: list[tuple[str, ModuleType]] = [("current", current)]
    if args.baseline:
        impls.append((f"baseline {args.baseline}", load_revision(args.baseline)))

    py = sys.version.split()[0]
    print(f"relay.secretstream per message, in memory, CPU time, best of {args.repeat} (Python {py})")
    print()
    head = "| size | path | " + " | ".join(f"{name} µs/msg | {name} MB/s" for name, _ in impls)
    if len(impls) == 2:
        head += " | current/baseline"
    print(head + " |")
    print("|" + "---|" * head.count("|"))
    for size, count in SIZES:
        results = measure([mod for _, mod in impls], size, count, args.repeat)
        for p, path in enumerate(("send", "recv", f"recv×{BATCH}")):
            cells = []
            for r in results:
                us = r[p] / count * 1e6
                mbs = size * count / r[p] / 1e6
                cells.append(f"{us:8.2f} | {mbs:8.1f}")
            row = f"| {fmt_size(size)} | {path} | " + " | ".join(cells)
            if len(results) == 2:
                row += f" | {results[0][p] / results[1][p]:.2f}"
            print(row + " |")


if __name__ == "__main__":
    main()
