"""The relay's own log beside a brand-new storage is no trace of an earlier key.

The wizard starts the relay detached with its output in `<storage>/blind-relay.log`, created
before the relay first runs; a storage holding only that log must get its first key, while
RocksDB's numbered write-ahead logs still count as traces of one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.service.storage import StorageError, load_primary_key


def test_a_storage_with_only_the_relay_log_gets_its_first_key(tmp_path: Path) -> None:
    (tmp_path / "blind-relay.log").write_text("")
    key = load_primary_key(tmp_path)
    assert (tmp_path / "primary-key").exists() and key is not None


def test_a_numbered_rocksdb_log_is_still_a_trace(tmp_path: Path) -> None:
    (tmp_path / "000003.log").write_text("")
    with pytest.raises(StorageError, match="held a relay key before"):
        load_primary_key(tmp_path)
