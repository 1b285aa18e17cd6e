"""Applying a planned `.env` change, with its read-back: one use case for the wizard and the CLI.

`write_plan` (envfile) writes atomically with a backup and refuses a file changed since it was
planned; this adds what an operator needs to trust it: the file read back from disk and the
relay keys it now holds, so "written" means "the key is there", not "a write call returned".
"""

from __future__ import annotations

from dataclasses import dataclass

from cosmictui.ops.runner import Runner
from cosmictui.ops.setup.envfile import EnvPlan, decode_text, read_relays, write_plan


@dataclass(frozen=True)
class AppliedPlan:
    path: str
    backup: str | None
    #: The relay keys in the file as read back after the write.
    keys: tuple[str, ...]
    key: str

    @property
    def key_present(self) -> bool:
        return self.key in self.keys

    def problem(self) -> str | None:
        """None when the read-back shows the key; else what to tell the operator."""
        if self.key_present:
            return None
        return f"Wrote {self.path}, but reading it back does not show the key {self.key[:12]}…: check the file."


async def apply_plan(runner: Runner, path: str, plan: EnvPlan, var: str, key: str) -> AppliedPlan:
    """Write `plan` (EnvFileError/RunnerError as `write_plan` raises them), then read it back."""
    backup = await write_plan(runner, path, plan)
    after = decode_text(await runner.read_file(path))
    return AppliedPlan(path, backup, tuple(read_relays(after, var, path)), key)
