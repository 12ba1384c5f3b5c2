"""`rlckpt train` with a remote tier whose server goes away mid-run, end to end (real Ray, TransferQueue,
trainer ranks and moto behind a proxy that can cut it off): training goes on, the replication that meets the
outage fails and the run says why, and once the server is back the next replication goes through. The same
through the Checkpointer is in tests/checkpointer/test_two_tiers.py, the interleavings in process in
tests/controller/test_two_tiers.py."""

from __future__ import annotations

import json

import pytest

from rlckpt.store import BundleStore
from support.gated_run import start_gated_run
from support.outage import ONE_QUICK_ATTEMPT, Outage

pytestmark = pytest.mark.slow


def test_a_remote_tier_lost_mid_run_fails_that_replication_and_the_next_one_goes_through(
    tmp_path, s3_run_url, s3_storage_options, shared_ray
):
    """Save 4 is held before its COMMIT until step 2 is replicated; then the remote's server goes away (every
    connection refused) and save 4 goes on: it commits locally and its replication fails. Save 6 is held until
    that failure is reported; the server is back by then, and 6 is replicated. The run ends 0."""
    run_dir = str(tmp_path / "run")
    with Outage(s3_storage_options["endpoint_url"]) as outage:
        remote = {**s3_storage_options, "endpoint_url": outage.endpoint, "config_kwargs": ONE_QUICK_ATTEMPT}
        tiers = ("--replicate-to", s3_run_url, "--replicate-storage-options", json.dumps(remote))
        run = start_gated_run(tmp_path, "commit:4,commit:6", run_dir, 6, *tiers, "--ray-address", shared_ray)
        try:
            run.wait_reached("commit-4")
            run.wait_said("replicated step 2 to")
            outage.cut()
            run.gate("commit-4").open()
            run.wait_reached("commit-6")
            run.wait_said("replication of step 4 FAILED")
            outage.restore()
            run.gate("commit-6").open()
            code = run.exit_code()
        finally:
            if run.proc.poll() is None:
                run.proc.kill()  # its job ends with it, and with the job its actors on the shared cluster
                run.proc.wait()
    assert code == 0, run.stderr()[-3000:]

    summary = run.summary()
    assert summary["bundles"] == [2, 4, 6] and summary["stop_reason"] == "completed"
    assert summary["replicated"] == [2, 6] and list(summary["replication_failed"]) == ["4"]
    assert f"{s3_run_url} unavailable" in summary["replication_failed"]["4"]
    remote_tier = BundleStore(s3_run_url, s3_storage_options)
    assert remote_tier.steps() == [2, 6]
    remote_tier.open(6).verify()
