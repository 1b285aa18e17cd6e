"""`cosmictui jobs recover`: the wizard's recovery use case, headless, loses nothing.

Against the scripted `cosmicac` stand-in of the wizard tests (a real program on PATH keeping
its jobs in the deployment directory), through `cli.main` with a real config file.
"""

from __future__ import annotations

import io
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cosmictui import cli
from cosmictui.ops.jobs.recover import recovery_dir
from tests.e2e._wizard_support import install_cosmicac, make_bin, path_with, seed_jobs

TEMPLATE = "cosmicac jobs create --name {name} --gpu {gpu}"


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _deploy(tmp_path: Path, create: str = "", bin_dir: Path | None = None) -> tuple[Path, Path]:
    """A deployment with two stuck jobs, and a config naming it; (deployment, config)."""
    d = tmp_path / "deploy"
    d.mkdir()
    now = time.time()
    seed_jobs(
        d,
        [
            {"id": "job-001", "name": "llama train", "gpu": "a100", "created": now - 3600, "updated": now - 3600}
            | {"script": ["Creating"]},
            {"id": "job-002", "name": "eval", "gpu": "h100", "created": now - 1800, "updated": now - 1800}
            | {"script": ["Creating"]},
        ],
    )
    real = install_cosmicac(tmp_path)
    cfg = tmp_path / "cosmictui.toml"
    commands = f"create = {json.dumps(create)}\n" if create else ""
    env = json.dumps(path_with(bin_dir or real))
    cfg.write_text(f"deployment = {json.dumps(str(d))}\n[commands]\n{commands}env = {{ PATH = {env} }}\n")
    return d, cfg


def _failing_create(tmp_path: Path) -> Path:
    """A `cosmicac` whose create is refused (exit 64, as for a bad flag); everything else is real."""
    real = tmp_path / "bin" / "cosmicac"
    script = f'[ "$2" = create ] && {{ echo "error: unknown flag --gpu" >&2; exit 64; }}\nexec "{real}" "$@"\n'
    return make_bin(tmp_path / "failing", {"cosmicac": script})


def run(cfg: Path, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    rc = cli.main(["--config", str(cfg), "jobs", "recover", *argv], out=out)
    return rc, out.getvalue()


def strict(text: str) -> Any:
    def refuse(word: str) -> None:
        raise AssertionError(f"not strict JSON: {word}")

    return json.loads(text, parse_constant=refuse)


def calls(d: Path) -> list[str]:
    log = d / "cosmicac.log"
    return [c for c in log.read_text().splitlines() if c != "jobs list"] if log.exists() else []


def job_ids(d: Path) -> list[str]:
    return [j["id"] for j in json.loads((d / "jobs.json").read_text())["jobs"]]


def records(d: Path) -> list[dict[str, Any]]:
    folder = recovery_dir(str(d))
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def test_without_yes_it_prints_the_plan_and_deletes_nothing(tmp_path: Path) -> None:
    d, cfg = _deploy(tmp_path, TEMPLATE)
    rc, out = run(cfg, "job-001", "job-002")
    assert rc == cli.NOT_CONFIRMED == 3
    assert "cosmicac jobs delete job-001" in out and "cosmicac jobs delete job-002" in out
    assert "cosmicac jobs create --name 'llama train' --gpu a100" in out
    assert "cosmicac jobs create --name eval --gpu h100" in out
    assert str(recovery_dir(str(d))) in out and "--yes" in out
    assert calls(d) == [] and job_ids(d) == ["job-001", "job-002"] and records(d) == []


def test_yes_saves_the_record_then_deletes_and_recreates(tmp_path: Path) -> None:
    d, cfg = _deploy(tmp_path, TEMPLATE)
    rc, out = run(cfg, "job-001", "--yes")
    assert rc == 0, out
    assert calls(d) == ["jobs delete job-001", "jobs create --name llama train --gpu a100"]
    assert job_ids(d) == ["job-002", "job-100"]  # the stand-in numbers new jobs from 100
    (record,) = records(d)
    (saved,) = recovery_dir(str(d)).glob("*.json")
    assert f"saved job job-001 (every field, recreate command) to {saved}" in out
    assert out.index("saved job job-001") < out.index("deleted and created again")
    job = record["job"]
    assert job["id"] == "job-001" and job["status"] == "Creating" and job["created"]
    assert {k: job["fields"][k] for k in ("id", "status", "name", "gpu")} == {
        "id": "job-001",
        "status": "Creating",
        "name": "llama train",
        "gpu": "a100",
    }
    assert set(job["fields"]) == {"id", "status", "created", "updated", "name", "gpu"}  # every column listed
    assert record["create_fields"]["name"] == "llama train" and record["create_fields"]["gpu_model"] == "a100"
    assert record["delete_command"] == "cosmicac jobs delete job-001"
    assert record["recreate_command"] == "cosmicac jobs create --name 'llama train' --gpu a100"
    assert record["recreate_source"] == "config" and record["deployment"] == str(d)


def test_each_recreated_job_says_which_new_job_replaces_it(tmp_path: Path) -> None:
    d, cfg = _deploy(tmp_path, TEMPLATE)
    rc, out = run(cfg, "job-001", "job-002", "--yes")
    assert rc == 0, out
    assert job_ids(d) == ["job-100", "job-101"]  # the stand-in numbers new jobs from 100
    assert "Job job-001 deleted and created again: new job job-100 replaces it." in out
    assert "Job job-002 deleted and created again: new job job-101 replaces it." in out
    saved = {r["job"]["id"]: r["new_job_id"] for r in records(d)}
    assert saved == {"job-001": "job-100", "job-002": "job-101"}


def test_under_json_each_result_names_its_new_job(tmp_path: Path) -> None:
    _, cfg = _deploy(tmp_path, TEMPLATE)
    rc, out = run(cfg, "job-002", "--yes", "--json")
    assert rc == 0, out
    (result,) = strict(out)["results"]
    assert result["id"] == "job-002" and result["outcome"] == "recreated" and result["new_job_id"] == "job-100"


def test_a_create_failing_after_its_delete_exits_1_and_the_record_recreates_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d, cfg = _deploy(tmp_path, TEMPLATE, bin_dir=_failing_create(tmp_path))
    rc, out = run(cfg, "job-001", "job-002", "--yes")
    assert rc == 1
    err = capsys.readouterr().err
    (saved,) = recovery_dir(str(d)).glob("*.json")
    assert "Job job-001 was DELETED and NOT recreated" in err and "exited 64" in err
    assert "cosmicac jobs create --name 'llama train' --gpu a100" in err and str(saved) in err
    assert "Stopped here" in err and f"saved job job-001 (every field, recreate command) to {saved}" in out
    assert calls(d) == ["jobs delete job-001"]  # stopped: job-002 is untouched
    assert job_ids(d) == ["job-002"]
    (record,) = records(d)
    # The saved file is enough to recreate the job by hand, with the real stand-in.
    subprocess.run(record["recreate_command"], shell=True, cwd=d, env={"PATH": path_with(tmp_path / "bin")}, check=True)
    jobs = json.loads((d / "jobs.json").read_text())["jobs"]
    assert [(j["name"], j["gpu"]) for j in jobs] == [("eval", "h100"), ("llama train", "a100")]


def test_a_failing_create_under_json_is_one_strict_json_object(tmp_path: Path) -> None:
    d, cfg = _deploy(tmp_path, TEMPLATE, bin_dir=_failing_create(tmp_path))
    rc, out = run(cfg, "job-001", "--yes", "--json")
    assert rc == 1
    doc = strict(out)
    (saved,) = recovery_dir(str(d)).glob("*.json")
    assert doc["exit_code"] == 1 and doc["confirmed"] is True
    assert "Job job-001 was DELETED and NOT recreated" in doc["error"]
    (result,) = doc["results"]
    assert result["outcome"] == "create-failed" and result["record"] == str(saved)
    assert result["command"] == "cosmicac jobs create --name 'llama train' --gpu a100"
    assert "unknown flag" in result["output"]


def test_no_known_create_command_is_refused_unless_delete_only(tmp_path: Path) -> None:
    d, cfg = _deploy(tmp_path)  # no [commands] create
    rc, out = run(cfg, "job-001", "--yes", "--json")
    assert rc == 2
    doc = strict(out)
    assert "no known create command for job job-001" in doc["error"] and "nothing deleted" in doc["error"]
    assert "--delete-only" in doc["fix"] and "--create-command" in doc["fix"]
    assert calls(d) == [] and records(d) == [] and job_ids(d) == ["job-001", "job-002"]

    rc, out = run(cfg, "job-001", "--delete-only")  # the plan says what --yes would do
    assert rc == 3 and "none known: deleted only" in out and calls(d) == []

    rc, out = run(cfg, "job-001", "--delete-only", "--yes")
    assert rc == 0, out
    assert calls(d) == ["jobs delete job-001"]  # never a guessed create
    assert "Recreate it yourself" in out
    (record,) = records(d)
    assert record["recreate_command"] is None and "recreate this job yourself" in record["note"]
    assert record["job"]["fields"]["name"] == "llama train"
    assert "{tags}" in record["draft_create_command"]  # the draft, for the operator to finish


def test_create_command_is_filled_per_job_and_refused_with_fields_left(tmp_path: Path) -> None:
    d, cfg = _deploy(tmp_path)
    rc, out = run(cfg, "job-001", "--create-command", "cosmicac jobs create --name {name} --tags {tags}", "--yes")
    assert rc == 2 and calls(d) == [] and records(d) == []
    rc, out = run(cfg, "job-001", "job-002", "--create-command", "cosmicac jobs create --name x --gpu a100", "--yes")
    assert rc == 2 and calls(d) == []  # one literal command would make the same job twice

    rc, out = run(cfg, "job-001", "job-002", "--create-command", TEMPLATE, "--yes", "--json")
    assert rc == 0, out
    doc = strict(out)
    assert [r["outcome"] for r in doc["results"]] == ["recreated", "recreated"]
    assert [j["create_source"] for j in doc["jobs"]] == ["operator", "operator"]
    assert calls(d) == [
        "jobs delete job-001",
        "jobs create --name llama train --gpu a100",
        "jobs delete job-002",
        "jobs create --name eval --gpu h100",
    ]
    assert [r["recreate_source"] for r in records(d)] == ["operator", "operator"]


def test_an_unknown_id_exits_1_and_deletes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d, cfg = _deploy(tmp_path, TEMPLATE)
    rc, out = run(cfg, "job-001", "job-404", "--yes")
    assert rc == 1 and out == ""
    err = capsys.readouterr().err
    assert "no job job-404 in the jobs list" in err and "job-001" in err
    assert calls(d) == [] and records(d) == [] and job_ids(d) == ["job-001", "job-002"]


def test_plan_under_json_is_strict_json_and_a_bad_flag_too(tmp_path: Path) -> None:
    d, cfg = _deploy(tmp_path, TEMPLATE)
    rc, out = run(cfg, "job-002", "--json")
    assert rc == 3
    doc = strict(out)
    assert doc["exit_code"] == 3 and doc["confirmed"] is False and doc["results"] == []
    assert doc["record_dir"] == str(recovery_dir(str(d)))
    assert doc["jobs"][0]["delete_command"] == "cosmicac jobs delete job-002"
    assert doc["jobs"][0]["create_command"] == "cosmicac jobs create --name eval --gpu h100"
    with pytest.raises(SystemExit) as e:
        run(cfg, "--json")  # JOB_ID is required
    assert e.value.code == 2
    assert calls(d) == []


def test_help_documents_the_command_and_its_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["jobs", "recover", "--help"])
    text = capsys.readouterr().out
    for word in ("JOB_ID", "--create-command", "--delete-only", "--yes", "--json", "BEFORE any delete"):
        assert word in text
    assert "3  jobs recover, relay start or setup without --yes" in cli.EXIT_CODES


def test_no_record_on_disk_means_no_delete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d, cfg = _deploy(tmp_path, TEMPLATE)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker))  # the record cannot be written there
    rc, out = run(cfg, "job-001", "--yes", "--json")
    assert rc == 1
    doc = strict(out)
    error = doc["error"].lower()
    assert "could not save job job-001's record" in error and "job job-001 not deleted" in error
    assert "XDG_STATE_HOME" in doc["fix"]
    assert doc["results"] == [] and calls(d) == [] and job_ids(d) == ["job-001", "job-002"]


def test_a_failing_delete_stops_before_any_create(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real = tmp_path / "bin" / "cosmicac"
    script = f'[ "$2" = delete ] && {{ echo "error: permission denied" >&2; exit 1; }}\nexec "{real}" "$@"\n'
    d, cfg = _deploy(tmp_path, TEMPLATE, bin_dir=make_bin(tmp_path / "nodelete", {"cosmicac": script}))
    rc, _ = run(cfg, "job-001", "job-002", "--yes")
    assert rc == 1
    err = capsys.readouterr().err
    assert "job job-001 not deleted" in err and "Stopped here" in err
    assert calls(d) == [] and job_ids(d) == ["job-001", "job-002"]  # the refused delete never reached the jobs
    assert len(records(d)) == 1  # saved before the attempt, kept


def test_a_dead_relay_from_the_wizard_refuses_yes_and_deletes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The wizard's step-6 guard, headless: the relay its step 2 started was killed (-9 leaves its
    runtime file): a recreated job would stay in Creating, so --yes refuses until it runs again."""
    from cosmictui.ops import progress as progress_mod

    d, cfg = _deploy(tmp_path, TEMPLATE)
    storage = tmp_path / "relay"
    storage.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    key = "ab" * 32
    runtime = {"pid": gone.pid, "key": key, "host": "127.0.0.1", "port": 49737, "metrics": None, "started_at": 1.0}
    (storage / "relay-runtime.json").write_text(json.dumps(runtime))
    p = progress_mod.WizardProgress(deployment=str(d), relay_key=key, relay_storage=str(storage))
    progress_mod.save_progress(p)

    rc, out = run(cfg, "job-001")  # the plan says so, and how --yes will behave
    assert rc == cli.NOT_CONFIRMED and f"pid {gone.pid} is gone" in out and "--yes will refuse" in out
    rc, out = run(cfg, "job-001", "--yes")
    err = capsys.readouterr().err
    assert rc == cli.FAILED and "is not running" in err and "Nothing deleted" in err and "--no-relay-check" in err
    assert calls(d) == [] and job_ids(d) == ["job-001", "job-002"] and records(d) == []

    rc, out = run(cfg, "job-001", "--yes", "--json")  # programs get the same refusal as JSON
    doc = strict(out)
    assert rc == cli.FAILED and doc["exit_code"] == 1 and "is not running" in doc["error"]
    assert calls(d) == []

    p.relay_external = True  # attached by key: it runs elsewhere, nothing local to check
    progress_mod.save_progress(p)
    rc, out = run(cfg, "job-001", "--yes")
    assert rc == 0, out
    p.relay_external = False
    progress_mod.save_progress(p)
    rc, out = run(cfg, "job-002", "--yes", "--no-relay-check")  # the operator knows better
    assert rc == 0, out
    assert calls(d) == [
        "jobs delete job-001",
        "jobs create --name llama train --gpu a100",
        "jobs delete job-002",
        "jobs create --name eval --gpu h100",
    ]
