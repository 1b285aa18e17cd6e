"""How messages to the operator are worded: sentences glued from parts, and the fix for a failed
deployment command. A leaf module (no other ops import), so every use case can share one wording.
"""

from __future__ import annotations

import re
import shlex
from contextvars import ContextVar

#: Where the operator finds a failed command's output, said in the generic fix: the wizard sets
#: its command-log key; a headless command prints the output itself, so it names no key.
OUTPUT_SHOWN_IN: ContextVar[str] = ContextVar("output_shown_in", default="")


def sentence(text: str) -> str:
    """`text` as one sentence: stripped, ending in . ! or ? (messages are glued from parts)."""
    text = text.strip()
    return text if not text or text[-1] in ".!?" else text + "."


def sentences(*parts: str | None) -> str:
    """Parts of a message as sentences separated by ". ": "…characters) Nothing" never again."""
    return " ".join(sentence(p) for p in parts if p and p.strip())


def command_failure_hint(cmd: str, exit_code: int, output: str, retry: str = "then try again") -> str:
    """How to fix a failed deployment command, from its exit code and output."""
    prog = (shlex.split(cmd) or [cmd])[0] if cmd.strip() else cmd
    low = output.lower()
    if exit_code == 127 or "command not found" in low or re.search(rf"\b{re.escape(prog)}: not found", low):
        return (
            f"`{prog}` was not found on the deployment host: install it, put it on PATH "
            "([commands] env PATH in the config), or set the command in the config."
        )
    if exit_code == 126 or "permission denied" in low:
        return f"`{prog}` could not run (permission denied): check its mode and the user the wizard connects as."
    if "does not exist" in low and prog == "task":
        return (
            "The Taskfile has no such task: check the deployment directory and the apply/restart "
            "commands in the config."
        )
    where = OUTPUT_SHOWN_IN.get()
    return f"Read its output{f' ({where})' if where else ''}, fix the cause on the deployment host, {retry}."
