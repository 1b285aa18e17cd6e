"""Key safety: one storage gives one key, the corestore derivation matches Node, nothing is ever overwritten."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.encoding import DecodeError
from relay.keys import encode_id
from relay.service.storage import (
    PRIMARY_KEY_FILE,
    StorageError,
    decode_corestore_head,
    load_primary_key,
    relay_key_pair,
)
from tests import vectors

CORESTORE = vectors.load("streams")["corestore"]


def test_relay_key_is_corestore_create_key_pair_blind_relay() -> None:
    v = CORESTORE["fixed_primary_key_store"]
    kp = relay_key_pair(bytes.fromhex(v["primaryKey"]))
    assert kp.public_key.hex() == v["publicKey"]
    assert kp.secret_key.hex() == v["secretKey"]
    assert encode_id(kp.public_key) == v["publicKey_z32"]
    r = CORESTORE["random_primary_key_store"]
    assert encode_id(relay_key_pair(bytes.fromhex(r["primaryKey"])).public_key) == r["publicKey_z32"]


@pytest.mark.parametrize("name", ["v1_legacy", "v2"])
def test_head_encodings_give_the_seed(name: str) -> None:
    ex = CORESTORE["head_encoding_examples"][name]
    assert decode_corestore_head(bytes.fromhex(ex["hex"])).hex() == ex["value"]["seed"]


def test_fresh_store_head_and_wal_only_store_heads_decode() -> None:
    v = CORESTORE["fixed_primary_key_store"]
    assert decode_corestore_head(bytes.fromhex(v["rocksdb_head_value"])).hex() == v["primaryKey"]
    w = CORESTORE["rocksdict_read_check"]["wal_only_store"]
    seed = decode_corestore_head(bytes.fromhex(w["head_value_read_by_rocksdict"]))
    assert relay_key_pair(seed).public_key.hex() == w["node_blind_relay_publicKey"]


def test_head_without_seed_is_none() -> None:
    assert decode_corestore_head(bytes([2, 0, 0, 0, 0])) is None
    assert decode_corestore_head(bytes([1, 0])) is None


@given(st.binary(max_size=80))
@settings(deadline=None)
def test_random_head_bytes_decode_or_raise_decode_error(data: bytes) -> None:
    try:
        seed = decode_corestore_head(data)
    except DecodeError:
        return
    assert seed is None or len(seed) == 32


def test_new_storage_creates_a_0600_key_and_reopens_to_the_same_key(tmp_path: Path) -> None:
    store = tmp_path / "a" / "b"
    first = load_primary_key(store)
    assert first.source == "created"
    f = store / PRIMARY_KEY_FILE
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert f.read_bytes() == first.key and len(first.key) == 32
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    again = load_primary_key(store)
    assert again.source == "primary-key" and again.key == first.key
    # the log line names the path once and the layout once
    assert first.describe() == f"new key created in {f.resolve()} (primary-key file)"
    assert again.describe() == f"key from {f.resolve()} (primary-key file)"
    assert [p.name for p in store.iterdir()] == [PRIMARY_KEY_FILE]  # no temp files left behind
    assert load_primary_key(tmp_path / "other").key != first.key


def test_legacy_primary_key_file_is_used_as_is(tmp_path: Path) -> None:
    (tmp_path / PRIMARY_KEY_FILE).write_bytes(b"\x42" * 32)
    pk = load_primary_key(tmp_path)
    v = CORESTORE["fixed_primary_key_store"]
    assert encode_id(relay_key_pair(pk.key).public_key) == v["publicKey_z32"]


def test_short_key_file_is_an_error_and_is_not_replaced(tmp_path: Path) -> None:
    (tmp_path / PRIMARY_KEY_FILE).write_bytes(b"short")
    with pytest.raises(StorageError, match="holds 5 bytes"):
        load_primary_key(tmp_path)
    assert (tmp_path / PRIMARY_KEY_FILE).read_bytes() == b"short"


def test_storage_that_is_a_file_is_an_error(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(StorageError, match="not a directory"):
        load_primary_key(f)


def test_corestore_file_without_db_is_an_error_not_a_new_key(tmp_path: Path) -> None:
    (tmp_path / "CORESTORE").write_text("device/platform=linux\n")
    with pytest.raises(StorageError, match="refusing to start with a different key"):
        load_primary_key(tmp_path)
    assert not (tmp_path / PRIMARY_KEY_FILE).exists()


def _as_nobody(fn: Callable[[], None]) -> tuple[int, str]:
    """Run `fn` in a forked child that dropped to an unprivileged uid (root reads everything)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        code, msg = 0, ""
        try:
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            fn()
        except StorageError as e:
            code, msg = 3, str(e)
        except BaseException as e:
            code, msg = 4, repr(e)
        os.write(w, msg.encode())
        os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 4096):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode()


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A temp dir every user can traverse (pytest's own base dir is 0700 to root)."""
    d = Path(tempfile.mkdtemp(prefix="relay-storage-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_unreadable_storage_dir_is_an_error_and_no_key_is_made(open_tmp: Path) -> None:
    store = open_tmp / "locked"
    store.mkdir(mode=0o700)
    if os.geteuid() != 0:
        os.chmod(store, 0)
    code, msg = _as_nobody(lambda: load_primary_key(store) and None)
    assert code == 3, msg
    assert msg.startswith(f"cannot read storage directory {store}: permission denied")
    assert list(store.iterdir()) == []


def test_unreadable_key_file_is_an_error_and_is_kept(open_tmp: Path) -> None:
    store = open_tmp / "s"
    key = load_primary_key(store).key
    os.chmod(store, 0o755)  # directory listable, key file still 0600 root-owned
    if os.geteuid() != 0:
        os.chmod(store / PRIMARY_KEY_FILE, 0)
    code, msg = _as_nobody(lambda: load_primary_key(store) and None)
    assert code == 3, msg
    assert "permission denied" in msg and "no new key is made" in msg
    assert (store / PRIMARY_KEY_FILE).read_bytes() == key


def test_readable_but_unwritable_storage_is_an_error(open_tmp: Path) -> None:
    from relay.service.storage import check_writable

    store = open_tmp / "ro"
    key = load_primary_key(store).key
    os.chmod(store / PRIMARY_KEY_FILE, 0o644)
    os.chmod(store, 0o755)  # the relay's user may read the key but not write the runtime file
    if os.geteuid() != 0:
        os.chmod(store, 0o555)

    def run() -> None:
        assert load_primary_key(store).key == key
        check_writable(store)

    code, msg = _as_nobody(run)
    assert code == 3, msg
    assert msg == f"storage directory {store} is not writable: permission denied"
    assert (store / PRIMARY_KEY_FILE).read_bytes() == key


@pytest.mark.parametrize(
    "traces",
    [
        {"relay.lock": "4242\n"},
        {"relay-runtime.json": '{"key": "%s", "pid": 4242}\n'},
        {"relay.lock": "", "relay-runtime.json": '{"key": "%s"}\n'},
        {"CORESTORE": "device/platform=linux\n"},
        {"relay-returning.json": '{"stopped_at": 1, "hosts": {}}\n'},
        {"db/IDENTITY": "x"},  # a corestore database whose CURRENT is gone
    ],
)
def test_storage_that_held_a_key_refuses_to_make_another(tmp_path: Path, traces: dict[str, str]) -> None:
    """The key file went missing after a run: a silent new key would strand every job, so refuse."""
    first = load_primary_key(tmp_path)
    old = encode_id(relay_key_pair(first.key).public_key)
    (tmp_path / PRIMARY_KEY_FILE).unlink()
    for name, text in traces.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text.replace("%s", old))
    with pytest.raises(StorageError) as e:
        load_primary_key(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{tmp_path.resolve() / PRIMARY_KEY_FILE} is missing, yet {tmp_path.resolve()} held")
    assert "restore" in msg and "--new-key" in msg
    for name in traces:
        assert name.split("/")[0] in msg
    assert (f"it served {old}" in msg) == ("relay-runtime.json" in traces)
    assert not (tmp_path / PRIMARY_KEY_FILE).exists()
    # asked for deliberately, a new key is made (and kept from then on)
    made = load_primary_key(tmp_path, new_key=True)
    assert made.source == "created" and made.key != first.key
    assert load_primary_key(tmp_path).key == made.key


def test_new_key_never_replaces_a_key_that_is_there(tmp_path: Path) -> None:
    key = load_primary_key(tmp_path).key
    (tmp_path / "relay.lock").write_text("")
    again = load_primary_key(tmp_path, new_key=True)
    assert again.source == "primary-key" and again.key == key


def test_brand_new_storage_needs_no_flag(tmp_path: Path) -> None:
    """blind-relay-service compatibility: an empty or missing directory just gets a key."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "unrelated").mkdir()
    (tmp_path / "unrelated" / "notes.txt").write_text("mine")
    for store in ("empty", "missing", "unrelated"):
        assert load_primary_key(tmp_path / store).source == "created"


def test_damaged_key_file_error_says_how_to_restore_or_start_fresh(tmp_path: Path) -> None:
    (tmp_path / PRIMARY_KEY_FILE).write_bytes(b"short")
    with pytest.raises(StorageError) as e:
        load_primary_key(tmp_path, new_key=True)
    msg = str(e.value)
    assert "restore it from a backup" in msg and "--new-key" in msg
    assert (tmp_path / PRIMARY_KEY_FILE).read_bytes() == b"short"
