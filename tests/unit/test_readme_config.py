"""README's config.toml example is read by the real loader: every key in it exists in code."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from cosmictui.ops.config import _TOML_KEYS, CREATE_FIELDS, load_settings
from cosmictui.ops.jobs.recover import unfilled

README = Path(__file__).resolve().parents[2] / "README.md"


def _example() -> str:
    text = README.read_text("utf-8")
    section = text[text.index("### Configuration (`config.toml`)") :]
    m = re.search(r"```toml\n(.*?)```", section, re.S)
    assert m, "README's configuration section has no ```toml block"
    return m.group(1)


def test_readme_config_example_loads_with_the_real_loader(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(_example())
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


def test_readme_example_covers_every_section_the_loader_reads() -> None:
    data = tomllib.loads(_example())
    shown = {
        (k if isinstance(v, dict) else None, sk if isinstance(v, dict) else k)
        for k, v in data.items()
        for sk in (v if isinstance(v, dict) else [k])
    }
    missing = sorted(f"[{sec}] {key}" if sec else key for sec, key in set(_TOML_KEYS) - shown)
    assert missing == []
