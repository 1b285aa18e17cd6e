"""The demo wizard in a real terminal (tmux), driven by keys as an operator would, at 80×24 and 60×20.

Pilot tests drive the app's own event loop; this one runs `python -m cosmictui` on tmux's pty with
the demo's real relay, private DHT and probe, so what the operator reads is read off the screen.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not shutil.which("tmux"), reason="tmux missing: .ci/run installs it")


class Tmux:
    def __init__(self, name: str) -> None:
        self.name = name

    def run(self, *args: str) -> str:
        res = subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=30, check=True)
        return res.stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", self.name)

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", self.name, *keys)

    def wait(self, cond: Callable[[str], bool], what: str, timeout: float = 60.0) -> str:
        """Poll the screen until `cond` holds; the timeout is only a safety net."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if cond(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; the screen:\n{text}")
            time.sleep(0.2)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    name = f"cosmictui-test-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), TERM="xterm-256color")
    # The wizard's exit code lands in a file, so the test can tell a clean quit from a crash.
    cmd = f"{sys.executable} -m cosmictui; echo $? > {tmp_path / 'rc'}; sleep 600"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", name, "-x", "80", "-y", "24", cmd], env=env, check=True, timeout=30
    )
    t = Tmux(name)
    t.rc = tmp_path / "rc"  # type: ignore[attr-defined]
    try:
        yield t
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True, timeout=30)


def test_demo_in_a_real_terminal_shows_the_relay_proof_at_80x24_and_60x20(tmux: Tmux) -> None:
    tmux.wait(lambda s: "Press n" in s.replace("\n", " "), "step 1's checks")
    tmux.keys("n")
    tmux.wait(lambda s: "Press s to start it" in s.replace("\n", " "), "step 2")
    tmux.keys("s")
    tmux.wait(lambda s: "Started the relay" in s.replace("\n", " "), "the relay started and checked", timeout=90)
    for size in ((80, 24), (60, 20)):
        tmux.run("resize-window", "-t", tmux.name, "-x", str(size[0]), "-y", str(size[1]))
        tmux.keys("End")
        screen = tmux.wait(
            lambda s: "Relay answers from" in s and "round trip" in s.replace("\n", " "),
            f"the reach check and the probe row at {size}",
        )
        assert all(len(line) <= size[0] for line in screen.splitlines())
        tmux.keys("Home")
        tmux.wait(lambda s: "Relay key" in s or "key (c copies" in s, f"the key at the top at {size}")
    tmux.keys("q")
    rc = tmux.rc  # type: ignore[attr-defined]
    deadline = time.monotonic() + 60
    while not rc.exists() or not rc.read_text().strip():
        assert time.monotonic() < deadline, tmux.screen()
        time.sleep(0.2)
    assert rc.read_text().strip() == "0"
    # the sandbox path printed at the start is gone: the last word says so
    tmux.wait(lambda s: "was removed" in s.replace("\n", ""), "the demo's goodbye")
