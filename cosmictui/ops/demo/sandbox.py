"""The demo sandbox: a throwaway CosmicAC deployment that behaves like the real one.

`create_sandbox()` makes a deployment directory with a real `.env` (the relays variable
absent), and sandbox `task` and `cosmicac` executables in its `bin/` that simulate the
worker: `task apply-...` copies the relays from `.env` into the worker config, `task
restart ...` records the restart time and (re)starts the worker (`demo.worker`, detached),
jobs created after a restart carry the applied relays, and a job leaves `Creating` only when
its agent, a real hyperdht peer, reached the worker through one of those relays with punching
off and the echo came back (then it keeps updating over that connection). Jobs created
before are seeded stuck. The sandbox runs the real Python relay.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cosmictui.ops.config import CREATE_FIELDS, ENV_VAR, Settings
from cosmictui.ops.jobs.model import format_age
from cosmictui.ops.jobs.recover import records_of
from cosmictui.ops.relayproc import attach, on_before_start, pid_alive

STATE_FILE = "sandbox-state.json"
DHT_READY_FILE = "dht.json"
DHT_LOG_FILE = "dht.log"
WORKER_LOG_FILE = "worker.log"
WORKER_SERVICE = "cosmicac-wrk-server-k8s-nvidia"

#: `cosmicac jobs create`'s flags, as CosmicAC documents them: each job field and its flag, all
#: required. The sandbox refuses any other flag, so a wrong `[commands] create` fails visibly.
CREATE_FLAGS: dict[str, str] = {f: "--" + f.replace("_", "-") for f in CREATE_FIELDS}
#: Fields that must be a whole number above zero.
COUNT_FIELDS = ("gpu_count", "disk_gb")
#: The demo's `[commands] create` and `test_job`: the documented ones (docs/configuration.md).
DEMO_CREATE_COMMAND = "cosmicac jobs create " + " ".join(f"{flag} {{{f}}}" for f, flag in CREATE_FLAGS.items())
DEMO_TEST_JOB_COMMAND = (
    "cosmicac jobs create --name relay-check --tags relay-check --location eu-1 --gpu-model L4 "
    "--gpu-count 1 --image ubuntu-22.04 --disk-gb 20"
)


@dataclass(frozen=True)
class Sandbox:
    root: Path
    deployment: Path
    bin_dir: Path
    relay_storage: Path
    settings: Settings
    temporary: bool = False  # made in a fresh temp dir: `close()` removes it too

    @property
    def env_path(self) -> Path:
        return self.deployment / ".env"

    @property
    def state_path(self) -> Path:
        return self.deployment / STATE_FILE

    @property
    def dht_ready_path(self) -> Path:
        return self.root / DHT_READY_FILE

    def stop_dht(self, timeout: float = 10.0) -> bool:
        """Stop the sandbox's private DHT (if this sandbox started one); True if it was running."""
        return stop_dht(self.root, timeout)

    @property
    def config_path(self) -> Path:
        """The sandbox's settings as a config file, for the headless commands (`cosmictui --config`)."""
        return self.root / "config.toml"

    def write_config(self) -> Path:
        """Write `config_path` from `settings`: `cosmictui --config FILE verify` then runs against it."""
        s = self.settings

        def q(v: str) -> str:
            return json.dumps(v)  # a JSON string is a TOML basic string

        lines = [
            f"deployment = {q(s.deployment)}",
            "",
            "[commands]",
            f"create = {q(s.create_command)}",
            f"test_job = {q(s.test_job_command)}",
            "env = { " + ", ".join(f"{k} = {q(v)}" for k, v in s.command_env.items()) + " }",
            "",
            "[relay]",
            f"storage = {q(s.relay_storage)}",
            f"port = {s.relay_port}",
            f"host = {q(s.relay_host)}",
            f"address = {q(s.relay_address)}",
            f"metrics = {q(s.relay_metrics)}",
            "bootstrap = [" + ", ".join(q(b) for b in s.relay_bootstrap) + "]",
            "",
            "[jobs]",
            f"poll_interval = {s.poll_interval:g}",
        ]
        self.config_path.write_text("\n".join(lines) + "\n")
        return self.config_path

    def remove_job_records(self) -> list[Path]:
        """Remove the records step 6 saved for this sandbox's jobs; the paths removed.

        A record is what it takes to recreate a deleted job, so it is kept for a real deployment.
        A demo job lives only in the sandbox: once the sandbox is gone there is nothing to
        recreate it in, and its record would only lie beside the real ones.
        """
        removed = []
        for path in records_of(str(self.deployment)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
        return removed

    def close(self, timeout: float = 10.0) -> None:
        """Stop what the sandbox runs in the background: its relay and its private DHT.

        A sandbox made in its own temp dir is throwaway, so its files go too; one made under a
        caller's `root` is left for the caller.
        """
        rt = attach(str(self.relay_storage))
        if rt is not None:
            _terminate(rt.pid, timeout)
        stop_worker(self.state_path, timeout)
        self.stop_dht(timeout)
        if self.temporary:
            shutil.rmtree(self.root, ignore_errors=True)


def _free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ENV_TEMPLATE = """\
# CosmicAC deployment settings (demo sandbox made by `cosmictui --demo`)
# Config overrides use K8S_COMMON_CONFIG__<section>__<key>; values are JSON where noted.
COSMICAC_ENV=sandbox
K8S_NAMESPACE=cosmicac
export KUBECONFIG=./kubeconfig.yaml
WRK_SERVER_IMAGE="registry.example.com/cosmicac/wrk-server-k8s-nvidia:1.14.2"
K8S_COMMON_CONFIG__logging__level=info
K8S_COMMON_CONFIG__interconnect__timeout_ms=30000
"""

TASKFILE = """\
# Sandbox Taskfile: the real tasks are simulated by bin/task
version: '3'
tasks:
  apply-wrk-server-k8s-nvidia-common-config:
    desc: Render the common config from .env and apply it to the cluster
  restart:
    desc: Restart SERVICES
"""

SCRIPT = """\
#!{python}
# Sandbox `{name}` made by cosmictui: simulates the CosmicAC command of that name.
import sys
sys.path.insert(0, {pkg_root!r})
from cosmictui.ops.demo.sandbox import {entry}
sys.exit({entry}(sys.argv[1:], {state!r}))
"""


def create_sandbox(
    root: str | Path | None = None,
    *,
    relay_port: int | None = None,
    metrics_port: int | None = None,
    bootstrap: tuple[str, ...] = (),
    seed_jobs: bool = True,
    start_dht: bool = True,
) -> Sandbox:
    """Create (or reuse) a sandbox under `root` (default: a new temp dir).

    The relay binds 127.0.0.1 on a free port. Unless `bootstrap` names DHT nodes, the sandbox
    runs a private five-node DHT on 127.0.0.1 (`demo.dht`, detached; started here when
    `start_dht`, else by `ensure_dht`), so the demo never needs the internet. Call
    `Sandbox.close()` to stop it and the relay; it also exits by itself once no relay has run on
    the sandbox storage for 15 minutes or the sandbox directory is removed.
    """
    temporary = root is None
    base = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="cosmictui-demo-"))
    base = base.expanduser().absolute()
    deployment = base / "deployment"
    bin_dir = base / "bin"
    storage = base / "relay-storage"
    for d in (deployment, bin_dir):
        d.mkdir(parents=True, exist_ok=True)
    state_path = deployment / STATE_FILE
    state = _load(state_path) if state_path.exists() else None
    if state is None:
        port = relay_port or _free_port(socket.SOCK_DGRAM)
        mport = metrics_port or _free_port(socket.SOCK_STREAM)
        now = time.time()
        state = {
            "env_path": str(deployment / ".env"),
            "env_var": ENV_VAR,
            "relay_storages": [str(storage)],
            "relay_port": port,
            "metrics_port": mport,
            "bootstrap": list(bootstrap),
            "dht_port": _free_port(socket.SOCK_DGRAM),
            "worker": {"applied_relays": [], "applied_at": None, "running_relays": [], "restarted_at": None},
            "fail": {},
            "secret": secrets.token_hex(16),  # the jobs' peers' keys derive from it (demo.worker.job_keys)
            "jobs": _seed_jobs(now) if seed_jobs else [],
        }
        _save(state_path, state)
        (deployment / ".env").write_text(ENV_TEMPLATE)
        (deployment / "Taskfile.yml").write_text(TASKFILE)
    pkg_root = str(Path(__file__).resolve().parent.parent.parent)
    for name, entry in (("task", "task_main"), ("cosmicac", "cosmicac_main")):
        script = bin_dir / name
        script.write_text(
            SCRIPT.format(python=sys.executable, name=name, pkg_root=pkg_root, entry=entry, state=str(state_path))
        )
        script.chmod(0o755)
    boot = tuple(state["bootstrap"])
    if not boot:
        dht_port = int(state["dht_port"])
        boot = (ensure_dht(base, storage, dht_port) if start_dht else f"127.0.0.1:{dht_port}",)
        port_now = int(boot[0].rsplit(":", 1)[1])
        # the relay must reach the DHT to start: bring it back if it stopped meanwhile (same port)
        on_before_start(str(storage), lambda: ensure_dht(base, storage, port_now))
    settings = Settings(
        deployment=str(deployment),
        command_env={"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"},
        relay_storage=str(storage),
        relay_port=int(state["relay_port"]),
        relay_host="127.0.0.1",
        relay_address="127.0.0.1",
        relay_metrics=f"127.0.0.1:{state['metrics_port']}",
        relay_bootstrap=boot,
        poll_interval=2.0,
        # The sandbox `cosmicac` takes the documented create flags (CREATE_FLAGS), so the demo
        # shows the command shape a real deployment configures, and its verify step a small
        # test job of its own (never a copy of a stuck 4-GPU job).
        create_command=DEMO_CREATE_COMMAND,
        test_job_command=DEMO_TEST_JOB_COMMAND,
    )
    sandbox = Sandbox(base, deployment, bin_dir, storage, settings, temporary)
    sandbox.write_config()
    return sandbox


_dht_children: dict[int, subprocess.Popen[bytes]] = {}


def _read_dht(root: Path) -> dict[str, Any] | None:
    try:
        info = json.loads((root / DHT_READY_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not pid_alive(int(info.get("pid", 0))):
        return None
    return info


def ensure_dht(root: Path, storage: Path, port: int = 0, timeout: float = 30.0) -> str:
    """The private DHT's bootstrap address, starting it (detached) when it does not run."""
    info = _read_dht(root)
    if info is not None:
        return str(info["bootstrap"])
    ready = root / DHT_READY_FILE
    with contextlib.suppress(FileNotFoundError):
        ready.unlink()
    cmd = [
        sys.executable,
        "-m",
        "cosmictui.ops.demo.dht",
        "--ready",
        str(ready),
        "--port",
        str(port),
        "--watch",
        str(storage),
    ]
    pkg_root = str(Path(__file__).resolve().parent.parent.parent)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
    with open(root / DHT_LOG_FILE, "ab") as log:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=root, env=env, start_new_session=True
        )
    _dht_children[proc.pid] = proc
    deadline = time.monotonic() + timeout
    while True:
        info = _read_dht(root)
        if info is not None and info.get("pid") == proc.pid:
            return str(info["bootstrap"])
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            _dht_children.pop(proc.pid, None)
            tail = (root / DHT_LOG_FILE).read_text(errors="replace")[-2000:]
            raise SandboxError(f"the sandbox's private DHT did not start:\n{tail}")
        time.sleep(0.05)


def _terminate(pid: int, timeout: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        child = _dht_children.get(pid)
        if child is not None and child.poll() is not None:
            break
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    child = _dht_children.pop(pid, None)
    if child is not None:
        child.wait()


def stop_dht(root: Path, timeout: float = 10.0) -> bool:
    """Stop the private DHT of the sandbox in `root`; True if it was running."""
    info = _read_dht(root)
    if info is None:
        return False
    _terminate(int(info["pid"]), timeout)
    return True


def _seed_jobs(now: float) -> list[dict[str, Any]]:
    """Jobs from before any relay: stuck in Creating/Starting, their status long stale."""
    return [
        {
            "id": "job-7f3a21",
            "name": "llama-3-70b-serve",
            "tags": "llm,serve",
            "location": "eu-1",
            "gpu_model": "A100",
            "gpu_count": "4",
            "image": "ubuntu-22.04",
            "disk_gb": "200",
            "status": "Creating",
            "created_at": now - 3 * 3600 - 720,
            "updated_at": now - 3 * 3600 - 700,
            "relays": [],
        },
        {
            "id": "job-19c0de",
            "name": "shell-a100",
            "tags": "dev,shell",
            "location": "eu-1",
            "gpu_model": "A100",
            "gpu_count": "1",
            "image": "ubuntu-22.04",
            "disk_gb": "50",
            "status": "Starting",
            "created_at": now - 47 * 60,
            "updated_at": now - 41 * 60,
            "relays": [],
        },
        {
            "id": "job-03be77",
            "name": "batch-embed",
            "tags": "batch,embed",
            "location": "us-2",
            "gpu_model": "L4",
            "gpu_count": "2",
            "image": "ubuntu-22.04",
            "disk_gb": "100",
            "status": "Completed",
            "created_at": now - 2 * 86400,
            "updated_at": now - 2 * 86400 + 5400,
            "relays": [],
        },
    ]


def _dht_bootstrap(state_path: Path, state: dict[str, Any]) -> list[str]:
    """The DHT the sandbox relay uses: the given bootstrap, else its private DHT's."""
    if state.get("bootstrap"):
        return list(state["bootstrap"])
    info = _read_dht(state_path.parent.parent)
    return [str(info["bootstrap"])] if info else [f"127.0.0.1:{state['dht_port']}"]


def _restart_worker(state_path: Path, state: dict[str, Any]) -> None:
    """What `rollout restart` does to the worker: the old one goes, a new one starts (detached)."""
    old = state["worker"].get("pid")
    if isinstance(old, int) and old != os.getpid() and pid_alive(old):
        with contextlib.suppress(ProcessLookupError):
            os.kill(old, signal.SIGTERM)
    cmd = [
        sys.executable,
        "-m",
        "cosmictui.ops.demo.worker",
        "--state",
        str(state_path),
        "--bootstrap",
        ",".join(_dht_bootstrap(state_path, state)),
    ]
    pkg_root = str(Path(__file__).resolve().parent.parent.parent)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
    with open(state_path.parent / WORKER_LOG_FILE, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd=state_path.parent,
            env=env,
            start_new_session=True,
        )
    state["worker"]["pid"] = proc.pid


def stop_worker(state_path: Path, timeout: float = 10.0) -> bool:
    """Stop the sandbox's worker process; True if it was running."""
    try:
        pid = _load(state_path).get("worker", {}).get("pid")
    except (OSError, ValueError):
        return False
    if not isinstance(pid, int) or not pid_alive(pid):
        return False
    _terminate(pid, timeout)
    return True


# --- state ---------------------------------------------------------------------------------


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text("utf-8"))


def _save(path: Path, state: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".state-", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[dict[str, Any]]:
    """Read-modify-write the state under an flock, so parallel commands do not lose updates."""
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = _load(path)
        yield state
        _save(path, state)


def _read_env_relays(state: dict[str, Any]) -> list[str]:
    """What the real apply task does: take the relays JSON from .env (dotenv rules)."""
    from dotenv import dotenv_values

    env_path = Path(state["env_path"])
    if not env_path.is_file():
        raise SandboxError(f"{env_path}: no such file")
    values = dotenv_values(env_path)
    raw = values.get(state["env_var"])
    if raw is None or not raw.strip():
        return []
    try:
        relays = json.loads(raw)
    except ValueError as e:
        raise SandboxError(f"{state['env_var']}: invalid JSON: {e}") from None
    if not isinstance(relays, list) or not all(isinstance(k, str) for k in relays):
        raise SandboxError(f"{state['env_var']}: expected a JSON array of strings")
    return relays


class SandboxError(Exception):
    """A simulated command failed the way the real one would."""


def _out(line: str) -> None:
    print(line, flush=True)


# --- `task` ----------------------------------------------------------------------------------

APPLY_TASK = "apply-wrk-server-k8s-nvidia-common-config"


def task_main(argv: list[str], state_file: str) -> int:
    """Sandbox `task`: `apply-wrk-server-k8s-nvidia-common-config` and `restart SERVICES=...`."""
    path = Path(state_file)
    if not argv:
        print(
            "task: No tasks given (sandbox knows: apply-wrk-server-k8s-nvidia-common-config, restart)", file=sys.stderr
        )
        return 200
    if argv[0] in ("--list-all", "-a"):  # go-task's listing, so step 1 reads it as it would the real one
        names = [APPLY_TASK, "restart"]
        if "--json" in argv[1:] or "-j" in argv[1:]:
            print(json.dumps({"tasks": [{"name": n, "task": n, "desc": "", "aliases": []} for n in names]}))
        else:
            print("task: Available tasks for this project:\n" + "".join(f"* {n}:\n" for n in names), end="")
        return 0
    name, args = argv[0], dict(a.split("=", 1) for a in argv[1:] if "=" in a)
    with _locked(path) as state:
        failure = state.get("fail", {}).get(name)
        if failure:
            _out(f"task: [{name}] {failure}")
            print(f'task: Failed to run task "{name}": exit status 1', file=sys.stderr)
            return 1
        if name == APPLY_TASK:
            _out(f"task: [{name}] envsubst < config/common.json.tpl > build/common.json")
            try:
                relays = _read_env_relays(state)
            except SandboxError as e:
                print(f"error: {e}", file=sys.stderr)
                print(f'task: Failed to run task "{name}": exit status 1', file=sys.stderr)
                return 1
            _out(f"task: [{name}] kubectl -n cosmicac apply -f build/common-config.yaml")
            _out("configmap/cosmicac-wrk-server-k8s-nvidia-common-config configured")
            _out(f"interconnect.relays = {json.dumps(relays)}")
            state["worker"]["applied_relays"] = relays
            state["worker"]["applied_at"] = time.time()
            return 0
        if name == "restart":
            services = args.get("SERVICES", "").strip('"')
            if not services:
                print(
                    'task: [restart] SERVICES is required, e.g. SERVICES="cosmicac-wrk-server-k8s-nvidia"',
                    file=sys.stderr,
                )
                return 1
            for service in services.split(","):
                _out(f"task: [restart] kubectl -n cosmicac rollout restart deployment/{service}")
                _out(f"deployment.apps/{service} restarted")
                if service == WORKER_SERVICE:
                    state["worker"]["running_relays"] = list(state["worker"]["applied_relays"])
                    state["worker"]["restarted_at"] = time.time()
                    _restart_worker(path, state)
                _out(f'Waiting for deployment "{service}" rollout to finish: 1 of 1 updated replicas are available...')
                _out(f'deployment "{service}" successfully rolled out')
            return 0
    print(f'task: Task "{name}" does not exist', file=sys.stderr)
    return 200


# --- `cosmicac` ------------------------------------------------------------------------------


def _worker_alive(state: dict[str, Any]) -> bool:
    pid = state.get("worker", {}).get("pid")
    return isinstance(pid, int) and pid_alive(pid)


def _refresh(state: dict[str, Any], now: float) -> None:
    """Say why jobs wait. Jobs move on only through the worker (`demo.worker`): Creating →
    Running when the job's agent echoed through a relay, and it bumps their last update."""
    worker = _worker_alive(state)
    for job in state["jobs"]:
        if job["status"] in ("Completed", "Failed"):
            continue
        if not job["relays"]:
            job["message"] = "no relay key: the worker had none when it created this job"
        elif not worker and job["status"] == "Creating":
            job["message"] = "waiting: the worker is not running (restart it)"


def _age(seconds: float) -> str:
    return "just now" if seconds < 5 else f"{format_age(seconds)} ago"


def _table(jobs: list[dict[str, Any]], now: float) -> str:
    """The jobs as an aligned table: every create field has its column, so recovery can refill it."""
    header = ["ID", *(f.replace("_", " ").upper() for f in CREATE_FIELDS), "STATUS", "AGE", "LAST UPDATE", "MESSAGE"]
    rows = [
        [
            j["id"],
            *(str(j.get(f, "")) or "-" for f in CREATE_FIELDS),
            j["status"],
            format_age(now - j["created_at"]),
            _age(now - j["updated_at"]),
            j.get("message", ""),
        ]
        for j in jobs
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows])


CREATE_USAGE = "usage: cosmicac jobs create " + " ".join(f"{flag} {f.upper()}" for f, flag in CREATE_FLAGS.items())


def parse_create(args: list[str]) -> dict[str, str]:
    """The job fields of `cosmicac jobs create ARGS`, or SandboxError naming the bad or missing flag."""
    by_flag = {flag: f for f, flag in CREATE_FLAGS.items()}
    fields: dict[str, str] = {}
    it = iter(args)
    for arg in it:
        flag, sep, value = arg.partition("=")
        if flag not in by_flag:
            what = f"unknown flag {flag}" if flag.startswith("-") else f"unexpected argument {arg!r}"
            raise SandboxError(f"error: {what}\n{CREATE_USAGE}")
        if not sep:
            nxt = next(it, None)
            if nxt is None or nxt.startswith("--"):
                raise SandboxError(f"error: {flag} needs a value\n{CREATE_USAGE}")
            value = nxt
        fields[by_flag[flag]] = value
    missing = [CREATE_FLAGS[f] for f in CREATE_FIELDS if not fields.get(f, "").strip()]
    if missing:
        raise SandboxError(
            f"error: missing required flag{'s' if len(missing) > 1 else ''} {', '.join(missing)}\n{CREATE_USAGE}"
        )
    for f in COUNT_FIELDS:
        if not fields[f].isdigit() or int(fields[f]) < 1:
            raise SandboxError(f"error: {CREATE_FLAGS[f]} must be a whole number above 0, not {fields[f]!r}")
    return fields


def cosmicac_main(argv: list[str], state_file: str) -> int:
    """Sandbox `cosmicac jobs list [--json] | create --name N --tags T ... | delete ID`."""
    path = Path(state_file)
    if len(argv) < 2 or argv[0] != "jobs":
        print(
            "usage: cosmicac jobs (list [--json] | create --name NAME --tags TAGS ... | delete JOB_ID)", file=sys.stderr
        )
        return 2
    verb, rest = argv[1], argv[2:]
    now = time.time()
    with _locked(path) as state:
        if verb == "list":
            _refresh(state, now)
            if "--json" in rest:
                _out(json.dumps({"jobs": [_json_job(j) for j in state["jobs"]]}, indent=2))
            elif state["jobs"]:
                _out(_table(state["jobs"], now))
            else:
                _out("No jobs found.")
            return 0
        if verb == "create":
            if rest in (["--help"], ["-h"]):
                _out(CREATE_USAGE)
                return 0
            try:
                fields = parse_create(rest)
            except SandboxError as e:
                print(e, file=sys.stderr)
                return 2
            job = {
                "id": f"job-{secrets.token_hex(3)}",
                **fields,
                "status": "Creating",
                "created_at": now,
                "updated_at": now,
                "relays": list(state["worker"]["running_relays"]),
                "direct": bool(state.get("direct_jobs")),  # its network does not block it (set_direct_jobs)
            }
            state["jobs"].append(job)
            _out(
                f"Created job {job['id']} ({job['name']}: {job['gpu_count']}x {job['gpu_model']} in {job['location']}, "
                f"{job['image']}, {job['disk_gb']} GB disk)"
            )
            return 0
        if verb == "delete":
            if not rest:
                print("error: job id required", file=sys.stderr)
                return 2
            before = len(state["jobs"])
            state["jobs"] = [j for j in state["jobs"] if j["id"] != rest[0]]
            if len(state["jobs"]) == before:
                print(f"Error: job {rest[0]} not found", file=sys.stderr)
                return 1
            _out(f"Deleted job {rest[0]}")
            return 0
    print(f"error: unknown command `jobs {verb}`", file=sys.stderr)
    return 2


def _json_job(j: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": j["id"],
        "name": j.get("name"),
        "tags": j.get("tags"),
        "location": j.get("location"),
        "gpuModel": j.get("gpu_model"),
        "gpuCount": j.get("gpu_count"),
        "image": j.get("image"),
        "diskGb": j.get("disk_gb"),
        "status": j["status"],
        "createdAt": _iso(j["created_at"]),
        "lastUpdate": _iso(j["updated_at"]),
        "message": j.get("message", ""),
    }


def _iso(ts: float) -> str:
    """UTC ISO 8601 with milliseconds (so a job made right after a restart sorts after it)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def set_failure(sandbox: Sandbox, task: str, message: str | None) -> None:
    """Make the sandbox `task <name>` fail with `message` (None: succeed again) — for demos and tests."""
    with _locked(sandbox.state_path) as state:
        if message is None:
            state.setdefault("fail", {}).pop(task, None)
        else:
            state.setdefault("fail", {})[task] = message


def set_direct_jobs(sandbox: Sandbox, direct: bool) -> None:
    """Jobs created from now on connect directly (their network does not block them), or through
    the relay again: how a verdict is tested against a job that did not need the relay."""
    with _locked(sandbox.state_path) as state:
        state["direct_jobs"] = direct


def sandbox_state(sandbox: Sandbox) -> dict[str, Any]:
    """The simulated worker and jobs (read-only view, for tests and the demo)."""
    return _load(sandbox.state_path)
