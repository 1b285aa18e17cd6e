from __future__ import annotations

import subprocess
import sys


def test_relay_help_lists_the_blind_relay_flags() -> None:
    out = subprocess.run([sys.executable, "-m", "relay", "--help"], capture_output=True, text=True, check=True).stdout
    for flag in ("--storage", "--port", "--host", "--bootstrap"):
        assert flag in out
