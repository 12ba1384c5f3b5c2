"""A policy checkpoint written by someone who can write the run's storage: every digest matches, and
what it holds would run code if DCP's own loaders unpickled it. BundleStorageReader refuses it, naming
the file and the global, before anything of it runs (docs/security.md). Local disk and S3, one body."""

from __future__ import annotations

import io
import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from rlckpt.dcp import BundleStorageReader, BundleStorageWriter
from rlckpt.dcp._safe_unpickle import load_metadata
from rlckpt.errors import UnsafeContentError
from rlckpt.grpo import GRPOConfig
from rlckpt.grpo.trainer import Trainer
from rlckpt.safeload import pickle_globals
from rlckpt.store import BundleStore
from support.dcp_ranks import bitwise_equal, flat_tensors, plain_policy, policy_state, quiet_dcp_warnings
from support.forge import RunsCode, code_pickle, files_under, forge_step

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

WIDTH, DEPTH = 64, 2


def fresh_state(seed: int = 5) -> dict:
    return policy_state(*plain_policy(WIDTH, DEPTH, seed=seed))


@pytest.fixture
def run(store_location):
    """(store, url, options) of a run whose step 1 rlckpt saved honestly."""
    url, options = store_location
    store = BundleStore(url, options)
    dcp.save(fresh_state(0), storage_writer=BundleStorageWriter(store, step=1))
    return store, url, options


def raised_inside(excinfo, error: type[BaseException]) -> BaseException:
    """The `error` a rank raised inside DCP's CheckpointException (DCP wraps every rank's failure)."""
    failures = getattr(excinfo.value, "failures", {})
    found = [err for err, _tb in failures.values() if isinstance(err, error)]
    assert found, f"no {error.__name__} among {failures or excinfo.value!r}"
    return found[0]


def test_metadata_that_asks_for_a_foreign_global_is_refused_before_it_runs(run, tmp_path):
    store, url, options = run
    marker = tmp_path / "ran"
    forge_step(store, 1, 2, {"policy/.metadata": code_pickle(marker)})
    with pytest.raises(UnsafeContentError, match=r"step 2 .*policy/\.metadata: .*asks for builtins\.exec"):
        dcp.load(fresh_state(), storage_reader=BundleStorageReader(url, step=None, storage_options=options))
    assert not marker.exists()


@pytest.mark.parametrize("planner", [None, DefaultLoadPlanner()], ids=["default-planner", "dcp-default-planner"])
def test_a_non_tensor_item_that_asks_for_a_foreign_global_is_refused_before_any_planner_sees_it(run, tmp_path, planner):
    """DCP's DefaultLoadPlanner loads non-tensor items with torch.load(weights_only=False): the reader
    must refuse the item itself, whichever planner the caller passes."""
    store, url, options = run
    marker = tmp_path / "ran"
    forged = fresh_state(0)
    forged["optim"]["param_groups"][0]["lr"] = RunsCode(marker)  # DCP writes it as a BYTE_IO item
    dcp.save(forged, storage_writer=BundleStorageWriter(store, step=2))
    with pytest.raises(BaseException) as excinfo:  # DCP's CheckpointException is a BaseException
        dcp.load(
            fresh_state(), storage_reader=BundleStorageReader(url, step=None, storage_options=options), planner=planner
        )
    refused = raised_inside(excinfo, UnsafeContentError)
    assert "item 'optim.param_groups.0.lr'" in str(refused) and "exec, which is not allowed" in str(refused)
    assert "step 2 " in str(refused) and "policy/__0_" in str(refused)
    assert not marker.exists()


def test_honest_non_tensor_items_reach_the_planner_unchanged(run):
    store, url, options = run
    saved = fresh_state(0)
    saved["optim"]["param_groups"][0]["lr"] = 0.125
    saved["optim"]["param_groups"][0]["betas"] = (0.5, 0.75)
    dcp.save(saved, storage_writer=BundleStorageWriter(store, step=2))
    loaded = fresh_state()
    dcp.load(loaded, storage_reader=BundleStorageReader(url, step=2, storage_options=options))
    assert loaded["optim"]["param_groups"] == saved["optim"]["param_groups"]
    assert bitwise_equal(flat_tensors(loaded), flat_tensors(saved)) == []


def test_a_bundle_holding_dcps_own_checkpoint_loads(run, tmp_path):
    """DCP's FileSystemWriter pickles more into `.metadata` than rlckpt's writer (a PosixPath as the
    checkpoint id): the allowlist holds what DCP's own writers put there."""
    store, url, options = run
    theirs = tmp_path / "dcp"
    saved = fresh_state(3)
    dcp.save(saved, storage_writer=dcp.FileSystemWriter(str(theirs)))
    forge_step(store, 1, 2, {rel: None for rel in store.open(1).manifest.files} | files_under(theirs, "policy"))
    loaded = fresh_state()
    dcp.load(loaded, storage_reader=BundleStorageReader(url, step=2, storage_options=options))
    assert bitwise_equal(flat_tensors(loaded), flat_tensors(saved)) == []
    shutil.rmtree(theirs)


def test_the_trainer_states_non_tensor_items_name_no_global_at_all(tmp_path):
    """What rlckpt itself saves as non-tensor items (AdamW's param_groups, the trainer record) is plain
    data: the allowlist for them could be empty."""
    store = BundleStore(str(tmp_path / "run"))
    dcp.save(Trainer(GRPOConfig()).checkpoint_state(), storage_writer=BundleStorageWriter(store, step=1))
    bundle = store.open(1)
    metadata = load_metadata(bundle.read_bytes("policy/.metadata"), "policy/.metadata")
    byte_items = [
        i for i in metadata.storage_data if isinstance(metadata.state_dict_metadata[i.fqn], BytesStorageMetadata)
    ]
    assert {i.fqn for i in byte_items} >= {"trainer", "optim.param_groups.0.lr", "optim.param_groups.0.params"}
    for index in byte_items:
        info = metadata.storage_data[index]
        item = bundle.read_bytes(f"policy/{info.relative_path}")[info.offset : info.offset + info.length]
        pickled = torch._C.PyTorchFileReader(io.BytesIO(item)).get_record("data.pkl")
        assert pickle_globals(pickled) == [], index.fqn
