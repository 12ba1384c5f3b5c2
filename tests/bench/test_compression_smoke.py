"""`python -m benchmarks.compression` at a tiny size on local disk, so it cannot rot: rlckpt with and without
compression beside DCP's writer for each draw, every load verified, bytes stored and save CPU recorded, the
goals judged and the report written. No timing assertions."""

from __future__ import annotations

import json

from benchmarks import compression
from benchmarks.lib import compression_report as report
from benchmarks.lib.policy import DCP, RLCKPT, RLCKPT_Z, points_from_document


def test_compression_bench_measures_both_rlckpts_per_draw_and_judges_the_goals(tmp_path):
    out = tmp_path / "compression.json"
    argv = ["--quick", "--destinations", "local", "--scratch-dir", str(tmp_path), "--out", str(out)]
    argv += ["--draws", "trained-bf16,random-bf16", "--ceiling", str(tmp_path / "none.json")]

    assert compression.main(argv) == 0

    points = points_from_document(json.loads(out.read_text()))
    assert sorted(p.draw for p in points) == ["random-bf16", "trained-bf16"]
    for p in points:
        assert sorted(p.systems) == sorted([RLCKPT, RLCKPT_Z, DCP])
        assert all(m.verified and m.stored_bytes and m.save_cpu_s is not None for m in p.measurements)
    trained = next(p for p in points if p.draw == "trained-bf16")
    assert trained.median_of(RLCKPT_Z, "stored_bytes") < trained.median_of(RLCKPT, "stored_bytes")
    goals = {g.goal for g in report.goals(points, {})}
    assert goals == {
        "stored <= 0.80x raw",
        "load <= 1.10x uncompressed",
        "stored <= 1.001x raw",
        "save <= 1.05x uncompressed",
    }
    markdown = out.with_suffix(".md").read_text()
    assert "| local | 1 | trained-bf16 |" in markdown and "| goal | where |" in markdown


def test_the_ceiling_of_each_rgw_path_is_its_fastest_put(tmp_path):
    results = {
        "direct": [
            {"op": "put", "mib_per_s": 300.0},
            {"op": "put", "mib_per_s": 400.0},
            {"op": "get", "mib_per_s": 900},
        ],
        "etag-proxy": [{"op": "put", "mib_per_s": 350.0}],
    }
    (tmp_path / "c.json").write_text(json.dumps({"results": results}))
    assert report.ceilings(tmp_path / "c.json") == {"s3-rgw": 400.0, "s3-rgw-etag-proxy": 350.0}
    assert report.ceilings(tmp_path / "missing.json") == {}
