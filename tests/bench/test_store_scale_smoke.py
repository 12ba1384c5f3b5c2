"""`python -m benchmarks.store_scale` runs end to end at tiny counts on local disk and the moto server, and counts
what it reports (figures are not checked: speed is not a test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_quick_store_benchmark_writes_json_and_markdown_for_local_and_s3(tmp_path):
    out_dir = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.store_scale", "--quick", "--out-dir", str(out_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    points = json.loads((out_dir / "store_scale.json").read_text())["points"]
    assert [(p["destination"], p["kind"], p["count"]) for p in points] == [
        (destination, kind, count)
        for destination in ("local", "s3-moto")
        for kind, count in (("participants", 2), ("participants", 4), ("files", 10), ("files", 20))
    ]
    for point in points:
        assert point["commit"]["calls"] > 0 and point["work"]["calls"] >= point["count"]
        assert (point["commit"]["requests"] is None) == (point["destination"] == "local")
    s3_participants = [p for p in points if p["destination"] == "s3-moto" and p["kind"] == "participants"]
    assert all(p["work"]["requests"] >= 2 * p["count"] for p in s3_participants)  # at least a PUT and a seal each
    markdown = (out_dir / "store_scale.md").read_text()
    assert "| local | 4 |" in markdown and "| s3-moto | 20 |" in markdown
