"""The command log: every command the wizard runs, where, its output and exit code.

Operators must be able to repeat by hand what the wizard did, so the log is plain text that
can be selected with the mouse or copied whole with one key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from textual.app import ComposeResult
from textual.containers import Vertical

from cosmictui.ops.progress import CommandJournal
from cosmictui.widgets.output_log import OutputLog


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
        self.border_subtitle = "y copy · l hide"

    def compose(self) -> ComposeResult:
        yield OutputLog(max_lines=5000, id="command-log-text")

    @property
    def _log(self) -> OutputLog:
        return self.query_one("#command-log-text", OutputLog)

    def begin(self, cmd: str, where: str) -> CommandEntry:
        """Record that `cmd` started on `where` (a host or "local")."""
        entry = CommandEntry(cmd, where)
        self.entries.append(entry)
        self._log.write_line(f"$ {cmd}    [{where}]")
        return entry

    def output(self, entry: CommandEntry, text: str) -> None:
        """Append output of a running command, line by line."""
        lines = text.splitlines() or [""]
        entry.output.extend(lines)
        self._log.write_lines(f"  │ {line}" for line in lines)

    def end(self, entry: CommandEntry, exit_code: int, expected: str | None = None) -> None:
        """`expected` says why a non-zero exit is no failure (e.g. the relay does not run yet)."""
        entry.exit_code = exit_code
        mark = "ok" if exit_code == 0 else (f"expected: {expected}" if expected else "FAILED")
        self._log.write_line(f"  └ exit {exit_code} ({mark})")
        if self.journal is not None:
            self.journal.command(entry.cmd, entry.where, entry.output, exit_code, mark, entry.started)

    def note(self, text: str) -> None:
        """A line that is not a command (file written, backup made) so the transcript is complete."""
        self._log.write_line(f"# {text}")
        if self.journal is not None:
            self.journal.note(text)

    def transcript(self, *, commands_only: bool = False) -> str:
        """The log as text: every command, with or without its output."""
        if commands_only:
            return "\n".join(e.cmd for e in self.entries) + ("\n" if self.entries else "")
        lines = self._log.plain_lines
        return "\n".join(lines) + ("\n" if lines else "")
