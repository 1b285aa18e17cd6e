"""How quick and how light is `cosmictui monitor` in a tmux pane?

    python3 benchmarks/monitor_bench.py [--runs 5] [--seconds 60]

1. Time to first frame: `cosmictui monitor --storage S` started in an 80×24 pseudo-terminal,
   timed from spawn to the first full frame (the footer is drawn) and to the first frame
   showing the relay's data ("▲ UP"). Median of --runs, the relay being a real `python -m relay`
   on a loopback hyperdht testnet (Node, from tests/interop).
2. CPU at 1 Hz over --seconds: the monitor's own CPU time (psutil, user+sys) while it watches
   (a) that idle relay — its refresh slows down when nothing changes, as designed — and
   (b) an endpoint in the exact /metrics + /stats format whose counters move all the time, so
   the monitor really scrapes and redraws every graph once a second (the worst case).

Prints a Markdown table for README's `### Monitor` section. Not a test: numbers depend on the box.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import pty
import select
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e._monitor_relay import MonitoredRelay, NodeTestnet  # noqa: E402
from tests.unit._metrics_server import FakeRelayMetrics  # noqa: E402


class PtyApp:
    """`python -m cosmictui ARGS` on a pseudo-terminal of a given size, its output drained."""

    def __init__(self, args: list[str], cols: int = 80, rows: int = 24, argv: list[str] | None = None) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)}
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            argv or [sys.executable, "-m", "cosmictui", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
        os.close(slave)
        self.master = master
        self.buf = bytearray()
        self.lock = threading.Lock()
        self.marks: dict[bytes, float] = {}
        self.cpu_marks: dict[bytes, float] = {}  # the app's CPU-seconds when the needle showed up
        self.ps = psutil.Process(self.proc.pid)
        self._stop = False
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while not self._stop:
            r, _, _ = select.select([self.master], [], [], 0.1)
            if not r:
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            now = time.perf_counter()
            with self.lock:
                self.buf += data
                if len(self.buf) > 1 << 20:
                    del self.buf[: len(self.buf) - (1 << 19)]
                for needle in list(self.marks):
                    if self.marks[needle] < 0 and needle in self.buf:
                        self.marks[needle] = now - self.t0
                        with contextlib.suppress(psutil.Error):
                            c = self.ps.cpu_times()
                            self.cpu_marks[needle] = c.user + c.system

    def watch(self, *needles: str) -> None:
        with self.lock:
            for n in needles:
                self.marks[n.encode()] = -1.0

    def wait_mark(self, needle: str, timeout: float = 60.0) -> float:
        key = needle.encode()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.marks.get(key, -1.0) >= 0:
                    return self.marks[key]
            time.sleep(0.005)
        raise TimeoutError(f"{needle!r} never appeared")

    def quit(self) -> None:
        try:
            os.write(self.master, b"q")
            self.proc.wait(15)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(15)
        self._stop = True
        self.thread.join(2)
        os.close(self.master)


BARE_APP = """
from textual.app import App
from textual.widgets import Footer, Static
class Bare(App):
    BINDINGS = [("q", "quit", "Quit")]
    def compose(self):
        yield Static("hello")
        yield Footer()
Bare().run()
"""


def bare_textual_frame(runs: int) -> tuple[list[float], list[float]]:
    """The floor on this box: a Textual app with one label and a footer, same pty, same needle."""
    frames, cpus = [], []
    for _ in range(runs):
        app = PtyApp([], argv=[sys.executable, "-c", BARE_APP])
        app.watch("Quit")
        frames.append(app.wait_mark("Quit"))
        cpus.append(app.cpu_marks.get(b"Quit", float("nan")))
        app.quit()
    return frames, cpus


def first_frame(storage: Path, runs: int) -> tuple[list[float], list[float], list[float]]:
    frames, datas, cpus = [], [], []
    for _ in range(runs):
        app = PtyApp(["monitor", "--storage", str(storage)])
        app.watch("Quit", "▲ UP")
        frames.append(app.wait_mark("Quit"))
        datas.append(app.wait_mark("▲ UP"))
        cpus.append(app.cpu_marks.get(b"Quit", float("nan")))
        app.quit()
    return frames, datas, cpus


def cpu_over(args: list[str], seconds: float, warmup: float = 5.0) -> tuple[float, float]:
    """(% of one core, RSS MB) of the monitor process over `seconds` after `warmup`."""
    app = PtyApp(args)
    app.watch("Quit")
    app.wait_mark("Quit")
    p = psutil.Process(app.proc.pid)
    time.sleep(warmup)
    c0, t0 = p.cpu_times(), time.perf_counter()
    time.sleep(seconds)
    c1, t1 = p.cpu_times(), time.perf_counter()
    rss = p.memory_info().rss / 1e6
    app.quit()
    used = (c1.user - c0.user) + (c1.system - c0.system)
    return 100.0 * used / (t1 - t0), rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=60.0)
    a = ap.parse_args()
    node = shutil.which("node")
    if node is None:
        sys.exit("node is needed for the loopback DHT the relay joins")
    tmp = Path(tempfile.mkdtemp(prefix="monitor-bench-"))
    testnet = NodeTestnet(node)
    relay = MonitoredRelay(tmp / "store", testnet.bootstrap).start()
    fake = FakeRelayMetrics()
    stop = threading.Event()

    def churn() -> None:  # counters that never stand still: the monitor redraws every second
        while not stop.wait(0.1):
            fake.counters["blind_relay_udp_received_bytes"].inc(150_000)
            fake.counters["blind_relay_udp_sent_bytes"].inc(148_000)
            fake.counters["blind_relay_relayed_bytes"].inc(147_000)
            fake.counters["blind_relay_udp_received_packets"].inc(130)
            fake.counters["blind_relay_udp_sent_packets"].inc(128)
            fake.counters["blind_relay_relayed_packets"].inc(127)
            fake.cpu.inc(0.01)

    threading.Thread(target=churn, daemon=True).start()
    try:
        bare, bare_cpu = bare_textual_frame(a.runs)
        frames, datas, frame_cpu = first_frame(relay.storage, a.runs)
        idle_cpu, idle_rss = cpu_over(["monitor", "--storage", str(relay.storage), "--interval", "1"], a.seconds)
        busy_cpu, busy_rss = cpu_over(["monitor", "--metrics", fake.url, "--interval", "1"], a.seconds)
    finally:
        stop.set()
        fake.close()
        relay.stop()
        testnet.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    cores = psutil.cpu_count()
    load = os.getloadavg()[0]
    floor = statistics.median(bare)
    rows = [
        ("first frame of a bare Textual app (label + footer), same pty", f"{floor:.2f} s", "(floor)"),
        (f"time to first frame (80×24, median of {a.runs})", f"{statistics.median(frames):.2f} s", "< 1 s"),
        ("time to first frame with the relay's data", f"{statistics.median(datas):.2f} s", "< 1 s"),
        ("first frame / bare Textual floor", f"{statistics.median(frames) / floor:.2f}×", "–"),
        (
            "CPU-seconds used until the first frame (bare Textual / monitor)",
            f"{statistics.median(bare_cpu):.2f} / {statistics.median(frame_cpu):.2f} s",
            "–",
        ),
        (
            f"CPU, real idle relay, 1 s refresh (slows when idle), {a.seconds:g} s",
            f"{idle_cpu:.2f} % of a core",
            "< 3 %",
        ),
        (f"CPU, counters moving, redraw every 1 s, {a.seconds:g} s", f"{busy_cpu:.2f} % of a core", "< 3 %"),
        ("monitor RSS (idle / moving)", f"{idle_rss:.0f} MB / {busy_rss:.0f} MB", "–"),
    ]
    print(
        f"\n`python3 benchmarks/monitor_bench.py --runs {a.runs} --seconds {a.seconds:g}` "
        f"({cores} cores, load average {load:.1f} at the end)\n"
    )
    print("| measurement | result | target |\n|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")
    raw = {"bare": bare, "bare_cpu": bare_cpu, "frames": frames, "frame_cpu": frame_cpu, "data_frames": datas}
    print("\nraw:", json.dumps(raw))


if __name__ == "__main__":
    main()
