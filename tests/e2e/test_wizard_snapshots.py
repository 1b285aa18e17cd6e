"""Layout snapshots of every wizard step at 80×24 (the size of a default tmux pane).

Run `pytest tests/e2e/test_wizard_snapshots.py --snapshot-update` after a deliberate layout
change and look at the SVGs. Everything shown must be reproducible, so the deployment lives at
a fixed path, the clock is fixed for job ages, the scripted tools print fixed text, and step 1
is fed fixed check results (its live checks are exercised in test_wizard_prereqs_relay.py).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.pilot import Pilot

from cosmictui.app import WizardApp
from cosmictui.ops.config import Settings
from cosmictui.ops.session import WizardContext
from cosmictui.ops.setup.checks import CheckResult
from cosmictui.screens.confirm import ConfirmScreen
from tests.e2e._wizard_support import (
    ENV_VAR,
    KEY,
    OTHER_KEY,
    make_bin,
    path_with,
    relay_running,
    resume_at,
    step,
    still,
    wait_status,
    wait_until,
)

T = 1_800_000_000.0  # the fixed "now": 2027-01-15 08:00:00 UTC
SIZE = (80, 24)

JOBS_TABLE = """\
ID          NAME               TYPE       GPUS   STATUS     AGE     LAST UPDATE
job-7f3a21  llama-3-70b-serve  inference  4      Creating   3h12m   3h11m ago
job-19c0de  shell-a100         instance   1      Starting   47m     41m ago
job-03be77  batch-embed        inference  2      Completed  2d      1d ago
job-5d2e90  llama-3-8b-test    inference  1      Running    20s     just now
"""


@pytest.fixture
def root(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A deployment at a fixed path (it appears on screen), removed afterwards."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    base = Path(tempfile.gettempdir()) / "cosmictui-snap" / request.node.name.split("[")[0].removeprefix("test_")
    shutil.rmtree(base, ignore_errors=True)
    monkeypatch.setenv("XDG_STATE_HOME", str(base / "state"))  # on screen (the recovery folder): fixed
    (base / "deploy").mkdir(parents=True)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
        monkeypatch.undo()
        time.tzset()


def _app(root: Path, resume: str | None, **settings: object) -> WizardApp:
    deploy = root / "deploy"
    if resume:
        resume_at(str(deploy), resume, relay_key=KEY, relay_storage=str(root / "relay"), restarted_at=T - 60)
    # Metrics off: a relay another test runs on the default port must not show up in the picture.
    settings.setdefault("relay_metrics", "off")
    settings.setdefault("create_command", "cosmicac jobs create --name {name} --type {type} --gpus {gpus}")
    s = Settings(deployment=str(deploy), relay_storage=str(root / "relay"), poll_interval=3600, **settings)  # type: ignore[arg-type]
    return WizardApp(WizardContext(s, clock=lambda: T, relay_check=relay_running))


async def _ready(pilot: Pilot[object], resumed: bool = True) -> None:
    app = pilot.app
    if resumed:  # "Resumed at step N" would cover part of the step: let it arrive, then clear it
        await wait_until(pilot, lambda: bool(app.screen.query("Toast")), "the resume toast")
        app.clear_notifications()
        await wait_until(pilot, lambda: not app.screen.query("Toast"), "the toast to go")
    app.screen.query_one("#next").focus()  # no blinking cursor in the picture
    await still(pilot)


def test_wizard_snapshot_step1_prerequisites(root: Path, snap_compare, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    results = [
        CheckResult("Relay runs here", "ok", "Python relay 0.1.0; Ed25519 + Noise XX self-test passed"),
        CheckResult("UDP port 49737", "fail", "held by pid 4242 (node)", "stop it, or choose another port"),
        CheckResult("Free memory", "ok", "3120 MB available (the relay needs up to 200 MB)"),
        CheckResult("Storage directory", "warn", "./corestore is relative", "use /var/lib/blind-relay"),
        CheckResult("DHT reachable, port open", "warn", "not known until the relay runs", "start the relay"),
        CheckResult("Deployment host reachable", "ok", "localhost: /srv/cosmicac"),
    ]

    async def fixed(*_a: object, **_k: object) -> list[CheckResult]:
        return results

    monkeypatch.setattr("cosmictui.screens.step_prereqs.gather_checks", fixed)

    async def run_before(pilot: Pilot[object]) -> None:
        await wait_status(pilot, pilot.app, "prereqs", ("error",))  # type: ignore[arg-type]
        await _ready(pilot, resumed=False)

    assert snap_compare(_app(root, None), terminal_size=SIZE, run_before=run_before)


def test_wizard_snapshot_step2_relay(root: Path, snap_compare) -> None:  # type: ignore[no-untyped-def]
    async def run_before(pilot: Pilot[object]) -> None:
        await wait_status(pilot, pilot.app, "relay", ("info",))  # type: ignore[arg-type]
        await _ready(pilot)

    assert snap_compare(_app(root, "relay"), terminal_size=SIZE, run_before=run_before)


def test_wizard_snapshot_step3_env_diff(root: Path, snap_compare) -> None:  # type: ignore[no-untyped-def]
    (root / "deploy" / ".env").write_text(f"# CosmicAC\nCOSMICAC_ENV=prod\n{ENV_VAR}='[\"{OTHER_KEY}\"]'\nZ=1\n")

    async def run_before(pilot: Pilot[object]) -> None:
        await wait_status(pilot, pilot.app, "env", ("info",))  # type: ignore[arg-type]
        await _ready(pilot)

    assert snap_compare(_app(root, "env"), terminal_size=SIZE, run_before=run_before)


def test_wizard_snapshot_step4_apply_failed(root: Path, snap_compare) -> None:  # type: ignore[no-untyped-def]
    task = 'echo "task: [$1] kubectl apply -f build/common-config.yaml"\n'
    task += 'echo "error: the server has asked for the client to provide credentials" >&2\nexit 1\n'
    bin_dir = make_bin(root, {"task": task})

    async def run_before(pilot: Pilot[object]) -> None:
        await pilot.press("r")
        await wait_status(pilot, pilot.app, "apply", ("error",))  # type: ignore[arg-type]
        await _ready(pilot)

    app = _app(root, "apply", command_env={"PATH": path_with(bin_dir)})
    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def _cosmicac(root: Path) -> dict[str, str]:
    bin_dir = make_bin(root, {"cosmicac": f"cat <<'EOF'\n{JOBS_TABLE}EOF\n"})
    return {"PATH": path_with(bin_dir)}


def test_wizard_snapshot_step5_verify(root: Path, snap_compare) -> None:  # type: ignore[no-untyped-def]
    async def run_before(pilot: Pilot[object]) -> None:
        await wait_status(pilot, pilot.app, "verify", ("busy",))  # type: ignore[arg-type]
        await _ready(pilot)

    assert snap_compare(_app(root, "verify", command_env=_cosmicac(root)), terminal_size=SIZE, run_before=run_before)


def test_wizard_snapshot_step6_recover_confirm(root: Path, snap_compare) -> None:  # type: ignore[no-untyped-def]
    async def run_before(pilot: Pilot[object]) -> None:
        app = pilot.app
        await wait_status(pilot, app, "recover", ("info",))  # type: ignore[arg-type]
        await _ready(pilot)
        step(app, "recover").query_one("#recover-jobs").focus()  # type: ignore[arg-type]
        await pilot.press("space", "d")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the confirmation")
        await pilot.pause()
        # At 80 columns each of these short commands is one line of the dialog, under its own $.
        rows = list(app.screen.query(".confirm-command-text"))
        assert len(rows) == 2 and all(r.size.height == 1 for r in rows)
        await still(pilot)

    assert snap_compare(_app(root, "recover", command_env=_cosmicac(root)), terminal_size=SIZE, run_before=run_before)
