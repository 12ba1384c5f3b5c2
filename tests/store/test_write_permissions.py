"""A store on local disk that may not be written: begin(), write_bytes() and commit() raise
StoreUnavailableError naming the store, the path and the cause (PermissionError), never a raw OSError.
The run directory is made read-only with its mode, enforced even when the tests run as root."""

from __future__ import annotations

import pytest

from rlckpt.errors import StoreUnavailableError
from rlckpt.store import BundleStore
from support.permissions import mode_enforced


@pytest.fixture
def run_dir(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    return path


def test_begin_in_a_read_only_run_dir_is_unavailable_naming_the_path(run_dir):
    store = BundleStore(str(run_dir))
    with mode_enforced(run_dir, 0o555), pytest.raises(StoreUnavailableError) as info:
        store.begin(1)
    message = str(info.value)
    assert message.startswith(f"store {run_dir} unavailable while beginning step 1: PermissionError")
    assert f"{run_dir}/_txn" in message


def test_write_into_a_read_only_staging_dir_is_unavailable_naming_the_path(run_dir):
    store = BundleStore(str(run_dir))
    with store.begin(1) as tx:
        staging = run_dir / "_tmp" / tx.txid
        with mode_enforced(staging, 0o555), pytest.raises(StoreUnavailableError, match=f"PermissionError.*{staging}"):
            tx.write_bytes("weights.bin", b"w" * 100)


def test_commit_into_a_read_only_run_dir_is_unavailable_naming_the_path(run_dir):
    store = BundleStore(str(run_dir))
    with store.begin(1) as tx:
        tx.write_bytes("weights.bin", b"w" * 100)
        with mode_enforced(run_dir, 0o555), pytest.raises(StoreUnavailableError, match=f"PermissionError.*{run_dir}"):
            tx.commit()
    assert store.steps() == []
