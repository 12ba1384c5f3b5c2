"""Bad input is refused before anything is written: unsafe relpaths, bad steps, existing steps, bad stores."""

from __future__ import annotations

import pytest

from rlckpt.errors import (
    BundleExistsError,
    InvalidPathError,
    InvalidStepError,
    StoreUnavailableError,
)
from rlckpt.store import BundleStore
from rlckpt.store.records.intent import Intent
from support.store_checks import debris, save_sample


@pytest.fixture
def store(store_location):
    url, options = store_location
    return BundleStore(url, options)


UNSAFE_RELPATHS = [
    "../x",
    "a/../../x",
    "/abs",
    "C:x",
    "a\\b",
    "",
    "a//b",
    "./a",
    "a/",
    "manifest.json",
    "COMMIT",
    "a\x00b",
    3,
]


def test_unsafe_relpath_is_refused_at_write(store):
    with store.begin(1) as txn:
        for relpath in UNSAFE_RELPATHS:
            with pytest.raises(InvalidPathError):
                txn.write_bytes(relpath, b"x")
        with pytest.raises(InvalidPathError):
            txn.put_dir("../up", ".")
        txn.abort()
    assert debris(store) == []


def test_same_relpath_twice_is_refused(store):
    with store.begin(1) as txn:
        txn.write_bytes("a", b"1")
        with pytest.raises(InvalidPathError, match="already written"):
            txn.write_bytes("a", b"2")
        with pytest.raises(InvalidPathError):
            txn.write_bytes("a/b", b"3")
        txn.commit()
    assert store.open(1).read_bytes("a") == b"1"


def test_bad_step_is_refused(store):
    for step in (-1, 1.0, "3", True, None):
        with pytest.raises(InvalidStepError):
            store.begin(step)
        with pytest.raises(InvalidStepError):
            store.open(step)


def test_committing_an_existing_step_raises_bundle_exists(store):
    save_sample(store, 4)
    with pytest.raises(BundleExistsError, match="step 4"):
        store.begin(4)
    store.open(4).verify()
    assert debris(store) == []  # the claim taken before COMMIT was seen is released


def test_committed_step_with_a_leftover_intent_is_refused_as_committed(store):
    save_sample(store, 4)
    leftover = Intent.new(4, "leftover-of-a-release-that-failed")
    store.backend.create_exclusive(store.claims.path(4), leftover.to_bytes())
    with pytest.raises(BundleExistsError, match="step 4 .* already committed"):
        store.begin(4)
    store.open(4).verify()


def test_non_json_metadata_is_refused_and_nothing_is_committed(store):
    with store.begin(1) as txn:
        txn.write_bytes("a", b"1")
        with pytest.raises(TypeError, match=r"metadata\['obj'\]: a builtins.object \(not JSON\)"):
            txn.commit({"obj": object()})
    assert store.steps() == []


def test_unknown_compression_is_refused(store):
    with store.begin(1) as txn, pytest.raises(ValueError, match="compression"):
        txn.write_bytes("a", b"1", compression="lz4")


def test_unreachable_store_raises_store_unavailable_naming_the_url(store_location, tmp_path):
    url, options = store_location
    if options is None:
        blocker = tmp_path / "a-file"
        blocker.write_bytes(b"")
        url = str(blocker / "run")
    else:
        options = dict(options, endpoint_url="http://127.0.0.1:9", config_kwargs={"retries": {"max_attempts": 1}})
    store = BundleStore(url, options)
    with pytest.raises(StoreUnavailableError, match=url):
        store.begin(1)
    with pytest.raises(StoreUnavailableError, match=url):
        store.steps()


def test_missing_bucket_raises_store_unavailable(s3_storage_options):
    url = "s3://rlckpt-no-such-bucket-here/run"
    with pytest.raises(StoreUnavailableError, match=url):
        BundleStore(url, s3_storage_options).latest()
