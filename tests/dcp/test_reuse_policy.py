"""A policy saved with reuse (`BundleStorageWriter(..., reuse=True)`): each tensor chunk of 1 MiB or more is a
file of its own, so a frozen tensor is a file the next save takes unchanged from the bundle before; with
compression on too, every bit comes back, at another world size as well. Local disk and S3."""

from __future__ import annotations

import os
import uuid

import pytest
import torch
import torch.distributed.checkpoint as dcp

from rlckpt.dcp import BundleStorageReader, BundleStorageWriter
from rlckpt.dcp._format import OWN_FILE_BYTES, SMALL_ITEM_BYTES, shard_plan
from rlckpt.s3local import make_s3fs
from rlckpt.store import BundleStore
from support import dcp_reuse_ranks as reuse_ranks
from support.dcp_ranks import bitwise_equal, flat_tensors, mlp, policy_state, quiet_dcp_warnings, run_ranks
from support.store_checks import stored_path

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture
def store(store_location):
    url, options = store_location
    return BundleStore(url, options)


def unchanged_files(store: BundleStore, before: int, after: int) -> dict[str, int]:
    """The files of bundle `after` whose entries are those of bundle `before` (relpath -> logical size)."""
    old, new = store.open(before).manifest.files, store.open(after).manifest.files
    return {rel: entry.logical_size for rel, entry in new.items() if old.get(rel) == entry}


def test_with_reuse_each_large_tensor_chunk_is_a_file_of_its_own_in_the_plans_order():
    state = {"big": torch.zeros(OWN_FILE_BYTES // 4), "mid": torch.zeros(SMALL_ITEM_BYTES), "step": torch.zeros(3)}
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    planner = DefaultSavePlanner()
    planner.set_up_planner(state, is_coordinator=True)
    items = planner.create_local_plan().items
    files = shard_plan("__0_", items, thread_count=2, for_reuse=True)
    names = [[wi.index.fqn for wi in bucket] for _name, bucket in files]
    assert names[0] == ["big"]
    assert sorted(fqn for bucket in names[1:] for fqn in bucket) == ["mid", "step"]


def test_a_frozen_tensor_is_a_file_the_next_save_takes_unchanged(store):
    torch.manual_seed(0)
    frozen, live = torch.randn(512, 1024), torch.randn(512, 1024)
    for step in (1, 2):
        live.add_(1.0)
        state = {"frozen": frozen, "live": live}
        dcp.save(state, storage_writer=BundleStorageWriter(store, step=step, reuse=True))
    same = unchanged_files(store, 1, 2)
    assert sum(same.values()) >= frozen.numel() * 4  # the frozen tensor's file, not rewritten
    into = {"frozen": torch.zeros_like(frozen), "live": torch.zeros_like(live)}
    dcp.load(into, storage_reader=BundleStorageReader(store, step=2))
    assert bitwise_equal(into, {"frozen": frozen, "live": live}) == []
    if store.is_local:  # the same bytes, stored once
        (rel,) = [r for r in same if r.endswith(".distcp")]
        assert os.path.samestat(*(os.stat(stored_path(store, s, rel)) for s in (1, 2)))


def test_without_reuse_a_frozen_tensor_shares_a_file_with_what_changes(store):
    torch.manual_seed(0)
    frozen, live = torch.randn(512, 1024), torch.randn(512, 1024)
    for step in (1, 2):
        live.add_(1.0)
        dcp.save({"frozen": frozen, "live": live}, storage_writer=BundleStorageWriter(store, step=step))
    assert not any(rel.endswith(".distcp") for rel in unchanged_files(store, 1, 2))


@pytest.fixture(scope="module", params=["local", "s3"])
def two_rank_saves(request, tmp_path_factory):
    """Two FSDP2 ranks saved steps 1 and 2 of a policy whose first layer is frozen (reuse and compression on)."""
    base = tmp_path_factory.mktemp(f"reuse-{request.param}")
    bucket_fs = bucket = None
    if request.param == "local":
        url, options = str(base / "run"), None
    else:
        options = dict(request.getfixturevalue("s3_storage_options"))
        bucket_fs, bucket = make_s3fs(options), f"rlckpt-reuse-{uuid.uuid4().hex[:12]}"
        bucket_fs.mkdir(bucket)
        url = f"s3://{bucket}/run"
    spec = reuse_ranks.ReuseSpec(url, options, str(base))
    run_ranks(reuse_ranks.save_twice, 2, spec, timeout=240)
    yield BundleStore(url, options), str(base)
    if bucket_fs is not None:
        bucket_fs.rm(bucket, recursive=True)


def test_two_ranks_take_the_frozen_layers_shards_from_the_bundle_before(two_rank_saves):
    store, _ = two_rank_saves
    same = unchanged_files(store, 1, 2)
    shard_bytes = reuse_ranks.WIDTH * reuse_ranks.WIDTH * 4 // 2
    assert sum(size for rel, size in same.items() if rel.endswith(".distcp")) >= 2 * shard_bytes
    assert {rel.split("/")[-1][:4] for rel in same if rel.endswith(".distcp")} == {"__0_", "__1_"}  # both ranks
    store.open(2).verify()
    if store.is_local:  # taken, not written again: one inode for both bundles
        for rel in (r for r in same if r.endswith(".distcp")):
            assert os.path.samestat(*(os.stat(stored_path(store, s, rel)) for s in (1, 2)))


def test_a_policy_saved_at_two_ranks_with_both_options_loads_at_one_rank_bitwise(two_rank_saves):
    store, workdir = two_rank_saves
    model = mlp(reuse_ranks.WIDTH, reuse_ranks.DEPTH, seed=99)
    optim = reuse_ranks.frozen_first_layer(model)
    state = policy_state(model, optim)
    dcp.load(state, storage_reader=BundleStorageReader(store, step=2))
    expected = flat_tensors(torch.load(os.path.join(workdir, "full_2.pt"), weights_only=True))
    assert bitwise_equal(flat_tensors(state), expected) == []
    assert any(e.compression for e in store.open(2).manifest.files.values())
