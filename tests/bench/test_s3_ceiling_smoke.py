"""The S3 ceiling benchmark runs end to end at a tiny size against the session's S3 server (figures are not
checked: speed is not a test)."""

from __future__ import annotations

import json


def test_the_ceiling_benchmark_measures_puts_and_gets_at_each_count_in_flight_and_writes_its_reports(
    tmp_path, s3_endpoint, run_benchmark
):
    out = tmp_path / "s3_ceiling.json"
    tiny = ["--mib", "32", "--at-once", "1,2", "--repeats", "1"]
    run_benchmark("s3_ceiling.py", "--endpoint", s3_endpoint, *tiny, "--out", str(out))
    rows = json.loads(out.read_text())["results"]["direct"]
    assert [(r["op"], r["at_once"]) for r in rows] == [("put", 1), ("get", 1), ("put", 2), ("get", 2)]
    assert all(r["mib"] == 32 and r["seconds"] > 0 for r in rows)
    assert out.with_suffix(".md").read_text().count("| direct |") == 4
