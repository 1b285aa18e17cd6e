"""The sans-IO cores stay sans-IO: no sockets, no event loop, no process probes, no clock.

Checked on the AST (not grep), so a comment or a docstring that names `asyncio` is fine and
`from time import monotonic as now` is not. A core takes `now` and bytes in and hands bytes,
deadlines and events out; the one asyncio runtime owns sockets and the clock. A core that
imports a runtime module inherits its IO, so relay-internal imports are followed too.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The cores named by the layer docs (relay/udx/__init__.py, relay/dht/__init__.py, DESIGN.md).
# Modules whose docstring says they are sans-IO are added by `claims_sans_io` below.
NAMED_CORES = [
    "relay.encoding",
    "relay.keys",
    "relay.noise",
    "relay.secretstream",
    "relay.protomux",
    "relay.blindrelay",
    "relay.udx.packet",
    "relay.udx.stream",
    "relay.dht.messages",
]

FORBIDDEN_MODULES = {"asyncio", "socket", "psutil", "selectors", "uvloop"}
CLOCK_FUNCS = {
    "time": {"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "sleep"},
    "datetime": {"now", "utcnow", "today"},  # datetime.now(), datetime.datetime.now(), date.today()
}


@dataclass(frozen=True)
class Violation:
    module: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.what}"


def module_path(name: str) -> Path:
    p = ROOT.joinpath(*name.split("."))
    return p / "__init__.py" if p.is_dir() else p.with_suffix(".py")


def all_relay_modules() -> list[str]:
    out = []
    for p in sorted((ROOT / "relay").rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append(".".join(parts))
    return out


_CLAIM = re.compile(r"\bsans-IO\b(?!\s*`)(?!\s+cores?\b)", re.IGNORECASE)


def claims_sans_io(docstring: str | None) -> bool:
    """True when the module says *it* is sans-IO: in its first paragraph, or in a paragraph that
    starts "Sans-IO". "driver for the sans-IO `SecretStream`" or "Layers (sans-IO cores, ...)"
    name other modules and do not count."""
    if not docstring:
        return False
    paragraphs = [" ".join(p.split()) for p in docstring.split("\n\n")]
    return bool(_CLAIM.search(paragraphs[0])) or any(p.lower().startswith("sans-io") for p in paragraphs[1:])


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    pkg = module.split(".")
    is_pkg = module_path(module).name == "__init__.py"
    base = pkg if is_pkg else pkg[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of nodes under `if TYPE_CHECKING:`, which never run."""
    skip: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and isinstance(n.test, ast.Name | ast.Attribute):
            name = n.test.id if isinstance(n.test, ast.Name) else n.test.attr
            if name == "TYPE_CHECKING":
                for m in n.body:
                    skip.update(id(x) for x in ast.walk(m))
    return skip


def _dotted(expr: ast.expr) -> str:
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if isinstance(expr, ast.Name):
        parts.append(expr.id)
    elif isinstance(expr, ast.Call):
        parts.append(_dotted(expr.func) + "()")
    return ".".join(reversed(parts))


def scan(source: str, module: str = "<mod>") -> tuple[list[Violation], set[str]]:
    """IO and clock use in one module's source, and the relay-internal modules it imports."""
    tree = ast.parse(source)
    skip = _type_checking_only(tree)
    found: list[Violation] = []
    internal: set[str] = set()
    aliases: dict[str, str] = {}  # local name -> "time" / "time.monotonic" / "datetime.datetime" ...

    def bad(node: ast.AST, what: str) -> None:
        found.append(Violation(module, getattr(node, "lineno", 0), what))

    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                if top in FORBIDDEN_MODULES:
                    bad(node, f"imports {a.name}")
                if top in CLOCK_FUNCS:
                    aliases[a.asname or top] = a.name if a.asname else top
                if top == "relay":
                    internal.add(a.name)
        elif isinstance(node, ast.ImportFrom):
            src = _resolve(module, node)
            top = src.split(".")[0]
            if top in FORBIDDEN_MODULES:
                bad(node, f"imports from {src}")
            for a in node.names:
                if top in CLOCK_FUNCS:
                    if src == "time" and a.name in CLOCK_FUNCS["time"]:
                        bad(node, f"imports the clock time.{a.name}")
                    aliases[a.asname or a.name] = f"{src}.{a.name}"
                if top == "relay":
                    sub = f"{src}.{a.name}"
                    internal.add(sub if module_path(sub).exists() else src)
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            head, _, rest = name.partition(".")
            full = f"{aliases[head]}.{rest}" if head in aliases and rest else aliases.get(head, name)
            mod, _, func = full.rpartition(".")
            if (mod == "time" and func in CLOCK_FUNCS["time"]) or (
                mod.split(".")[0] == "datetime" and func in CLOCK_FUNCS["datetime"]
            ):
                bad(node, f"reads the clock: {name}()")
            elif func == "time" and (mod.lower().endswith("loop") or mod.endswith("_loop()")):
                bad(node, f"reads the loop clock: {name}()")
    return found, internal


def cores() -> list[str]:
    claimed = [
        m for m in all_relay_modules() if claims_sans_io(ast.get_docstring(ast.parse(module_path(m).read_text())))
    ]
    return sorted(set(NAMED_CORES) | set(claimed))


def check(module: str) -> list[Violation]:
    """Violations in `module` and in every relay module it imports, transitively."""
    seen: set[str] = set()
    todo = [module]
    out: list[Violation] = []
    while todo:
        m = todo.pop()
        if m in seen or not module_path(m).exists():
            continue
        seen.add(m)
        found, internal = scan(module_path(m).read_text(), m)
        out += [v if m == module else Violation(module, v.line, f"via {m}: {v.what}") for v in found]
        todo += internal
    return out


def test_the_core_list_is_what_the_layer_docs_say() -> None:
    found = cores()
    for m in NAMED_CORES:
        assert module_path(m).exists(), f"{m} is listed as a sans-IO core but does not exist"
    # these say "sans-IO" about themselves today; if one stops, this list and the docstring must agree
    for m in ["relay.dht.rpc", "relay.dht.query", "relay.dht.router", "relay.dht.handshake"]:
        assert m in found, f"{m} no longer says it is sans-IO"
    assert "relay.secretstream_aio" not in found  # "driver for the sans-IO `SecretStream`"
    assert "relay.dht.node" not in found  # the runtime that feeds the cores


@pytest.mark.parametrize("module", cores())
def test_sans_io_core_does_no_io_and_reads_no_clock(module: str) -> None:
    problems = check(module)
    assert not problems, "sans-IO core does IO or reads a clock:\n" + "\n".join(map(str, problems))


# The checker itself must catch what it claims to catch (else the tests above cannot fail).
@pytest.mark.parametrize(
    "source",
    [
        "import asyncio",
        "import socket as s",
        "from asyncio import get_running_loop",
        "import psutil.process",
        "import time\ndef f():\n    return time.monotonic()",
        "import time as t\nx = t.perf_counter()",
        "from time import monotonic\n",
        "from time import time as now\n",
        "from datetime import datetime\nx = datetime.now()",
        "import datetime\nx = datetime.datetime.utcnow()",
        "def f(loop):\n    return loop.time()",
        "def f(self):\n    return self._loop.time()",
        "import asyncio\nx = asyncio.get_running_loop().time()",
    ],
)
def test_guard_catches(source: str) -> None:
    found, _ = scan(source)
    assert found, f"not caught: {source!r}"


@pytest.mark.parametrize(
    "source",
    [
        '"""mentions asyncio and time.monotonic() in prose"""',
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import asyncio",
        "import struct\nx = struct.pack('<I', 1)",
        "def f(now: float) -> float:\n    return now + 1",
        "from datetime import timedelta\nx = timedelta(seconds=1)",
    ],
)
def test_guard_allows(source: str) -> None:
    found, _ = scan(source)
    assert not found, found


def test_guard_follows_relay_imports(tmp_path: Path) -> None:
    _, internal = scan("from .node import DHTNode\nfrom relay.udx import packet\n", "relay.dht.handshake")
    assert internal == {"relay.dht.node", "relay.udx.packet"}
    problems = check("relay.dht.server")  # the runtime: imports asyncio itself
    assert any("imports asyncio" in p.what for p in problems)


# --- the glue: timers only through the driver, no clock but the loop's ------------------------

#: glue that may read a clock other than the loop's, and why (the guard below names each)
CLOCK_EXCEPTIONS = {
    # a collection's pause, inside one callback: finer than uvloop's millisecond clock; a metric
    ("relay.service.pauses", "time.perf_counter"),
    # how long a trim (gc.collect + malloc_trim) took, inside one callback; a metric
    ("relay.service.memory", "time.perf_counter"),
}
#: wall time, for timestamps only (logs, metrics, the records a restart reads, announce bumps)
WALL_CLOCK = {"time.time"}
TIMER_METHODS = {"call_at", "call_later"}


def glue_modules() -> list[str]:
    """Every relay module that is not a sans-IO core (the asyncio glue and the service), but
    relay.core itself, whose driver is the one place that arms timers."""
    core_set = set(cores())
    return [m for m in all_relay_modules() if m not in core_set and m != "relay.core"]


def glue_scan(source: str, module: str = "<mod>") -> list[Violation]:
    """Timers armed outside the driver, a handle asked for its time, a clock that is not the loop's."""
    tree = ast.parse(source)
    skip = _type_checking_only(tree)
    found: list[Violation] = []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in CLOCK_FUNCS:
                    aliases[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in CLOCK_FUNCS:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            name = _dotted(node.func)
            attr = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if attr in TIMER_METHODS:
                found.append(Violation(module, node.lineno, f"arms a timer outside the driver: {name}()"))
            elif attr == "when" and not node.args:
                found.append(Violation(module, node.lineno, f"asks a timer handle for its time: {name}()"))
            head, _, rest = name.partition(".")
            full = f"{aliases[head]}.{rest}" if head in aliases and rest else aliases.get(head, name)
            mod, _, func = full.rpartition(".")
            clock = (mod == "time" and func in CLOCK_FUNCS["time"] - {"sleep"}) or (
                mod.split(".")[0] == "datetime" and func in CLOCK_FUNCS["datetime"]
            )
            if clock and full not in WALL_CLOCK and (module, full) not in CLOCK_EXCEPTIONS:
                found.append(Violation(module, node.lineno, f"reads a clock that is not the loop's: {name}()"))
    return found


@pytest.mark.parametrize("module", glue_modules())
def test_glue_arms_timers_only_through_the_driver_and_reads_only_the_loops_clock(module: str) -> None:
    problems = glue_scan(module_path(module).read_text(), module)
    assert not problems, "glue outside relay.core.Driver:\n" + "\n".join(map(str, problems))


@pytest.mark.parametrize(
    "source",
    [
        "def f(loop, cb):\n    loop.call_at(1.0, cb)",
        "def f(self):\n    self._loop.call_later(5, self.tick)",
        "import asyncio\ndef f(cb):\n    asyncio.get_running_loop().call_later(2.0, cb)",
        "def f(h, due):\n    return h.when() <= due",
        "import time\ndef f():\n    return time.monotonic()",
        "from time import perf_counter\nx = perf_counter()",
        "import datetime\nx = datetime.datetime.now()",
    ],
)
def test_glue_guard_catches(source: str) -> None:
    assert glue_scan(source), f"not caught: {source!r}"


@pytest.mark.parametrize(
    "source",
    [
        "def f(loop):\n    return loop.time()",  # the loop's clock
        "import time\nstarted = time.time()",  # wall time, for a timestamp
        "def f(loop, cb):\n    loop.call_soon(cb)",  # not a timer
        "def f(driver):\n    driver.arm()",
    ],
)
def test_glue_guard_allows(source: str) -> None:
    assert not glue_scan(source)


def test_the_driver_is_where_timers_are_armed() -> None:
    """relay.core's driver is the one place a glue timer is armed (the guard above exempts it)."""
    assert any("arms a timer" in v.what for v in glue_scan(module_path("relay.core").read_text(), "relay.core"))
