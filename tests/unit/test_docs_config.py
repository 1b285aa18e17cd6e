"""The config.toml examples in docs/configuration.md and README are read by the real loader:
every key in them exists in code, and the full example shows every key the loader reads."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from cosmictui.ops.config import _TOML_KEYS, CREATE_FIELDS, load_settings
from cosmictui.ops.jobs.recover import unfilled

ROOT = Path(__file__).resolve().parents[2]


def _toml_blocks(doc: Path, marked: bool = False) -> list[str]:
    """The ```toml blocks of `doc` (only those after a `<!-- config -->` line when `marked`)."""
    prefix = r"<!-- config -->\n" if marked else ""
    return re.findall(prefix + r"```toml\n(.*?)```", doc.read_text("utf-8"), re.S)


def _full_example() -> str:
    blocks = _toml_blocks(ROOT / "docs" / "configuration.md")
    assert blocks, "docs/configuration.md has no ```toml block"
    return blocks[0]


def test_the_full_example_loads_with_the_real_loader(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(_full_example())
    s = load_settings(cfg)  # raises ConfigError on any key the loader does not know
    assert s.deployment == "ssh://ops@gpu-head.example.net:22/opt/cosmicac"
    assert s.ssh_known_hosts == "~/.ssh/known_hosts_cosmicac" and s.ssh_identity == ("~/.ssh/id_ed25519_cosmicac",)
    assert s.command_env["PATH"].startswith("/home/ops/.local/bin")
    assert s.relay_storage == "/var/lib/blind-relay" and s.relay_address == "203.0.113.10" and s.relay_bootstrap == ()
    assert s.test_job_command.startswith("cosmicac jobs create --name relay-check")
    assert s.statuses.classify("Creating") == "stuck" and s.statuses.classify("Running") == "done"
    assert s.statuses.classify("CrashLoopBackOff") == "failed"
    # The create template names exactly the documented fields.
    assert sorted(set(unfilled(s.create_command))) == sorted(CREATE_FIELDS)


def test_the_full_example_covers_every_key_the_loader_reads() -> None:
    data = tomllib.loads(_full_example())
    shown = {
        (k if isinstance(v, dict) else None, sk if isinstance(v, dict) else k)
        for k, v in data.items()
        for sk in (v if isinstance(v, dict) else [k])
    }
    missing = sorted(f"[{sec}] {key}" if sec else key for sec, key in set(_TOML_KEYS) - shown)
    assert missing == []


def test_every_marked_example_loads_with_the_real_loader(tmp_path: Path) -> None:
    """README's minimal config (and any other block marked `<!-- config -->`) is a working file."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    marked = [(doc, block) for doc in docs for block in _toml_blocks(doc, marked=True)]
    assert any(doc.name == "README.md" for doc, _ in marked), "README's config.toml is not marked <!-- config -->"
    for i, (doc, block) in enumerate(marked):
        cfg = tmp_path / f"config-{i}.toml"
        cfg.write_text(block)
        s = load_settings(cfg)
        assert s.deployment, f"{doc.name}: the example names no deployment"
