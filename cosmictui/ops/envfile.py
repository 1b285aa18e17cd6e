"""Edit the relays variable in a deployment's `.env` without touching anything else.

The file is read with python-dotenv's parser (the same rules the deployment's tooling
applies), but written by splicing: only the one assignment of the relays variable is
replaced (or appended), every other byte stays as it was — CRLF, comments, `export `,
quoting, a missing final newline. When the file is not something we can edit safely we
raise `EnvFileError` with the line and the fix, and write nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cosmictui.ops.config import ENV_VAR

Mode = Literal["merge", "replace"]


class EnvFileError(ValueError):
    """The `.env` cannot be edited safely: what is wrong, on which line, how to fix it."""

    def __init__(self, problem: str, line: int | None = None, fix: str = "", path: str = ".env") -> None:
        self.problem = problem
        self.line = line
        self.fix = fix
        self.path = path
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {problem}" + (f" — {fix}" if fix else ""))


@dataclass(frozen=True)
class EnvPlan:
    """What setting the relays would do: whole old and new text, keys, and a unified diff."""

    old: str
    new: str
    diff: str
    old_keys: tuple[str, ...]
    new_keys: tuple[str, ...]
    line: int  # 1-based line of the assignment in the new text

    @property
    def changed(self) -> bool:
        return self.old != self.new


def decode_text(data: bytes) -> str:
    """Bytes of a `.env` as text that encodes back to the very same bytes."""
    raise NotImplementedError


def encode_text(text: str) -> bytes:
    """Inverse of `decode_text`."""
    raise NotImplementedError


def normalize_key(key: str) -> str:
    """A relay key as z32 (accepts z32 or 64 hex chars); ValueError with why otherwise."""
    raise NotImplementedError


def read_relays(text: str, var: str = ENV_VAR, path: str = ".env") -> tuple[str, ...]:
    """The relay keys currently set (empty when the variable is absent or empty)."""
    raise NotImplementedError


def plan_relays(
    text: str, key: str | list[str], mode: Mode = "merge", var: str = ENV_VAR, path: str = ".env"
) -> EnvPlan:
    """Plan setting `var='["<key>", ...]'`: merge into the existing array or replace it."""
    raise NotImplementedError
