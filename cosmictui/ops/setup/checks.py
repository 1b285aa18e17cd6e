"""Prerequisite checks, one function per prerequisite on the operator page.

Each returns a `CheckResult` with a status ("ok" | "warn" | "fail"), what was seen, and how
to fix it; none raises for an expected failure. Sync checks look at this machine; async
ones go through a runner to the deployment host.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import os
import re
import shlex
import socket
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

import psutil

from cosmictui.ops.config import Settings
from cosmictui.ops.relayproc import STORAGE_FIX, RelayRuntime, attach, storage_problem
from cosmictui.ops.runner import Runner, RunnerError
from cosmictui.ops.vocabulary import CheckResult, Status
from relay.dht.messages import BOOTSTRAP_NODES

MIN_FREE_RAM = 200 * 1024 * 1024


def _worst(statuses: list[Status]) -> Status:
    return "fail" if "fail" in statuses else "warn" if "warn" in statuses else "ok"


def check_relay_runs_here() -> CheckResult:
    """Our relay package imports and its crypto works (key pair + Noise round trip / signature)."""
    name = "Relay runs here"
    try:
        import relay
        from relay.keys import encode_id, key_pair
    except Exception as e:  # an install problem of any kind
        return CheckResult(name, "fail", f"cannot import the relay package: {e}", "reinstall: pip install cosmictui")
    try:
        a, b = key_pair(), key_pair()
        try:
            from relay.noise import NoiseHandshake
        except ImportError:
            NoiseHandshake = None  # type: ignore[assignment,misc]
        if NoiseHandshake is not None:
            i = NoiseHandshake("XX", True, a)
            r = NoiseHandshake("XX", False, b)
            r.recv(i.send())
            i.recv(r.send(b"ping"))
            r.recv(i.send(b"pong"))
            if not (i.complete and r.complete and i.tx == r.rx and i.rx == r.tx and i.remote_static == b.public_key):
                return CheckResult(name, "fail", "Noise XX self-test gave mismatched keys", "reinstall PyNaCl")
            how = "Ed25519 key pair + Noise XX round trip"
        else:
            import nacl.bindings as nb

            signed = nb.crypto_sign(b"cosmictui", a.secret_key)
            if nb.crypto_sign_open(signed, a.public_key) != b"cosmictui":
                return CheckResult(name, "fail", "Ed25519 self-test failed", "reinstall PyNaCl")
            how = "Ed25519 sign/verify"
        encode_id(a.public_key)
    except Exception as e:
        return CheckResult(name, "fail", f"crypto self-test failed: {e}", "reinstall PyNaCl (pip install -U pynacl)")
    version = getattr(relay, "__version__", "?")
    return CheckResult(name, "ok", f"Python relay {version}; {how} passed")


def check_udp_port(port: int, host: str = "0.0.0.0", storage: str | None = None) -> CheckResult:
    """The UDP port is free, or held by our relay (per `<storage>/relay-runtime.json`)."""
    name = f"UDP port {port}"
    if storage:
        rt = attach(storage)
        if rt is not None and rt.port == port:
            return CheckResult(name, "ok", f"held by our relay (pid {rt.pid}, key {rt.key[:12]}…)")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((host, port))
    except PermissionError:
        return CheckResult(name, "fail", f"not allowed to bind {host}:{port}", "use a port above 1023 (--port)")
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            return CheckResult(
                name, "fail", f"cannot bind {host}:{port}: {e.strerror or e}", "check [relay] host in the config"
            )
        holder = _udp_holder(port)
        return CheckResult(
            name,
            "fail",
            f"already in use{' by ' + holder if holder else ''}",
            "stop that process, or choose another port ([relay] port in the config; open it in the firewall)",
        )
    finally:
        sock.close()
    return CheckResult(name, "ok", "free")


def _udp_holder(port: int) -> str:
    try:
        for conn in psutil.net_connections(kind="udp"):
            if conn.laddr and conn.laddr.port == port and conn.pid:
                try:
                    return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
                except psutil.Error:
                    return f"pid {conn.pid}"
    except (psutil.Error, OSError):
        pass
    return ""


def check_memory(minimum: int = MIN_FREE_RAM) -> CheckResult:
    """At least 200 MB of RAM available (the relay's budget on the operator page)."""
    available = psutil.virtual_memory().available
    mb = available // (1024 * 1024)
    need = minimum // (1024 * 1024)
    if available >= minimum:
        return CheckResult("Free memory", "ok", f"{mb} MB available (the relay needs up to {need} MB)")
    return CheckResult(
        "Free memory",
        "fail",
        f"only {mb} MB available, the relay needs up to {need} MB",
        "free memory (stop other services) or run the relay on a bigger host",
    )


_VOLATILE_FS = frozenset({"tmpfs", "ramfs", "devtmpfs", "overlay-tmpfs"})
_VOLATILE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run")


def _mount_of(path: str) -> tuple[str, str]:
    best = ("/", "")
    try:
        for part in psutil.disk_partitions(all=True):
            mp = part.mountpoint
            if (path == mp or path.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best[0]):
                best = (mp, part.fstype)
    except (psutil.Error, OSError):
        pass
    return best


def check_storage(path: str) -> CheckResult:
    """Storage directory writable and persistent (warn on relative paths, tmpfs, /tmp)."""
    name = "Storage directory"
    statuses: list[Status] = []
    notes: list[str] = []
    fixes: list[str] = []
    if not os.path.isabs(os.path.expanduser(path)):
        statuses.append("warn")
        notes.append(f"{path!r} is relative, so the key depends on where the relay is started")
        fixes.append("use an absolute path such as /var/lib/blind-relay")
    full = os.path.realpath(os.path.expanduser(path))
    probe = full
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return CheckResult(name, "fail", storage_problem(full) or f"{probe} is not a directory", STORAGE_FIX)
    try:  # os.access says yes to root even on read-only mounts: really write
        fd, tmp = tempfile.mkstemp(prefix=".cosmictui-check.", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        statuses.append("fail")
        notes.append(f"cannot write in {probe}: {e.strerror or e}")
        fixes.append(f"sudo mkdir -p {full} && sudo chown $(id -un) {full}")
    mountpoint, fstype = _mount_of(full)
    if fstype in _VOLATILE_FS:
        statuses.append("warn")
        notes.append(f"it is on {fstype} ({mountpoint}): wiped at reboot, and the relay key with it")
        fixes.append("use a directory on a persistent disk")
    elif any(full == d or full.startswith(d + "/") for d in _VOLATILE_DIRS):
        statuses.append("warn")
        notes.append("it is under a temporary directory that may be cleaned, and the relay key with it")
        fixes.append("use a persistent directory such as /var/lib/blind-relay")
    status = _worst(statuses)
    if status == "ok":
        existing = "exists" if os.path.isdir(full) else "will be created"
        return CheckResult(name, "ok", f"{full} is writable and persistent ({existing}, {fstype or 'unknown fs'})")
    return CheckResult(name, status, f"{full}: " + "; ".join(notes), "; ".join(fixes))


def check_dht(stats: dict[str, Any] | None, running: RelayRuntime | None = None) -> CheckResult:
    """From the relay's `/stats`: bootstrapped and not firewalled. `running`: the relay that runs
    (its runtime file), so a relay whose /stats cannot be read is never called "not running"."""
    name = "DHT reachable, port open"
    if stats is None and running is not None:
        why = (
            f"its metrics did not answer at {running.metrics}"
            if running.metrics
            else "its metrics are off (--metrics off)"
        )
        return CheckResult(
            name,
            "warn",
            f"the relay runs (pid {running.pid}, UDP port {running.port}) but {why}, so what it sees of the DHT "
            "is not known",
            "to see its DHT view here, restart it with metrics on ([relay] metrics, or blind-relay --metrics "
            "HOST:PORT; the same storage keeps the same key)",
        )
    if stats is None:
        return CheckResult(
            name,
            "warn",
            "the relay is not running (or its metrics are off), so this is not known yet",
            "start the relay",
        )
    dht = stats.get("dht")
    if not isinstance(dht, dict):
        return CheckResult(name, "warn", "the relay's /stats has no DHT section", "update the relay")
    if not dht.get("bootstrapped"):
        note = f" ({dht['note']})" if dht.get("note") else ""
        return CheckResult(
            name,
            "fail" if not dht.get("note") else "warn",
            f"not bootstrapped: the relay has not reached the DHT{note}",
            'allow outbound UDP to the bootstrap nodes (or set [relay] bootstrap = ["HOST:PORT"] for a private DHT)',
        )
    public = dht.get("public_host")
    where = f"{public}:{dht.get('public_port')}" if public else "unknown public address"
    if dht.get("firewalled", True):
        return CheckResult(
            name,
            "fail",
            f"bootstrapped ({dht.get('nodes', '?')} nodes) but firewalled: peers cannot reach {where}",
            f"open UDP port {stats.get('port', '')} to the internet on this host and its cloud firewall",
        )
    return CheckResult(name, "ok", f"bootstrapped, {dht.get('nodes', '?')} nodes, reachable at {where}")


async def fetch_stats(metrics_url: str, timeout: float = 3.0) -> dict[str, Any] | None:
    """The relay's `/stats`, None when it does not answer (`metrics.client.read_stats`: one fetcher)."""
    from cosmictui.ops.metrics.client import read_stats

    return await read_stats(metrics_url, timeout)


async def check_deployment_host(runner: Runner) -> CheckResult:
    """The deployment host answers and its directory exists."""
    name = "Deployment host reachable"
    try:
        result = await runner.run("true", timeout=30)
    except RunnerError as e:
        return CheckResult(name, "fail", e.what, e.fix)
    if not result.ok:
        return CheckResult(name, "fail", f"`true` exited {result.exit_code} on {runner.label}", "check the login shell")
    return CheckResult(name, "ok", f"{runner.label}: {runner.root}")


# A dht-rpc PING (docs/wire/dht.md §1, §2): type 0x03, flags 0x04 (internal), tid uint16 LE, `to` (IPv4 +
# uint16 LE port), command 0. The reply starts 0x13, echoes the tid and carries the address
# the relay saw us at. Stdlib only: it runs on the deployment host with whatever python3 is there.
PING_SCRIPT = """\
import os,socket,sys,time
h=socket.gethostbyname(sys.argv[1]);p=int(sys.argv[2]);t=float(sys.argv[3]);end=time.time()+t;n=0
tid=os.urandom(2);req=bytes((3,4))+tid+socket.inet_aton(h)+bytes((p&255,p>>8,0))
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
while time.time()<end:
 s.sendto(req,(h,p));n+=1;s.settimeout(max(0.05,min(1.0,end-time.time())))
 try:
  while True:
   d,a=s.recvfrom(2048)
   if a==(h,p) and len(d)>=10 and d[0]==0x13 and d[2:4]==tid:
    print("PONG %s:%d sees us as %s:%d"%(h,p,socket.inet_ntoa(d[4:8]),d[8]|d[9]<<8));sys.exit(0)
 except socket.timeout:pass
 except OSError as e:print("ERROR %s"%e);time.sleep(0.2)
print("NOREPLY %s:%d after %d pings in %gs"%(h,p,n,t));sys.exit(1)
"""


def dht_ping(host: str, port: int, timeout: float = 1.0) -> tuple[bool, str]:
    """Send a dht-rpc PING from here (same bytes as the one-liner); (answered, what happened)."""
    try:
        ip = socket.gethostbyname(host)
    except OSError as e:
        return False, f"cannot resolve {host}: {e}"
    tid = os.urandom(2)
    req = b"\x03\x04" + tid + socket.inet_aton(ip) + port.to_bytes(2, "little") + b"\x00"
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        while (left := deadline - time.monotonic()) > 0:
            try:
                s.sendto(req, (ip, port))
                s.settimeout(max(0.05, min(0.5, left)))
                while True:
                    data, addr = s.recvfrom(2048)
                    if addr == (ip, port) and len(data) >= 10 and data[0] == 0x13 and data[2:4] == tid:
                        return True, f"answered from {ip}:{port}"
            except TimeoutError:
                continue
            except OSError as e:  # ICMP port unreachable shows up here on loopback
                err = e.strerror or str(e)
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
                if time.monotonic() >= deadline:
                    return False, f"no dht-rpc reply from {ip}:{port} ({err})"
    return False, f"no dht-rpc reply from {ip}:{port} within {timeout:g} s"


def ping_command(host: str, port: int, timeout: float = 3.0, python: str = "python3") -> str:
    """A stdlib-only `python3 -c` one-liner that sends a dht-rpc PING and prints the reply."""
    # one physical line (copyable from the command log): exec("...") with \n, \\ and \x22 escapes
    body = PING_SCRIPT.replace("\\", "\\\\").replace('"', "\\x22").replace("\n", "\\n")
    assert "'" not in body
    return " ".join(
        [shlex.quote(python), "-c", f"'exec(\"{body}\")'", shlex.quote(host), str(int(port)), f"{timeout:g}"]
    )


async def check_relay_from_deployment(runner: Runner, host: str, port: int, timeout: float = 3.0) -> CheckResult:
    """From the deployment host, the relay's UDP port answers a dht-rpc PING."""
    name = f"Relay answers from {runner.label}"
    try:
        result = await runner.run(ping_command(host, port, timeout), timeout=timeout + 30)
    except RunnerError as e:
        if e.kind == "missing-command":
            return await _ping_without_python(runner, name, host, port, timeout)
        return CheckResult(name, "fail", e.what, e.fix)
    last = result.output.strip().splitlines()[-1] if result.output.strip() else ""
    if result.ok and last.startswith("PONG"):
        return CheckResult(name, "ok", f"dht-rpc PING to {host}:{port} answered ({last[5:]})")
    if result.exit_code == 1 and last.startswith("NOREPLY"):
        return CheckResult(
            name,
            "fail",
            f"no dht-rpc reply from {host}:{port} over UDP within {timeout:g} s",
            f"is the relay running and answering? open UDP port {port} on the relay host's firewall, and check that "
            f"{host} is the address the deployment host uses to reach it",
        )
    return CheckResult(name, "fail", f"the ping check failed: {last or 'no output'}", "see the command log")


def bash_ping_command(ip: str, port: int, timeout: float = 3.0) -> str:
    """The same dht-rpc PING with bash's /dev/udp and coreutils, for a host without python3.

    bash opens a connected UDP socket for /dev/udp/HOST/PORT, so the reply can be read back
    from the same descriptor; `od` prints its first byte (13 = a dht-rpc response).
    """
    tid = os.urandom(2)
    req = b"\x03\x04" + tid + socket.inet_aton(ip) + port.to_bytes(2, "little") + b"\x00"
    payload = "".join(f"\\x{b:02x}" for b in req)
    wait = max(1, int(timeout + 0.999))
    script = (
        f"exec 3<>/dev/udp/{ip}/{int(port)} || exit 3; "
        f"for i in 1 2 3; do printf '{payload}' >&3; done; "
        f"timeout {wait} head -c 1 <&3 | od -An -tx1"
    )
    return "bash -c " + shlex.quote(script)


async def _ping_without_python(runner: Runner, name: str, host: str, port: int, timeout: float) -> CheckResult:
    """python3 is missing on the deployment host: a warning, with the PING sent by bash instead."""
    missing = f"python3 is not on {runner.label}"
    try:
        ip = socket.gethostbyname(host)
    except OSError:
        ip = host
    cmd = bash_ping_command(ip, port, timeout)
    manual = (
        f"install python3 there for the usual check, or from {runner.label} send any UDP datagram to "
        f"{host}:{port} and watch the relay's received packets rise (cosmictui monitor)"
    )
    try:
        result = await runner.run(cmd, timeout=timeout + 30)
    except RunnerError as e:
        return CheckResult(name, "warn", f"{missing} and the bash fallback could not run ({e.what})", manual)
    answer = result.output.strip().split()
    if result.ok and answer[:1] == ["13"]:
        return CheckResult(name, "warn", f"{missing}; checked with bash /dev/udp instead: {ip}:{port} answered", "")
    if result.exit_code == 127 or "not found" in result.output:
        return CheckResult(name, "warn", f"{missing}, nor bash, so the UDP check cannot run there", manual)
    return CheckResult(
        name,
        "fail",
        f"{missing}; checked with bash /dev/udp instead: no dht-rpc reply from {ip}:{port} within {timeout:g} s",
        f"open UDP port {port} on the relay host's firewall, and check that {host} is the address the deployment "
        "host uses to reach it ([relay] address)",
    )


def task_names(cmd: str) -> list[str] | None:
    """The task names a `task …` command runs (None when it is not a go-task command)."""
    try:
        words = shlex.split(cmd)
    except ValueError:
        return None
    if not words or os.path.basename(words[0]) != "task":
        return None
    return [w for w in words[1:] if not w.startswith("-") and "=" not in w]


_NO_TASKFILE = re.compile(r"(?i)no taskfile found")
_NO_TASKS = re.compile(r"(?im)^task: no tasks available")
_TASK_ERROR = re.compile(r"(?i)taskfile|yaml")  # go-task's own words when it cannot read one


def _last_lines(output: str) -> str:
    """go-task's error in one line: its last line, with the `task: …` line before it if any."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    tail = lines[-2:] if len(lines) >= 2 and lines[-2].startswith("task:") else lines[-1:]
    return " ".join(tail)[:300]


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_TASKFILES = ("Taskfile.yml", "Taskfile.yaml", "taskfile.yml", "taskfile.yaml", "Taskfile.dist.yml")


def _names_from_listing(output: str) -> set[str] | None:
    """Task names from `task --list-all --json` (or its text form), None when it is neither."""
    text = output.strip()
    start = text.find("{")
    if start >= 0:
        try:
            data = json.loads(text[start:])
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("tasks"), list):
            return {str(t.get("name")) for t in data["tasks"] if isinstance(t, dict) and t.get("name")}
    names = {m.group(1) for m in re.finditer(r"(?m)^\* ([^\s:]+(?::[^\s:]+)*):", output)}
    return names or None


def _names_from_taskfile(text: str) -> set[str]:
    """Top-level task names under `tasks:` in a Taskfile (no YAML library for one key)."""
    names: set[str] = set()
    inside = False
    indent: int | None = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if re.match(r"^tasks:\s*(#.*)?$", line):
            inside = True
            continue
        if inside:
            if not line.startswith((" ", "\t")):
                break
            width = len(line) - len(line.lstrip())
            indent = width if indent is None else indent
            m = re.match(r"^\s*['\"]?([^'\":\s]+(?::[^'\":\s]+)*)['\"]?:", line)
            if width == indent and m:
                names.add(m.group(1))
    return names


async def check_tasks(runner: Runner, settings: Settings) -> CheckResult:
    """`task` runs on the deployment host and knows the apply and restart tasks."""
    name = "Taskfile tasks"
    wanted: list[str] = []
    for key, cmd in (("apply", settings.apply_command), ("restart", settings.restart_command)):
        tasks = task_names(cmd)
        if tasks is None:
            return await _check_program(runner, cmd, f"[commands] {key}")
        wanted += tasks
    # go-task's own listing first: JSON (go-task >= 3.19), then its text form (older go-task has
    # no --json); the Taskfile is read only when `task` gives neither and names no error of its own
    # (a stand-in), so a Taskfile go-task cannot parse is never passed by reading it ourselves.
    known: set[str] | None = None
    source = "task --list-all"
    said = ""
    for cmd in ("task --list-all --json", "task --list-all"):
        try:
            result = await runner.run(cmd, timeout=30)
        except RunnerError as e:
            if e.kind == "missing-command":
                return CheckResult(
                    name,
                    "fail",
                    f"`task` (go-task) is not on PATH on {runner.label}",
                    "install go-task there, or add its directory to [commands] env PATH in the config",
                )
            return CheckResult(name, "fail", e.what, e.fix)
        # go-task colours its words where it thinks someone watches (CI=true, FORCE_COLOR): read plain text
        result = dataclasses.replace(result, output=_ANSI.sub("", result.output))
        known = _names_from_listing(result.output)
        if known is None and _NO_TASKS.search(result.output):
            known = set()  # go-task exits 1 on a Taskfile without tasks
        if known is not None:
            break
        said = _last_lines(result.output) or f"exit {result.exit_code}"
        if cmd.endswith("--json"):
            continue  # an older go-task has no --json (its usage text names Taskfiles): ask for the text form
        if _NO_TASKFILE.search(result.output):
            return CheckResult(
                name,
                "fail",
                f"`task` on {runner.label} found no Taskfile in {runner.root} or above it ({said})",
                "give the deployment directory that holds the Taskfile: --deployment PATH "
                "(or ssh://user@host/PATH), or deployment = ... in the config",
            )
        if not result.ok and _TASK_ERROR.search(result.output):
            return CheckResult(
                name,
                "fail",
                f"`{cmd}` on {runner.label} cannot read the Taskfile: {said}",
                f"fix the Taskfile in {runner.root} (`{cmd}` there shows the same error)",
            )
    if known is None:
        for file in _TASKFILES:
            try:
                data = await runner.read_file(file)
            except RunnerError:
                continue
            known, source = _names_from_taskfile(data.decode("utf-8", "replace")), file
            break
    if known is None:
        return CheckResult(
            name,
            "fail",
            f"`task --list-all` on {runner.label} listed no tasks and {runner.root} has no Taskfile (it said: {said})",
            "give the deployment directory that holds the Taskfile: --deployment PATH (or ssh://user@host/PATH), "
            "or deployment = ... in the config; or put go-task on PATH there ([commands] env PATH)",
        )
    missing = [t for t in wanted if t not in known]
    if missing:
        return CheckResult(
            name,
            "fail",
            f"the Taskfile has no task {', '.join(missing)} (it has: {', '.join(sorted(known)) or 'none'})",
            "check the deployment directory, or set [commands] apply and restart to the tasks it has",
        )
    return CheckResult(name, "ok", f"{', '.join(wanted)} found ({source} on {runner.label})")


async def _check_program(runner: Runner, cmd: str, key: str) -> CheckResult:
    """A configured command that is not a `task` one: at least its program must be there."""
    try:
        prog = (shlex.split(cmd) or [cmd])[0]
    except ValueError:
        return CheckResult("Deployment commands", "fail", f"{key} is not a valid shell command: {cmd}", f"fix {key}")
    try:
        result = await runner.run(f"command -v {shlex.quote(prog)}", timeout=30)
    except RunnerError as e:
        return CheckResult("Deployment commands", "fail", e.what, e.fix)
    if not result.ok:
        return CheckResult(
            "Deployment commands",
            "fail",
            f"`{prog}` ({key}) is not on PATH on {runner.label}",
            "install it, add its directory to [commands] env PATH, or give its full path in " + key,
        )
    return CheckResult("Deployment commands", "ok", f"`{prog}` found on {runner.label}")


_NOT_LOGGED_IN = re.compile(r"(?i)not logged in|log ?in|unauthori[sz]ed|unauthenticated|authenticat|\b401\b|token")


async def check_jobs_cli(runner: Runner, settings: Settings) -> CheckResult:
    """The list command runs, is logged in, and prints something we can read as jobs."""
    from cosmictui.ops.jobs.listing import list_jobs

    name = "Jobs can be listed"
    listing = await list_jobs(runner.run, settings, datetime.now(UTC))
    if listing.ok:
        return CheckResult(name, "ok", f"`{listing.cmd}` listed {len(listing.jobs)} job(s) on {runner.label}")
    e = listing.runner_error
    if e is not None and e.kind == "missing-command":
        return CheckResult(name, "fail", e.what, e.fix)
    if listing.exit_code not in (None, 0) and _NOT_LOGGED_IN.search(listing.raw or ""):
        said = (listing.raw or "").strip().splitlines()[-1][:160]
        return CheckResult(
            name,
            "fail",
            f"`{listing.cmd}` is not logged in on {runner.label} (it said: {said})",
            f"log in to CosmicAC there as the user the wizard connects as ({runner.label}), then press r",
        )
    return CheckResult(name, "fail", listing.error or "the jobs list failed", "")


async def check_bootstrap(settings: Settings, timeout: float = 1.5) -> CheckResult:
    """A bootstrap node answers a dht-rpc PING from here: without one the relay never joins the DHT."""
    name = "Bootstrap node answers"
    configured = bool(settings.relay_bootstrap)
    nodes = list(settings.relay_bootstrap or PUBLIC_BOOTSTRAP)
    addrs: list[tuple[str, str, int]] = []
    for node in nodes:
        host, sep, port = node.rpartition(":")
        if not sep or not port.isdigit():
            return CheckResult(name, "fail", f"bootstrap node {node!r} is not HOST:PORT", "fix [relay] bootstrap")
        ip = host.split("@", 1)[0]  # suggestedIP@hostname: the IP, no DNS needed
        addrs.append((node, ip, int(port)))
    answers = await asyncio.gather(*(asyncio.to_thread(dht_ping, ip, port, timeout) for _, ip, port in addrs))
    ok = [node for (node, _, _), (answered, _) in zip(addrs, answers, strict=True) if answered]
    if ok:
        return CheckResult(name, "ok", f"{len(ok)} of {len(nodes)} answered ({ok[0]})")
    why = answers[0][1] if answers else "no nodes"
    if configured:
        return CheckResult(
            name,
            "fail",
            f"none of the {len(nodes)} configured bootstrap node(s) answered ({why})",
            "check [relay] bootstrap (HOST:PORT of running DHT nodes) and outbound UDP from this host",
        )
    return CheckResult(
        name,
        "warn",
        f"none of the public HyperDHT bootstrap nodes answered from here ({why})",
        "allow outbound UDP to port 49737, or set [relay] bootstrap to DHT nodes this host reaches; step 2 "
        "shows whether the relay joined the DHT",
    )


#: The nodes the relay joins without [relay] bootstrap (the public HyperDHT ones); tests point it at loopback.
PUBLIC_BOOTSTRAP: tuple[str, ...] = tuple(BOOTSTRAP_NODES)


def relay_address(settings: Settings, runner: Runner | None, stats: dict[str, Any] | None) -> str | None:
    """How the deployment host reaches the relay: configured, else the public address, else loopback."""
    if settings.relay_address:
        return settings.relay_address
    if runner is not None and not getattr(runner, "host", None):
        return "127.0.0.1"
    dht = (stats or {}).get("dht") or {}
    return dht.get("public_host") or None


async def run_checks(settings: Settings, runner: Runner | None = None, ping_timeout: float = 3.0) -> list[CheckResult]:
    """Every check, in the wizard's order (remote ones only when a runner is given)."""
    storage = settings.relay_storage
    rt = attach(storage)
    results = [
        check_relay_runs_here(),
        check_udp_port(settings.relay_port, settings.relay_host, storage),
        check_memory(),
        check_storage(storage),
    ]
    url = rt.metrics if rt is not None and rt.metrics else settings.metrics_url
    bootstrap = asyncio.ensure_future(check_bootstrap(settings))  # pings run while the host is checked
    stats = await fetch_stats(url) if url and rt is not None else None
    results.append(check_dht(stats, rt))
    if runner is not None:
        host_result = await check_deployment_host(runner)
        results.append(await bootstrap)
        results.append(host_result)
        if host_result.ok:
            results.append(await check_tasks(runner, settings))
            results.append(await check_jobs_cli(runner, settings))
        address = relay_address(settings, runner, stats)
        port = rt.port if rt is not None else settings.relay_port
        if not host_result.ok:
            pass
        elif address is None:
            results.append(
                CheckResult(
                    f"Relay answers from {runner.label}",
                    "warn",
                    "the relay's address as seen from the deployment host is not known yet",
                    "set [relay] address in the config (the relay host's IP or name)",
                )
            )
        else:
            results.append(await check_relay_from_deployment(runner, address, port, ping_timeout))
    else:
        results.append(await bootstrap)
    return results
