"""Settings: seed defaults, TOML file, overrides, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosmictui.ops.config import ConfigError, Settings, load_settings


def test_defaults_are_the_seed_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no default file there
    s = load_settings()
    assert s.env_var == "K8S_COMMON_CONFIG__interconnect__relays"
    assert s.apply_command == "task apply-wrk-server-k8s-nvidia-common-config"
    assert s.restart_command == 'task restart SERVICES="cosmicac-wrk-server-k8s-nvidia"'
    assert s.list_command == "cosmicac jobs list" and s.delete_command == "cosmicac jobs delete {id}"
    # create is unknown by default: the seed page documents only list and delete
    assert s.create_command == "" and s.test_job_command == ""
    assert s.statuses.classify("Creating") == "stuck" and s.statuses.classify("Pulling") == "unknown"
    assert (s.relay_storage, s.relay_port, s.relay_metrics) == ("/var/lib/blind-relay", 49737, "127.0.0.1:49738")
    assert s.metrics_url == "http://127.0.0.1:49738" and s.config_path is None


def test_toml_then_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "cosmictui" / "config.toml"
    cfg.parent.mkdir()
    cfg.write_text(
        'deployment = "ssh://ops@gpu/opt/cosmicac"\n'
        "[commands]\n"
        'list = "cosmicac jobs list --json"\n'
        'env = { PATH = "/opt/bin:/usr/bin" }\n'
        "[relay]\n"
        "port = 50000\n"
        'bootstrap = ["10.0.0.1:49737"]\n'
        'metrics = "off"\n'
        "kernel_forwarding = true\n"
        "[jobs]\n"
        "stuck_after = 60\n"
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    s = load_settings()  # the default file is picked up
    assert s.deployment == "ssh://ops@gpu/opt/cosmicac" and s.list_command == "cosmicac jobs list --json"
    assert s.command_env == {"PATH": "/opt/bin:/usr/bin"}
    assert s.relay_port == 50000 and s.relay_bootstrap == ("10.0.0.1:49737",) and s.metrics_url is None
    assert s.stuck_after == 60.0 and s.config_path == str(cfg) and s.relay_kernel_forwarding is True
    o = load_settings(cfg, relay_port="50001", deployment=None, relay_bootstrap="a:1,b:2")
    assert o.relay_port == 50001 and o.deployment == "ssh://ops@gpu/opt/cosmicac"
    assert o.relay_bootstrap == ("a:1", "b:2")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[relay]\nport = 'many'\n", "[relay] port must be a whole number"),
        ("[relay]\ncolour = 1\n", "unknown key [relay] colour"),
        ("[relay]\nkernel_forwarding = 'yes'\n", '[relay] kernel_forwarding must be true, false or "auto"'),
        ("nonsense = 1\n", "unknown key nonsense"),
        ("[relay\n", "not valid TOML"),
    ],
)
def test_bad_config_files(tmp_path: Path, text: str, words: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=words.replace("[", r"\[")):
        load_settings(cfg)


def test_missing_explicit_config_and_unknown_override(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="unknown override"):
        Settings().with_overrides(relay_colour="blue")
