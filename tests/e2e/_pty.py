"""A program on a pseudo-terminal, its screen bytes collected as it draws (for real-terminal tests)."""

from __future__ import annotations

import contextlib
import os
import pty
import subprocess
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path


@contextlib.contextmanager
def on_pty(
    argv: list[str], env: Mapping[str, str], cwd: Path | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], list[bytes]]]:
    """Start `argv` in its own session on a pty; yields the process and the chunks it wrote so far.

    A reader thread drains the pty (an app blocks on a full one). The caller ends the process;
    on the way out the pty is closed and the reader joined.
    """
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=dict(env), stdin=slave, stdout=slave, stderr=slave, start_new_session=True
    )
    os.close(slave)
    screen: list[bytes] = []

    def drain() -> None:
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 65536):
                screen.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        yield proc, screen
    finally:
        os.close(master)
        reader.join(timeout=5)
