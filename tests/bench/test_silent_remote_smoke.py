"""The silent-remote benchmark runs end to end at a tiny size (figures are not checked: speed is not a test):
both ways are measured, the remote tier goes silent from the first save on, and nothing reaches it."""

from __future__ import annotations

import json


def test_the_silent_remote_benchmark_runs_both_ways_and_no_replication_reaches_the_silent_tier(tmp_path, run_benchmark):
    run_benchmark("silent_remote.py", "--steps", "6", "--repeats", "1", "--out", str(tmp_path))
    document = json.loads((tmp_path / "silent_remote.json").read_text())
    (one,), (two,) = document["runs"]["one tier"], document["runs"]["two tiers, silent remote"]
    assert one["saves"] == two["saves"] == 3 and one["replicated"] == two["replicated"] == []
    assert one["replication_failed"] == [] and one["pending_at_last_save"] is None
    assert two["replication_failed"] != []  # the calls left waiting on the silent remote fail once it is cut
    assert two["pending_at_last_save"]["steps"] == [2, 4] and two["pending_at_last_save"]["held"] >= 1
    medians = document["median_step_s"]
    assert medians.keys() == document["runs"].keys()
    assert document["ratio"] == medians["two tiers, silent remote"] / medians["one tier"]  # the report's own sum
    assert "| two tiers, silent remote |" in (tmp_path / "silent_remote.md").read_text()
