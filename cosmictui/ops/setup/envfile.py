"""Edit the relays variable in a deployment's `.env` without touching anything else.

The file is read with python-dotenv's parser (the same rules the deployment's tooling
applies), but written by splicing: only the one assignment of the relays variable is
replaced (or appended), every other byte stays as it was — CRLF, comments, `export `,
quoting, a missing final newline. When the file is not something we can edit safely we
raise `EnvFileError` with the line and the fix, and write nothing.
"""

from __future__ import annotations

import difflib
import io
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from dotenv.parser import parse_stream

from cosmictui.ops.config import ENV_VAR
from cosmictui.ops.runner import RunnerError

if TYPE_CHECKING:
    from cosmictui.ops.runner import Runner

Mode = Literal["merge", "replace"]


class EnvFileError(ValueError):
    """The `.env` cannot be edited safely: what is wrong, on which line, how to fix it."""

    def __init__(self, problem: str, line: int | None = None, fix: str = "", path: str = ".env") -> None:
        self.problem = problem
        self.line = line
        self.fix = fix
        self.path = path
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {problem}" + (f" — {fix}" if fix else ""))


class EnvChanged(EnvFileError):
    """The file changed under us (another writer): refused, nothing written, nothing lost. Not the
    operator's mistake, so the CLI exits 1 for it, not 2."""


@dataclass(frozen=True)
class EnvPlan:
    """What setting the relays would do: whole old and new text, keys, and a unified diff."""

    old: str
    new: str
    diff: str
    old_keys: tuple[str, ...]
    new_keys: tuple[str, ...]
    line: int  # 1-based line of the assignment in the new text
    bom: bool = False
    """the file starts with a UTF-8 byte order mark: kept as it was, and said in the diff"""
    path: str = ".env"

    @property
    def changed(self) -> bool:
        return self.old != self.new

    def written_diff(self) -> str:
        """The same change once it is on disk: the old text is "before", the new one "written"."""
        cut = len(BOM) if self.bom else 0
        return _diff(self.old[cut:], self.new[cut:], self.path, self.bom, ("before", "written"))


def decode_text(data: bytes) -> str:
    """Bytes of a `.env` as text that encodes back to the very same bytes."""
    return data.decode("utf-8", "surrogateescape")


def encode_text(text: str) -> bytes:
    """Inverse of `decode_text`."""
    return text.encode("utf-8", "surrogateescape")


def _decode_key(key: str) -> bytes:
    try:
        from relay.keys import decode_id
    except ImportError:  # relay.keys not there: our own z32 reading
        return _z32_key(key)
    try:
        return decode_id(key)
    except Exception as e:  # KeyEncodingError (a DecodeError) and anything odd
        raise ValueError(str(e)) from None


def _z32_key(key: str) -> bytes:
    if len(key) == 64:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    if len(key) != 52:
        raise ValueError(f"a relay key is 52 z-base-32 characters (or 64 hex), got {len(key)} characters")
    value = 0
    for pos, ch in enumerate(key):
        i = _Z32.find(ch)
        if i < 0:
            raise ValueError(f"invalid z-base-32 character {ch!r} at position {pos}")
        value = value << 5 | i
    return (value >> 4).to_bytes(33, "big")[-32:]


def _z32_encode(data: bytes) -> str:
    value = int.from_bytes(data, "big") << 4
    return "".join(_Z32[(value >> (5 * (51 - i))) & 31] for i in range(52))


_Z32 = "ybndrfg8ejkmcpqxot1uwisza345h769"


def normalize_key(key: str) -> str:
    """A relay key as z32 (accepts z32 or 64 hex chars); ValueError with why otherwise."""
    if not isinstance(key, str):
        raise ValueError(f"a relay key is a string, got {type(key).__name__}")
    key = key.strip()
    raw = _decode_key(key)
    try:
        from relay.keys import encode_id
    except ImportError:
        return _z32_encode(raw)
    return encode_id(raw)


@dataclass(frozen=True)
class _Assignment:
    """Where the relays variable is assigned: its binding text split into parts."""

    index: int  # position in the bindings list
    line: int
    prefix: str  # leading whitespace, `export `, name, `=` with spacing
    suffix: str  # whitespace and comment after the value
    eol: str
    keys: tuple[str, ...]


_LINE_RE = re.compile(
    r"""(?P<prefix>\s*(?:export[ \t]+)?(?P<name>[^=\s]+)(?P<eq>[ \t]*=[ \t]*)?)"""
    r"""(?P<value>'(?:\\'|[^'])*'|"(?:\\"|[^"])*"|[^\r\n]*?)"""
    r"""(?P<suffix>(?:[ \t]+\#[^\r\n]*|[ \t]*))(?P<eol>\r\n|\n|\r)?\Z""",
    re.S,
)


def _first_line(original: str, line: int) -> int:
    """dotenv counts a binding from the blank lines before it; we point at the line itself."""
    lead = original[: len(original) - len(original.lstrip())]
    return line + lead.count("\n")


def _eol_of(text: str) -> str:
    crlf = text.count("\r\n")
    return "\r\n" if crlf and crlf >= text.count("\n") - crlf else "\n"


def _parse(text: str, var: str, path: str, check_value: bool = True) -> tuple[list[str], _Assignment | None]:
    """Split `text` into dotenv bindings (exact substrings) and find the one assignment of `var`.

    `check_value=False` (replace mode) takes a value that is not a valid relays array as empty:
    replacing it is how the operator repairs it.
    """
    pieces: list[str] = []
    found: _Assignment | None = None
    for index, binding in enumerate(parse_stream(io.StringIO(text))):
        pieces.append(binding.original.string)
        line = _first_line(binding.original.string, binding.original.line)
        if binding.error:
            shown = binding.original.string.rstrip("\r\n")
            raise EnvFileError(
                f"not a KEY=VALUE line, comment or blank line: {shown[:60]!r}",
                line,
                "fix or remove this line (comment it out with `#`, quote values with spaces), then retry",
                path,
            )
        if binding.key != var:
            continue
        if found is not None:
            raise EnvFileError(
                f"{var} is assigned twice (lines {found.line} and {line})",
                line,
                f"keep one assignment of {var} and delete the other, then retry",
                path,
            )
        m = _LINE_RE.match(binding.original.string)
        if m is None or m.group("name") != var:
            raise EnvFileError(
                f"cannot locate the value of {var} on this line",
                line,
                f"""write it on one line as {var}='["<relay-key>"]'""",
                path,
            )
        try:
            keys = _keys_of(binding.value, var, line, path)
        except EnvFileError:
            if check_value:
                raise
            keys = ()
        found = _Assignment(
            index,
            line,
            m.group("prefix") + ("" if m.group("eq") else "="),
            m.group("suffix"),
            m.group("eol") or "",
            keys,
        )
    if "".join(pieces) != text:  # dotenv skipped something: we would not write it back faithfully
        raise EnvFileError("the file could not be split into lines losslessly", None, "check its encoding", path)
    return pieces, found


def _keys_of(value: str | None, var: str, line: int, path: str) -> tuple[str, ...]:
    if value is None or not value.strip():
        return ()
    example = f"""{var}='["<relay-key>"]'"""
    try:
        parsed = json.loads(value)
    except ValueError as e:
        raise EnvFileError(
            f"the value of {var} is not valid JSON ({e}): {value[:60]!r}",
            line,
            f"the value must be a JSON array of relay keys in single quotes, e.g. {example}",
            path,
        ) from None
    if not isinstance(parsed, list):
        raise EnvFileError(
            f"the value of {var} is JSON but not an array: {value[:60]!r}",
            line,
            f"wrap the keys in [ ], e.g. {example}",
            path,
        )
    keys: list[str] = []
    for i, item in enumerate(parsed):
        if not isinstance(item, str):
            raise EnvFileError(
                f"entry {i} of {var} is {json.dumps(item)[:40]}, not a relay key string",
                line,
                f"each entry is a quoted z32 relay key, e.g. {example}",
                path,
            )
        try:
            _decode_key(item)
        except ValueError as e:
            raise EnvFileError(
                f"entry {i} of {var} ({item[:60]!r}) is not a relay key: {e}",
                line,
                "use the key printed on the relay's `Server listening on` line (52 z-base-32 characters)",
                path,
            ) from None
        keys.append(item)
    return tuple(keys)


BOM = "\ufeff"
"""A UTF-8 byte order mark as `decode_text` reads it; python-dotenv drops it silently."""


def _split_bom(text: str) -> tuple[str, str]:
    return (BOM, text[1:]) if text.startswith(BOM) else ("", text)


def read_relays(text: str, var: str = ENV_VAR, path: str = ".env") -> tuple[str, ...]:
    """The relay keys currently set (empty when the variable is absent or empty)."""
    _, found = _parse(_split_bom(text)[1], var, path)
    return found.keys if found else ()


def plan_relays(
    text: str, key: str | list[str], mode: Mode = "merge", var: str = ENV_VAR, path: str = ".env"
) -> EnvPlan:
    """Plan setting `var='["<key>", ...]'`: merge into the existing array or replace it."""
    if mode not in ("merge", "replace"):
        raise ValueError(f"mode must be 'merge' or 'replace', got {mode!r}")
    wanted: list[str] = []
    for k in [key] if isinstance(key, str) else list(key):
        try:
            z = normalize_key(k)
        except ValueError as e:
            raise EnvFileError(
                f"{k!r} is not a relay key: {e}", None, "copy the key from the relay's `Server listening on` line", path
            ) from None
        if z not in wanted:
            wanted.append(z)
    if not wanted:
        raise EnvFileError("no relay key given", None, "pass the relay's key", path)
    bom, body = _split_bom(text)
    pieces, found = _parse(body, var, path, check_value=mode == "merge")
    old_keys = found.keys if found else ()
    if mode == "merge":
        seen = {_decode_key(k) for k in old_keys}
        new_keys = list(old_keys) + [k for k in wanted if _decode_key(k) not in seen]
    else:
        new_keys = wanted
    value = "'" + json.dumps(new_keys, separators=(",", ":")) + "'"
    if found is not None:
        if tuple(new_keys) == old_keys:
            new = body
        else:
            pieces[found.index] = found.prefix + value + found.suffix + found.eol
            new = "".join(pieces)
        line = found.line
    else:
        eol = _eol_of(body)
        sep = "" if not body or body.endswith(("\n", "\r")) else eol
        new = body + sep + f"{var}={value}" + eol
        line = (body + sep).count("\n") + 1
    new = bom + new
    diff = _diff(body, new[len(bom) :], path, bool(bom))
    return EnvPlan(text, new, diff, old_keys, tuple(new_keys), line, bool(bom), path)


def _diff(old: str, new: str, path: str, bom: bool = False, labels: tuple[str, str] = ("now", "new")) -> str:
    """Unified diff of the text after any BOM; a BOM is named in the headers (it is invisible).

    `labels` say what each side is: the file now and as it would be, or once written, before and written.
    """
    kept = "; starts with a UTF-8 BOM, kept" if bom else ""
    return "\n".join(
        difflib.unified_diff(
            old.splitlines(),
            new.splitlines(),
            f"{path} ({labels[0]}{kept})",
            f"{path} ({labels[1]}{kept})",
            lineterm="",
        )
    )


async def write_plan(runner: Runner, path: str, plan: EnvPlan) -> str | None:
    """Write `plan.new` to `path` (atomic, with a timestamped backup) if the file still holds
    `plan.old`; returns the backup path. A file edited since it was planned raises EnvFileError
    and is left alone, so nobody's change is lost.
    """
    if not plan.changed:
        return None
    try:
        current = decode_text(await runner.read_file(path))
    except RunnerError as e:
        if e.kind != "missing-file" or plan.old:
            raise
        current = ""
    if current != plan.old:
        raise EnvChanged(
            "the file changed since the edit was planned", None, "review the new diff and confirm again", path
        )
    try:
        # the runner checks again at the last moment (content, then size/mtime/inode before the rename)
        return await runner.write_file_atomic(path, encode_text(plan.new), backup=True, expect=encode_text(plan.old))
    except RunnerError as e:
        if e.kind != "changed":
            raise
        raise EnvChanged(
            "another writer changed the file while it was being written; nothing was written",
            None,
            "review the new diff and run again",
            path,
        ) from None
