"""Prerequisite checks, one function per prerequisite on the operator page.

Each returns a `CheckResult` with a status ("ok" | "warn" | "fail"), what was seen, and how
to fix it; none raises for an expected failure. Sync checks look at this machine; async
ones go through a runner to the deployment host.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shlex
import socket
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from typing import Any, Literal

import psutil

from cosmictui.ops.config import Settings
from cosmictui.ops.relayproc import attach
from cosmictui.ops.runner import Runner, RunnerError

Status = Literal["ok", "warn", "fail"]
MIN_FREE_RAM = 200 * 1024 * 1024


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "fail"


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
        return CheckResult(name, "fail", f"{probe} exists and is not a directory", "choose a directory path")
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


def check_dht(stats: dict[str, Any] | None) -> CheckResult:
    """From the relay's `/stats`: bootstrapped and not firewalled."""
    name = "DHT reachable, port open"
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
    """GET `<metrics_url>/stats` as JSON; None when the relay does not answer."""

    def get() -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(metrics_url.rstrip("/") + "/stats", timeout=timeout) as r:
                data = json.loads(r.read())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    return await asyncio.to_thread(get)


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


# A dht-rpc PING (dht.md A2/A3): type 0x03, flags 0x04 (internal), tid uint16 LE, `to` (IPv4 +
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
            return CheckResult(
                name,
                "fail",
                f"python3 is not available on {runner.label}, so the UDP check cannot run there",
                "install python3 on the deployment host, or check UDP reachability of the relay port by hand",
            )
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
    stats = await fetch_stats(url) if url and rt is not None else None
    results.append(check_dht(stats))
    if runner is not None:
        host_result = await check_deployment_host(runner)
        results.append(host_result)
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
    return results
