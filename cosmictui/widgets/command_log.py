"""The command log: every command the wizard runs, where, its output and exit code.

Operators must be able to repeat by hand what the wizard did, so the log is plain text that
can be selected with the mouse or copied whole with one key.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field

from textual.app import ComposeResult
from textual.containers import Vertical

from cosmictui.ops.progress import CommandJournal
from cosmictui.widgets.output_log import OutputLog

MAX_LINES = 5000

#: An argument longer than this is shown folded (`'…870 chars…'`); the full text is in the saved log.
FOLD_ARG = 48


def fold_command(cmd: str) -> str:
    """`cmd` with its long arguments folded, so a 900-character `python3 -c '…'` is one short line.

    The program and the short arguments (host, port, a job id) stay: they say what ran.
    """
    try:
        words = shlex.split(cmd)
    except ValueError:
        words = None
    if words is None or len(cmd) <= 2 * FOLD_ARG:
        return cmd if len(cmd) <= 4 * FOLD_ARG else f"{cmd[:FOLD_ARG]}…({len(cmd)} chars)"
    shown = [shlex.quote(w) if len(w) <= FOLD_ARG else f"'…{len(w)} chars…'" for w in words]
    return " ".join(shown)


@dataclass
class CommandEntry:
    """One command the wizard ran (or is running)."""

    cmd: str
    where: str
    started: float = field(default_factory=time.time)
    exit_code: int | None = None
    output: list[str] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.exit_code is None


class CommandLog(Vertical):
    """A scrolling, selectable transcript of commands with their output."""

    DEFAULT_CLASSES = "command-log"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.entries: list[CommandEntry] = []
        #: The same log on disk (beside the progress file), when the wizard gives one.
        self.journal: CommandJournal | None = None
        self.border_title = "Command log"
        self.border_subtitle = "y copies it in full · l hide"
        #: what `y` copies: the lines as shown, but every command in full
        self.full_lines: list[str] = []

    def compose(self) -> ComposeResult:
        yield OutputLog(max_lines=MAX_LINES, id="command-log-text")

    @property
    def _log(self) -> OutputLog:
        return self.query_one("#command-log-text", OutputLog)

    def begin(self, cmd: str, where: str) -> CommandEntry:
        """Record that `cmd` started on `where` (a host or "local")."""
        entry = CommandEntry(cmd, where)
        self.entries.append(entry)
        self._write(f"$ {fold_command(cmd)}    [{where}]", f"$ {cmd}    [{where}]")
        return entry

    def _write(self, line: str, full: str | None = None) -> None:
        self._log.write_line(line)
        self.full_lines.append(line if full is None else full)
        if len(self.full_lines) > MAX_LINES:
            del self.full_lines[: len(self.full_lines) - MAX_LINES]

    def output(self, entry: CommandEntry, text: str) -> None:
        """Append output of a running command, line by line."""
        lines = text.splitlines() or [""]
        entry.output.extend(lines)
        for line in lines:
            self._write(f"  │ {line}")

    def end(self, entry: CommandEntry, exit_code: int, expected: str | None = None) -> None:
        """`expected` says why a non-zero exit is no failure (e.g. the relay does not run yet)."""
        entry.exit_code = exit_code
        mark = "ok" if exit_code == 0 else (f"expected: {expected}" if expected else "FAILED")
        self._write(f"  └ exit {exit_code} ({mark})")
        if self.journal is not None:
            self.journal.command(entry.cmd, entry.where, entry.output, exit_code, mark, entry.started)

    def note(self, text: str) -> None:
        """A line that is not a command (file written, backup made) so the transcript is complete."""
        self._write(f"# {text}")
        if self.journal is not None:
            self.journal.note(text)

    def transcript(self, *, commands_only: bool = False) -> str:
        """The log as text: every command, with or without its output."""
        if commands_only:
            return "\n".join(e.cmd for e in self.entries) + ("\n" if self.entries else "")
        lines = self.full_lines
        return "\n".join(lines) + ("\n" if lines else "")
