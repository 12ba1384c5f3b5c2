"""`rlckpt export RUN --out DIR`: the policy as safetensors files; --json for scripts; exit codes for the bad cases."""

from __future__ import annotations

import argparse
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

from rlckpt.cli.export import size_arg
from rlckpt.dcp import BundleStorageWriter
from support.store_checks import corrupt_file

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def save_policy(run, step=1):
    """A `policy/` DCP piece in bundle `step` of `run`: a model and an optimizer moment; the model's tensors."""
    model = {"w": torch.arange(64, dtype=torch.float32).reshape(8, 8), "b": torch.ones(8)}
    state = {"model": model, "optim": {"exp_avg": torch.zeros(8, 8)}}
    dcp.save(state, storage_writer=BundleStorageWriter(run.store(), step=step))
    return model


def test_export_writes_the_models_tensors_and_json_reports_each_file(run, cli, tmp_path):
    model = save_policy(run)
    out = tmp_path / "out"
    result = cli("export", run.url, *run.options_args(), "--out", str(out), "--rename", "model.=", "--json")
    assert result.code == 0, result.err
    report = result.json()
    assert (report["step"], report["tensors"], report["piece"]) == (1, 2, "policy")
    (written,) = report["files"]
    assert written["name"] == "model.safetensors" and written["bytes"] == os.path.getsize(out / written["name"])
    assert len(written["blake3"]) == 64 and sorted(written["tensors"]) == ["b", "w"]
    loaded = load_file(out / "model.safetensors")
    assert torch.equal(loaded["w"], model["w"]) and torch.equal(loaded["b"], model["b"])


def test_export_of_a_corrupt_bundle_exits_1_in_one_line_naming_the_file(run, cli, tmp_path):
    save_policy(run)
    shard = next(r for r in run.store().open(1).manifest.files if r.endswith(".distcp"))
    corrupt_file(run.store(), 1, shard, "flip")
    result = cli("export", run.url, *run.options_args(), "--out", str(tmp_path / "out"))
    assert result.code == 1
    assert result.err.count("\n") == 1 and shard in result.err
    assert not (tmp_path / "out").exists()


def test_export_into_a_directory_that_is_not_empty_exits_3_unless_overwrite(run, cli, tmp_path):
    save_policy(run)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("x")
    refused = cli("export", run.url, *run.options_args(), "--out", str(tmp_path / "out"))
    assert refused.code == 3 and "--overwrite" in refused.err
    assert cli("export", run.url, *run.options_args(), "--out", str(tmp_path / "out"), "--overwrite").code == 0
    assert "model.safetensors" in os.listdir(tmp_path / "out")


def test_export_of_a_run_without_a_bundle_exits_2(run, cli, tmp_path):
    result = cli("export", run.url, *run.options_args(), "--out", str(tmp_path / "out"))
    assert result.code == 2 and "nothing to export" in result.err


@pytest.mark.parametrize(
    ("text", "size"), [("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("2GiB", 2 * 2**30), ("1024", 1024), ("1.5kb", 1500)]
)
def test_shard_sizes_read_as_hugging_face_writes_them(text, size):
    assert size_arg(text) == size


@pytest.mark.parametrize("text", ["", "five", "0", "3 parsecs"])
def test_a_shard_size_that_is_not_one_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        size_arg(text)


def test_export_help_names_the_layout_and_the_exit_codes(cli):
    result = cli("export", "--help")
    assert result.code == 0
    assert "model.safetensors.index.json" in result.out and "exit codes" in result.out
