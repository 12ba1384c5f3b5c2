"""`rlckpt train` stopped by SIGTERM or a deadline, end to end: real Ray, TransferQueue and trainer
ranks. Each stop point is a gate (support.gates) the run waits at until the test has sent its
signal, so the point is exact, not a guess. The interleavings are tested in-process in
tests/controller/test_loop_stop.py, the stop's state machine cell by cell in tests/cli/test_train_stop.py;
these are the real thing, one run per point: start-up, a SIGKILL of the driver, a job-wide SIGTERM (what
Slurm's scancel sends), a second SIGTERM, a silent S3 during the final save, a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from rlckpt.dataplane.cluster_reaper import cluster_processes
from rlckpt.store import BundleStore
from support.gated_run import GatedProcess, start_gated_run
from support.outage import Outage
from support.store_checks import debris
from support.train_cli import job_processes, kill_run, run_train

pytestmark = pytest.mark.slow
DEADLINE_AFTER_S = 90.0  # the deadline test's deadline: this long after a whole uninterrupted run would end (20 s
# was too little on a clean clone: with both workers busy the run had not trained step 1 by then). Its run waits
# for it beside the module's other tests (deadline_run), so a wide margin costs no time.


DEADLINE_TEST = "test_a_deadline_a_few_steps_ahead_saves_once_and_stops_cleanly"


@pytest.fixture
def start_gated(tmp_path, ray_dir) -> Iterator[Callable[..., GatedProcess]]:
    """Start `rlckpt train --json ...` with gates ``POINT:STEP,...``; whatever is left of it is killed after."""
    started: list[GatedProcess] = []

    def start(points: str, run_dir: str, steps: int, *extra: str) -> GatedProcess:
        started.append(start_gated_run(tmp_path, points, run_dir, steps, "--ray-temp-dir", ray_dir, *extra))
        return started[-1]

    yield start
    for run in started:
        kill_run(run.proc, ray_dir)


@dataclass
class Straight:
    """0 → 8 uninterrupted, in_order, on local disk: the reference for exact resume, and how long a
    whole run (Ray's start included) takes on this machine now."""

    summary: dict[str, Any]
    seconds: float


@pytest.fixture(scope="module")
def straight(straight_run) -> Straight:
    """The session's uninterrupted reference run (tests/e2e/conftest.py)."""
    return Straight(straight_run, straight_run["seconds"])


@pytest.fixture(scope="module", autouse=True)
def deadline_run(request, straight, tmp_path_factory) -> Iterator[tuple[GatedProcess, str] | None]:
    """The deadline test's run, started before the module's first test: it spends most of its life waiting
    for its deadline (batch 3 is never generated), and that wait goes on beside the other tests' runs rather
    than in a test of its own. Not started when that test is not selected; killed after the module if it is
    still running."""
    if not any(item.name == DEADLINE_TEST for item in request.session.items):
        yield None
        return
    home = tmp_path_factory.mktemp("deadline")
    ray_dir = tempfile.mkdtemp(prefix="rlckpt-e2e-ray-", dir="/tmp")
    run_dir = str(home / "run")
    deadline = f"{straight.seconds + DEADLINE_AFTER_S:.0f}"
    run = start_gated_run(home, "generate:3", run_dir, 8, "--ray-temp-dir", ray_dir, "--save-by-seconds", deadline)
    try:
        yield run, run_dir
    finally:
        kill_run(run.proc, ray_dir)
        shutil.rmtree(ray_dir, ignore_errors=True)


def test_sigterm_during_a_background_upload_on_s3_saves_the_step_reached_and_the_resume_is_bit_identical(
    straight, start_gated, s3_run_url, s3_storage_options, shared_ray
):
    """The trainer ranks are held inside their write of step 4's policy (saves are async: training goes
    on) when SIGTERM comes. The gate opens once the controller has the stop: save 4 is finished, not
    aborted or taken twice, then the step reached is saved, and the run exits 0. A new run resumes
    from that bundle and ends bit-identical to the uninterrupted one. Both runs store the policy compressed
    (--compress-policy auto, on S3): the resume loads byte planes."""
    options = json.dumps(s3_storage_options)
    run = start_gated("upload:4", s3_run_url, 8, "--storage-options", options, "--compress-policy", "auto")
    run.wait_reached("upload-4")
    run.sigterm()
    run.wait_acknowledged()
    run.gate("upload-4").open()
    assert run.exit_code() == 0, run.stderr()[-3000:]

    first = run.summary()
    reached = first["step"]
    assert (first["stop_reason"], first["last_committed_step"]) == ("preempted", reached)
    assert first["bundles"] == sorted({2, 4, reached}) == [save["step"] for save in first["saves"]]
    assert f"rlckpt train: preempted: saved step {reached}, stopped" in run.stderr()
    assert debris(BundleStore(s3_run_url, s3_storage_options)) == []
    files = BundleStore(s3_run_url, s3_storage_options).open(reached).manifest.files
    assert "zstd-planes4" in {e.compression for rel, e in files.items() if rel.startswith("policy/__")}

    resumed = run_train(
        s3_run_url, 8, "--storage-options", options, "--compress-policy", "auto", ray_address=shared_ray
    )
    assert resumed["resumed_from"] == reached and resumed["stop_reason"] == "completed"
    assert resumed["policy_sha256"] == straight.summary["policy_sha256"]
    assert first["trained_draws"] + resumed["trained_draws"] == straight.summary["trained_draws"]


def test_a_second_sigterm_during_the_final_save_aborts_it_and_the_previous_bundle_stays_newest(tmp_path, start_gated):
    """SIGTERM while batch 5 is generated (step 5 trained, bundles 2 and 4 periodic); the final save of
    step 5 is held before its COMMIT and a second SIGTERM comes: it is aborted cleanly, exit 143."""
    run_dir = str(tmp_path / "run")
    run = start_gated("generate:5,commit:5", run_dir, 8)
    run.wait_reached("generate-5")
    run.sigterm()
    run.wait_reached("commit-5")
    run.sigterm()
    assert run.exit_code() == 143, run.stderr()[-3000:]

    assert run.summary() == {
        "step": 4,  # the resume point: what was trained past it is lost
        "stop_reason": "preempted",
        "final_save_aborted": True,
        "last_committed_step": 4,
        "bundles": [2, 4],
        "run_dir": run_dir,
    }
    assert "resume point: 4" in run.stderr()
    store = BundleStore(run_dir)
    assert store.steps() == [2, 4] and debris(store) == []


# --- start-up, and the private cluster on every exit path ---------------------------------------


def test_a_sigterm_while_ray_starts_stops_the_start_up_with_nothing_to_save(tmp_path, start_gated, ray_dir):
    """Held inside the private cluster's start, ray.init done (its own SIGTERM handler installed): the
    SIGTERM waits until the start is over, then stops the run there. Nothing was trained: exit 0, and the
    driver stopped every process of its cluster before it exited."""
    run_dir = str(tmp_path / "run")
    run = start_gated("ray-init", run_dir, 8)
    run.wait_reached("ray-init")
    run.sigterm()
    run.gate("ray-init").open()
    assert run.exit_code() == 0, run.stderr()[-3000:]

    assert "rlckpt train: preempted: nothing new to save, at step 0, stopped" in run.stderr()
    assert run.summary() == {
        "step": 0,
        "stop_reason": "preempted",
        "final_save_aborted": False,
        "last_committed_step": None,
        "bundles": [],
        "run_dir": run_dir,
    }
    assert cluster_processes(ray_dir) == []


def test_a_driver_killed_by_sigkill_leaves_no_process_of_its_ray_cluster(tmp_path, start_gated, ray_dir):
    """Ray's agents rename themselves (``ray::DashboardAgent``) and outlived a SIGKILLed driver; its reaper
    finds them by the cluster's mark in their environment and kills them."""
    run = start_gated("setup", str(tmp_path / "run"), 8)
    run.wait_reached("setup")
    run.wait_until("a renamed process of the cluster", lambda: _renamed(cluster_processes(ray_dir)) != [])
    run.proc.kill()  # the driver alone
    run.proc.wait()
    run.wait_until("no process of the cluster left", lambda: cluster_processes(ray_dir) == [], while_running=False)


def _renamed(pids: list[int]) -> list[int]:
    """The processes whose command line no longer names anything (``ray::...``)."""
    named = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if cmdline.read().startswith(b"ray::"):
                    named.append(pid)
        except OSError:
            pass
    return named


# --- a job-wide SIGTERM, and a silent store ------------------------------------------------------


def test_a_job_wide_sigterm_saves_the_step_reached_and_exits_0(tmp_path, start_gated, ray_dir):
    """What Slurm's scancel does: SIGTERM to every process of the job — the driver, its reaper, Ray's GCS,
    raylet and agents, TransferQueue, the trainer ranks, the controller actor — at once, mid-training
    (batch 3 held: step 3 is the step reached). They leave it to the driver: step 3 is saved, exit 0."""
    run_dir = str(tmp_path / "run")
    run = start_gated("generate:3", run_dir, 8)
    run.wait_reached("generate-3")
    job = job_processes(run.proc.pid, ray_dir)
    assert len(job) > 8, job  # the driver, its reaper, and Ray's processes and actors
    for pid in job:
        os.kill(pid, signal.SIGTERM)
    assert run.exit_code() == 0, run.stderr()[-3000:]

    summary = run.summary()
    assert (summary["stop_reason"], summary["last_committed_step"], summary["bundles"]) == ("preempted", 3, [2, 3])
    assert "rlckpt train: preempted: saved step 3, stopped" in run.stderr()
    store = BundleStore(run_dir)
    store.open(3).verify()  # what a resume reads first
    assert debris(store) == []
    assert cluster_processes(ray_dir) == []


def test_a_final_save_on_a_silent_s3_is_abandoned_and_the_run_ends_while_s3_is_still_silent(
    start_gated, s3_run_url, s3_storage_options
):
    """S3 takes every request and answers none from the SIGTERM on (step 2 committed, step 3 reached):
    the final save's first request never returns. The run does not wait for it past its grace period
    (--grace-seconds 5) and the abort's bound: it exits 143 with step 2 as the resume point while S3 is
    still silent (S3 answers only once the process has ended). docs/benchmarks.md has the stop's times."""
    with Outage(s3_storage_options["endpoint_url"]) as outage:
        options = json.dumps({**s3_storage_options, "endpoint_url": outage.endpoint})
        run = start_gated("generate:3", s3_run_url, 8, "--storage-options", options, "--grace-seconds", "5")
        run.wait_reached("generate-3")
        run.wait_until("save 2 committed", lambda: "saved step 2" in run.stderr())
        outage.stall()
        run.sigterm()
        code = run.exit_code()
        outage.answer()
    assert code == 143, run.stderr()[-3000:]

    assert run.summary() == {
        "step": 2,  # the resume point: what was trained past it is lost
        "stop_reason": "preempted",
        "final_save_aborted": True,
        "last_committed_step": 2,
        "bundles": None,  # not listed: S3 did not answer
        "run_dir": s3_run_url,
    }
    assert "step 3 was not saved within the 5s grace period; its save was abandoned" in run.stderr()
    assert BundleStore(s3_run_url, s3_storage_options).steps() == [2]


# --- a deadline (last: its run, started with the module, has long reached it by now) ----------------------


def test_a_deadline_a_few_steps_ahead_saves_once_and_stops_cleanly(deadline_run):
    """Batch 3 is never generated, so the run cannot pass step 3 and waits there for the deadline. The
    deadline is set later than a whole uninterrupted run took here (Ray's start included), so steps
    are trained by then; the stop comes at step 3 or, if the estimate of the save calls for it, a
    step before. Either way: the step reached is saved once, the run exits 0 and says why."""
    assert deadline_run is not None
    run, run_dir = deadline_run  # started with the module
    assert run.exit_code() == 0, run.stderr()[-3000:]

    summary = run.summary()
    reached = summary["step"]
    assert 1 <= reached <= 3
    assert (summary["stop_reason"], summary["last_committed_step"]) == ("deadline", reached)
    assert summary["bundles"] == [save["step"] for save in summary["saves"]] and summary["bundles"][-1] == reached
    assert f"rlckpt train: deadline: stopping at step {reached} to save" in run.stderr()
    assert "a save takes" in run.stderr()  # the estimate the stop was planned with
    assert f"rlckpt train: deadline: saved step {reached}, stopped" in run.stderr()
    assert debris(BundleStore(run_dir)) == []
