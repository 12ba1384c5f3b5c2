"""A bundle whose `policy/.metadata` lies about where its items are (committed through the store's own API,
so every digest matches) is refused by BundleStorageReader with a CorruptBundleError naming the shard file and
the item, on local disk and on S3: slices out of the file's bounds before anything is sliced, and whatever
torch raises for an item sliced from the wrong bytes."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

from rlckpt.dcp import BundleStorageReader, BundleStorageWriter
from rlckpt.errors import CorruptBundleError
from rlckpt.store import BundleStore
from support.dcp_ranks import (
    bitwise_equal,
    flat_tensors,
    plain_policy,
    policy_state,
    quiet_dcp_warnings,
    train_step,
)

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

WIDTH, DEPTH = 64, 2
FORGED_STEP = 2

# How a forgery changes the storage record (_StorageInfo) of the largest tensor item, given its file's size.
Forgery = Callable[[Any, int], Any]


def _past_the_end(info: Any, size: int) -> Any:
    return dataclasses.replace(info, offset=size + 4096)


def _negative_offset(info: Any, size: int) -> Any:
    return dataclasses.replace(info, offset=-8)


def _absurd_length(info: Any, size: int) -> Any:
    return dataclasses.replace(info, length=1 << 62)


def _running_over_the_end(info: Any, size: int) -> Any:
    return dataclasses.replace(info, length=size - info.offset + 1)


def _shifted_by_one_byte(info: Any, size: int) -> Any:  # in bounds, but not where a torch.save begins
    return dataclasses.replace(info, offset=info.offset + 1, length=info.length - 1)


OUT_OF_BOUNDS = {
    "offset past the end": _past_the_end,
    "negative offset": _negative_offset,
    "absurd length": _absurd_length,
    "length running over the end": _running_over_the_end,
}


def _state(seed: int) -> dict:
    """A policy after one AdamW step (so the optimizer holds tensors too)."""
    model, optim = plain_policy(WIDTH, DEPTH, seed=seed)
    train_step(model, optim, WIDTH, seed=seed + 1)
    return policy_state(model, optim)


@pytest.fixture
def store(store_location) -> BundleStore:
    """A run whose step 1 is a policy saved through rlckpt."""
    url, options = store_location
    store = BundleStore(url, options)
    dcp.save(_state(0), storage_writer=BundleStorageWriter(store, step=1))
    return store


def _largest_tensor_item(metadata: Any) -> MetadataIndex:
    tensors = [
        i for i in metadata.storage_data if not isinstance(metadata.state_dict_metadata[i.fqn], BytesStorageMetadata)
    ]
    return max(tensors, key=lambda index: metadata.storage_data[index].length)


def _commit_forged(store: BundleStore, forge: Callable[[Any, MetadataIndex], None]) -> None:
    """Commit step FORGED_STEP with step 1's files and its `.metadata` changed by `forge(metadata, item)`
    (item: the largest tensor item), through the store's own transaction, digests and all."""
    bundle = store.open(1)
    metadata = pickle.loads(bundle.read_bytes("policy/.metadata"))
    forge(metadata, _largest_tensor_item(metadata))
    with store.begin(FORGED_STEP) as tx:
        for rel in bundle.manifest.files:
            data = pickle.dumps(metadata) if rel == "policy/.metadata" else bundle.read_bytes(rel)
            tx.write_bytes(rel, data)
        tx.commit(bundle.manifest.metadata)


def _refusal(store: BundleStore) -> tuple[CorruptBundleError, dict]:
    """What loading FORGED_STEP raised (from inside DCP's CheckpointException), and the target's tensors after."""
    target = _state(77)
    with pytest.raises(dcp.CheckpointException) as excinfo:
        dcp.load(target, storage_reader=BundleStorageReader(store, step=FORGED_STEP))
    failures = [error for error, _tb in excinfo.value.failures.values()]
    assert len(failures) == 1 and isinstance(failures[0], CorruptBundleError), failures
    return failures[0], flat_tensors(target)


@pytest.mark.parametrize("forgery", OUT_OF_BOUNDS.values(), ids=OUT_OF_BOUNDS.keys())
def test_a_slice_outside_its_shard_file_is_refused_naming_the_file_and_the_item(store, forgery):
    shard: dict[str, Any] = {}

    def forge(metadata: Any, item: MetadataIndex) -> None:
        info = metadata.storage_data[item]
        size = store.open(1).manifest.files[f"policy/{info.relative_path}"].logical_size
        metadata.storage_data[item] = forgery(info, size)
        shard.update(path=f"policy/{info.relative_path}", fqn=item.fqn, size=size)

    _commit_forged(store, forge)
    untouched = flat_tensors(_state(77))
    error, loaded = _refusal(store)
    message = str(error)
    assert f"step {FORGED_STEP}" in message and shard["path"] in message and shard["fqn"] in message
    assert f"{shard['size']} bytes" in message
    assert bitwise_equal(loaded, untouched) == []  # refused before torch read a byte of it


def test_an_item_sliced_from_the_wrong_bytes_is_refused_naming_the_file_the_item_and_what_torch_said(store):
    shard: dict[str, Any] = {}

    def forge(metadata: Any, item: MetadataIndex) -> None:
        info = metadata.storage_data[item]
        metadata.storage_data[item] = _shifted_by_one_byte(info, 0)
        shard.update(path=f"policy/{info.relative_path}", fqn=item.fqn)

    _commit_forged(store, forge)
    error, _loaded = _refusal(store)
    message = str(error)
    assert f"step {FORGED_STEP}" in message and shard["path"] in message and shard["fqn"] in message
    assert "does not load" in message and error.__cause__ is not None
    assert type(error.__cause__).__name__ in message


def test_two_items_on_the_same_bytes_are_refused_naming_both(store):
    shard: dict[str, Any] = {}

    def forge(metadata: Any, item: MetadataIndex) -> None:  # a tensor item pointed at a pickled one
        pickled = next(
            i for i in metadata.storage_data if isinstance(metadata.state_dict_metadata[i.fqn], BytesStorageMetadata)
        )
        metadata.storage_data[item] = metadata.storage_data[pickled]
        shard.update(path=f"policy/{metadata.storage_data[pickled].relative_path}", fqns=(item.fqn, pickled.fqn))

    _commit_forged(store, forge)
    error, _loaded = _refusal(store)
    message = str(error)
    assert "on the same bytes of" in message and shard["path"] in message
    assert all(fqn in message for fqn in shard["fqns"])


def test_an_item_without_a_storage_record_is_refused_naming_it(store):
    named: dict[str, Any] = {}

    def forge(metadata: Any, item: MetadataIndex) -> None:
        del metadata.storage_data[item]
        named.update(fqn=item.fqn)

    _commit_forged(store, forge)
    error, _loaded = _refusal(store)
    assert named["fqn"] in str(error) and "records no bytes" in str(error)


def test_the_unforged_step_still_loads(store):
    target = _state(77)
    dcp.load(target, storage_reader=BundleStorageReader(store, step=1))
    assert bitwise_equal(flat_tensors(target), flat_tensors(_state(0))) == []
