"""Migration from blind-relay-service: a storage made by the real npm corestore keeps its key with our relay.

The Node side is `corestore` 7.12.5 exactly as blind-relay-service 2.x uses it
(`new Corestore(dir)`, `createKeyPair('blind-relay')`).
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.keys import encode_id
from relay.service.storage import PRIMARY_KEY_FILE, load_primary_key, relay_key_pair
from tests.interop._relay_net import Testnet
from tests.interop._relay_proc import RelayProcess

pytestmark = pytest.mark.interop
INTEROP = Path(__file__).resolve().parent


def node_corestore_key(node: str, storage: Path, *extra: str) -> str:
    done = subprocess.run(
        [node, "js/storage_corestore_key.js", str(storage), *extra],
        cwd=INTEROP,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # --no-close kills itself with SIGKILL once the key is out (a crash, store unclosed)
    expected = -signal.SIGKILL if "--no-close" in extra else 0
    assert done.returncode == expected, (done.returncode, done.stderr[-2000:])
    return json.loads(done.stdout)["key"]


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[Testnet]:
    with Testnet(node, size=3) as tn:
        yield tn


def relay_prints(storage: Path, testnet: Testnet) -> str:
    with RelayProcess(storage, bootstrap=testnet.bootstrap) as r:
        r.start()
        assert r.key is not None, r.stderr
        assert r.terminate(signal.SIGTERM) == 0
        return r.key


def test_interop_storage_node_corestore_store_gives_the_node_key(node: str, tmp_path: Path, testnet: Testnet) -> None:
    storage = tmp_path / "corestore"
    node_key = node_corestore_key(node, storage)
    assert (storage / "db" / "CURRENT").exists()
    before = sorted(p.name for p in (storage / "db").iterdir())
    assert relay_prints(storage, testnet) == node_key
    # the live directory is only read (through a copy): no sidecar, no new key file
    assert sorted(p.name for p in (storage / "db").iterdir()) == before
    assert not (storage / PRIMARY_KEY_FILE).exists()
    # and the Node service still opens it afterwards with the same key
    assert node_corestore_key(node, storage) == node_key


def test_interop_storage_unclosed_node_store_wal_only(node: str, tmp_path: Path) -> None:
    storage = tmp_path / "corestore"
    node_key = node_corestore_key(node, storage, "--no-close")
    pk = load_primary_key(storage, create=False)
    assert pk.source == "corestore7"
    assert pk.describe() == f"key from {storage.resolve() / 'db'} (corestore 7 store)"
    assert encode_id(relay_key_pair(pk.key).public_key) == node_key


def test_interop_storage_python_store_opens_in_node_with_the_same_key(
    node: str, tmp_path: Path, testnet: Testnet
) -> None:
    """Our new-storage layout is corestore 6's primary-key file, which corestore 7 migrates: moving back works."""
    storage = tmp_path / "corestore"
    ours = relay_prints(storage, testnet)
    assert node_corestore_key(node, storage) == ours
    assert (storage / "db" / "CURRENT").exists()  # Node migrated it into RocksDB
    assert relay_prints(storage, testnet) == ours  # and we read the migrated store too


def _refused(storage: Path, testnet: Testnet, *args: str) -> str:
    """Start the relay on `storage`; it must exit 1 with exactly one error line, which is returned."""
    with RelayProcess(storage, *args, bootstrap=testnet.bootstrap) as r:
        r.start()
        assert r.wait() == 1 and r.key is None, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("blind-relay: error: "), r.stderr
    return lines[0]


def test_interop_storage_deleted_key_is_refused_not_replaced(tmp_path: Path, testnet: Testnet) -> None:
    """`rm S/primary-key` after a run (relay.lock and relay-runtime.json still there): the relay
    refuses, names the file and the key it served, and only `--new-key` makes a new one."""
    storage = tmp_path / "corestore"
    with RelayProcess(storage, bootstrap=testnet.bootstrap) as r:
        r.start()
        old = r.key
        assert old is not None, r.stderr
        r.stop()  # killed: its runtime file stays, as after a crash
    assert (storage / "relay.lock").exists() and (storage / "relay-runtime.json").exists()
    (storage / PRIMARY_KEY_FILE).unlink()
    line = _refused(storage, testnet)
    assert f"{storage.resolve() / PRIMARY_KEY_FILE} is missing" in line
    assert f"it served {old}" in line and "--new-key" in line and "restore" in line
    assert not (storage / PRIMARY_KEY_FILE).exists()
    # a clean exit removes the runtime file; relay.lock alone is still enough to refuse
    (storage / "relay-runtime.json").unlink()
    assert "--new-key" in _refused(storage, testnet)
    with RelayProcess(storage, "--new-key", bootstrap=testnet.bootstrap) as r:
        r.start()
        assert r.key is not None and r.key != old, r.stderr
        assert "made a new relay key as asked (--new-key)" in r.stderr
        assert r.terminate(signal.SIGTERM) == 0
    assert relay_prints(storage, testnet) == r.key  # and kept from then on, without the flag


def test_interop_storage_garbled_manifest_names_the_operators_file(node: str, tmp_path: Path, testnet: Testnet) -> None:
    """A damaged db/MANIFEST-* in a Node-made storage: one line naming the operator's file (not the
    scratch copy it was read from) and how to restore or start fresh; no key is made."""
    storage = tmp_path / "corestore"
    node_corestore_key(node, storage)
    (manifest,) = (storage / "db").glob("MANIFEST-*")
    data = bytearray(manifest.read_bytes())
    for i in range(0, len(data), 3):
        data[i] ^= 0x5A
    manifest.write_bytes(bytes(data))
    line = _refused(storage, testnet)
    db = storage.resolve() / "db"
    assert "blind-relay-corestore" not in line and "/tmp/blind-relay" not in line, line
    assert str(db / manifest.name) in line, line
    assert f"restore {db} from a backup" in line and "--new-key" in line, line
    assert not (storage / PRIMARY_KEY_FILE).exists()
    # the operator sets the database aside as told: still no silent new key (CORESTORE remains)
    db.rename(db.with_name("db.damaged"))
    assert "--new-key" in _refused(storage, testnet)
    with RelayProcess(storage, "--new-key", bootstrap=testnet.bootstrap) as r:
        r.start()
        assert r.key is not None, r.stderr
        assert r.terminate(signal.SIGTERM) == 0
