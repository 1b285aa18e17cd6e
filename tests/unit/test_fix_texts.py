"""Every fix text names something that exists: config keys the loader knows, flags the CLIs take.

Operators copy these words into their config or shell; a `pass --identity` that no command
takes (or a `[commands] creat` no loader reads) sends them nowhere.
"""

from __future__ import annotations

import argparse
import re
import tokenize
from pathlib import Path

from cosmictui.cli import build_parser
from cosmictui.ops.config import _TOML_KEYS

ROOT = Path(__file__).resolve().parents[2]
OURS = [
    *sorted((ROOT / "cosmictui" / "ops").rglob("*.py")),
    *sorted((ROOT / "cosmictui" / "cli").glob("*.py")),
    *sorted((ROOT / "cosmictui" / "screens").glob("*.py")),
]
CONFIG_REF = re.compile(r"\[(env|commands|relay|ssh|jobs|monitor)\]\s+([a-z_]+)")


def _strings(path: Path) -> list[str]:
    """The text of every string literal in a module (f-strings as written), from its tokens.

    Tokens, not `ast.parse`: CPython 3.11's AST constructor can fail spuriously ("recursion depth
    mismatch") late in a long test run, and a test must not flake for that.
    """
    kinds = {tokenize.STRING} | {getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    with open(path, "rb") as f:
        return [t.string for t in tokenize.tokenize(f.readline) if t.type in kinds]


def test_every_config_key_named_in_a_message_exists() -> None:
    named: set[tuple[str, str]] = set()
    for path in OURS:
        for text in _strings(path):
            named.update(CONFIG_REF.findall(text))
    assert named, "the scan found no config references at all"
    unknown = sorted(f"[{s}] {k}" for s, k in named if (s, k) not in _TOML_KEYS)
    assert unknown == []


def test_no_fix_text_names_a_flag_that_no_command_takes() -> None:
    flags = {"--storage", "--port", "--host", "--bootstrap", "--metrics", "--allow", "--systemd-unit", "--help"}
    parsers = [build_parser()]
    while parsers:  # cosmictui's own flags, every subcommand at any depth (jobs recover, relay probe)
        for action in parsers.pop()._actions:
            flags.update(o for o in action.option_strings if o.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
    bad = []
    for path in OURS:
        for text in _strings(path):
            for m in re.finditer(r"\bpass (--[a-z-]+)", text):
                if m.group(1) not in flags:
                    bad.append((path.name, m.group(0)))
    assert bad == []
