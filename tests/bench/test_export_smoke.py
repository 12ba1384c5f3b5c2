"""`python -m benchmarks.export` at a tiny size on local disk, so it cannot rot: two ranks save, a fresh process
exports and another reads the same files raw, each one's peak RSS taken, the goals judged and the report written.
No timing assertions."""

from __future__ import annotations

import json

from benchmarks import export


def test_export_bench_measures_an_export_beside_a_raw_read_and_judges_both_goals(tmp_path):
    out = tmp_path / "export.json"
    assert export.main(["--quick", "--destinations", "local", "--scratch-dir", str(tmp_path), "--out", str(out)]) == 0

    (point,) = json.loads(out.read_text())["points"]
    assert point["ranks"] == 2 and point["model_bytes"] > 0
    assert point["export_peak_rss"] > point["export_extra_rss"] > 0  # the imports' share taken off
    assert point["rss_bound"] > point["largest_tensor"]
    markdown = out.with_suffix(".md").read_text()
    assert "| export <= 1.2x the raw read | local, 2 ranks" in markdown
    assert "| peak RSS over its imports <= largest tensor + shard + 256 MiB | local, 2 ranks" in markdown
