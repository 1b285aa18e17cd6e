"""Every command README and docs/ show in a block marked runnable runs as shown.

Mark a block by the line before its fence:

    <!-- runnable -->          each line runs on its own and exits 0; a line with `--json` may also
                               exit 1 (down, not running, a check failed) or 3 (a plan printed),
                               as long as it printed one JSON object naming the error and its fix;
                               never 2: a shown command is never a usage error
    <!-- runnable: wizard -->  each line starts the wizard: it must draw its first step on a
                               pseudo-terminal, then end on SIGHUP and leave no demo behind

Commands run from this checkout's virtual environment, in an empty directory, with HOME and the
XDG directories pointing at the test's own, so no operator's config or state is read.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e._pty import on_pty

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"<!-- runnable(?:: (?P<kind>[a-z]+))? -->\n```(?:sh|bash|console)?\n(?P<body>.*?)```", re.S)


def _commands(kind: str) -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for m in BLOCK.finditer(doc.read_text("utf-8")):
            if (m.group("kind") or "plain") != kind:
                continue
            for line in m.group("body").splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    found.append((doc.relative_to(ROOT).as_posix(), line.strip()))
    return found


PLAIN = _commands("plain")
WIZARD = _commands("wizard")


def test_readme_marks_its_commands_runnable() -> None:
    """The markers are what keeps this test honest: README must keep using them."""
    readme = [cmd for doc, cmd in PLAIN + WIZARD if doc == "README.md"]
    assert any(cmd.startswith("blind-relay") for cmd in readme), readme
    assert any(cmd.startswith("cosmictui") for cmd in readme), readme
    assert WIZARD, "README's demo command is not marked <!-- runnable: wizard -->"


def _env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_STATE_HOME=str(home / ".local" / "state"),
        COLUMNS="100",
    )


@pytest.mark.parametrize(("doc", "command"), PLAIN, ids=[c for _, c in PLAIN])
def test_a_runnable_command_runs_as_shown(doc: str, command: str, tmp_path: Path) -> None:
    argv = shlex.split(command, comments=True)
    r = subprocess.run(argv, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    where = f"{doc}: `{command}` exited {r.returncode}\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-2000:]}"
    assert r.stdout.strip(), where
    if "--json" in argv:
        doc_json = json.loads(r.stdout)
        assert isinstance(doc_json, dict), where
        if r.returncode != 0:
            assert r.returncode in (1, 3) and doc_json.get("error") and doc_json.get("fix"), where
    else:
        assert r.returncode == 0, where


@pytest.mark.parametrize(("doc", "command"), WIZARD, ids=[c for _, c in WIZARD])
def test_a_runnable_wizard_command_draws_the_wizard_and_cleans_up(doc: str, command: str, tmp_path: Path) -> None:
    env = dict(_env(tmp_path), TERM="xterm-256color", COLUMNS="80", LINES="24")
    with on_pty(shlex.split(command, comments=True), env, cwd=tmp_path) as (proc, screen):
        try:
            deadline = time.monotonic() + 90
            while b"Prerequisites" not in b"".join(screen):
                assert proc.poll() is None, f"{doc}: `{command}` exited {proc.returncode}: {b''.join(screen)[-2000:]!r}"
                assert time.monotonic() < deadline, f"{doc}: `{command}` drew no wizard: {b''.join(screen)[-2000:]!r}"
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGHUP)  # a closed terminal: the wizard ends as on q
            assert proc.wait(timeout=60) == 128 + signal.SIGHUP
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    out = b"".join(screen).decode("utf-8", "replace")
    m = re.search(r"demo sandbox in (\S+)", out)
    if m:  # the demo removes its throwaway deployment, relay storage and DHT with it
        assert not Path(m.group(1)).exists(), f"{doc}: `{command}` left {m.group(1)} behind"
