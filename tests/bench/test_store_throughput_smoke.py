"""The store throughput benchmark runs end to end at a tiny size (figures are not checked: speed is not a test)."""

from __future__ import annotations

import json


def test_quick_benchmark_writes_json_and_markdown_for_local_and_s3(tmp_path, run_benchmark):
    out_dir = tmp_path / "results"
    proc = run_benchmark("store_throughput.py", "--quick", "--backends", "local,s3", "--out-dir", str(out_dir))
    rows = json.loads((out_dir / "store_throughput.json").read_text())["rows"]
    assert [r["backend"] for r in rows] == ["local", "s3 (moto)"]
    for row in rows:
        assert row["files"] > 1
        assert all(len(v) == row["repeats"] for v in row["samples"].values())
    markdown = (out_dir / "store_throughput.md").read_text()
    assert "| local |" in markdown and "| s3 (moto) |" in markdown
    assert "save ×" in proc.stdout
