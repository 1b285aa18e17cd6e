"""Every fix text names something that exists: config keys the loader knows, flags the CLIs take.

Operators copy these words into their config or shell; a `pass --identity` that no command
takes (or a `[commands] creat` no loader reads) sends them nowhere.
"""

from __future__ import annotations

import re
import tokenize
from pathlib import Path

from cosmictui.cli import build_parser
from cosmictui.ops.config import _TOML_KEYS

ROOT = Path(__file__).resolve().parents[2]
OURS = [
    *sorted((ROOT / "cosmictui" / "ops").glob("*.py")),
    *sorted((ROOT / "cosmictui" / "screens").glob("step*.py")),
    ROOT / "cosmictui" / "screens" / "context.py",
]
CONFIG_REF = re.compile(r"\[(env|commands|relay|ssh|jobs)\]\s+([a-z_]+)")


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
    parser = build_parser()
    for action in parser._actions:  # cosmictui's own flags, every subcommand
        flags.update(o for o in action.option_strings if o.startswith("--"))
        for sub in getattr(action, "choices", None) or {}:
            sp = action.choices[sub]  # type: ignore[index]
            flags.update(o for a in sp._actions for o in a.option_strings if o.startswith("--"))
    bad = []
    for path in OURS:
        for text in _strings(path):
            for m in re.finditer(r"\bpass (--[a-z-]+)", text):
                if m.group(1) not in flags:
                    bad.append((path.name, m.group(0)))
    assert bad == []
