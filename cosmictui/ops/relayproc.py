"""Manage the relay process on this machine: start detached, attach, status, stop, key.

The relay writes `<storage>/relay-runtime.json` once listening (pid, key, port, metrics);
we start it in its own session so it outlives the TUI, with stdout/stderr appended to
`<storage>/blind-relay.log`. The key derives from the storage directory, so anything that
would switch storage directories gets a warning first (`key_change_warning`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

RUNTIME_FILE = "relay-runtime.json"
LOG_FILE = "blind-relay.log"
LOCK_FILE = "relay.lock"  # relay.service.storage.StorageLock: taken first thing at start, held until exit


class RelayProcError(Exception):
    """Starting, attaching to or stopping the relay failed; says why and how to fix it."""

    def __init__(self, what: str, fix: str = "", log_tail: str = "") -> None:
        self.what = what
        self.fix = fix
        self.log_tail = log_tail
        super().__init__(what + (f" — {fix}" if fix else ""))


@dataclass(frozen=True)
class RelayRuntime:
    """The contents of `relay-runtime.json` plus where it was found."""

    pid: int
    key: str
    host: str
    port: int
    metrics: str | None
    started_at: float
    version: str
    storage: str


@dataclass(frozen=True)
class RelayStatus:
    storage: str
    running: bool
    runtime: RelayRuntime | None
    log_path: str
    stale_runtime: bool = False  # a runtime file whose pid is gone


def runtime_path(storage: str) -> Path:
    return Path(storage).expanduser().absolute() / RUNTIME_FILE


def log_path(storage: str) -> Path:
    return Path(storage).expanduser().absolute() / LOG_FILE


def _abs(storage: str) -> str:
    return str(Path(storage).expanduser().absolute())


STORAGE_FIX = "choose a directory for the relay's storage: [relay] storage in the config, or --storage DIR"


def storage_problem(storage: str) -> str | None:
    """Why `storage` cannot be a relay's storage directory (a file there, or a file in its path),
    else None. Said before anything talks of keys: a file holds no key and never will."""
    path = Path(_abs(storage))
    for p in (path, *path.parents):
        if p.exists():
            if p.is_dir():
                return None
            what = "is a file" if p == path else f"is under {p}, which is a file"
            return f"storage {path} {what}, not a directory: no relay can keep its key there"
    return None


def read_runtime(storage: str) -> RelayRuntime | None:
    """The runtime file, or None when absent or unreadable."""
    try:
        data = json.loads(runtime_path(storage).read_text("utf-8"))
        return RelayRuntime(
            pid=int(data["pid"]),
            key=str(data["key"]),
            host=str(data.get("host", "0.0.0.0")),
            port=int(data["port"]),
            metrics=str(data["metrics"]) if data.get("metrics") else None,
            started_at=float(data.get("started_at") or 0),
            version=str(data.get("version", "")),
            storage=_abs(storage),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def pid_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie (our own exited child is reaped here)."""
    if pid <= 0:  # 0 and negatives address process groups, never one relay
        return False
    child = _children.get(pid)
    if child is not None and child.poll() is not None:
        del _children[pid]
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _is_relay_process(pid: int) -> bool:
    """Guard against a recycled pid: the process must look like our relay."""
    try:
        cmdline = " ".join(psutil.Process(pid).cmdline())
    except psutil.AccessDenied:
        return True
    except psutil.Error:
        return False
    return "relay" in cmdline


_children: dict[int, subprocess.Popen[bytes]] = {}
_prestart: dict[str, Callable[[], object]] = {}


def on_before_start(storage: str, hook: Callable[[], object]) -> None:
    """Run `hook` (sync) before this process starts a relay on `storage`.

    The demo sandbox uses it to (re)start its private DHT, which the relay must reach to start.
    """
    _prestart[_abs(storage)] = hook


def relay_status(storage: str) -> RelayStatus:
    runtime = read_runtime(storage)
    running = runtime is not None and pid_alive(runtime.pid) and _is_relay_process(runtime.pid)
    return RelayStatus(_abs(storage), running, runtime, str(log_path(storage)), runtime is not None and not running)


def lock_holder(storage: str, locks: str = "/proc/locks") -> int | None:
    """The pid holding `<storage>/relay.lock`: a relay runs on this storage, listening or still
    joining the DHT (it writes its runtime file only once it listens). Read from the kernel's lock
    table, never by taking the lock, which would make a relay starting at that instant refuse the
    storage. None when nobody holds it or this system has no /proc/locks."""
    try:
        st = os.stat(Path(_abs(storage)) / LOCK_FILE)
        table = Path(locks).read_text()
    except OSError:
        return None
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 18529 fe:00:2154513 0 EOF" (a waiter's line has "->" after the id)
        f = line.split()
        if len(f) >= 6 and f[1] == "FLOCK" and f[3] == "WRITE" and f[5] == inode and f[4].isdigit():
            pid = int(f[4])
            return pid if pid_alive(pid) else None
    return None


def relay_problem(storage: str, key: str) -> str | None:
    """Why the relay set up with `storage` and `key` cannot serve jobs now; None when it runs.

    A relay killed with -9 leaves its runtime file behind, and saved progress still says the
    relay step is done: recreating jobs then would send them to a relay that is gone.
    """
    status = relay_status(storage)
    rt = status.runtime
    if status.running and rt is not None:
        if rt.key != key:
            return (
                f"The relay running with storage {status.storage} has key {rt.key[:12]}…, "
                f"not the key set up earlier ({key[:12]}…)."
            )
        return None
    why = f"pid {rt.pid} is gone; it was stopped or killed" if rt is not None else "no relay-runtime.json"
    return f"The relay (storage {status.storage}) is not running ({why})."


def attach(storage: str) -> RelayRuntime | None:
    """The running relay of `storage` (runtime file present and its pid alive), else None."""
    status = relay_status(storage)
    return status.runtime if status.running else None


@dataclass(frozen=True)
class KernelChoice:
    """Whether the wizard's relay forwards established pairs in the kernel (nftables), and why.

    `on`: the relay this process starts gets --kernel-forwarding. `unit`: the systemd unit gets it
    (the unit grants CAP_NET_ADMIN itself, so only a host without nftables rules it out). `why`:
    one plain line for the operator.
    """

    on: bool
    unit: bool
    why: str


_kernel_support: tuple[bool, bool, str] | None = None
_kernel_support_lock = threading.Lock()


def kernel_support() -> tuple[bool, bool, str]:
    """(a relay this process starts can manage nftables, the host has nftables, why not) — found
    out honestly, in a child process as the relay would be (libnftables writes to stderr, which
    must not reach a TUI): the relay's own binding adds and deletes an empty `inet` table in one
    transaction, so nothing is left behind. Asked once per process."""
    global _kernel_support
    with _kernel_support_lock:  # a caller during the wizard's warm-up waits for it, not a second child
        if _kernel_support is None:
            _kernel_support = _ask_kernel_support()
    return _kernel_support


def _ask_kernel_support() -> tuple[bool, bool, str]:
    code = "import json\nfrom cosmictui.ops.relayproc import probe_kernel_here as p\nprint(json.dumps(p()))"
    env = dict(os.environ)
    spec = importlib.util.find_spec("cosmictui")
    if spec is not None and spec.origin:
        root = str(Path(spec.origin).parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        res = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=env, check=False
        )
        can, host_has, why = json.loads(res.stdout.strip().splitlines()[-1])
        return bool(can), bool(host_has), str(why)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        return False, False, f"could not check for nftables ({e})"


def probe_kernel_here() -> tuple[bool, bool, str]:
    """`kernel_support`'s check, in this process."""
    try:
        from relay.udx.kernel import unavailable_reason
        from relay.udx.nft import Nft, NftError
    except ImportError as e:  # pragma: no cover - the relay ships with cosmictui
        return False, False, f"the relay's kernel forwarding is not installed ({e})"
    try:
        nft = Nft()
    except NftError as e:
        return False, False, unavailable_reason(e)
    name = f"cosmictui_check_{os.getpid()}"
    try:
        nft.run(f"add table inet {name}\ndelete table inet {name}")
    except NftError as e:
        denied = "Operation not permitted" in str(e)
        why = unavailable_reason(e)
        if denied:
            why = "this process lacks CAP_NET_ADMIN, which the relay's nftables table needs (run the wizard as root)"
        return False, denied, why
    finally:
        nft.close()
    return True, True, ""


def choose_kernel_forwarding(wanted: bool | None) -> KernelChoice:
    """`[relay] kernel_forwarding`: true or false as configured; unset ("auto"), on where the host
    allows it (root or CAP_NET_ADMIN, and nftables), with one line saying why not elsewhere."""
    if wanted is False:
        return KernelChoice(
            False, False, "Kernel forwarding is off ([relay] kernel_forwarding = false): the relay forwards in Python."
        )
    can, host_has, why = kernel_support()
    if wanted is True:
        note = "" if can else f" It may not work here: {why}; the relay then forwards in Python."
        return KernelChoice(True, True, f"Kernel forwarding is on ([relay] kernel_forwarding = true).{note}")
    if can:
        return KernelChoice(True, True, "Kernel forwarding is on: established pairs are forwarded by nftables.")
    unit = " The systemd unit below grants CAP_NET_ADMIN, so it is on there." if host_has else ""
    return KernelChoice(False, host_has, f"Kernel forwarding is off: {why}; the relay forwards in Python.{unit}")


def relay_command(
    storage: str,
    port: int,
    host: str = "0.0.0.0",
    bootstrap: tuple[str, ...] | list[str] = (),
    metrics: str | None = None,
    python: str = sys.executable,
    kernel_forwarding: bool | None = False,
) -> list[str]:
    """`python -m relay --storage S --port P [--host H] [--bootstrap ...] [--metrics ...] [--kernel-forwarding]`.

    `kernel_forwarding` None ("auto", `[relay] kernel_forwarding` unset): on where this host allows
    it (`choose_kernel_forwarding`)."""
    if kernel_forwarding is None:
        kernel_forwarding = choose_kernel_forwarding(None).on
    cmd = [python, "-m", "relay", "--storage", _abs(storage), "--port", str(port)]
    if host and host != "0.0.0.0":
        cmd += ["--host", host]
    if bootstrap:
        cmd += ["--bootstrap", ",".join(bootstrap)]
    if metrics:
        cmd += ["--metrics", metrics]
    if kernel_forwarding:
        cmd.append("--kernel-forwarding")
    return cmd


def log_tail(storage: str, lines: int = 20) -> str:
    """The last lines of the relay log (for error messages and the monitor)."""
    try:
        with open(log_path(storage), "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


async def start_relay(
    storage: str,
    port: int,
    host: str = "0.0.0.0",
    bootstrap: tuple[str, ...] | list[str] = (),
    metrics: str | None = None,
    timeout: float = 30.0,
    python: str = sys.executable,
    kernel_forwarding: bool | None = False,
) -> RelayRuntime:
    """Start the relay detached and wait until it listens; attach instead if it already runs.

    The relay gets its own session (SIGHUP from a closing terminal or tmux pane does not
    reach it) and appends its output to `<storage>/blind-relay.log`.
    """
    running = attach(storage)
    if running is not None:
        return running
    root = Path(_abs(storage))
    if problem := storage_problem(storage):
        raise RelayProcError(problem, STORAGE_FIX)
    hook = _prestart.get(str(root))
    if hook is not None:
        try:
            await asyncio.to_thread(hook)
        except Exception as e:
            raise RelayProcError(f"preparing to start the relay failed: {e}", "see the message above") from None
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RelayProcError(
            f"cannot create storage directory {root}: {e.strerror or e}",
            "create it with the right owner (sudo mkdir -p DIR && sudo chown $USER DIR) or choose another",
        ) from None
    cmd = relay_command(storage, port, host, bootstrap, metrics, python, kernel_forwarding)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    spec = importlib.util.find_spec("relay")
    if spec is not None and spec.origin:  # run the same relay package we import, wherever cwd is
        pkg_root = str(Path(spec.origin).parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
    try:
        log = open(log_path(storage), "ab")  # noqa: SIM115 - handed to the child
    except OSError as e:
        raise RelayProcError(f"cannot write the relay log in {root}: {e.strerror or e}", "check permissions") from None
    with log:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # the relay's flags; the interpreter by name only: where it is installed is no part of the
        # run, and a log line pasted into a ticket or shown on screen should not carry it
        shown = [Path(cmd[0]).name, *cmd[1:]]
        log.write(f"--- {stamp} cosmictui started: {shlex.join(shown)}\n".encode())
        log.flush()
        start_offset = log.tell()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd=root,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    _children[proc.pid] = proc
    deadline = time.monotonic() + timeout
    while True:
        runtime = read_runtime(storage)
        if runtime is not None and runtime.pid == proc.pid:
            return runtime
        code = proc.poll()
        if code is not None:
            _children.pop(proc.pid, None)
            tail = _log_since(storage, start_offset)
            raise RelayProcError(
                f"the relay exited with code {code} before listening",
                _error_hint(tail),
                tail,
            )
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            _children.pop(proc.pid, None)
            tail = _log_since(storage, start_offset)
            raise RelayProcError(
                f"the relay did not report `Server listening on` within {timeout:g} s (stopped it)",
                f"see {log_path(storage)}",
                tail,
            )
        await asyncio.sleep(0.05)


def _log_since(storage: str, offset: int) -> str:
    try:
        with open(log_path(storage), "rb") as f:
            f.seek(offset)
            return f.read()[-8192:].decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _error_hint(tail: str) -> str:
    for line in reversed(tail.splitlines()):
        if "error" in line.lower():
            if "address already in use" in line.lower() or "in use" in line.lower():
                return "the UDP port is taken: stop what holds it or choose another port"
            return line.strip()
    return "see the relay log for details"


async def stop_relay(storage: str, timeout: float = 10.0) -> bool:
    """SIGTERM the relay of `storage` and wait for it to exit; False when none was running.

    After `timeout` seconds it gets SIGKILL (it would otherwise hold the port forever).
    """
    status = relay_status(storage)
    if not status.running or status.runtime is None:
        return False
    pid = status.runtime.pid
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    except PermissionError:
        raise RelayProcError(
            f"not allowed to stop the relay (pid {pid})", f"stop it as its owner: sudo kill {pid}"
        ) from None
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5.0
            timeout = 5.0
        await asyncio.sleep(0.05)
    child = _children.pop(pid, None)
    if child is not None:
        child.wait()
    return True


_LISTENING = re.compile(r"^Server listening on (\S+)\s*$", re.M)


def read_key(storage: str) -> str | None:
    """The relay key: from the runtime file, else the last `Server listening on` in the log."""
    runtime = read_runtime(storage)
    if runtime is not None:
        return runtime.key
    try:
        text = log_path(storage).read_text("utf-8", "replace")
    except OSError:
        return None
    found = _LISTENING.findall(text)
    return found[-1] if found else None


def storage_key(storage: str) -> str | None:
    """The key a relay on `storage` will have (from its primary key), None if it holds none yet."""
    try:
        from relay.keys import encode_id
        from relay.service.storage import StorageError, load_primary_key, relay_key_pair
    except ImportError:
        return read_key(storage)
    try:
        primary = load_primary_key(storage, create=False)
    except StorageError:
        return None
    return encode_id(relay_key_pair(primary.key).public_key)


def running_relays() -> list[RelayRuntime]:
    """Relays running on this machine (found by their command line, confirmed by runtime file)."""
    found: dict[int, RelayRuntime] = {}
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        try:
            argv = proc.info["cmdline"] or []
            if not any(a.endswith("blind-relay") for a in argv[:2]) and not (
                "-m" in argv and "relay" in argv[argv.index("-m") + 1 : argv.index("-m") + 2]
            ):
                continue
            storage = "./corestore"
            for i, arg in enumerate(argv):
                if arg in ("-s", "--storage") and i + 1 < len(argv):
                    storage = argv[i + 1]
                elif arg.startswith("--storage="):
                    storage = arg.split("=", 1)[1]
            if not os.path.isabs(storage) and proc.info.get("cwd"):
                storage = os.path.join(proc.info["cwd"], storage)
            rt = read_runtime(storage)
            if rt is not None and rt.pid == proc.info["pid"]:
                found[rt.pid] = rt
        except (psutil.Error, ValueError, IndexError):
            continue
    return list(found.values())


def key_change_warning(
    storage: str,
    previous_storage: str | None = None,
    configured_keys: tuple[str, ...] | list[str] = (),
    running: list[RelayRuntime] | None = None,
    port: int | None = None,
) -> str | None:
    """A warning when using `storage` would change the relay key (else None).

    Compares with the storage used last time (`previous_storage`), with the keys the
    deployment's `.env` already lists (`configured_keys`), and with relays already running
    (`running`, e.g. `running_relays()`). Of those, only the ones that bear on this deployment
    are named (the one whose key the `.env` lists, the one on `port`); on a shared host the
    rest are one line, not a list.
    """
    path = _abs(storage)
    if problem := storage_problem(path):
        return f"{problem[0].upper()}{problem[1:]}. Fix: {STORAGE_FIX}."
    key = storage_key(path)
    notes: list[str] = []
    if previous_storage and _abs(previous_storage) != path:
        old_key = storage_key(previous_storage) or read_key(previous_storage)
        if key is None or old_key is None or key != old_key:
            notes.append(
                f"Last time the relay used storage {_abs(previous_storage)}"
                + (f" (key {old_key})" if old_key else "")
                + f". Storage {path} "
                + ("holds no key yet, so the relay will make a NEW key." if key is None else f"has key {key}.")
            )
        previous = attach(previous_storage)
        if previous is not None:
            notes.append(f"A relay is running on {_abs(previous_storage)} (pid {previous.pid}, key {previous.key}).")
    # Other relays on this host only hint at a key change when nothing says which key this
    # deployment uses: restarting on last time's storage, or on one whose key the .env lists,
    # keeps the key however many unrelated relays run beside it.
    known_good = key is not None and (
        (previous_storage is not None and _abs(previous_storage) == path) or key in configured_keys
    )
    elsewhere = [
        other
        for other in running or ()
        if not known_good
        and other.storage != path
        and not (previous_storage is not None and other.storage == _abs(previous_storage))
        and other.key != key
    ]
    named = [o for o in elsewhere if o.key in configured_keys or (port is not None and o.port == port)]
    for other in named:
        why = "its key is the one the .env lists" if other.key in configured_keys else f"it holds UDP port {port}"
        notes.append(f"The relay on storage {other.storage} (pid {other.pid}, key {other.key}) runs here and {why}.")
    if rest := len(elsewhere) - len(named):
        also = " other" if named else ""
        plural = rest != 1
        notes.append(
            f"{rest}{also} relay{'s' if plural else ''} with {'their' if plural else 'its'} own storage and key"
            f" run{'' if plural else 's'} on this host"
            + (f", not on port {port}" if port is not None else "")
            + (" and not with a key the .env lists." if configured_keys else ".")
        )
    if elsewhere:
        notes.append(f"{path} " + ("holds no key yet." if key is None else f"has key {key}."))
    if configured_keys:
        if key is None:
            notes.append(f"{path} holds no key yet: the relay will make a new key that is not in the .env.")
        elif key not in configured_keys:
            notes.append(f"The .env lists {', '.join(configured_keys)}, not this storage's key {key}.")
    if not notes:
        return None
    return (
        " ".join(notes) + " Jobs created with the old key cannot reach a relay with a different key; "
        "use the same storage directory as before unless you mean to change the key."
    )
