"""What quitting the wizard leaves running: the relay named, and the right way to stop it."""

from __future__ import annotations

from pathlib import Path

from cosmictui.ops.config import Settings
from cosmictui.ops.setup.leaving import left_running, resume_command, systemd_unit


def _cgroup(proc: Path, pid: int, text: str) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(text)


def test_the_service_that_runs_a_pid_is_read_from_its_cgroup(tmp_path: Path) -> None:
    _cgroup(tmp_path, 10, "0::/system.slice/blind-relay.service\n")
    _cgroup(tmp_path, 11, "0::/user.slice/user-0.slice/session-3.scope\n")  # started from a shell
    _cgroup(tmp_path, 12, "12:pids:/system.slice/blind-relay.service\n1:name=systemd:/system.slice/x.service\n")
    _cgroup(tmp_path, 13, "0::/\n")  # a container: nothing to tell
    assert systemd_unit(10, tmp_path) == "blind-relay.service"
    assert systemd_unit(11, tmp_path) is None
    assert systemd_unit(12, tmp_path) == "blind-relay.service"
    assert systemd_unit(13, tmp_path) is None
    assert systemd_unit(14, tmp_path) is None  # gone


def test_nothing_is_said_when_nothing_stays_here(tmp_path: Path) -> None:
    s = Settings(deployment="/srv/cosmicac")
    storage = str(tmp_path / "no-relay")
    assert left_running(s, storage, external=False, demo=False, resume_at="step 2") is None  # none runs
    assert left_running(s, storage, external=True, demo=False, resume_at="step 2") is None  # runs elsewhere
    assert left_running(s, storage, external=False, demo=True, resume_at="step 2") is None  # goes with the demo


def test_the_resume_command_names_the_deployment_and_the_config() -> None:
    assert resume_command(Settings(deployment="/srv/my deploy")) == "cosmictui --deployment '/srv/my deploy'"
    with_config = Settings(deployment="ssh://ops@h/opt/c", config_path="/etc/c.toml")
    assert resume_command(with_config) == "cosmictui --deployment ssh://ops@h/opt/c --config /etc/c.toml"
