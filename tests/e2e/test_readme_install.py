"""README starts with the two commands for a fresh machine, and the first works in a fresh clone.

The clone holds only what git tracks, so a module or data file that exists in a working tree but
was never committed breaks this, not an operator's install. The install runs as README writes it,
with the dependencies taken from this test run's environment instead of the package index
(`--no-deps --no-build-isolation --no-index`, this environment's site-packages named by a `.pth`
file, and first on the path while pip builds): what is tested is the clone, its build and its
entry points, not the index.
"""

from __future__ import annotations

import os
import re
import signal
import site
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e._pty import on_pty

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text("utf-8")
BLOCK = re.compile(r"^```sh\n(.*?)\n```", re.S | re.M)
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/cosmictui"


def test_readme_starts_with_the_install_and_the_suite_commands_and_ci_runs_the_second() -> None:
    first, second = BLOCK.findall(README)[:2]
    assert first == INSTALL
    assert second.startswith("python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]'") and "pytest" in second
    ci = [line for line in (ROOT / ".ci" / "run").read_text("utf-8").splitlines() if line.startswith("python3 ")]
    assert ci == [second], ".ci/run must run README's test command as written"
    assert README.index(first) < README.index("## "), "the commands come before the first section"


def test_readme_install_command_works_in_a_fresh_clone(tmp_path: Path) -> None:
    clone = tmp_path / "cosmictui"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    make_venv, install, start = INSTALL.split(" && ")
    subprocess.run(make_venv.split(), cwd=clone, check=True, timeout=120)
    fresh = clone / ".venv" / "bin" / "python"
    minor = subprocess.run(
        [fresh, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert minor == str(sys.version_info[:2]), "python3 is not the Python this suite runs on"
    target = Path(
        subprocess.run(
            [fresh, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (target / "suite-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # the build backend too comes from this environment (the venv's own setuptools may be older)
    build_env = dict(os.environ, PYTHONPATH=os.pathsep.join(site.getsitepackages()))
    r = subprocess.run(
        [*install.split(), "--no-deps", "--no-build-isolation", "--no-index"],
        cwd=clone,
        env=build_env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]

    version = subprocess.run([clone / ".venv/bin/blind-relay", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("blind-relay"), version

    home = tmp_path / "home"
    home.mkdir()
    env = dict(
        os.environ,
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_STATE_HOME=str(home / ".local" / "state"),
        TERM="xterm-256color",
        COLUMNS="80",
        LINES="24",
    )
    with on_pty([str(clone / start)], env, cwd=clone) as (proc, screen):
        try:
            deadline = time.monotonic() + 90
            while b"Prerequisites" not in b"".join(screen):
                assert proc.poll() is None, f"the wizard exited {proc.returncode}: {b''.join(screen)[-2000:]!r}"
                assert time.monotonic() < deadline, f"no wizard drawn: {b''.join(screen)[-2000:]!r}"
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGHUP)  # a closed terminal: the wizard ends and removes its demo
            assert proc.wait(timeout=60) == 128 + signal.SIGHUP
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
