"""The save-occupancy benchmark runs end to end at a tiny size against the session's S3 server (figures are not
checked: speed is not a test)."""

from __future__ import annotations

import json


def test_the_occupancy_benchmark_saves_puts_the_same_bytes_samples_the_slots_and_writes_its_reports(
    tmp_path, s3_endpoint, run_benchmark
):
    out = tmp_path / "occupancy.json"
    tiny = ["--mib", "32", "--repeats", "1", "--no-connector"]
    run_benchmark("s3_save_occupancy.py", "--endpoint", s3_endpoint, *tiny, "--out", str(out))
    row = json.loads(out.read_text())["results"]["direct"]
    assert row["mib"] == 32 and len(row["saves"]) == len(row["raw_puts"]) == 1
    assert row["save_s"] > 0 and row["raw_put_s"] > 0 and row["connector_save_s"] is None
    assert 0 <= row["none_in_flight"] <= 1 and 0 <= row["all_slots_busy"] <= 1
    assert out.with_suffix(".md").read_text().count("| direct |") == 1
