"""`rlckpt train` with a remote tier whose server goes away mid-run, end to end (real Ray, TransferQueue,
trainer ranks and moto behind a proxy that can cut it off): training goes on, the replication that meets the
outage fails and the run says why, and once the server is back the next replication goes through. The same
through the Checkpointer is in tests/checkpointer/test_two_tiers.py, the interleavings in process in
tests/controller/test_two_tiers.py."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rlckpt.store import BundleStore
from support.gates import Gate
from support.outage import ONE_QUICK_ATTEMPT, Outage
from support.train_cli import RUN_TIMEOUT_S, train_command

pytestmark = pytest.mark.slow


def _wait(what: str, ready: Callable[[], bool], proc: subprocess.Popen[bytes], err: Path) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S  # the bound for a hang, never what a passing test waits for
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the run exited {proc.returncode} before {what}:\n{err.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {RUN_TIMEOUT_S}s:\n{err.read_text()[-3000:]}")
        time.sleep(0.2)


def test_a_remote_tier_lost_mid_run_fails_that_replication_and_the_next_one_goes_through(
    tmp_path, s3_run_url, s3_storage_options, shared_ray
):
    """Save 4 is held before its COMMIT until step 2 is replicated; then the remote's server goes away (every
    connection refused) and save 4 goes on: it commits locally and its replication fails. Save 6 is held until
    that failure is reported; the server is back by then, and 6 is replicated. The run ends 0."""
    run_dir, gates = str(tmp_path / "run"), tmp_path / "gates"
    gates.mkdir()
    out, err = tmp_path / "run.out", tmp_path / "run.err"
    with Outage(s3_storage_options["endpoint_url"]) as outage:
        remote = {**s3_storage_options, "endpoint_url": outage.endpoint, "config_kwargs": ONE_QUICK_ATTEMPT}
        tiers = ("--replicate-to", s3_run_url, "--replicate-storage-options", json.dumps(remote))
        cmd = train_command(
            run_dir, 6, "--json", *tiers, "--ray-address", shared_ray, module="support.gates",
            prefix=(str(gates), "commit:4,commit:6"),
        )  # fmt: skip
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr)
        try:
            said = err.read_text
            _wait("save 4 held", Gate(str(gates), "commit-4").reached_path.exists, proc, err)
            _wait("step 2 replicated", lambda: "replicated step 2 to" in said(), proc, err)
            outage.cut()
            Gate(str(gates), "commit-4").open()
            _wait("save 6 held", Gate(str(gates), "commit-6").reached_path.exists, proc, err)
            _wait("the failure of step 4's replication", lambda: "replication of step 4 FAILED" in said(), proc, err)
            outage.restore()
            Gate(str(gates), "commit-6").open()
            code = proc.wait(timeout=RUN_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()  # its job ends with it, and with the job its actors on the shared cluster
                proc.wait()
    assert code == 0, err.read_text()[-3000:]

    summary = json.loads(out.read_text().strip().splitlines()[-1])
    assert summary["bundles"] == [2, 4, 6] and summary["stop_reason"] == "completed"
    assert summary["replicated"] == [2, 6] and list(summary["replication_failed"]) == ["4"]
    assert f"{s3_run_url} unavailable" in summary["replication_failed"]["4"]
    remote_tier = BundleStore(s3_run_url, s3_storage_options)
    assert remote_tier.steps() == [2, 6]
    remote_tier.open(6).verify()
