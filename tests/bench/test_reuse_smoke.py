"""`python -m benchmarks.reuse` at a tiny size on local disk, so it cannot rot: a half-frozen policy saved with
reuse off and on, the reusing save writing only what changed, both loads checked bitwise, the goals judged and
the report written. No timing assertions."""

from __future__ import annotations

import json

from benchmarks import reuse
from benchmarks.lib.reuse_bench import FULL, REUSE


def test_reuse_bench_saves_both_ways_and_the_reusing_save_writes_only_what_changed(tmp_path):
    out = tmp_path / "reuse.json"
    assert reuse.main(["--quick", "--destinations", "local", "--scratch-dir", str(tmp_path), "--out", str(out)]) == 0

    document = json.loads(out.read_text())
    assert sorted({r["system"] for r in document["records"]}) == [FULL, REUSE]
    (row,) = reuse.summary(document["records"])
    assert row["verified"]
    full = next(r for r in document["records"] if r["system"] == FULL)
    assert row["full_written"] == full["stored_bytes"]  # a full save writes every byte
    assert 0.4 < row["written_ratio"] < 0.6  # the frozen half is taken, the trained half and moments written
    markdown = out.with_suffix(".md").read_text()
    assert "| local | 1 |" in markdown and "| written <= 0.55x a full save | local, 1 rank(s) |" in markdown
