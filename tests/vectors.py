"""Loads the test vectors made by the real Node libraries (../shared/protocol/vectors)."""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def vectors_dir() -> Path:
    """Prefer shared/ beside the checkout (the team's reference), else the committed copy."""
    env = os.environ.get("COSMICTUI_VECTORS")
    if env:
        return Path(env)
    for base in (ROOT.parent / "shared", ROOT.parent.parent / "shared"):
        if (base / "protocol" / "vectors").is_dir():
            return base / "protocol" / "vectors"
    # A checkout without shared/ beside it uses the copy committed with the tests.
    return ROOT / "tests" / "data" / "vectors"


@cache
def load(name: str) -> Any:
    return json.loads((vectors_dir() / f"{name}.json").read_text())
