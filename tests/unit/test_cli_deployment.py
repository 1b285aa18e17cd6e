"""`cosmictui env set-relay` and `cosmictui jobs` against a real local deployment directory:
the file edits and the commands run are real; only `cosmicac` is a scripted stand-in."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from cosmictui import cli
from tests.e2e._wizard_support import install_cosmicac, make_bin, seed_jobs

VAR = "K8S_COMMON_CONFIG__interconnect__relays"
KEY_A = "rm3o6uqaafhhquc38k16r9qyuok8g8q8b5bcntmeofb6rm789miy"
KEY_B = "q17xbmsgqfzt149hza6tay7qjguz1ra98ii8nrfqggmy8ameh85o"
ENV = f"# deployment\r\nA=1\r\nexport B='x y'\r\n{VAR}='[\"{KEY_A}\"]'\r\nC=\"q\" # tail"  # CRLF, no final EOL


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return cli.main(list(argv), out=out), out.getvalue()


@pytest.fixture
def deploy(tmp_path: Path) -> Path:
    d = tmp_path / "deploy"
    d.mkdir()
    (d / ".env").write_bytes(ENV.encode())
    return d


def test_env_set_relay_merges_writes_backup_and_keeps_every_other_byte(deploy: Path) -> None:
    rc, out = run("--deployment", str(deploy), "env", "set-relay", KEY_B)
    assert rc == 0
    assert f'+{VAR}=\'["{KEY_A}","{KEY_B}"]\'' in out and "wrote " in out
    new = (deploy / ".env").read_bytes()
    assert new == ENV.replace(f'["{KEY_A}"]', f'["{KEY_A}","{KEY_B}"]').encode()
    backups = list(deploy.glob(".env.bak-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == ENV.encode()
    # again: already there, nothing written
    rc, out = run("--deployment", str(deploy), "env", "set-relay", KEY_B)
    assert rc == 0 and "nothing to change" in out
    assert len(list(deploy.glob(".env.bak-*"))) == 1


def test_env_set_relay_replace_and_dry_run(deploy: Path) -> None:
    rc, out = run("--deployment", str(deploy), "env", "set-relay", KEY_B, "--replace", "--dry-run")
    assert rc == 0 and "dry run" in out and f"+{VAR}='[\"{KEY_B}\"]'" in out
    assert (deploy / ".env").read_bytes() == ENV.encode()
    rc, _ = run("--deployment", str(deploy), "env", "set-relay", KEY_B, "--replace")
    assert rc == 0 and f"{VAR}='[\"{KEY_B}\"]'" in (deploy / ".env").read_text()


def test_env_set_relay_other_env_path(deploy: Path) -> None:
    (deploy / "conf").mkdir()
    (deploy / "conf" / "prod.env").write_text("X=1\n")
    rc, _ = run("--deployment", str(deploy), "env", "set-relay", KEY_A, "--env", "conf/prod.env")
    assert rc == 0
    assert (deploy / "conf" / "prod.env").read_text() == f"X=1\n{VAR}='[\"{KEY_A}\"]'\n"
    assert (deploy / ".env").read_bytes() == ENV.encode()


def test_env_set_relay_diff_says_before_and_written_once_written(
    deploy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = str(deploy / ".env")
    change = f'+{VAR}=\'["{KEY_A}","{KEY_B}"]\''
    # a dry run: the file as it is now and as it would be
    rc, out = run("--deployment", str(deploy), "env", "set-relay", KEY_B, "--dry-run")
    assert rc == 0 and f"--- {env} (now)" in out and f"+++ {env} (new)" in out and change in out, out
    rc, out = run("--deployment", str(deploy), "env", "set-relay", KEY_B, "--json", "--dry-run")
    diff = json.loads(out)["diff"]
    assert f"--- {env} (now)" in diff and f"+++ {env} (new)" in diff, diff
    # a refused write (another writer got in first): nothing was written, so still now/new
    from cosmictui.ops import runner as runner_mod

    def other_writer(path: str) -> None:
        with open(path, "a") as f:
            f.write("\nLATE=1\n")

    runner_mod.BEFORE_RENAME.append(other_writer)
    try:
        rc, out = run("--deployment", str(deploy), "env", "set-relay", KEY_B)
    finally:
        runner_mod.BEFORE_RENAME.remove(other_writer)
    assert rc == 1 and "another writer" in capsys.readouterr().err
    assert f"--- {env} (now)" in out and f"+++ {env} (new)" in out and "(written)" not in out, out
    assert KEY_B not in (deploy / ".env").read_text()
    (deploy / ".env").write_bytes(ENV.encode())
    # written: the same change, labelled as what is now true of the file
    rc, out = run("--deployment", str(deploy), "env", "set-relay", KEY_B)
    assert rc == 0 and "wrote " in out and change in out, out
    assert f"--- {env} (before)" in out and f"+++ {env} (written)" in out, out
    assert "(now)" not in out and "(new)" not in out, out
    assert out.index("(written)") < out.index("wrote "), out  # printed once the write succeeded
    (deploy / ".env").write_bytes(ENV.encode())
    rc, out = run("--deployment", str(deploy), "env", "set-relay", KEY_B, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["written"], doc
    assert f"--- {env} (before)" in doc["diff"] and f"+++ {env} (written)" in doc["diff"], doc["diff"]
    assert "(now)" not in doc["diff"] and "(new)" not in doc["diff"] and change in doc["diff"], doc["diff"]


@pytest.mark.parametrize(
    ("env", "key", "expect"),
    [
        (ENV, "not-a-key", "KEY:"),
        (f"{VAR}='[\"{KEY_A}\"'\n", KEY_B, "JSON"),  # broken JSON in the value
        (None, KEY_B, ".env"),  # no .env at all
    ],
)
def test_env_set_relay_bad_input_exits_2_and_changes_nothing(
    deploy: Path, env: str | None, key: str, expect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if env is None:
        (deploy / ".env").unlink()
    else:
        (deploy / ".env").write_text(env)
    before = sorted((p.name, p.read_bytes()) for p in deploy.iterdir())
    rc, _ = run("--deployment", str(deploy), "env", "set-relay", key)
    assert rc == 2
    assert expect in capsys.readouterr().err
    assert sorted((p.name, p.read_bytes()) for p in deploy.iterdir()) == before


def test_env_set_relay_missing_deployment_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _ = run("--deployment", str(tmp_path / "nope"), "env", "set-relay", KEY_A)
    assert rc == 2 and "does not exist" in capsys.readouterr().err


def _jobs_config(tmp_path: Path, bin_dir: Path) -> Path:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[commands]\nenv = {{ PATH = "{bin_dir}:/usr/local/bin:/usr/bin:/bin" }}\n')
    return cfg


def test_jobs_lists_marks_stuck_and_prints_json(deploy: Path, tmp_path: Path) -> None:
    now = time.time()
    seed_jobs(
        deploy,
        [
            {
                "id": "job-old",
                "name": "a",
                "gpu": "1",
                "created": now - 7200,
                "updated": now - 7200,
                "script": ["Creating"],
            },
            {"id": "job-ok", "name": "b", "gpu": "2", "created": now - 60, "updated": now - 60, "script": ["Running"]},
        ],
    )
    cfg = _jobs_config(tmp_path, install_cosmicac(tmp_path))
    rc, out = run("--config", str(cfg), "--deployment", str(deploy), "jobs")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "AGE", "NOTE"]
    old = next(ln for ln in lines if ln.startswith("job-old"))
    assert "Creating" in old and "2h" in old and len(old.split()) > 3  # a stuck note
    rc, out = run("--config", str(cfg), "--deployment", str(deploy), "jobs", "--json")
    doc = json.loads(out)
    jobs = {j["id"]: j for j in doc["jobs"]}
    # No restart is recorded: which jobs are new is not known, said, not guessed.
    assert doc["relay"] is None and doc["case"] == "unknown" and "No worker restart is recorded" in doc["verdict"]
    assert rc == 0 and set(jobs) == {"job-old", "job-ok"}
    assert jobs["job-old"]["stuck"] and jobs["job-ok"]["status"] == "Running" and not jobs["job-ok"]["stuck"]


def test_jobs_watch_json_is_one_line_per_listing(deploy: Path, tmp_path: Path) -> None:
    now = time.time()
    seed_jobs(
        deploy,
        [
            {
                "id": "job-1",
                "name": "a",
                "gpu": "1",
                "created": now,
                "updated": now,
                "script": ["Creating", "Starting", "Running"],
            }
        ],
    )
    cfg = _jobs_config(tmp_path, install_cosmicac(tmp_path))
    rc, out = run(
        "--config",
        str(cfg),
        "--deployment",
        str(deploy),
        "jobs",
        "--watch",
        "--json",
        "--interval",
        "0.2",
        "--count",
        "3",
    )
    docs = [json.loads(ln) for ln in out.splitlines()]
    assert rc == 0 and len(docs) == 3
    assert [d["jobs"][0]["status"] for d in docs] == ["Starting", "Running", "Running"]


def test_jobs_failures_exit_1_with_the_output(deploy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bin_dir = make_bin(tmp_path / "t1", {"cosmicac": "echo 'not logged in' >&2; exit 3\n"})
    rc, _ = run("--config", str(_jobs_config(tmp_path, bin_dir)), "--deployment", str(deploy), "jobs")
    err = capsys.readouterr().err
    assert rc == 1 and "exited 3" in err and "not logged in" in err
    bin_dir = make_bin(tmp_path / "t2", {"cosmicac": "echo 'all good, 2 jobs'\n"})
    rc, out = run("--config", str(_jobs_config(tmp_path, bin_dir)), "--deployment", str(deploy), "jobs", "--json")
    doc = json.loads(out)
    assert rc == 1 and "Cannot read the jobs list" in doc["error"] and doc["output"].strip() == "all good, 2 jobs"


def test_env_set_relay_json_reports_the_plan_and_the_backup(deploy: Path) -> None:
    rc, out = run("--deployment", str(deploy), "env", "set-relay", KEY_B, "--json", "--dry-run")
    doc = json.loads(out)
    assert rc == 0 and doc["dry_run"] and not doc["written"] and doc["changed"]
    assert doc["old_relays"] == [KEY_A] and doc["new_relays"] == [KEY_A, KEY_B] and doc["mode"] == "merge"
    assert doc["path"] == str(deploy / ".env") and doc["backup"] is None
    assert (deploy / ".env").read_bytes() == ENV.encode()
    rc, out = run("--deployment", str(deploy), "env", "set-relay", KEY_B, "--json", "--replace")
    doc = json.loads(out)
    assert rc == 0 and doc["written"] and doc["new_relays"] == [KEY_B] and doc["mode"] == "replace"
    assert doc["read_back"] == [KEY_B]  # the file as read back after the write (same use case as step 3)
    assert doc["backup"] and Path(doc["backup"]).read_bytes() == ENV.encode()
    rc, out = run("--deployment", str(deploy), "env", "set-relay", KEY_B, "--json", "--replace")
    doc = json.loads(out)
    assert rc == 0 and not doc["changed"] and not doc["written"]


@pytest.mark.parametrize("spec", ["ftp://x", "ssh://", "ssh://h:port/x"])
@pytest.mark.parametrize("cmd", [["jobs"], ["check"], ["env", "set-relay", KEY_A]])
def test_unsupported_deployment_is_a_usage_error(spec: str, cmd: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = run("--deployment", spec, *cmd)
    err = capsys.readouterr().err
    assert rc == 2 and out == "" and "--deployment" in err and "Traceback" not in err


def test_jobs_watch_json_on_stdout_is_ndjson_and_before_restart_comes_from_the_wizard(
    deploy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    now = time.time()
    jobs = [
        {"id": "job-old", "name": "a", "gpu": "1", "created": now - 600, "updated": now, "script": ["Running"]},
        {"id": "job-new", "name": "b", "gpu": "1", "created": now - 10, "updated": now, "script": ["Running"]},
    ]
    seed_jobs(deploy, jobs)
    cfg = _jobs_config(tmp_path, install_cosmicac(tmp_path))
    argv = ["--config", str(cfg), "--deployment", str(deploy), "jobs", "--json"]
    # no wizard run recorded a restart: unknown, not false
    assert cli.main(argv) == 0  # out=None: the real sys.stdout (pretty when not watching)
    docs = json.loads(capsys.readouterr().out)["jobs"]
    assert [d["before_restart"] for d in docs] == [None, None]
    from cosmictui.ops.progress import WizardProgress, save_progress

    save_progress(WizardProgress(deployment=str(deploy), restarted_at=now - 300))
    assert cli.main([*argv, "--watch", "--interval", "0.2", "--count", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2  # one JSON object per line
    for line in lines:
        doc = json.loads(line)
        by_id = {j["id"]: j for j in doc["jobs"]}
        assert by_id["job-old"]["before_restart"] is True and by_id["job-new"]["before_restart"] is False
        # a new job left Creating; no relay set up to ask whether it carried it: cannot tell, never proven
        assert by_id["job-new"]["status_class"] == "done" and doc["case"] == "cannot-tell"
        assert doc["verdict"].startswith("Job job-new is Running. Cannot tell")
