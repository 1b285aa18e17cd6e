"""The mission's network, built from Linux network namespaces: two LANs behind NAT routers that
block direct connections, and a shared "wan" where the relay and a hyperdht testnet live.

    lan a (10.1.0.2) -- router ra (NAT) --+                       +-- relay   (11.0.0.2)
                                          +-- wan bridge (11.0.0.0/24) +-- dht  (11.0.0.3)
    lan b (10.2.0.2) -- router rb (NAT) --+

- The routers masquerade LAN traffic to their wan address: `fully-random` ports (a new public
  port for every destination, so hyperdht rates both NATs RANDOM and cannot punch), or plain
  `masquerade` (ports kept: consistent mappings that hyperdht can punch). They forward only
  LAN -> wan and the replies conntrack matches; nothing unsolicited gets in.
- The wan bridge drops packets whose TTL is below `WAN_MIN_TTL`: hyperdht's low-TTL (5) holepunch
  probes open the sender's own NAT and then die, as they do a few hops into the internet.
- Loss and delay on the wan (benchmarks only) are nftables `numgen random` drops on the bridge and
  a userspace delay line (see `delay_line.py`); this kernel has no sch_netem.

Every name carries this process's pid and a counter, so parallel runs never collide, and
`close()` kills every process inside our namespaces (`ip netns pids`) before deleting them — also
when a test failed. Addresses exist only inside these namespaces; nothing is routed to the host.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
JS = Path(__file__).resolve().parent / "js"
NODE_MODULES = ROOT / "tests" / "interop" / "node_modules"
DELAY_LINE = Path(__file__).resolve().parent / "delay_line.py"

WAN_NET = "11.0.0"  # never leaves the namespaces: the wan bridge has no link to the host
WAN_MIN_TTL = 10  # the wan drops what has fewer hops left (hyperdht's HOLEPUNCH_TTL is 5)
HOSTS = {"relay": f"{WAN_NET}.2", "dht": f"{WAN_NET}.3"}
ROUTERS = {"a": (f"{WAN_NET}.11", "10.1.0"), "b": (f"{WAN_NET}.12", "10.2.0")}

_counter = itertools.count()


class NetworkUnavailable(RuntimeError):
    """What this machine lacks to build the topology (root, iproute2, nftables, netns)."""


def missing_requirements() -> list[str]:
    """Everything that keeps the topology from being built here, each said exactly."""
    missing = []
    if os.geteuid() != 0:
        missing.append(f"root (network namespaces need CAP_NET_ADMIN; running as uid {os.geteuid()})")
    for exe, pkg in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(exe) is None:
            missing.append(f"`{exe}` on PATH (Debian: apt-get install -y --no-install-recommends {pkg})")
    if shutil.which("node") is None:
        missing.append("`node` on PATH (Node 20, for the hyperdht peers)")
    elif not (NODE_MODULES / "hyperdht").is_dir():
        missing.append(f"{NODE_MODULES}/hyperdht (run `npm ci --prefix tests/interop`)")
    if not missing:
        probe = f"bnprobe{os.getpid()}"
        r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if r.returncode != 0:
            missing.append(f"network namespaces (`ip netns add` failed: {r.stderr.strip()})")
        else:
            r = subprocess.run(
                ["ip", "netns", "exec", probe, "nft", "add", "table", "inet", "probe"], capture_output=True, text=True
            )
            if r.returncode != 0:
                missing.append(f"nftables in the kernel (`nft add table` failed: {r.stderr.strip()})")
            subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return missing


def run(*argv: str, input: str | None = None) -> str:
    """Run one setup command; a failure says which command and why."""
    r = subprocess.run(list(argv), input=input, capture_output=True, text=True)
    if r.returncode != 0:
        raise NetworkUnavailable(f"`{' '.join(argv)}` failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


@dataclass
class NsProcess:
    """A process started inside one of our namespaces; stdout lines are queued for event waits."""

    ns: str
    argv: list[str]
    proc: subprocess.Popen[str]
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    stdout_lines: list[str] = field(default_factory=list)
    stderr_lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout_lines.append(line.rstrip("\n"))
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines[-50:])

    def wait_line(self, pred: Any, timeout: float, what: str) -> str:
        """The first stdout line `pred` accepts (a safety timeout only; the line is the event)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                raise TimeoutError(f"{what}: nothing within {timeout}s; stderr: {self.stderr}") from None
            if line is None:
                raise RuntimeError(f"{what}: process exited ({self.proc.wait()}); stderr: {self.stderr}")
            if pred(line):
                return line

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self, timeout: float = 10) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self.proc.send_signal(signal.SIGTERM)
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)


class Peer:
    """A Node hyperdht peer (js/peer.js) on a LAN host; `call` runs one command and returns its result."""

    def __init__(self, p: NsProcess, name: str) -> None:
        self.p = p
        self.name = name
        self._seq = itertools.count(1)
        self._results: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def call(self, op: str, timeout: float = 60, **args: Any) -> dict[str, Any]:
        seq = next(self._seq)
        self.p.send(json.dumps({"op": op, "seq": seq, **args}))

        def mine(line: str) -> bool:
            if not line.startswith("{"):
                return False
            ev = json.loads(line)
            return ev.get("seq") == seq and ev.get("ev") in ("result", "error")

        ev = json.loads(self.p.wait_line(mine, timeout, f"peer {self.name} {op}"))
        if ev["ev"] == "error":
            raise RuntimeError(f"peer {self.name} {op}: {ev['message']}")
        return ev


class Topology:
    """Build with `Topology(nat=...).build()` (or as a context manager); `close()` always tears down."""

    def __init__(
        self,
        *,
        nat: str = "random",
        udp_timeout: int | None = None,
        wan_loss_percent: float = 0,
        wan_delay_ms: float = 0,
        relay_delay_ms: float = 0,
    ) -> None:
        if nat not in ("random", "consistent", "mixed"):
            raise ValueError(f"nat must be 'random', 'consistent' or 'mixed' (a random, b consistent), got {nat!r}")
        self.nat = nat
        self.udp_timeout = udp_timeout
        self.wan_loss_percent = wan_loss_percent
        self.wan_delay_ms = wan_delay_ms  # one way, on each router's uplink
        self.relay_delay_ms = relay_delay_ms  # one way, on the relay host's link (a distant relay)
        self.prefix = f"bn{os.getpid()}x{next(_counter)}"
        self.namespaces: list[str] = []
        self.procs: list[NsProcess] = []
        self.testnet: NsProcess | None = None
        self.bootstrap: list[str] = []

    # names
    def ns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    @property
    def relay_host(self) -> str:
        return HOSTS["relay"]

    @property
    def dht_host(self) -> str:
        return HOSTS["dht"]

    def lan_host(self, side: str) -> str:
        return f"{ROUTERS[side][1]}.2"

    def router_wan(self, side: str) -> str:
        return ROUTERS[side][0]

    # building
    def _add_ns(self, host: str) -> str:
        name = self.ns(host)
        run("ip", "netns", "add", name)
        self.namespaces.append(name)
        run("ip", "-n", name, "link", "set", "lo", "up")
        return name

    def _veth(self, ns1: str, if1: str, ns2: str, if2: str) -> None:
        run("ip", "link", "add", "name", if1, "netns", ns1, "type", "veth", "peer", "name", if2, "netns", ns2)
        run("ip", "-n", ns1, "link", "set", if1, "up")
        run("ip", "-n", ns2, "link", "set", if2, "up")

    def nft(self, host: str, ruleset: str) -> None:
        run("ip", "netns", "exec", self.ns(host), "nft", "-f", "-", input=ruleset)

    def build(self) -> Topology:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        wan = self._add_ns("wan")
        run("ip", "-n", wan, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", wan, "link", "set", "br0", "up")
        self.nft("wan", self._wan_rules())

        def on_wan(host: str, addr: str, delay_ms: float = 0) -> str:
            ns = self.ns(host) if self.ns(host) in self.namespaces else self._add_ns(host)
            port = f"p{host}"
            if delay_ms > 0:  # host -- [delay line namespace] -- bridge
                line = self._add_ns(f"d{host}")
                self._veth(ns, "wan0", line, "x0")
                self._veth(line, "x1", wan, port)
                for dev in ("x0", "x1"):
                    run("ip", "-n", line, "link", "set", dev, "promisc", "on")
                dl = self.spawn(f"d{host}", [sys.executable, str(DELAY_LINE), "x0", "x1", str(delay_ms)])
                dl.wait_line(lambda ln: ln == "ready", 30, f"delay line for {host}")
            else:
                self._veth(ns, "wan0", wan, port)
            run("ip", "-n", wan, "link", "set", port, "master", "br0")
            run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "wan0")
            return ns

        for host, addr in HOSTS.items():
            on_wan(host, addr, self.relay_delay_ms if host == "relay" else 0)
        for side, (wan_addr, lan_net) in ROUTERS.items():
            router = on_wan(f"r{side}", wan_addr, self.wan_delay_ms)
            lan = self._add_ns(side)
            self._veth(router, "lan0", lan, "eth0")
            run("ip", "-n", router, "addr", "add", f"{lan_net}.1/24", "dev", "lan0")
            run("ip", "-n", lan, "addr", "add", f"{lan_net}.2/24", "dev", "eth0")
            run("ip", "-n", lan, "route", "add", "default", "via", f"{lan_net}.1")
            run("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            self.nft(f"r{side}", self._router_rules(side))
            if self.udp_timeout is not None:
                self.set_udp_timeout(self.udp_timeout, side)

    def set_udp_timeout(self, seconds: int, *sides: str) -> None:
        """How long the routers keep an idle UDP mapping (both conntrack UDP timeouts). They are
        per namespace, so only our routers forget early; an entry takes the new value on its next packet."""
        for side in sides or tuple(ROUTERS):
            for key in ("nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream"):
                run("ip", "netns", "exec", self.ns(f"r{side}"), "sysctl", "-qw", f"net.netfilter.{key}={seconds}")

    def nat_of(self, side: str) -> str:
        return ("random" if side == "a" else "consistent") if self.nat == "mixed" else self.nat

    def _router_rules(self, side: str) -> str:
        masq = "masquerade fully-random" if self.nat_of(side) == "random" else "masquerade"
        return f"""
table inet nat_router {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "wan0" {masq}
  }}
  chain forward {{
    type filter hook forward priority filter; policy drop;
    ct state established,related accept
    iifname "lan0" oifname "wan0" accept
  }}
  chain input {{
    type filter hook input priority filter; policy drop;
    iifname "lo" accept
    ct state established,related accept
    iifname "lan0" accept
  }}
}}
"""

    def _wan_rules(self) -> str:
        loss = ""
        if self.wan_loss_percent:
            per_million = round(self.wan_loss_percent * 10_000)
            loss = f"    meta l4proto udp numgen random mod 1000000 < {per_million} counter drop\n"
        return f"""
table bridge wan {{
  chain forward {{
    type filter hook forward priority filter; policy accept;
    ether type ip ip ttl < {WAN_MIN_TTL} counter drop
{loss}  }}
}}
"""

    def firewall_relay_host(self, *udp_ports: int) -> None:
        """A cloud security group on the relay host: inbound only UDP to these ports (and replies)."""
        ports = ", ".join(str(p) for p in udp_ports)
        self.nft(
            "relay",
            f"""
table inet security_group {{
  chain input {{
    type filter hook input priority filter; policy drop;
    iifname "lo" accept
    ct state established,related accept
    udp dport {{ {ports} }} accept
    counter drop
  }}
}}
""",
        )

    def open_relay_host(self) -> None:
        with contextlib.suppress(NetworkUnavailable):
            run("ip", "netns", "exec", self.ns("relay"), "nft", "delete", "table", "inet", "security_group")

    def counter(self, host: str, table: str) -> list[int]:
        """Packet counts of the `counter` rules in one of our tables (to show a rule really bit)."""
        data = json.loads(run("ip", "netns", "exec", self.ns(host), "nft", "-j", "list", "table", *table.split()))
        out = []
        for item in data["nftables"]:
            for expr in item.get("rule", {}).get("expr", []):
                if "counter" in expr:
                    out.append(int(expr["counter"]["packets"]))
        return out

    # processes
    def spawn(self, host: str, argv: list[str], *, cwd: Path = ROOT, env: dict[str, str] | None = None) -> NsProcess:
        full = ["ip", "netns", "exec", self.ns(host), *argv]
        proc = subprocess.Popen(
            full,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "NODE_PATH": str(NODE_MODULES), **(env or {})},
        )
        p = NsProcess(self.ns(host), full, proc)
        self.procs.append(p)
        return p

    def start_testnet(self, size: int = 12, timeout: float = 90) -> list[str]:
        self.testnet = self.spawn(
            "dht", ["node", str(JS / "testnet.js"), json.dumps({"host": self.dht_host, "size": size})]
        )
        line = self.testnet.wait_line(lambda ln: ln.startswith("{"), timeout, "dht testnet ready")
        self.bootstrap = json.loads(line)["bootstrap"]
        return self.bootstrap

    def peer(self, side: str, name: str | None = None) -> Peer:
        p = self.spawn(side, ["node", str(JS / "peer.js"), json.dumps({"bootstrap": self.bootstrap})])
        p.wait_line(lambda ln: '"started"' in ln, 60, f"peer on lan {side} started")
        return Peer(p, name or side)

    def python_relay(self, storage: Path, port: int, *extra: str, timeout: float = 90) -> RelayInNs:
        argv = [sys.executable, "-m", "relay", "--storage", str(storage), "--port", str(port)]
        argv += ["--host", self.relay_host, "--bootstrap", ",".join(self.bootstrap), "--metrics", "127.0.0.1:0"]
        p = self.spawn("relay", [*argv, *extra], env={"PYTHONUNBUFFERED": "1"})
        line = p.wait_line(lambda ln: ln.startswith("Server listening on "), timeout, "python relay listening")
        runtime = json.loads((storage / "relay-runtime.json").read_text())
        return RelayInNs(self, p, key=line.split()[-1], port=int(runtime["port"]), metrics=runtime.get("metrics"))

    def node_relay(self, seed: str, port: int, timeout: float = 90, dht: dict[str, Any] | None = None) -> RelayInNs:
        """The Node yardstick: npm hyperdht + blind-relay as blind-relay-service runs them
        (`dht`: extra HyperDHT options, e.g. `{"firewalled": False}` to skip its NAT check)."""
        script = ROOT / "benchmarks" / "js" / "relay_node_server.js"
        opts: dict[str, Any] = {"bootstrap": self.bootstrap, "port": port, "host": self.relay_host, "seed": seed}
        if dht:
            opts["dht"] = dht
        p = self.spawn("relay", ["node", str(script), json.dumps(opts)])
        info = json.loads(p.wait_line(lambda ln: ln.startswith("{"), timeout, "node relay listening"))
        return RelayInNs(self, p, key=info["key"], port=int(info["port"]), metrics=None, ports=list(info["ports"]))

    def exec_in(self, host: str, *argv: str, timeout: float = 30) -> str:
        r = subprocess.run(
            ["ip", "netns", "exec", self.ns(host), *argv], capture_output=True, text=True, timeout=timeout
        )
        if r.returncode != 0:
            raise RuntimeError(f"{argv} in {host} failed: {r.stderr.strip()}")
        return r.stdout

    # teardown
    def close(self) -> None:
        """Kill every process inside our namespaces (by pid), then delete them (by name)."""
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.stop(timeout=5)
        for ns in self.namespaces:
            r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in r.stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.namespaces.clear()
        self.procs.clear()

    def __enter__(self) -> Topology:
        return self.build()

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class RelayInNs:
    """A relay process on the relay host; `stats()` reads its /stats from inside the namespace."""

    topo: Topology
    proc: NsProcess
    key: str
    port: int
    metrics: str | None
    ports: list[int] = field(default_factory=list)  # every UDP port the relay owns (Node: server + client socket)

    @property
    def address(self) -> dict[str, Any]:
        return {"host": self.topo.relay_host, "port": self.port}

    def is_relay(self, remote: dict[str, Any]) -> bool:
        """Is this remote (a peer's rawStream view) one of the relay's sockets?"""
        return remote.get("host") == self.topo.relay_host and remote.get("port") in (self.ports or [self.port])

    def stats(self) -> dict[str, Any]:
        assert self.metrics, "the Node relay has no /stats"
        url = self.metrics + "/stats"
        code = f"import urllib.request as u, sys; sys.stdout.write(u.urlopen({url!r}, timeout=10).read().decode())"
        return json.loads(self.topo.exec_in("relay", sys.executable, "-c", code))

    def stop(self) -> None:
        self.proc.stop()


@contextlib.contextmanager
def topology(**kw: Any) -> Iterator[Topology]:
    missing = missing_requirements()
    if missing:
        raise NetworkUnavailable("the blocked-network topology needs: " + "; ".join(missing))
    t = Topology(**kw)
    try:
        yield t.build()
    finally:
        t.close()
