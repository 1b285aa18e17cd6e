"""The `.env` editor: the relays line changes, every other byte survives, bad files are refused."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from dotenv.parser import parse_stream
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cosmictui.ops.config import ENV_VAR
from cosmictui.ops.runner import LocalRunner
from cosmictui.ops.setup.envfile import (
    EnvFileError,
    decode_text,
    encode_text,
    normalize_key,
    plan_relays,
    read_relays,
    write_plan,
)
from relay.keys import encode_id, key_pair

K1 = encode_id(key_pair(b"\x01" * 32).public_key)
K2 = encode_id(key_pair(b"\x02" * 32).public_key)
K3 = encode_id(key_pair(b"\x03" * 32).public_key)


def without_var(text: str) -> str:
    """Everything but the relays assignment (dotenv counts blank lines before it in), exactly as written."""
    out = []
    for b in parse_stream(io.StringIO(text)):
        s = b.original.string
        out.append(s if b.key != ENV_VAR else s[: len(s) - len(s.lstrip())])
    return "".join(out)


def test_adds_line_when_absent_keeping_crlf_and_missing_final_newline() -> None:
    old = "# deployment\r\nexport DB_HOST=db.local\r\nTOKEN='a b'  # secret\r\nLAST=1"
    plan = plan_relays(old, K1)
    assert plan.new == old + "\r\n" + f"""{ENV_VAR}='["{K1}"]'\r\n"""
    assert plan.old_keys == () and plan.new_keys == (K1,)
    assert plan.line == 5 and plan.changed
    assert f"+{ENV_VAR}='[\"{K1}\"]'" in plan.diff


def test_the_written_diff_is_the_same_change_labelled_before_and_written() -> None:
    plan = plan_relays(f"\ufeffA=1\n{ENV_VAR}='[\"{K2}\"]'\n", K1, path="/srv/deploy/.env")
    planned, written = plan.diff.splitlines(), plan.written_diff().splitlines()
    assert planned[:2] == [
        "--- /srv/deploy/.env (now; starts with a UTF-8 BOM, kept)",
        "+++ /srv/deploy/.env (new; starts with a UTF-8 BOM, kept)",
    ]
    assert written[:2] == [
        "--- /srv/deploy/.env (before; starts with a UTF-8 BOM, kept)",
        "+++ /srv/deploy/.env (written; starts with a UTF-8 BOM, kept)",
    ]
    assert written[2:] == planned[2:]


def test_empty_file_and_empty_value() -> None:
    assert plan_relays("", K1).new == f"""{ENV_VAR}='["{K1}"]'\n"""
    for empty in (f"{ENV_VAR}=\n", f"{ENV_VAR}=''\n", f'{ENV_VAR}=""\n', f"{ENV_VAR}\n"):
        plan = plan_relays("A=1\n" + empty + "B=2\n", K1)
        assert plan.new == f"""A=1\n{ENV_VAR}='["{K1}"]'\nB=2\n""", empty


def test_merge_keeps_existing_without_duplicates_and_replace_drops_them() -> None:
    old = f"""A=1\nexport {ENV_VAR}='["{K1}","{K2}"]' # two relays\nB=2\n"""
    merged = plan_relays(old, [K2, K3])
    assert merged.new_keys == (K1, K2, K3)
    assert merged.new == f"""A=1\nexport {ENV_VAR}='["{K1}","{K2}","{K3}"]' # two relays\nB=2\n"""
    same = plan_relays(old, K1)
    assert not same.changed and same.new == old and same.diff == ""
    replaced = plan_relays(old, K3, mode="replace")
    assert replaced.new_keys == (K3,)
    assert replaced.new == f"""A=1\nexport {ENV_VAR}='["{K3}"]' # two relays\nB=2\n"""


def test_hex_key_is_written_as_z32_and_matches_existing_z32() -> None:
    hex_key = key_pair(b"\x01" * 32).public_key.hex()
    assert normalize_key(hex_key) == K1
    assert not plan_relays(f"""{ENV_VAR}='["{K1}"]'\n""", hex_key).changed
    assert read_relays(f"""{ENV_VAR}="[\\"{K1}\\"]"\n""") == (K1,)  # double-quoted with escapes


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("A=1\nthis is not an assignment\n", 2, "not a KEY=VALUE"),
        (f"A=1\n\n{ENV_VAR}='[\"{K1}\"'\n", 3, "not valid JSON"),
        (f"{ENV_VAR}='{{\"relays\": []}}'\n", 1, "not an array"),
        (f"{ENV_VAR}='\"{K1}\"'\n", 1, "not an array"),
        (f"{ENV_VAR}='[\"abc\"]'\n", 1, "not a relay key"),
        (f"{ENV_VAR}='[\"{K1[:-1]}!\"]'\n", 1, "not a relay key"),
        (f"{ENV_VAR}='[42]'\n", 1, "not a relay key string"),
        (f"{ENV_VAR}='[]'\nB=1\nexport {ENV_VAR}='[]'\n", 3, "assigned twice"),
    ],
)
def test_bad_files_raise_with_line_and_fix(text: str, line: int, words: str) -> None:
    with pytest.raises(EnvFileError) as err:
        plan_relays(text, K2)
    assert err.value.line == line
    assert words in err.value.problem
    assert err.value.fix
    assert f".env:{line}:" in str(err.value)


def test_bad_new_key_is_refused() -> None:
    with pytest.raises(EnvFileError, match="not a relay key"):
        plan_relays("A=1\n", "not-a-key")
    with pytest.raises(EnvFileError, match="not a relay key"):
        plan_relays("A=1\n", K1.upper())


def test_bytes_round_trip_even_when_not_utf8() -> None:
    raw = b"A=\xff\xfe\r\nB='\xc3\xa9'\n"
    text = decode_text(raw)
    plan = plan_relays(text, K1)
    assert encode_text(plan.new).startswith(raw)


async def test_write_plan_backs_up_and_refuses_a_file_changed_meanwhile(tmp_path: Path) -> None:
    runner = LocalRunner(str(tmp_path))
    (tmp_path / ".env").write_bytes(b"A=1\r\n# keep\r\n")
    plan = plan_relays(decode_text(await runner.read_file(".env")), K1)
    backup = await write_plan(runner, ".env", plan)
    assert backup is not None and Path(backup).read_bytes() == b"A=1\r\n# keep\r\n"
    assert (tmp_path / ".env").read_bytes() == encode_text(plan.new)
    assert await write_plan(runner, ".env", plan_relays(plan.new, K1)) is None  # nothing to change
    stale = plan_relays(plan.new, K2)
    (tmp_path / ".env").write_bytes(b"A=1\r\n# someone else edited this\r\n")
    with pytest.raises(EnvFileError, match="changed since"):
        await write_plan(runner, ".env", stale)
    assert (tmp_path / ".env").read_bytes() == b"A=1\r\n# someone else edited this\r\n"
    fresh = plan_relays("", K1)
    assert await write_plan(runner, "new.env", fresh) is None  # created, nothing to back up
    assert (tmp_path / "new.env").read_text() == fresh.new


# --- property tests ---------------------------------------------------------------------------

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"
names = st.builds(lambda a, b: a + b, st.sampled_from(_LETTERS), st.text(_LETTERS + "0123456789", max_size=12)).filter(
    lambda n: n != ENV_VAR
)
eols = st.sampled_from(["\n", "\r\n"])
safe = st.text(st.characters(blacklist_characters="\r\n'\"\\#", blacklist_categories=("Cs", "Zl", "Zp", "Cc")))
values = st.one_of(
    safe.map(str.strip),
    safe.map(lambda v: f"'{v}'"),
    safe.map(lambda v: f'"{v}"'),
)
comment_text = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs", "Zl", "Zp")))
assignment = st.builds(
    lambda export, name, value, comment: f"{'export ' if export else ''}{name}={value}{comment}",
    st.booleans(),
    names,
    values,
    st.one_of(st.just(""), comment_text.map(lambda c: f"  # {c}")),
)
other_line = st.one_of(assignment, comment_text.map(lambda c: "#" + c), st.sampled_from(["", "   ", "\t"]))
existing_var = st.builds(
    lambda export, keys, quote: (
        f"{'export ' if export else ''}{ENV_VAR}={quote}"
        + (json.dumps(keys).replace('"', '\\"') if quote == '"' else json.dumps(keys))
        + quote
    ),
    st.booleans(),
    st.lists(st.sampled_from([K1, K2, K3]), unique=True),
    st.sampled_from(["'", '"']),
)


@st.composite
def env_files(draw: st.DrawFn) -> str:
    lines = draw(st.lists(other_line, max_size=12))
    if draw(st.booleans()):
        lines.insert(draw(st.integers(0, len(lines))), draw(existing_var))
    out = "".join(line + draw(eols) for line in lines)
    if lines and draw(st.booleans()):
        out = out.rstrip("\r\n")  # no final newline
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env_files(), st.lists(st.sampled_from([K1, K2, K3]), min_size=1), st.sampled_from(["merge", "replace"]))
def test_property_other_content_survives_byte_for_byte(text: str, keys: list[str], mode: str) -> None:
    plan = plan_relays(text, keys, mode=mode)  # type: ignore[arg-type]
    new_keys = read_relays(plan.new)
    assert set(keys) <= set(new_keys) and len(set(new_keys)) == len(new_keys)
    if mode == "merge":
        assert set(read_relays(text)) <= set(new_keys)
    else:
        assert set(new_keys) == set(keys)
    if ENV_VAR in {b.key for b in parse_stream(io.StringIO(text))}:
        assert without_var(plan.new) == without_var(text)
    else:
        assert plan.new.startswith(text)  # appended, nothing else moved
        assert without_var(plan.new).rstrip("\r\n") == text.rstrip("\r\n")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.sampled_from(["merge", "replace"]))
def test_property_arbitrary_text_is_edited_faithfully_or_refused(text: str, mode: str) -> None:
    try:
        plan = plan_relays(text, K1, mode=mode)  # type: ignore[arg-type]
    except EnvFileError as e:
        assert e.fix or e.line is None
        return
    assert K1 in read_relays(plan.new)
    if plan.new.startswith(text):
        assert len(plan.new) > len(text) or not plan.changed
    else:
        assert without_var(plan.new) == without_var(text)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_property_random_bytes_round_trip(raw: bytes) -> None:
    assert encode_text(decode_text(raw)) == raw


@pytest.mark.parametrize(
    "bad_value",
    ["'[\"abc\"]'", "'[\"abc\",'", "'{\"relays\": []}'", "'[42]'"],
)
def test_replace_repairs_a_bad_relays_value_that_merge_refuses(bad_value: str) -> None:
    # Replace is the operator's way out of a broken value: it must not need the old value to parse.
    text = f"A=1\nexport {ENV_VAR}={bad_value} # relays\nB=2\n"
    with pytest.raises(EnvFileError):
        plan_relays(text, K1, mode="merge")
    plan = plan_relays(text, K1, mode="replace")
    assert plan.old_keys == ()
    assert plan.new == f"""A=1\nexport {ENV_VAR}='["{K1}"]' # relays\nB=2\n"""
    assert plan.line == 2
    assert read_relays(plan.new) == (K1,)
