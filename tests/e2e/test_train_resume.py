"""`rlckpt train` end to end: real TransferQueue and trainer ranks.

Each run is a new process with its own TransferQueue and actors, as a resume on a new machine would be
(≈25-45 s each: their start-up dominates), so these tests share runs where they can. Runs a test kills have
a private Ray cluster each; the others join the worker's shared one (``shared_ray``, tests/e2e/conftest.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from rlckpt.store import BundleStore, copy_bundle
from support.store_checks import corrupt_file
from support.train_cli import RUN_TIMEOUT_S, copy_run_dir, kill_run, run_train, train_command

pytestmark = pytest.mark.slow
POLICY_SHARD = "policy/__1_0.distcp"  # rank 1's shard file in a bundle of two trainer ranks (the default)


def test_in_order_resume_from_s3_with_an_empty_staging_dir_is_exact(
    straight_run, tmp_path, s3_run_url, s3_storage_options, shared_ray
):
    """Bundle 4 of the uninterrupted run, taken while it trained on (rollouts in flight) and copied to S3 as
    the same bundle (`rlckpt copy`'s way), is all a fresh cluster with an empty staging dir gets: resumed
    from S3, saving with both ways to write fewer bytes on (issue 40: reuse of unchanged files, byte-plane
    compression), it ends where the uninterrupted run without them ended, and what it saved verifies. (Runs
    that save to S3 from their start are in test_preemption.py and test_signed_two_tiers.py.)"""
    options = json.dumps(s3_storage_options)
    copy_bundle(BundleStore(straight_run["run_dir"]), 4, BundleStore(s3_run_url, s3_storage_options))
    staging = tmp_path / "fresh-machine-staging"
    staging.mkdir()
    fewer_bytes = ("--reuse-unchanged", "--compress-policy", "on")
    second = run_train(
        s3_run_url, 8, "--storage-options", options, "--staging-dir", str(staging), *fewer_bytes, ray_address=shared_ray
    )
    assert second["resumed_from"] == 4
    assert second["policy_sha256"] == straight_run["policy_sha256"]
    assert second["trained_draws"] == straight_run["trained_draws"][len(straight_run["trained_draws"]) // 2 :]
    store = BundleStore(s3_run_url, s3_storage_options)
    assert store.steps() == [4, 6, 8]
    for step in (6, 8):
        store.open(step).verify()
    shards = {e.compression for rel, e in store.open(8).manifest.files.items() if rel.endswith(".distcp")}
    assert "zstd-planes4" in shards


def test_a_corrupt_newest_bundle_is_skipped_loudly_and_the_run_still_ends_exact(straight_run, tmp_path, shared_ray):
    run_dir = copy_run_dir(straight_run, tmp_path)  # bundles 2, 4, 6, 8
    corrupt_file(BundleStore(run_dir), 8, POLICY_SHARD, "flip")
    pinned = subprocess.run(
        train_command(run_dir, 8, "--resume-step", "8", "--ray-address", shared_ray),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert pinned.returncode == 3, pinned.stderr[-2000:]
    assert "cannot resume step 8" in pinned.stderr and POLICY_SHARD in pinned.stderr
    resumed = run_train(run_dir, 8, ray_address=shared_ray)  # a fresh TransferQueue, from local disk
    assert resumed["resumed_from"] == 6
    assert [b["step"] for b in resumed["skipped_bundles"]] == [8]
    assert POLICY_SHARD in resumed["skipped_bundles"][0]["reason"]
    assert resumed["policy_sha256"] == straight_run["policy_sha256"]
    assert resumed["trained_draws"] == straight_run["trained_draws"][-len(resumed["trained_draws"]) :]
    assert len(resumed["trained_draws"]) == len(straight_run["trained_draws"]) // 4  # steps 7 and 8 of 8
    assert resumed["bundles"] == [2, 4, 6, 8]  # step 8 saved anew; the corrupt one kept in _quarantine/


def test_async_restart_loses_no_prompt_and_trains_none_twice(tmp_path, shared_ray):
    run_dir = str(tmp_path / "run")
    first = run_train(run_dir, 4, "--mode", "async", "--max-staleness", "2", ray_address=shared_ray)
    second = run_train(run_dir, 8, "--mode", "async", "--max-staleness", "2", ray_address=shared_ray)
    trained = first["trained_draws"] + second["trained_draws"]
    assert len(trained) == len(set(trained)), "a prompt was trained twice"
    assert sorted(trained + second["unconsumed_draws"]) == list(range(second["drawn"])), "a prompt was lost"


def _start_held_run(
    tmp_path, run_dir: str, ray_dir: str, *extra: str, steps: int = 6
) -> tuple[subprocess.Popen, object]:
    """`rlckpt train` with the save of step 4 held before its COMMIT; returns once it is held."""
    held = tmp_path / "save-4-is-held"
    held_train = ("4", str(held))  # `rlckpt train`, save 4 held
    cmd = train_command(
        run_dir,
        steps,
        "--json",
        "--ray-temp-dir",
        ray_dir,
        *extra,
        module="support.held_train",
        prefix=held_train,
    )
    log = tmp_path / "held-run.log"  # a file, not a pipe: a full pipe would stall the run
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=sink, start_new_session=True)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not held.exists():
        if proc.poll() is not None:
            pytest.fail(f"run ended before the save of step 4: {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            kill_run(proc, ray_dir)
            pytest.fail("the save of step 4 never started")
        time.sleep(0.2)
    return proc, log


def test_sigkill_while_a_save_uploads_in_the_background_resumes_from_the_previous_bundle(tmp_path, ray_dir, shared_ray):
    """Saves are async: save 4 is held before its COMMIT while training goes on, and the whole
    process tree is SIGKILLed then. The next run resumes from step 2 and saves 4 anew."""
    run_dir = str(tmp_path / "run")
    proc, _log = _start_held_run(tmp_path, run_dir, ray_dir)
    kill_run(proc, ray_dir)
    store = BundleStore(run_dir)
    assert store.latest() == 2, "the killed save must not be visible"
    assert any(e.step == 4 and e.state != "committed" for e in store.entries())

    resumed = run_train(run_dir, 6, ray_address=shared_ray)
    assert resumed["resumed_from"] == 2 and resumed["step"] == 6
    assert resumed["bundles"] == [2, 4, 6]
    for step in resumed["bundles"]:
        store.open(step).verify()


def test_sigterm_with_on_sigterm_exit_aborts_the_save_in_flight_cleanly(tmp_path, ray_dir):
    """SIGTERM to `rlckpt train --on-sigterm exit` while save 4 is in flight: the controller aborts that
    transaction (nothing committed, its intent and staging removed, not left for gc) and the process
    exits 143. (The default, --on-sigterm save, is tested in test_preemption.py.)"""
    run_dir = str(tmp_path / "run")
    proc, log = _start_held_run(tmp_path, run_dir, ray_dir, "--on-sigterm", "exit")
    try:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        kill_run(proc, ray_dir)  # whatever is left of the private cluster
    assert code == 143, log.read_text()[-3000:]
    store = BundleStore(run_dir)
    assert store.steps() == [2]
    assert [e.step for e in store.entries() if e.state != "committed"] == [], log.read_text()[-3000:]


def test_the_grpo_policy_exports_to_safetensors_bit_identical_to_the_runs_final_weights(straight_run, tmp_path, capsys):
    """`rlckpt export` of the uninterrupted run's last bundle: the weights safetensors loads back are, bit for
    bit, the policy the run ended with (its summary's digest, over the trainer's own names)."""
    from safetensors.torch import load_file

    from rlckpt.cli.main import main
    from rlckpt.grpo import weights_sha256

    out = tmp_path / "policy"
    assert main(["export", straight_run["run_dir"], "--out", str(out), "--rename", "model.=", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["step"] == 8 and [f["name"] for f in report["files"]] == ["model.safetensors"]
    assert weights_sha256(load_file(out / "model.safetensors")) == straight_run["policy_sha256"]
