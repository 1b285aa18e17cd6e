"""The wizard deploys the kernel path where the host allows it: its relay start and the systemd
unit it prints carry --kernel-forwarding (the unit granting exactly CAP_NET_ADMIN and AF_NETLINK);
without CAP_NET_ADMIN one plain line says why and the relay it starts forwards in Python."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cosmictui.ops import relayproc
from cosmictui.ops.config import ConfigError, Settings, load_settings
from cosmictui.ops.session import wanted_args
from cosmictui.ops.setup.install import install_plan

ROOT = Path(__file__).resolve().parents[2]
STORAGE = "/var/lib/blind-relay"
NO_NET_ADMIN = ["setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin", "--"]

# What the wizard does with its default settings, printed as JSON (run here and without CAP_NET_ADMIN).
WIZARD = """
import json
from cosmictui.ops import relayproc
from cosmictui.ops.config import Settings
from cosmictui.ops.session import wanted_args
from cosmictui.ops.setup.install import install_plan
s = Settings()
choice = relayproc.choose_kernel_forwarding(s.relay_kernel_forwarding)
print(json.dumps({
    "on": choice.on, "grants": choice.unit, "why": choice.why,
    "start": relayproc.relay_command("/var/lib/blind-relay", 49737, kernel_forwarding=s.relay_kernel_forwarding),
    "wanted": wanted_args(s, "/var/lib/blind-relay", 49737),
    "unit": install_plan(s, "/var/lib/blind-relay", 49737).unit.splitlines(),
}))
"""


def _host_can_manage_nftables() -> bool:
    """Found out apart from the code under test: the nft tool adds and deletes a table."""
    try:
        res = subprocess.run(
            ["nft", "-f", "-"],
            input="add table inet wizardprobe\ndelete table inet wizardprobe\n",
            capture_output=True,
            text=True,
        )
    except OSError:
        return False
    return res.returncode == 0


def _wizard(prefix: list[str]) -> dict[str, object]:
    res = subprocess.run(
        [*prefix, sys.executable, "-c", WIZARD], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_by_default_the_wizard_starts_and_installs_the_kernel_path_where_the_host_allows_it() -> None:
    can = _host_can_manage_nftables()
    got = _wizard([])
    assert got["on"] is can and got["grants"] is can
    assert ("--kernel-forwarding" in got["start"]) is can  # type: ignore[operator]
    assert ("--kernel-forwarding" in got["wanted"]) is can  # type: ignore[operator]
    unit = got["unit"]  # the unit Finish installs (a venv under /opt), as it renders it
    if can:
        assert "AmbientCapabilities=CAP_NET_ADMIN" in unit and "CapabilityBoundingSet=CAP_NET_ADMIN" in unit
        assert "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK" in unit
        assert any(line.startswith("ExecStart=") and "--kernel-forwarding" in line for line in unit)
    else:
        assert "forwards in Python" in str(got["why"])


def test_without_cap_net_admin_one_line_says_why_and_the_relay_forwards_in_python() -> None:
    host_has_nftables = _host_can_manage_nftables()
    got = _wizard(NO_NET_ADMIN)
    assert got["on"] is False
    assert "--kernel-forwarding" not in got["start"] and "--kernel-forwarding" not in got["wanted"]  # type: ignore[operator]
    why = str(got["why"])
    assert "\n" not in why and "forwards in Python" in why
    if host_has_nftables:  # only the capability is missing: that is what it says, and the unit grants it
        assert "CAP_NET_ADMIN" in why and got["grants"] is True
        unit = got["unit"]  # the unit Finish installs (a venv under /opt), as it renders it
        assert "AmbientCapabilities=CAP_NET_ADMIN" in unit and "CapabilityBoundingSet=CAP_NET_ADMIN" in unit


def test_the_config_decides_when_it_says_so() -> None:
    assert relayproc.choose_kernel_forwarding(False).on is False
    assert "--kernel-forwarding" not in wanted_args(Settings(relay_kernel_forwarding=False), STORAGE, 49737)
    assert "--kernel-forwarding" not in install_plan(Settings(relay_kernel_forwarding=False), STORAGE, 49737).unit
    assert relayproc.choose_kernel_forwarding(True).on is True
    assert "--kernel-forwarding" in wanted_args(Settings(relay_kernel_forwarding=True), STORAGE, 49737)


def test_kernel_forwarding_in_the_config_is_true_false_or_auto(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    for text, want in (("true", True), ("false", False), ('"auto"', None)):
        cfg.write_text(f"[relay]\nkernel_forwarding = {text}\n")
        assert load_settings(str(cfg)).relay_kernel_forwarding is want
    assert Settings().relay_kernel_forwarding is None  # unset: auto
    cfg.write_text("[relay]\nkernel_forwarding = 'yes'\n")
    try:
        load_settings(str(cfg))
    except ConfigError as e:
        assert '[relay] kernel_forwarding must be true, false or "auto"' in str(e)
    else:
        raise AssertionError("'yes' was taken")


def test_relay_status_says_which_path_carries_the_traffic() -> None:
    import io

    from cosmictui import cli
    from tests.unit._metrics_server import FakeRelayMetrics

    fake = FakeRelayMetrics()
    base = fake.stats
    try:
        kernel: dict[str, object] = {"enabled": True, "directions": 4}
        fake.stats = lambda: (
            base()
            | {  # type: ignore[method-assign]
                "kernel": kernel,
                "traffic": {"relayed_bytes": 1000, "kernel_bytes": 900},
            }
        )
        out = io.StringIO()
        assert cli.main(["relay", "status", "--metrics", fake.url, "--json"], out=out) == 0
        assert json.loads(out.getvalue())["forwarding"] == {
            "path": "kernel",
            "kernel_share": 0.9,
            "python_share": 0.1,
            "kernel_directions": 4,
            "reason": None,
        }
        out = io.StringIO()
        cli.main(["relay", "status", "--metrics", fake.url], out=out)
        assert "path     kernel 90% · Python 10% of relayed bytes · 4 ways now" in out.getvalue()
        kernel.clear()
        kernel.update(enabled=False, reason="the relay lacks CAP_NET_ADMIN")
        out = io.StringIO()
        cli.main(["relay", "status", "--metrics", fake.url, "--json"], out=out)
        doc = json.loads(out.getvalue())["forwarding"]
        assert doc["path"] == "python" and doc["python_share"] == 1.0 and "CAP_NET_ADMIN" in doc["reason"]
    finally:
        fake.close()
