"""`blind-relay`: blind-relay-service's command line, served by the Python relay.

The two stdout lines are a contract (operators and the wizard copy the key from them):
`Using corestore storage at <abs path>` then `Server listening on <z32 key>`. Everything
else goes to stderr. Exit codes (also in `--help`): 0 clean exit (SIGINT/SIGTERM too); 1 runtime
error, one `blind-relay: error: …` line (storage, key, port in use, allow file); 2 usage error,
one line of the same form (a flag value that can never work: bad port, address, key, limit or
budget, or a `--systemd-unit` that would fail or change the key). Every flag and address is
checked, and the metrics address bound, before the storage is touched: a bad flag creates nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import ipaddress
import logging
import math
import shlex
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import relay
from relay.dhtprom import ScraperConfig, check_alias, default_alias
from relay.keys import KeyEncodingError, decode_id, encode_id
from relay.service.allow import AllowListError, build_allow_list, parse_key
from relay.service.limits import Limits
from relay.service.logs import configure_logging
from relay.service.memory import DEFAULT_BUDGET, MB, MIN_BUDGET, connection_bytes, run_on_malloc
from relay.service.metrics import (
    DEFAULT_METRICS_HOST,
    DEFAULT_METRICS_PORT,
    MetricsError,
    bind_metrics_socket,
    parse_address,
)
from relay.service.pauses import apply_gc_policy
from relay.service.storage import (
    NEW_KEY_FLAG,
    StorageError,
    StorageLock,
    check_writable,
    load_primary_key,
    relay_key_pair,
)
from relay.service.systemd import DEFAULT_STATE_DIR, render_unit

if TYPE_CHECKING:
    from relay.service.app import RelayApp, RelayConfig

log = logging.getLogger("relay")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2

EXIT_CODES_HELP = """exit codes:
  0  clean exit (SIGINT/SIGTERM close the relay cleanly)
  1  runtime error, one 'blind-relay: error: ...' line: storage or key unreadable, storage in use
     by another relay, port in use, allow file unreadable or bad (no bootstrap node answering
     is not an error: the relay listens, warns once and keeps trying to join the DHT)
  2  usage error, one 'blind-relay: error: ...' line: a flag value that can never work (port,
     --host or --metrics not an address of this machine, --allow key, limits, --memory-budget,
     --bootstrap), or a --systemd-unit that would fail at boot or start with another key;
     nothing is created in the storage"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line and exit 2 (the usage is for --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


class _Exit(Exception):
    """Stop before anything is created: `code` and the one line to print."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _address(text: str, what: str) -> str:
    """An IP address (or localhost): a name would need DNS, which a relay must not wait on."""
    if text == "localhost":
        return text
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} {text!r} is not an IP address") from None
    return text


def _host(text: str) -> str:
    return _address(text, "host")


def _megabytes(text: str) -> int:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of megabytes") from None
    if not MIN_BUDGET / MB <= v < float("inf"):
        raise argparse.ArgumentTypeError(
            f"{text} MB is below the {MIN_BUDGET // MB} MB an idle relay and a few connections need"
        )
    return int(v * MB)


def _port(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"port {v} is out of range 0-65535")
    return v


def _metrics(text: str) -> str:
    try:
        addr = parse_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if addr is not None:
        _address(addr[0], "metrics host")
    return text


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be at least 1")
    return v


def _positive_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return v


def _bootstrap(text: str) -> list[str]:
    nodes = [n.strip() for n in text.split(",") if n.strip()]
    if not nodes:
        raise argparse.ArgumentTypeError("expected HOST:PORT[,HOST:PORT...]")
    for n in nodes:
        host, sep, port = n.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise argparse.ArgumentTypeError(f"{n!r} is not HOST:PORT")
    return nodes


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="blind-relay",
        description="Blind relay for HyperDHT peers (Python, Node-free; a drop-in for blind-relay-service).",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-s", "--storage", default=None, help="storage directory holding the relay's key (default ./corestore)"
    )
    p.add_argument("-p", "--port", type=_port, default=49737, help="UDP port (default 49737)")
    p.add_argument("--host", type=_host, default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    p.add_argument(
        NEW_KEY_FLAG,
        action="store_true",
        help="make a new relay key in a storage that held one before but lost it (without this the relay "
        "refuses to start there, so the key never changes silently; a key that is there is always kept)",
    )
    p.add_argument(
        "--bootstrap", type=_bootstrap, default=None, help="HOST:PORT[,HOST:PORT...] (default: public HyperDHT nodes)"
    )
    p.add_argument(
        "--metrics",
        type=_metrics,
        default=None,
        help="HOST:PORT for GET /metrics and /stats, or off (default 127.0.0.1:49738; if that is taken, "
        "a free port, said on stderr and in relay-runtime.json)",
    )
    p.add_argument(
        "--kernel-forwarding",
        action="store_true",
        help="forward established pairs in the kernel with nftables (Linux, IPv4 and IPv6, needs root or "
        "CAP_NET_ADMIN; "
        "an extension of ours: without it, or where it cannot be, pairs are forwarded in Python)",
    )
    p.add_argument("--allow", action="append", default=[], metavar="KEY", help="peer key allowed to pair (repeatable)")
    p.add_argument(
        "--allow-file", action="append", default=[], metavar="PATH", help="allowed keys, one a line (reread on SIGHUP)"
    )
    p.add_argument("--log-format", choices=("text", "json"), default="text", help="log lines on stderr (default text)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    p.add_argument("--systemd-unit", action="store_true", help="print a hardened systemd unit for these flags and exit")
    p.add_argument(
        "--unit-exec",
        metavar="CMD",
        default=None,
        help="with --systemd-unit: the relay command the unit runs, e.g. /opt/blind-relay/bin/blind-relay "
        "(default: this one; it must not live under /home, /root or /tmp)",
    )
    for flag, what in (
        ("--scraper-public-key", "public key of a dht-prometheus scraper (hyperdht-prometheus-bridge), hex or z32"),
        ("--scraper-secret", "secret shared with the dht-prometheus scraper, hex or z32"),
        ("--scraper-alias", "alias to register with at the scraper (default blind-relay-<relay key>, <= 99 chars)"),
    ):
        p.add_argument(flag, nargs="?", const="", default=None, metavar="VALUE", help=what)
    p.add_argument("--version", action="version", version=f"blind-relay (cosmictui relay) {relay.__version__}")
    d = Limits()
    g = p.add_argument_group(
        "limits",
        "One relayed connection costs two sessions (each peer opens its own connection to the relay) "
        f"and one active pair: about {math.ceil(connection_bytes() / 1000)} KB of memory at most, "
        f"buffers included. The memory budget (default {DEFAULT_BUDGET // MB} MB) sets --max-sessions, "
        "--max-active-pairs and --max-pending unless they are given, and admission checks the relay's "
        f"own RSS against it: {d.max_active_pairs:,} relayed connections at 200 MB. When full, the relay "
        "refuses new sessions and pairings at once (the peer sees its relay connection close); a pair "
        "that carries traffic is never dropped to make room.",
    )
    g.add_argument(
        "--memory-budget",
        type=_megabytes,
        default=DEFAULT_BUDGET,
        metavar="MB",
        help=f"megabytes (MiB) of RAM the relay may use (default {DEFAULT_BUDGET // MB}, at least {MIN_BUDGET // MB})",
    )
    g.add_argument(
        "--max-sessions",
        type=_positive_int,
        default=None,
        help=f"open sessions, two per relayed connection (default from the budget: {d.max_sessions} at 200 MB)",
    )
    g.add_argument(
        "--max-pending",
        type=_positive_int,
        default=None,
        help=f"pending pairings, total (from the budget: {d.max_pending_total} at 200 MB)",
    )
    g.add_argument(
        "--max-pending-per-session",
        type=_positive_int,
        default=d.max_pending_per_session,
        help=f"pending pairings per session ({d.max_pending_per_session})",
    )
    g.add_argument(
        "--pending-timeout",
        type=_positive_seconds,
        default=d.pending_timeout,
        help=f"seconds a pairing may wait ({d.pending_timeout})",
    )
    g.add_argument(
        "--max-active-pairs",
        type=_positive_int,
        default=None,
        help=f"relayed pairs at once, one per relayed connection (from the budget: {d.max_active_pairs} at 200 MB)",
    )
    g.add_argument(
        "--handshakes-per-address",
        type=_positive_int,
        default=d.handshakes_per_address,
        help=f"handshake burst per source address ({d.handshakes_per_address}, refilled "
        f"{d.handshake_refill_per_second}/s)",
    )
    g.add_argument(
        "--session-idle-timeout",
        type=_positive_seconds,
        default=d.session_idle_timeout,
        help=f"seconds a session may hold no relayed pair before it is closed ({d.session_idle_timeout})",
    )
    g.add_argument(
        "--silent-pair-timeout",
        type=_positive_seconds,
        default=d.silent_pair_timeout,
        help=f"seconds a matched pair may go without a packet both ways ({d.silent_pair_timeout})",
    )
    g.add_argument(
        "--max-control-frame",
        type=_positive_int,
        default=d.max_control_frame,
        help=f"bytes in one control-stream frame; a bigger one ends the session ({d.max_control_frame})",
    )
    g.add_argument(
        "--busy-address-sessions",
        type=_positive_int,
        default=d.busy_address_sessions,
        help=f"sessions after which an address's handshakes wait behind other addresses' ({d.busy_address_sessions})",
    )
    g.add_argument(
        "--handshake-budget",
        type=_positive_seconds,
        default=d.handshake_budget_per_second,
        help=f"handshakes per second relay-wide before busy addresses wait ({d.handshake_budget_per_second:g})",
    )
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and check the flags; anything the command line alone gets wrong exits 2 (argparse style)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for k in args.allow:
        try:
            parse_key(k, "--allow")
        except AllowListError as e:
            parser.error(str(e))
    if args.unit_exec is not None and not args.systemd_unit:
        parser.error("--unit-exec only goes with --systemd-unit")
    return args


#: the caps the memory budget sets unless given: (Limits field, flag's dest)
BUDGET_CAPS = (
    ("max_sessions", "max_sessions"),
    ("max_active_pairs", "max_active_pairs"),
    ("max_pending_total", "max_pending"),
)


def _limits(args: argparse.Namespace) -> Limits:
    given = {field: getattr(args, dest) for field, dest in BUDGET_CAPS if getattr(args, dest) is not None}
    return Limits.for_budget(
        args.memory_budget,
        **given,
        max_pending_per_session=args.max_pending_per_session,
        pending_timeout=args.pending_timeout,
        handshakes_per_address=args.handshakes_per_address,
        session_idle_timeout=args.session_idle_timeout,
        silent_pair_timeout=args.silent_pair_timeout,
        max_control_frame=args.max_control_frame,
        busy_address_sessions=args.busy_address_sessions,
        handshake_budget_per_second=args.handshake_budget,
    )


def _fail(message: str) -> int:
    print(f"blind-relay: error: {message}", file=sys.stderr, flush=True)
    return EXIT_ERROR


def _unit_extra_args(args: argparse.Namespace) -> list[str]:
    """Non-default limit flags, so the unit runs the relay exactly as asked."""
    d = _limits(build_parser().parse_args([]))
    mine = _limits(args)
    out: list[str] = []
    if args.memory_budget != DEFAULT_BUDGET:
        out += ["--memory-budget", f"{args.memory_budget / MB:g}"]
    for field, dest in BUDGET_CAPS:  # only those given: the others follow the budget
        if getattr(args, dest) is not None:
            out += ["--" + dest.replace("_", "-"), str(getattr(mine, field))]
    flags = {
        "max_pending_per_session": "--max-pending-per-session",
        "pending_timeout": "--pending-timeout",
        "handshakes_per_address": "--handshakes-per-address",
        "session_idle_timeout": "--session-idle-timeout",
        "silent_pair_timeout": "--silent-pair-timeout",
        "max_control_frame": "--max-control-frame",
        "busy_address_sessions": "--busy-address-sessions",
        "handshake_budget_per_second": "--handshake-budget",
    }
    for attr, flag in flags.items():
        if getattr(mine, attr) != getattr(d, attr):
            out += [flag, str(getattr(mine, attr))]
    if args.log_level != "info":
        out += ["--log-level", args.log_level]
    if _scraper_flags(args) is not None:  # validated: a bad value exits 2 here, not at boot
        out += ["--scraper-public-key", args.scraper_public_key, "--scraper-secret", args.scraper_secret]
        if args.scraper_alias:
            out += ["--scraper-alias", args.scraper_alias]
    return out


def _note(message: str) -> None:
    print(f"blind-relay: note: {message}", file=sys.stderr, flush=True)


def _systemd_unit(args: argparse.Namespace) -> int:
    """Print the unit on stdout; notes (which key it will have, what to create) on stderr."""
    try:
        command = shlex.split(args.unit_exec) if args.unit_exec else None
        unit = render_unit(
            storage=str(Path(args.storage).resolve()) if args.storage else None,
            port=args.port,
            host=args.host,
            bootstrap=",".join(args.bootstrap) if args.bootstrap else None,
            metrics=args.metrics or f"{DEFAULT_METRICS_HOST}:{DEFAULT_METRICS_PORT}",
            allow=args.allow,
            allow_files=args.allow_file,
            log_format=args.log_format,
            extra_args=_unit_extra_args(args),
            command=command,
            kernel_forwarding=args.kernel_forwarding,
        )
    except ValueError as e:  # UnitError, or unbalanced quotes in --unit-exec
        build_parser().error(str(e))
    if not args.storage:
        here = Path("./corestore").resolve()
        _note(
            f"no --storage: the unit keeps its key in {DEFAULT_STATE_DIR}, while a plain `blind-relay` run "
            f"from here uses {here}; these are two different keys unless you copy {here} into "
            f"{DEFAULT_STATE_DIR} first (or pass --storage to choose)"
        )
    for note in unit.notes:
        _note(note)
    if args.scraper_secret and args.scraper_public_key:
        _note(
            "the unit holds --scraper-secret in its ExecStart: install it mode 0600 (systemd reads it as root), "
            "as the secret is also visible in the process list, as with blind-relay-service"
        )
    print(unit.text, end="", flush=True)
    return EXIT_OK


def _scraper_flags(args: argparse.Namespace) -> tuple[bytes, bytes, str | None] | None:
    """(scraper key, secret, alias or None) from --scraper-*, or None; bad values exit 2 naming the flag."""
    key, secret, alias = args.scraper_public_key, args.scraper_secret, args.scraper_alias
    if not key:
        if secret is not None or alias is not None:
            log.warning("--scraper-secret/--scraper-alias given without --scraper-public-key: not registering")
        return None
    if not secret:
        build_parser().error("--scraper-public-key needs --scraper-secret (the scraper's shared secret, hex or z32)")
    try:
        key_bytes = decode_id(key)
    except KeyEncodingError:
        build_parser().error(f"--scraper-public-key {key!r} is not a 32-byte key in hex (64 chars) or z32 (52 chars)")
    try:
        secret_bytes = decode_id(secret)
    except KeyEncodingError:
        build_parser().error("--scraper-secret is not 32 bytes in hex (64 chars) or z32 (52 chars)")
    if alias is not None:
        try:
            check_alias(alias)
        except ValueError as e:
            build_parser().error(f"--scraper-alias: {e}")
    return key_bytes, secret_bytes, alias or None


def _scraper_config(flags: tuple[bytes, bytes, str | None] | None, relay_key: str) -> ScraperConfig | None:
    if flags is None:
        return None
    key, secret, alias = flags
    return ScraperConfig(public_key=key, secret=secret, alias=alias or default_alias(relay_key))


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the program itself (`blind-relay`, `python -m relay`), not a caller's argv
        run_on_malloc()  # memory a burst took can go back (relay.service.memory); may re-run us
    args = parse_args(argv)
    configure_logging(args.log_format, args.log_level)

    if args.systemd_unit:
        return _systemd_unit(args)

    scraper_flags = _scraper_flags(args)
    limits = _limits(args)
    try:
        allow = build_allow_list(args.allow, args.allow_file)
    except AllowListError as e:
        return _fail(str(e))
    try:  # every address checked, the metrics one bound, before the storage is touched
        metrics, metrics_socket = _bind_metrics(args)
        _check_udp(args.host, args.port)
    except _Exit as e:
        print(f"blind-relay: error: {e}", file=sys.stderr, flush=True)
        return e.code
    storage = Path(args.storage or "./corestore").resolve()
    print(f"Using corestore storage at {storage}", flush=True)
    try:
        primary = load_primary_key(storage, new_key=args.new_key)
        check_writable(storage)
        lock = StorageLock(storage)
    except (StorageError, AllowListError) as e:
        if metrics_socket is not None:
            metrics_socket.close()
        return _fail(str(e))
    log.info(primary.describe())
    if args.new_key:
        if primary.source == "created":
            log.warning(
                "made a new relay key as asked (%s): deployments naming the old key need this one", NEW_KEY_FLAG
            )
        else:
            log.warning("%s given but the storage holds a key: it is kept (%s)", NEW_KEY_FLAG, primary.path)
    key_pair = relay_key_pair(primary.key)

    from relay.service.app import PUBLIC_BOOTSTRAP, RelayApp, RelayConfig, RelayStartError

    config = RelayConfig(
        storage=storage,
        key_pair=key_pair,
        host=args.host,
        port=args.port,
        bootstrap=list(args.bootstrap or PUBLIC_BOOTSTRAP),
        metrics=metrics,
        metrics_socket=metrics_socket,
        allow=allow,
        limits=limits,
        kernel_forwarding=args.kernel_forwarding,
        scraper=_scraper_config(scraper_flags, encode_id(key_pair.public_key)),
    )

    def reload_allow(app: RelayApp) -> None:
        """SIGHUP: read --allow/--allow-file again; new sessions see the new list at once."""
        try:
            app.config.allow = build_allow_list(args.allow, args.allow_file)
        except AllowListError as e:
            log.warning("allow-list not reloaded, keeping the old one: %s", e)
            return
        n = "open" if app.config.allow is None else len(app.config.allow)
        log.info("allow-list reloaded", extra={"keys": n})

    try:
        return _run(config, RelayApp, (RelayStartError, MetricsError, StorageError), reload_allow)
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        lock.release()


def _bind_metrics(args: argparse.Namespace) -> tuple[tuple[str, int] | None, socket.socket | None]:
    """The metrics address and its bound socket (None, None for `off`). The default address,
    when another relay holds it, falls back to a free port (said on stderr), as before."""
    addr = parse_address(args.metrics or f"{DEFAULT_METRICS_HOST}:{DEFAULT_METRICS_PORT}")
    if addr is None:
        return None, None
    host, port = addr
    try:
        return addr, bind_metrics_socket(host, port)
    except OSError as e:
        if e.errno == errno.EADDRINUSE and args.metrics is None:
            try:
                sock = bind_metrics_socket(host, 0)
            except OSError as e2:
                raise _Exit(EXIT_ERROR, f"cannot serve metrics on {host}: {e2.strerror or e2}") from e2
            free = sock.getsockname()[1]
            shown = f"[{host}]" if ":" in host else host
            log.warning(
                "metrics address %s:%d is in use (another relay?); serving metrics on http://%s:%d instead",
                host,
                port,
                shown,
                free,
            )
            return (host, free), sock
        if e.errno == errno.EADDRINUSE:
            raise _Exit(
                EXIT_ERROR,
                f"cannot serve metrics on {host}:{port}: address already in use (use --metrics HOST:PORT or off)",
            ) from e
        if e.errno == errno.EADDRNOTAVAIL:
            raise _Exit(
                EXIT_USAGE,
                f"--metrics {host}:{port}: {host} is not an address of this machine (use --metrics HOST:PORT or off)",
            ) from e
        if e.errno == errno.EACCES:
            raise _Exit(
                EXIT_ERROR,
                f"cannot serve metrics on {host}:{port}: permission denied (ports below 1024 need privileges)",
            ) from e
        raise _Exit(EXIT_USAGE, f"--metrics {host}:{port}: {e.strerror or e}") from e


def _check_udp(host: str, port: int) -> None:
    """Bind the relay's UDP address for a moment: an address this machine does not have is a
    usage error, a port in use a runtime one, both before the storage is touched."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as e:
            from relay.service.app import _bind_error

            code = EXIT_USAGE if e.errno == errno.EADDRNOTAVAIL else EXIT_ERROR
            raise _Exit(code, _bind_error(host, port, e)) from e


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _run(
    config: RelayConfig,
    app_cls: type[RelayApp],
    errors: tuple[type[Exception], ...],
    reload_allow: Callable[[RelayApp], None] | None = None,
) -> int:
    async def amain() -> int:
        app = app_cls(config)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if reload_allow is not None:
            loop.add_signal_handler(signal.SIGHUP, lambda: reload_allow(app))
        starting = asyncio.ensure_future(app.start())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # signalled while joining the DHT: leave quietly
            starting.cancel()
            with contextlib.suppress(BaseException):
                await starting
            await app.close()
            log.info("signal received before listening, closing")
            return EXIT_OK
        stopping.cancel()
        try:
            starting.result()
        except errors as e:
            await app.close()
            return _fail(str(e))
        apply_gc_policy()  # start-up is done: what it made lives for the whole run
        try:
            app.write_runtime()
        except OSError as e:
            await app.close()
            return _fail(f"cannot write {config.storage}/relay-runtime.json: {e.strerror or e}")
        print(f"Server listening on {app.key}", flush=True)
        log.info(
            "relay listening",
            extra={"port": app.port, "host": config.host, "metrics": app.metrics.url if app.metrics else "off"},
        )
        try:
            await stop.wait()
            log.info("signal received, closing")
        finally:
            await app.close()
            app.remove_runtime()
        return EXIT_OK

    with asyncio.Runner(loop_factory=_new_loop) as runner:
        return runner.run(amain())


if __name__ == "__main__":  # pragma: no cover
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
