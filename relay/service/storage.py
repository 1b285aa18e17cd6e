"""The relay's storage directory: where its primary key lives, so one storage always gives one key.

The relay key is what operators paste into CosmicAC's `.env`; if it silently changed every job
would be stranded. So this module reads the primary key from every layout a blind-relay-service
storage can have, and only ever creates a key in a directory that holds none:

* corestore 7 (blind-relay-service >= 1.2): RocksDB in `<storage>/db` (or, in early versions,
  directly in `<storage>`), column family `corestore`, key `00` = the `@corestore/head` record
  whose `seed` field is the primary key (docs/wire/streams.md §2). Read from a copy with rocksdict.
* corestore <= 6 (blind-relay-service 1.0/1.1): `<storage>/primary-key`, 32 raw bytes.

A new storage gets the corestore <= 6 file `<storage>/primary-key` (32 random bytes, mode 0600,
written atomically and never over an existing file). That is the layout corestore 7 itself
migrates on first open (hypercore-storage migration 0 copies the file into its head), so the
same directory given to the Node blind-relay-service later yields the very same key.

A key is only made in a storage that never held one. A directory with a trace of an earlier
run (`relay.lock`, `relay-runtime.json`, corestore's `CORESTORE` or `db/`, RocksDB files) but no
readable key lost it: starting would silently give a new key that no job knows, so the relay
refuses, naming the file to restore, unless the operator asks for a new key (`--new-key`).
Errors name the operator's files, never the scratch copy the database is read from.

The relay key is corestore's `createKeyPair('blind-relay')` on the root namespace.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from relay.encoding import DecodeError, Reader
from relay.keys import KeyPair, corestore_key_pair
from relay.service.runtime import RETURNING_FILE, RUNTIME_FILE

PRIMARY_KEY_FILE = "primary-key"
LOCK_FILE = "relay.lock"
NEW_KEY_FLAG = "--new-key"
RELAY_KEY_NAME = "blind-relay"
KEY_BYTES = 32
# corestore 7 head record: column family and key (index-encoder UINT(TL_HEAD = 0)).
CORESTORE_COLUMN_FAMILY = "corestore"
CORESTORE_HEAD_KEY = b"\x00"


class StorageError(Exception):
    """The storage directory cannot give us its key; the message says what and how to fix it."""


@dataclass(frozen=True)
class PrimaryKey:
    """The store seed plus where it came from (for the log and /stats)."""

    key: bytes
    source: str  # "corestore7" | "primary-key" | "created"
    path: Path

    def describe(self) -> str:
        """One log line saying where the key is and in which layout, each said once."""
        if self.source == "corestore7":
            return f"key from {self.path} (corestore 7 store)"
        if self.source == "created":
            return f"new key created in {self.path} (primary-key file)"
        return f"key from {self.path} (primary-key file)"


def decode_corestore_head(value: bytes) -> bytes | None:
    """Return the seed in a `@corestore/head` record (versions 0, 1 and 2), or None if it has none."""
    r = Reader(value)
    version = r.uint()
    if version >= 2:
        r.uint()  # cores
        r.uint()  # datas
        r.uint()  # groups
        flags = r.uint()
        return r.fixed(KEY_BYTES) if flags & 1 else None
    flags = r.uint()
    if flags & 1:
        r.uint()  # cores
        r.uint()  # datas
    return r.fixed(KEY_BYTES) if flags & 2 else None


def _rocksdb_dir(storage: Path) -> Path | None:
    """Where corestore 7 keeps its RocksDB inside `storage`, if it does."""
    if (storage / "db" / "CURRENT").exists():
        return storage / "db"
    if (storage / "CURRENT").exists():
        return storage
    return None


def read_corestore_seed(db_dir: Path) -> bytes | None:
    """Read the head seed from a corestore 7 RocksDB directory, working on a scratch copy.

    rocksdict writes a sidecar file into whatever it opens, and the live directory may belong
    to a running Node service, so we never open it in place. Read-only mode replays the WAL,
    which is where the seed sits when the Node process exited without closing the store.
    """
    try:
        import rocksdict
    except ImportError as e:  # pragma: no cover - rocksdict is a dependency
        raise StorageError(
            f"{db_dir} is a corestore 7 (RocksDB) storage but the rocksdict package is missing: pip install rocksdict"
        ) from e
    with tempfile.TemporaryDirectory(prefix="blind-relay-corestore-") as scratch:
        copy = Path(scratch) / "db"
        try:
            copy.mkdir()
            for entry in os.listdir(db_dir):
                src = db_dir / entry
                # Only RocksDB's own files; skip the lock and anything that is a directory.
                if entry == "LOCK" or not src.is_file():
                    continue
                shutil.copy2(src, copy / entry)
        except PermissionError as e:
            raise StorageError(
                f"cannot read the corestore database in {db_dir}: {e.strerror}; give the relay's user read access "
                "(no new key is made while the old one cannot be read)"
            ) from e
        except OSError as e:
            raise StorageError(
                f"cannot copy the corestore database in {db_dir}: {_operator_paths(e, copy, db_dir)}"
            ) from e
        try:
            opts, cfs = rocksdict.Options.load_latest(str(copy), ignore_unknown_options=True)
            db = rocksdict.Rdict(
                str(copy), options=opts, column_families=cfs, access_type=rocksdict.AccessType.read_only()
            )
        except Exception as e:
            raise StorageError(
                f"cannot open the corestore database in {db_dir}: {_operator_paths(e, copy, db_dir)}; "
                f"{_damaged_db_fix(db_dir)}"
            ) from e
        try:
            if CORESTORE_COLUMN_FAMILY not in cfs:
                return None
            value = db.get_column_family(CORESTORE_COLUMN_FAMILY).get(CORESTORE_HEAD_KEY)
        except Exception as e:
            raise StorageError(
                f"cannot read the corestore head in {db_dir}: {_operator_paths(e, copy, db_dir)}; "
                f"{_damaged_db_fix(db_dir)}"
            ) from e
        finally:
            db.close()
    if value is None:
        return None
    if not isinstance(value, bytes | bytearray):
        raise StorageError(f"corestore head in {db_dir} is not a byte string ({type(value).__name__})")
    try:
        return decode_corestore_head(bytes(value))
    except DecodeError as e:
        raise StorageError(f"corestore head in {db_dir} is damaged: {e}; {_damaged_db_fix(db_dir)}") from e


def _operator_paths(e: Exception, copy: Path, db_dir: Path) -> str:
    """The error text with the scratch copy's path replaced by the operator's own directory
    (the copy is deleted by the time anyone reads the message)."""
    return " ".join(str(e).replace(str(copy), str(db_dir)).split())


def _damaged_db_fix(db_dir: Path) -> str:
    return (
        f"restore {db_dir} from a backup (the relay key is in it), or set it aside "
        f"(mv {db_dir} {db_dir}.damaged) and start with {NEW_KEY_FLAG} to make a new key deliberately"
    )


_ROCKSDB_NAMES = ("CURRENT", "IDENTITY", "MANIFEST-", "OPTIONS-")


def _numbered_log(name: str) -> bool:
    stem, dot, ext = name.rpartition(".")
    return bool(dot) and ext == "log" and stem.isdigit()


def previous_run_traces(root: Path, entries: set[str]) -> list[str]:
    """Files in `root` that show a relay (ours or Node's) ran on it, so it once held a key."""
    found = [n for n in (LOCK_FILE, RUNTIME_FILE, RETURNING_FILE, "CORESTORE", "db") if n in entries]
    # RocksDB's write-ahead logs are numbered (000003.log); the relay's own log beside the key
    # (blind-relay.log, written before the first start) is no trace of a key.
    found += sorted(n for n in entries if n.startswith(_ROCKSDB_NAMES) or n.endswith(".sst") or _numbered_log(n))
    return found


def _served_key(root: Path) -> str | None:
    """The relay key the last run announced, as its runtime file recorded it."""
    try:
        key = json.loads((root / RUNTIME_FILE).read_text()).get("key")
    except (OSError, ValueError, AttributeError):
        return None
    return key if isinstance(key, str) and key.isalnum() else None


def _lost_key_error(root: Path, traces: list[str]) -> StorageError:
    key_file = root / PRIMARY_KEY_FILE
    served = _served_key(root)
    what = f"it served {served}; " if served else ""
    restore = f"{key_file} (or {root / 'db'})" if "db" in traces or "CORESTORE" in traces else str(key_file)
    return StorageError(
        f"{key_file} is missing, yet {root} held a relay key before ({what}found {', '.join(traces)}): "
        f"refusing to start with a different key; restore {restore} from a backup, or start with "
        f"{NEW_KEY_FLAG} to make a new key deliberately (every deployment naming the old key then needs the new one)"
    )


def _read_primary_key_file(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except PermissionError as e:
        raise StorageError(
            f"cannot read {path}: permission denied; give the relay's user read access "
            "(no new key is made while the old one cannot be read)"
        ) from e
    except OSError as e:
        raise StorageError(f"cannot read {path}: {e.strerror or e}") from e
    if len(data) != KEY_BYTES:
        # shorter is damaged; longer is damaged too or not a primary key at all (using its first 32
        # bytes would announce a key nobody configured)
        raise StorageError(
            f"{path} holds {len(data)} bytes, a primary key is exactly {KEY_BYTES}; refusing to use or replace it: "
            f"restore it from a backup, or set it aside (mv {path} {path}.damaged) and start with {NEW_KEY_FLAG} to "
            "make a new key deliberately"
        )
    return data


def _write_new_key(path: Path, key: bytes) -> None:
    """Write `key` to `path` atomically with mode 0600; never replace an existing file."""
    fd, tmp = tempfile.mkstemp(prefix=".primary-key.", dir=path.parent)  # mkstemp creates with 0600
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # fails with EEXIST instead of clobbering a key that appeared meanwhile
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load_primary_key(storage: str | os.PathLike[str], *, create: bool = True, new_key: bool = False) -> PrimaryKey:
    """Find the primary key in `storage`, or create it when the directory never held one.

    A storage with traces of an earlier run but no key is refused unless `new_key` (the
    operator's deliberate `--new-key`); `new_key` never replaces a key that is there."""
    root = Path(storage).resolve()
    try:
        exists = root.exists()
    except PermissionError as e:
        raise StorageError(f"cannot reach storage directory {root}: permission denied on a parent directory") from e
    if exists:
        if not root.is_dir():
            raise StorageError(f"storage {root} exists but is not a directory")
        try:
            entries = set(os.listdir(root))
        except PermissionError as e:
            raise StorageError(
                f"cannot read storage directory {root}: permission denied; fix its permissions or run the relay as "
                "its owner (no new key is made while the old one cannot be read)"
            ) from e
        except OSError as e:
            raise StorageError(f"cannot read storage directory {root}: {e.strerror or e}") from e
    else:
        entries = set()

    db_dir = _rocksdb_dir(root) if entries else None
    if db_dir is not None:
        seed = read_corestore_seed(db_dir)
        if seed is not None:
            return PrimaryKey(seed, "corestore7", db_dir)
        if PRIMARY_KEY_FILE not in entries:
            raise StorageError(
                f"{db_dir} is a corestore database without a primary key; refusing to make a new one there "
                "(point --storage at the directory the relay used before, or at an empty one)"
            )
    if PRIMARY_KEY_FILE in entries:
        path = root / PRIMARY_KEY_FILE
        return PrimaryKey(_read_primary_key_file(path), "primary-key", path)
    if not create:
        raise StorageError(f"{root} holds no relay key")
    traces = previous_run_traces(root, entries)
    if traces and not new_key:
        raise _lost_key_error(root, traces)

    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except PermissionError as e:
        raise StorageError(f"cannot create storage directory {root}: permission denied") from e
    except OSError as e:
        raise StorageError(f"cannot create storage directory {root}: {e.strerror or e}") from e
    path = root / PRIMARY_KEY_FILE
    try:
        _write_new_key(path, os.urandom(KEY_BYTES))
    except FileExistsError:
        return PrimaryKey(_read_primary_key_file(path), "primary-key", path)
    except PermissionError as e:
        raise StorageError(f"cannot write {path}: storage directory {root} is not writable") from e
    except OSError as e:
        if e.errno == errno.EROFS:
            raise StorageError(f"cannot write {path}: storage {root} is on a read-only file system") from e
        raise StorageError(f"cannot write {path}: {e.strerror or e}") from e
    return PrimaryKey(_read_primary_key_file(path), "created", path)


def relay_key_pair(primary_key: bytes) -> KeyPair:
    """The relay identity, as blind-relay-service gets it: `store.createKeyPair('blind-relay')`."""
    return corestore_key_pair(primary_key, RELAY_KEY_NAME)


def check_writable(storage: Path) -> None:
    """Fail early (before announcing) if the relay could not write its runtime file."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".write-check.", dir=storage)
    except PermissionError as e:
        raise StorageError(f"storage directory {storage} is not writable: permission denied") from e
    except OSError as e:
        raise StorageError(f"storage directory {storage} is not writable: {e.strerror or e}") from e
    try:
        os.write(fd, b"\0" * 4096)  # a full disk takes empty files; find out now, not at the runtime file
        os.fsync(fd)
    except OSError as e:
        raise StorageError(f"storage directory {storage} is not writable: {e.strerror or e}") from None
    finally:
        os.close(fd)
        os.unlink(tmp)


class StorageLock:
    """An exclusive `flock` on `<storage>/relay.lock`, held while the relay runs.

    Two relays on one storage would announce one key from two addresses; corestore refuses
    that through its own locks, and so do we. The kernel drops the lock when the process dies,
    so a crash never leaves the storage locked.
    """

    def __init__(self, storage: Path) -> None:
        import fcntl

        self.path = storage / LOCK_FILE
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise StorageError(f"cannot open {self.path}: {e.strerror or e}") from e
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip()
            os.close(self._fd)  # touch nothing else: the storage and its files belong to that relay
            who = f"pid {holder} (another relay)" if holder.isdigit() else "another relay"
            raise StorageError(f"storage {storage} is in use by {who}; stop it or use another --storage") from None
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as e:  # a full disk: say so in one line, keep nothing half-made
            os.close(self._fd)
            self._fd = -1
            raise StorageError(f"cannot write {self.path}: {e.strerror or e}") from None

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = -1
