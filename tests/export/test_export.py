"""`rlckpt.export_safetensors` and `rlckpt.load_state`: a bundle's DCP piece out as whole tensors, in one process,
bit-identical to the gathered state (a two-rank FSDP2 bundle: tests/dcp/test_multi_rank.py); the Hugging Face
layout; a transaction of its own; bad input exports nothing. Bundles on local disk and S3, exports to local disk
(and S3 where named)."""

from __future__ import annotations

import errno
import json
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

import rlckpt
from rlckpt.dcp import BundleStorageWriter
from rlckpt.errors import CorruptBundleError, ExportError, UncommittedBundleError, UnsignedBundleError
from rlckpt.export import safetensors_out
from rlckpt.store import BundleStore, SigningKey
from support.dcp_ranks import (
    bitwise_equal,
    flat_tensors,
    full_state,
    plain_policy,
    policy_state,
    quiet_dcp_warnings,
    train_step,
)
from support.store_checks import corrupt_file

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
WIDTH, DEPTH = 64, 3


@pytest.fixture
def store(store_location):
    url, options = store_location
    return BundleStore(url, options)


def saved_policy(store: BundleStore, step: int = 1, prefix: str = "policy") -> dict[str, torch.Tensor]:
    """A plain MLP + AdamW saved through DCP (world size 1) as bundle `step`; its full state, flat."""
    model, optim = plain_policy(WIDTH, DEPTH, seed=step)
    train_step(model, optim, WIDTH, seed=step)
    dcp.save(policy_state(model, optim), storage_writer=BundleStorageWriter(store, step=step, prefix=prefix))
    return {k: v.clone() for k, v in flat_tensors(full_state(model, optim)).items()}


def model_part(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if k.startswith("model.")}


def exported(out) -> dict[str, torch.Tensor]:
    """Every tensor of an export directory, read with safetensors' own loader."""
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(out)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(out, name)))
    return tensors


def test_an_export_holds_the_models_tensors_bit_identical_and_leaves_the_optimizer_out(store, tmp_path):
    state = saved_policy(store)
    report = rlckpt.export_safetensors(store, out=str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path / "out")) == ["model.safetensors", "rlckpt-export.json"]
    assert bitwise_equal(exported(tmp_path / "out"), model_part(state)) == []
    assert report.step == 1 and report.piece == "policy" and report.tensors == len(model_part(state))
    assert any(name.startswith("optim.") for name in report.left_out)
    provenance = json.loads((tmp_path / "out" / "rlckpt-export.json").read_text())
    assert provenance["txid"] == store.open(1).manifest.txid
    assert provenance["files"][0]["bytes"] == os.path.getsize(tmp_path / "out" / "model.safetensors")


def test_only_all_exports_the_optimizers_tensors_too(store, tmp_path):
    state = saved_policy(store)
    rlckpt.export_safetensors(store, out=str(tmp_path / "out"), only=["all"])
    assert bitwise_equal(exported(tmp_path / "out"), state) == []


def test_load_state_gives_back_the_flat_consolidated_state_in_one_process(store):
    state = saved_policy(store)
    loaded = rlckpt.load_state(store.url, storage_options=store.storage_options or None)
    assert bitwise_equal(loaded, state) == []
    assert bitwise_equal(rlckpt.load_state(store, only=["model"]), model_part(state)) == []


def test_more_than_one_shard_comes_with_a_hugging_face_index(store, tmp_path):
    state = model_part(saved_policy(store))
    report = rlckpt.export_safetensors(store, out=str(tmp_path / "out"), max_shard_size=20_000)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    names = [f.name for f in report.files]
    assert names == [f"model-{k:05d}-of-{len(names):05d}.safetensors" for k in range(1, len(names) + 1)]
    assert sorted(index["weight_map"]) == sorted(state)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in state.values())
    for name, file in index["weight_map"].items():
        assert torch.equal(load_file(tmp_path / "out" / file)[name], state[name])


def test_dtype_casts_floating_tensors_and_keeps_the_others(tmp_path):
    store = BundleStore(str(tmp_path / "run"))
    state = {"model": {"w": torch.randn(64, 64), "ids": torch.arange(10)}}
    dcp.save(state, storage_writer=BundleStorageWriter(store, step=1))
    rlckpt.export_safetensors(store, out=str(tmp_path / "out"), dtype="bf16")
    got = exported(tmp_path / "out")
    assert got["model.w"].dtype == torch.bfloat16 and torch.equal(got["model.w"], state["model"]["w"].bfloat16())
    assert torch.equal(got["model.ids"], state["model"]["ids"])


def test_rename_rules_apply_first_then_the_hook_which_may_leave_a_tensor_out(store, tmp_path):
    state = model_part(saved_policy(store))
    rlckpt.export_safetensors(
        store,
        out=str(tmp_path / "out"),
        rename=["model.=transformer."],
        rename_hook=lambda name: None if name.endswith(".bias") else name,
    )
    expected = {"transformer." + k.removeprefix("model."): v for k, v in state.items() if not k.endswith(".bias")}
    assert bitwise_equal(exported(tmp_path / "out"), expected) == []


def test_a_rename_that_gives_two_tensors_one_name_is_refused_before_anything_is_written(store, tmp_path):
    saved_policy(store)
    with pytest.raises(ExportError, match="the same name"):
        rlckpt.export_safetensors(store, out=str(tmp_path / "out"), rename_hook=lambda name: "one")
    assert not (tmp_path / "out").exists()


def test_an_output_that_is_not_empty_is_refused_unless_overwrite(store, tmp_path):
    state = model_part(saved_policy(store))
    (tmp_path / "exports").mkdir()
    out = tmp_path / "exports" / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="exists and is not empty"):
        rlckpt.export_safetensors(store, out=str(out))
    assert sorted(os.listdir(out)) == ["keep.txt"]
    rlckpt.export_safetensors(store, out=str(out), overwrite=True)
    assert bitwise_equal(exported(out), state) == []
    assert "keep.txt" not in os.listdir(out)
    assert sorted(os.listdir(tmp_path / "exports")) == ["out"]  # nothing beside it: no staging, no replaced copy


def test_an_empty_output_directory_is_taken(store, tmp_path):
    saved_policy(store)
    (tmp_path / "out").mkdir()
    rlckpt.export_safetensors(store, out=str(tmp_path / "out"))
    assert "model.safetensors" in os.listdir(tmp_path / "out")


def test_a_corrupt_bundle_exports_nothing_and_names_the_file(store, tmp_path):
    saved_policy(store)
    shard = next(r for r in store.open(1).manifest.files if r.endswith(".distcp"))
    corrupt_file(store, 1, shard, "flip")
    (tmp_path / "exports").mkdir()
    with pytest.raises(CorruptBundleError, match=shard.replace(".", r"\.")):
        rlckpt.export_safetensors(store, out=str(tmp_path / "exports" / "out"))
    assert sorted(os.listdir(tmp_path / "exports")) == []


def test_an_unsigned_bundle_is_not_exported_with_a_verify_key(tmp_path):
    store = BundleStore(str(tmp_path / "run"))
    saved_policy(store)
    key = SigningKey.generate()
    with pytest.raises(UnsignedBundleError):
        rlckpt.export_safetensors(store.url, 1, out=str(tmp_path / "out"), verify_key=key.public)
    with pytest.raises(UncommittedBundleError):  # the newest bundle that key signed: there is none
        rlckpt.export_safetensors(store.url, out=str(tmp_path / "out"), verify_key=key.public)
    assert not (tmp_path / "out").exists()


def test_a_disk_full_midway_leaves_nothing_that_looks_complete(store, tmp_path, monkeypatch):
    saved_policy(store)
    real = safetensors_out.ShardStream.write
    calls = []

    def full_disk(self, name, tensor):  # the disk fills while the second shard file is written
        calls.append(self.path)
        if len(set(calls)) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", self.path)
        real(self, name, tensor)

    monkeypatch.setattr(safetensors_out.ShardStream, "write", full_disk)
    (tmp_path / "exports").mkdir()
    with pytest.raises(OSError, match="No space left"):
        rlckpt.export_safetensors(store, out=str(tmp_path / "exports" / "out"), max_shard_size=20_000)
    assert len(set(calls)) == 2
    assert sorted(os.listdir(tmp_path / "exports")) == []  # neither the output nor its staging dir


def test_an_export_to_s3_puts_the_index_last_and_an_interrupted_one_leaves_no_index(
    tmp_path, s3_run_url, s3_storage_options, monkeypatch
):
    store = BundleStore(str(tmp_path / "run"))
    state = model_part(saved_policy(store))
    out = s3_run_url + "/export"
    rlckpt.export_safetensors(store, out=out, out_storage_options=s3_storage_options, max_shard_size=20_000)
    fs = BundleStore(s3_run_url, s3_storage_options).fs
    fs.get(out.removeprefix("s3://") + "/", str(tmp_path / "got"), recursive=True)
    assert bitwise_equal(exported(tmp_path / "got"), state) == []

    real, calls = safetensors_out.ShardStream.write, []

    def fails_second(self, name, tensor):
        calls.append(self.path)
        if len(set(calls)) == 2:
            raise OSError(errno.EIO, "interrupted", self.path)
        real(self, name, tensor)

    monkeypatch.setattr(safetensors_out.ShardStream, "write", fails_second)
    again = s3_run_url + "/export-2"
    with pytest.raises(OSError, match="interrupted"):
        rlckpt.export_safetensors(store, out=again, out_storage_options=s3_storage_options, max_shard_size=20_000)
    assert not fs.exists(again.removeprefix("s3://") + "/model.safetensors.index.json")
    assert fs.find(again.removeprefix("s3://")) == []  # the shard it wrote is removed too


def test_a_checkpointers_state_exports_its_model_under_the_key_it_was_saved_with(tmp_path):
    store = BundleStore(str(tmp_path / "run"))
    model, optim = plain_policy(WIDTH, DEPTH, seed=3)
    train_step(model, optim, WIDTH, seed=3)
    state = {"train": policy_state(model, optim)}
    dcp.save(state, storage_writer=BundleStorageWriter(store, step=1, prefix="state"))
    report = rlckpt.export_safetensors(store, out=str(tmp_path / "out"), rename=["train.model.="])
    assert report.piece == "state"
    expected = {k.removeprefix("model."): v for k, v in model_part(flat_tensors(full_state(model, optim))).items()}
    assert bitwise_equal(exported(tmp_path / "out"), expected) == []


def test_a_bundle_without_a_dcp_piece_is_refused_naming_what_it_holds(tmp_path):
    store = BundleStore(str(tmp_path / "run"))
    with store.begin(1) as txn:
        txn.write_bytes("notes.txt", b"hello")
        txn.commit()
    with pytest.raises(ExportError, match="holds no DCP piece"):
        rlckpt.export_safetensors(store, out=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
