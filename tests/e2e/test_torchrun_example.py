"""examples/fsdp2_torchrun.py end to end: `torchrun --standalone --nproc-per-node 2` (gloo, FSDP2 on CPU), on local
disk and on S3 (moto). A run to 6 steps in two parts (4, then 6) ends bit-identical to one run straight to 6, and
SIGTERM to the torchrun job (which forwards it to its workers) saves the step the ranks reached and stops, and a
rank whose training step raises exits 1 (not an abort) with the step it saved before committed.

Each run is a fresh torchrun job (≈10-20 s here, mostly importing torch in three processes), shared by the
tests through module fixtures.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rlckpt.s3local import make_s3fs
from rlckpt.store import BundleStore
from support.store_checks import debris

pytestmark = pytest.mark.slow
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fsdp2_torchrun.py"
CRASHING = Path(__file__).resolve().parent / "example_crashing_at.py"
RUN_TIMEOUT_S = 300


@dataclass(frozen=True)
class Run:
    url: str
    options: dict[str, Any] | None

    def command(self, *args: str, script: list[str] | None = None) -> list[str]:
        storage = ["--storage-options", json.dumps(self.options)] if self.options else []
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            *(script or [str(EXAMPLE)]),
            "--run-dir",
            self.url,
            "--json",
            *storage,
            *args,
        ]

    def train(self, steps: int, *extra: str, save_every: int = 2) -> dict[str, Any]:
        """Run the example to `steps` (with `extra` flags); its summary (rank 0's JSON line)."""
        done = subprocess.run(
            self.command("--steps", str(steps), "--save-every", str(save_every), *extra),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            env=_env(),
        )
        assert done.returncode == 0, done.stderr[-4000:]
        return _summary(done.stdout)

    def store(self) -> BundleStore:
        return BundleStore(self.url, self.options)


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def _summary(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, stdout
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[str, Any]:
    """One run straight to 6 steps, on local disk."""
    return Run(str(tmp_path_factory.mktemp("straight") / "run"), None).train(6)


@dataclass(frozen=True)
class Location:
    """Where a module's runs go: a local dir, or an S3 bucket (moto); each run under a name of its own."""

    base: str
    options: dict[str, Any] | None

    def run(self, name: str) -> Run:
        return Run(f"{self.base}/{name}", self.options)


@pytest.fixture(scope="module", params=["local", "s3"])
def location(request, tmp_path_factory) -> Location:
    if request.param == "local":
        return Location(str(tmp_path_factory.mktemp("torchrun")), None)
    options = dict(request.getfixturevalue("s3_storage_options"))
    bucket = f"rlckpt-torchrun-{os.urandom(6).hex()}"
    make_s3fs(options).mkdir(bucket)
    return Location(f"s3://{bucket}", options)


@pytest.fixture(scope="module")
def two_parts(location) -> tuple[Run, dict[str, Any], dict[str, Any]]:
    """The same run in two parts: to 4, then (resumed) to 6; with --compress-policy auto, which compresses on S3
    (the resume then loads byte planes) and leaves local disk raw, and --reuse-unchanged."""
    run = location.run("two-parts")
    options = ("--compress-policy", "auto", "--reuse-unchanged")
    return run, run.train(4, *options), run.train(6, *options)


def test_a_run_to_6_in_two_parts_ends_bit_identical_to_one_straight_run(two_parts, straight):
    _, first, second = two_parts
    assert first["step"] == 4 and second["step"] == 6
    assert second["weights_sha256"] == straight["weights_sha256"]
    assert first["weights_sha256"] != straight["weights_sha256"]  # the digest tells steps apart


def test_the_second_part_resumes_from_the_bundle_of_the_first(two_parts):
    run, _, second = two_parts
    assert second["restored_from"] == 4 and second["last_committed_step"] == 6
    assert run.store().steps() == [2, 4, 6]
    run.store().open(6).verify()


def test_compress_policy_auto_stores_the_state_in_planes_on_s3_and_raw_on_local_disk(two_parts):
    run, _, _ = two_parts
    for step in (4, 6):
        files = run.store().open(step).manifest.files
        kinds = {e.compression for rel, e in files.items() if rel.endswith(".distcp") and e.logical_size > 1 << 16}
        assert kinds == ({None} if run.options is None else {"zstd-planes4"}), (step, kinds)


def test_the_examples_model_exports_to_safetensors_bit_identical_to_the_weights_it_ended_with(two_parts, tmp_path):
    """The Checkpointer's bundle of the example's last step, exported with the model's own names: the digest of
    what safetensors loads back is the example's digest of its full weights (the same names, dtypes, bytes)."""
    import hashlib

    import torch
    from safetensors.torch import load_file

    import rlckpt

    run, _, second = two_parts
    out = tmp_path / "model"
    report = rlckpt.export_safetensors(run.url, out=str(out), storage_options=run.options, rename=["train.model.="])
    assert report.step == 6 and report.piece == "state"
    weights = load_file(out / "model.safetensors")
    digest = hashlib.sha256()
    for name in sorted(weights):
        tensor = weights[name].contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    assert digest.hexdigest() == second["weights_sha256"]


@pytest.fixture(scope="module")
def preempted(location) -> tuple[Run, dict[str, Any], int]:
    """A long run (its first save would be at step 1000) sent SIGTERM once rank 0 has reported step 2: its
    summary and the torchrun job's exit code."""
    run = location.run("preempted")
    proc = subprocess.Popen(
        run.command("--steps", "100000", "--save-every", "1000"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # read as it comes: a full pipe would stall the ranks
            if line.startswith("step 2 "):
                break
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert '"stop_reason": "preempted"' in out, err[-4000:]
    return run, _summary(out), proc.returncode


def test_sigterm_to_the_torchrun_job_saves_the_step_the_ranks_reached(preempted):
    run, summary, _ = preempted
    assert summary["stop_reason"] == "preempted" and summary["step"] >= 2
    assert summary["last_committed_step"] == summary["step"]
    assert run.store().steps() == [summary["step"]]
    run.store().open(summary["step"]).verify()
    assert debris(run.store()) == []


@pytest.fixture(scope="module")
def crashed(location) -> tuple[Run, subprocess.CompletedProcess[str]]:
    """A run saving every 2 steps whose rank 1 raises in the forward of step 3, with step 2's save staged."""
    run = location.run("crashed")
    done = subprocess.run(
        run.command("--steps", "6", "--save-every", "2", script=[str(CRASHING), "1", "3"]),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=_env(),
    )
    return run, done


def test_a_rank_whose_training_step_raises_exits_1_rather_than_aborting(crashed):
    _, done = crashed
    assert done.returncode == 1, done.stderr[-4000:]
    assert "injected: rank 1's forward of step 3 fails" in done.stderr
    exits = _worker_exit_codes(done.stderr)
    assert exits.get(1) == 1, done.stderr[-3000:]  # rank 0 exits 1 too, or is stopped by torchrun first
    assert -6 not in exits.values() and "terminate called" not in done.stderr


def _worker_exit_codes(stderr: str) -> dict[int, int]:
    """Each failed worker's exit code, from torchrun's failure report."""
    found = re.findall(r"rank\s+: (\d+) \(local_rank: \d+\)\n\s+exitcode\s+: (-?\d+)", stderr)
    return {int(rank): int(code) for rank, code in found}


def test_the_step_saved_before_a_rank_raised_is_committed(crashed):
    run, done = crashed
    assert run.store().steps() == [2], done.stderr[-4000:]
    run.store().open(2).verify()
    assert debris(run.store()) == []
