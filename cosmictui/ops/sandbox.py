"""The demo sandbox: a throwaway CosmicAC deployment that behaves like the real one.

`create_sandbox()` makes a deployment directory with a real `.env` (the relays variable
absent), and sandbox `task` and `cosmicac` executables in its `bin/` that simulate the
worker: `task apply-...` copies the relays from `.env` into the worker config, `task
restart ...` records the restart time, jobs created after a restart carry the applied
relays, and a job leaves `Creating` only when a relay with one of its keys answers a dht-rpc
PING at the address its runtime file gives. Jobs created before are seeded stuck.
The sandbox runs the real Python relay.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cosmictui.ops.config import Settings

STATE_FILE = "sandbox-state.json"


@dataclass(frozen=True)
class Sandbox:
    root: Path
    deployment: Path
    bin_dir: Path
    relay_storage: Path
    settings: Settings

    @property
    def env_path(self) -> Path:
        return self.deployment / ".env"

    @property
    def state_path(self) -> Path:
        return self.deployment / STATE_FILE


def create_sandbox(
    root: str | Path | None = None,
    *,
    relay_port: int | None = None,
    metrics_port: int | None = None,
    bootstrap: tuple[str, ...] = (),
    seed_jobs: bool = True,
) -> Sandbox:
    """Create (or reuse) a sandbox under `root` (default: a new temp dir)."""
    raise NotImplementedError
