"""Step 1 checks the deployment contract with the REAL go-task binary (PyPI go-task-bin) against a
real Taskfile, locally and over SSH to a REAL OpenSSH server; `cosmicac` stand-ins on PATH."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from cosmictui.ops.config import Settings
from cosmictui.ops.runner import LocalRunner, open_deployment
from cosmictui.ops.setup.checks import check_jobs_cli, check_tasks
from tests.e2e._openssh import OpenSSH, openssh  # noqa: F401  (the fixture)
from tests.e2e._wizard_support import make_app, make_bin, path_with, status, step, wait_status, wait_until

TASK_BIN = Path(sys.executable).parent / "task"  # installed by the test extra's go-task-bin
TASKFILE = """\
version: '3'
tasks:
  apply-wrk-server-k8s-nvidia-common-config:
    desc: Render and apply the common config
    cmds:
      - echo applied
  restart:
    cmds:
      - echo "restarting {{.SERVICES}}"
"""
JOBS = "ID        STATUS    NAME\njob-001   Running   notebook\n\n1 job\n"


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _deployment(tmp_path: Path, *, taskfile: str | None = TASKFILE, cosmicac: str | None = None) -> tuple[Path, Path]:
    """A deployment dir (Taskfile) and a bin dir with the real `task` and a `cosmicac` stand-in."""
    assert TASK_BIN.exists(), "go-task-bin is not installed (it is in the test extra)"
    d = tmp_path / "deploy"
    d.mkdir()
    if taskfile is not None:
        (d / "Taskfile.yml").write_text(taskfile)
    scripts = {"cosmicac": cosmicac if cosmicac is not None else f"printf '{JOBS}'\n"}
    bin_dir = make_bin(tmp_path / "tools", scripts)
    (bin_dir / "task").symlink_to(TASK_BIN)
    return d, bin_dir


def _settings(d: Path | str, bin_dir: Path | None, **kw: object) -> Settings:
    return Settings(deployment=str(d), command_env={"PATH": path_with(bin_dir)}, **kw)  # type: ignore[arg-type]


async def test_real_task_knows_both_tasks_and_cosmicac_lists(tmp_path: Path) -> None:
    d, bin_dir = _deployment(tmp_path)
    runner = LocalRunner(str(d), env={"PATH": path_with(bin_dir)})
    tasks = await check_tasks(runner, Settings())
    assert tasks.status == "ok" and "task --list-all" in tasks.detail, tasks
    assert "apply-wrk-server-k8s-nvidia-common-config, restart found" in tasks.detail
    jobs = await check_jobs_cli(runner, Settings())
    assert jobs.status == "ok" and "listed 1 job(s)" in jobs.detail, jobs  # "1 job" is a footer, not a job


async def test_real_task_missing_a_task_name_fails_naming_it(tmp_path: Path) -> None:
    only_apply = TASKFILE.split("  restart:")[0]
    d, bin_dir = _deployment(tmp_path, taskfile=only_apply)
    result = await check_tasks(LocalRunner(str(d), env={"PATH": path_with(bin_dir)}), Settings())
    assert result.status == "fail" and "has no task restart" in result.detail, result
    assert "[commands] apply and restart" in result.fix


async def test_real_task_without_a_taskfile_and_task_missing(tmp_path: Path) -> None:
    d, bin_dir = _deployment(tmp_path, taskfile=None)
    result = await check_tasks(LocalRunner(str(d), env={"PATH": path_with(bin_dir)}), Settings())
    assert result.status == "fail" and "found no Taskfile" in result.detail, result
    assert "--deployment PATH" in result.fix and "deployment = " in result.fix, result  # a flag and a config key
    no_task = make_bin(tmp_path / "empty", {"cosmicac": "true\n"})
    result = await check_tasks(LocalRunner(str(d), env={"PATH": path_with(no_task)}), Settings())
    assert result.status == "fail" and "`task` (go-task) is not on PATH" in result.detail, result
    assert "[commands] env PATH" in result.fix


async def test_a_go_task_without_json_is_asked_for_its_plain_listing(tmp_path: Path) -> None:
    """An older go-task has no --json (it prints `unknown flag` and its usage, which names Taskfiles);
    its plain `task --list-all` is asked next. The real binary lists a Taskfile one directory up, as
    go-task finds it from the deployment directory; reading `<root>/Taskfile.yml` ourselves cannot."""
    d, bin_dir = _deployment(tmp_path)
    sub = d / "services"
    sub.mkdir()
    (bin_dir / "task").unlink()
    old_task = (
        'for a in "$@"; do if [ "$a" = "--json" ]; then\n'
        '  echo "unknown flag: --json" >&2; echo "Usage: task [flags...] [task...] (looks for a Taskfile)" >&2\n'
        f'  exit 1; fi; done\nexec {TASK_BIN} "$@"\n'
    )
    make_bin(tmp_path / "tools", {"task": old_task})
    result = await check_tasks(LocalRunner(str(sub), env={"PATH": path_with(bin_dir)}), Settings())
    assert result.status == "ok", result
    assert "apply-wrk-server-k8s-nvidia-common-config, restart found (task --list-all on" in result.detail


async def test_a_taskfile_go_task_cannot_parse_fails_with_its_words(tmp_path: Path) -> None:
    """The real go-task refuses a Taskfile with a YAML error; the check says so (it passed by reading
    the task names itself, so step 1 ticked a deployment whose apply could never run)."""
    d, bin_dir = _deployment(tmp_path, taskfile=TASKFILE.replace("      - echo applied", "      - [echo applied"))
    result = await check_tasks(LocalRunner(str(d), env={"PATH": path_with(bin_dir)}), Settings())
    assert result.status == "fail", result
    assert "cannot read the Taskfile" in result.detail and "yaml: line" in result.detail, result
    assert f"fix the Taskfile in {d}" in result.fix, result


@pytest.mark.parametrize(
    ("script", "words"),
    [
        (None, "`cosmicac` is not installed or not on PATH"),
        ("echo 'Error: not logged in. Run the login command first.' >&2; exit 1\n", "is not logged in"),
        ("echo '401 Unauthorized' >&2; exit 4\n", "is not logged in"),
        ("echo '<html>502</html>'\n", "Cannot read the jobs list"),
    ],
)
async def test_cosmicac_missing_or_not_logged_in(tmp_path: Path, script: str | None, words: str) -> None:
    d, bin_dir = _deployment(tmp_path, cosmicac=script or "true\n")
    if script is None:
        (bin_dir / "cosmicac").unlink()
    result = await check_jobs_cli(LocalRunner(str(d), env={"PATH": path_with(bin_dir)}), Settings())
    assert result.status == "fail" and words in result.detail, result


async def test_wizard_step1_with_missing_task_fails_and_next_is_refused(tmp_path: Path) -> None:
    d, bin_dir = _deployment(tmp_path)
    (bin_dir / "task").unlink()
    app = make_app(_settings(d, bin_dir, relay_storage=str(tmp_path / "relay")))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_status(pilot, app, "prereqs", ("error",), timeout=60)
        rows = [r.text for r in step(app, "prereqs").query("CheckRow")]
        assert any(r.startswith("✘ FAIL Taskfile tasks") and "not on PATH" in r for r in rows), rows
        assert any(r.startswith("✔ ok Jobs can be listed") for r in rows), rows
        await pilot.press("n")
        assert app.screen.index == 0 and "Taskfile tasks" in status(app, "prereqs")


async def test_contract_over_real_openssh_and_a_dropped_connection_reconnects(
    tmp_path: Path,
    openssh: OpenSSH,  # noqa: F811
) -> None:
    d, bin_dir = _deployment(tmp_path)
    settings = _settings(
        openssh.spec(d),
        bin_dir,
        ssh_known_hosts=str(openssh.known_hosts),
        ssh_identity=(str(openssh.client_key),),
        relay_storage=str(tmp_path / "relay"),
    )
    runner = await open_deployment(
        settings.deployment,
        env=settings.command_env,
        known_hosts=settings.ssh_known_hosts,
        client_keys=list(settings.ssh_identity),
    )
    try:
        tasks = await check_tasks(runner, settings)
        assert tasks.status == "ok" and f"on {runner.label}" in tasks.detail, tasks
        assert (await check_jobs_cli(runner, settings)).status == "ok"
    finally:
        await runner.close()

    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_status(pilot, app, "prereqs", ("ok", "warn", "error"), timeout=90)
        rows = [r.text for r in step(app, "prereqs").query("CheckRow")]
        assert any(r.startswith("✔ ok Taskfile tasks") for r in rows), rows
        assert any(r.startswith("✔ ok Jobs can be listed") for r in rows), rows
        ctx = app.screen.ctx
        first = await ctx.deployment()
        assert openssh.drop_sessions() >= 1  # the SSH connection drops under the wizard
        await wait_until(pilot, lambda: first.lost, "the client to notice the drop", timeout=30)
        started = time.monotonic()
        await pilot.press("r")  # the next action connects again, with a plain message
        await wait_status(pilot, app, "prereqs", ("ok", "warn", "error"), timeout=90)
        assert time.monotonic() - started < 90
        rows = [r.text for r in step(app, "prereqs").query("CheckRow")]
        assert any(r.startswith("✔ ok Taskfile tasks") for r in rows), rows
        assert not any("Unexpected error" in r for r in rows)
        titles = [(n.title, n.message) for n in app._notifications]
        assert any("was lost; the next action connects again" in m for _, m in titles), titles
        assert any(m.startswith("Connected to") and "again" in m for _, m in titles), titles
        assert await ctx.deployment() is not first
