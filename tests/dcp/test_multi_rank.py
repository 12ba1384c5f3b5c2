"""DCP through rlckpt at world size 2 (FSDP2 + AdamW on a CPU mesh, gloo on 127.0.0.1): save, load, reshard
to one rank, async_save, joined mode, failures and a rank that dies — on local disk and on S3 (moto).

The ranks run once per backend (support.dcp_scenarios: a spawn costs seconds) and record what
they saw; each test below asserts one behaviour on those records or on the store they left.
"""

from __future__ import annotations

import os
import pickle
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from rlckpt.dcp import BundleStorageReader
from rlckpt.dcp._format import SMALL_ITEM_BYTES
from rlckpt.errors import ParticipantError, UncommittedBundleError
from rlckpt.s3local import make_s3fs
from rlckpt.store import BundleStore, Manifest, Receipt
from rlckpt.store.paths.paths import step_dirname
from support import dcp_scenarios as scenarios
from support.dcp_ranks import (
    bitwise_equal,
    flat_tensors,
    plain_policy,
    policy_state,
    quiet_dcp_warnings,
    run_ranks,
)
from support.store_checks import debris

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@dataclass
class Ranks:
    """What the two ranks recorded, and what the caller (this process) did with its two transactions."""

    store: BundleStore
    url: str
    options: dict[str, Any] | None
    workdir: str
    records: list[dict[str, Any]]
    joined: Manifest | None
    joined_failing_left: list[str]  # files in the failing joined transaction before the caller ended it
    joined_failing_commit: BaseException | None


@pytest.fixture(scope="module", params=["local", "s3"])
def ranks(request, tmp_path_factory):
    base = tmp_path_factory.mktemp(f"dcp-{request.param}")
    bucket_fs = bucket = None
    if request.param == "local":
        url, options, dcp_dir = str(base / "run"), None, str(base / "dcp")
    else:
        options = dict(request.getfixturevalue("s3_storage_options"))
        bucket_fs, bucket = make_s3fs(options), f"rlckpt-dcp-{uuid.uuid4().hex[:12]}"
        bucket_fs.mkdir(bucket)
        url, dcp_dir = f"s3://{bucket}/run", f"s3://{bucket}/dcp"
    workdir = str(base / "records")
    os.makedirs(workdir)
    store = BundleStore(url, options)
    joined, joined_failing = store.begin(4), store.begin(5)
    spec = scenarios.ScenarioSpec(url, options, dcp_dir, joined.handle(), joined_failing.handle(), workdir)
    run_ranks(scenarios.run, 2, spec, expected_exits={1: scenarios.DEAD_RANK_EXIT}, timeout=240)
    records = [torch.load(os.path.join(workdir, f"rank{r}.pt"), weights_only=False) for r in (0, 1)]

    # the caller's side of the joined scenarios: commit the good one, try to commit the failed one
    manifest = None
    receipts = [Receipt.from_json(r["joined_receipt"]) for r in records if r["joined_receipt"]]
    if len(receipts) == 2:
        manifest = joined.commit({"world_size": 2}, receipts=receipts, participants={"rank0", "rank1"})
    else:
        joined.abort()
    data_root = store.backend.data_root(step_dirname(5), joined_failing.txid)
    left = sorted(store.backend.list_files(data_root).sizes)
    failing_receipts = [Receipt.from_json(r["joined_failing_receipt"]) for r in records if r["joined_failing_receipt"]]
    try:
        joined_failing.commit(receipts=failing_receipts, participants={"rank0", "rank1"})
        refusal = None
    except ParticipantError as exc:
        refusal = exc
    yield Ranks(store, url, options, workdir, records, manifest, left, refusal)
    if bucket_fs is not None:
        bucket_fs.rm(bucket, recursive=True)


def _full(ranks: Ranks, name: str) -> dict[str, torch.Tensor]:
    return flat_tensors(torch.load(os.path.join(ranks.workdir, name), weights_only=False))


def _load_one_rank(reader) -> dict[str, torch.Tensor]:
    """Load into an unsharded model + AdamW in this process (world size 1, no process group)."""
    model, optim = plain_policy(scenarios.WIDTH, scenarios.DEPTH, seed=99)
    state = policy_state(model, optim)
    dcp.load(state, storage_reader=reader)
    return flat_tensors(state)


# --- saving and loading ---------------------------------------------------------------------------


def test_two_ranks_save_and_load_back_bitwise(ranks):
    for rec in ranks.records:
        assert rec["save_1"]["raised"] is None, rec["save_1"].get("traceback")
        assert rec["load_newest"]["raised"] is None, rec["load_newest"].get("traceback")
        assert rec["load_newest_differs_from_A"] == []


def test_a_two_rank_bundle_reshards_to_one_rank_bitwise(ranks):
    loaded = _load_one_rank(BundleStorageReader(ranks.url, step=1, storage_options=ranks.options))
    assert len(loaded) > 20
    assert bitwise_equal(loaded, _full(ranks, "full_A.pt")) == []


def test_a_two_rank_bundle_exports_to_safetensors_files_of_whole_tensors_bitwise(ranks, tmp_path):
    """`rlckpt.export_safetensors` in this one process, no group: each FSDP2 shard pair put back whole, in
    several files with their index (docs/export.md)."""
    from safetensors.torch import load_file

    import rlckpt

    rlckpt.export_safetensors(
        ranks.url, 1, out=str(tmp_path / "out"), storage_options=ranks.options, max_shard_size=4096
    )
    files = sorted(p for p in (tmp_path / "out").iterdir() if p.suffix == ".safetensors")
    assert len(files) > 1 and (tmp_path / "out" / "model.safetensors.index.json").exists()
    exported = {name: t for path in files for name, t in load_file(path).items()}
    full = {name: t for name, t in _full(ranks, "full_A.pt").items() if name.startswith("model.")}
    assert bitwise_equal(exported, full) == []


def test_a_two_rank_bundle_loads_with_dcps_own_reader(ranks):
    loaded = _load_one_rank(scenarios.dcp_own_reader(ranks.store, 1, ranks.options))
    assert bitwise_equal(loaded, _full(ranks, "full_A.pt")) == []


def test_async_save_commits_a_bundle_that_loads_back_bitwise(ranks):
    for rec in ranks.records:
        assert rec["async_save_3"]["raised"] is None, rec["async_save_3"].get("traceback")
        assert rec["load_3_differs_from_B"] == []
    assert (
        bitwise_equal(
            _load_one_rank(BundleStorageReader(ranks.url, step=3, storage_options=ranks.options)),
            _full(ranks, "full_B.pt"),
        )
        == []
    )


def test_a_compressed_two_rank_bundle_loads_back_and_reshards_to_one_rank_bitwise(ranks):
    for rec in ranks.records:
        assert rec["compressed_save_8"]["raised"] is None, rec["compressed_save_8"].get("traceback")
        assert rec["load_8"]["raised"] is None, rec["load_8"].get("traceback")
        assert rec["load_8_differs_from_B"] == []
    files = ranks.store.open(8).manifest.files
    bulk = {e.compression for rel, e in files.items() if rel.endswith(".distcp") and e.logical_size > SMALL_ITEM_BYTES}
    assert bulk == {"zstd-planes4"}
    loaded = _load_one_rank(BundleStorageReader(ranks.url, step=8, storage_options=ranks.options))
    assert bitwise_equal(loaded, _full(ranks, "full_B.pt")) == []


def test_a_ranks_shards_are_packed_by_their_own_bytes_not_by_the_whole_tensors(ranks):
    """At 2 ranks a weight's chunk is half the weight. Under a cap that holds two chunks but not two whole
    weights, every file of a rank's large items holds two of them (each went alone into a file when an item
    was weighed by its whole tensor), and stays within the cap."""
    for rec in ranks.records:
        assert rec["capped_save_7"]["raised"] is None, rec["capped_save_7"].get("traceback")
    bundle = ranks.store.open(7)
    metadata = pickle.loads(bundle.read_bytes("policy/.metadata"))
    lengths: dict[str, list[int]] = defaultdict(list)
    for info in metadata.storage_data.values():
        lengths[info.relative_path].append(info.length)
    bulk = {name: sizes for name, sizes in lengths.items() if min(sizes) > SMALL_ITEM_BYTES}
    assert {name[:4] for name in bulk} == {"__0_", "__1_"}
    assert all(len(sizes) == 2 for sizes in bulk.values()), bulk
    assert max(bundle.manifest.files[f"policy/{name}"].size for name in bulk) <= scenarios.CAPPED_SHARD_BYTES


# --- joined mode ------------------------------------------------------------------------------------


def test_joined_ranks_hand_receipts_to_the_caller_who_commits_one_bundle(ranks):
    assert [r["joined_save"]["raised"] for r in ranks.records] == [None, None]
    assert ranks.joined is not None
    rank0, rank1 = (sorted(r["joined_receipt"]["files"]) for r in ranks.records)
    assert rank0[0] == "policy/.metadata" and rank0[1:] and all(f.startswith("policy/__0_") for f in rank0[1:])
    assert rank1 and all(f.startswith("policy/__1_") for f in rank1)
    assert sorted(ranks.joined.files) == sorted(rank0 + rank1)
    assert (
        bitwise_equal(
            _load_one_rank(BundleStorageReader(ranks.url, step=4, storage_options=ranks.options)),
            _full(ranks, "full_B.pt"),
        )
        == []
    )


def test_a_joined_rank_that_fails_leaves_no_receipt_and_no_files(ranks):
    assert [r["joined_failing_save"]["raised"] for r in ranks.records] == ["CheckpointException"] * 2
    assert [r["joined_failing_receipt"] for r in ranks.records] == [None, None]
    # rank 1 had finished one of its two shard files when it failed: that file is gone too
    assert not [f for f in ranks.joined_failing_left if "__1_" in f]
    assert [f for f in ranks.joined_failing_left if "__0_" in f]  # rank 0's are the caller's to drop


def test_the_callers_commit_refuses_the_failed_joined_save(ranks):
    assert ranks.joined_failing_commit is not None
    assert "no receipt from participant(s) ['rank0', 'rank1']" in str(ranks.joined_failing_commit)
    assert 5 not in ranks.store.steps()


# --- failures --------------------------------------------------------------------------------------


def test_a_failed_save_commits_nothing_and_the_previous_bundle_stays_newest(ranks):
    for rec in ranks.records:
        assert rec["save_2_failing"]["raised"] == "CheckpointException"
        assert rec["load_newest_step"] == 1
    assert 2 not in ranks.store.steps()
    with pytest.raises(UncommittedBundleError):
        BundleStorageReader(ranks.url, step=2, storage_options=ranks.options)


def test_dcps_own_writer_leaves_a_silently_loadable_mix_after_the_same_failure(ranks):
    """The hazard rlckpt removes: DCP's writer overwrote rank 0's shard in place, rank 1's and the old
    .metadata stayed, and the folder loads without an error, half new and half old."""
    for rec in ranks.records:
        assert rec["dcp_save_B_failing"]["raised"] == "CheckpointException"
        assert rec["dcp_load"]["raised"] is None
    rank0, rank1 = ranks.records
    assert rank0["dcp_load_differs_from_A"] and rank1["dcp_load_differs_from_A"] == []  # rank 0's half is new
    assert rank1["dcp_load_differs_from_B"]  # rank 1's half is old


def test_a_rank_that_dies_fails_the_save_on_the_others_and_commits_nothing(ranks):
    dying = ranks.records[0]["dying_save"]
    assert dying["raised"] is not None  # rank 0 got an error back instead of hanging
    assert "dying_save" not in ranks.records[1]  # rank 1 died inside it
    assert 6 not in ranks.store.steps()
    assert ranks.store.read_intent(6) is None  # rank 0's writer aborted the transaction it began


def test_no_debris_is_left_by_any_scenario(ranks):
    assert debris(ranks.store) == []
    assert ranks.store.steps() == [1, 3, 4, 7, 8]
