"""`python -m benchmarks.policy --merge`: one result out of lane-by-lane runs, each point from the latest run that
measured it and naming that run; runs of different settings are not put in one table."""

from __future__ import annotations

import json
from typing import Any

import pytest
from benchmarks.lib.policy import RLCKPT, Measurement, PointResult, PolicyBenchConfig, result_document
from benchmarks.lib.policy_merge import MergeRefused, merge_documents
from benchmarks.lib.policy_report import policy_table
from benchmarks.policy import main


def _run(date: str, commit: str, points: list[tuple[str, int, float, float]], **config: Any) -> dict[str, Any]:
    """A policy result of rlckpt alone: (destination, ranks, size MiB, save seconds) per point."""
    made = [
        PointResult(
            size,
            int(size * 2**20),
            8,
            ranks,
            dest,
            [Measurement(RLCKPT, 0, save_s, save_s / 2, True, save_extra_mib=1.0, load_extra_mib=1.0)],
            kind="local" if dest == "local" else "s3",
        )
        for dest, ranks, size, save_s in points
    ]
    meta = {"command": f"run at {commit}", "git_commit": commit, "date_utc": date, "load_average_1m": 0.5}
    return json.loads(json.dumps(result_document(made, PolicyBenchConfig([1.0], [1], **config), meta)))


OLD = _run("2026-12-04 10:00:00Z", "aaaaaaa", [("local", 1, 1.0, 9.0), ("local", 2, 1.0, 8.0)])
NEW = _run("2026-12-04 12:00:00Z", "bbbbbbb", [("local", 2, 1.0, 2.0), ("s3-moto", 1, 1.0, 3.0)])


def _saves(points: list[PointResult]) -> dict[tuple[str, int], float]:
    return {(p.destination, p.ranks): p.median(RLCKPT, "save") for p in points}


def test_each_point_comes_from_the_latest_run_that_measured_it_whatever_the_order_given():
    merged = merge_documents([NEW, OLD])
    assert _saves(merged.points) == {("local", 1): 9.0, ("local", 2): 2.0, ("s3-moto", 1): 3.0}


def test_each_point_names_its_run_and_the_table_shows_it():
    merged = merge_documents([OLD, NEW])
    assert {(p.destination, p.ranks): p.run for p in merged.points}[("local", 1)] == "aaaaaaa 2026-12-04 10:00"
    assert "| run |" in policy_table(merged.points) and "bbbbbbb 2026-12-04 12:00 |" in policy_table(merged.points)


def test_a_run_whose_every_point_was_measured_again_later_is_not_listed():
    superseded = _run("2026-12-04 09:00:00Z", "ccccccc", [("local", 2, 1.0, 7.0)])
    merged = merge_documents([superseded, OLD, NEW])
    assert [m["git_commit"] for m in merged.runs] == ["aaaaaaa", "bbbbbbb"]


def test_runs_of_different_repeats_or_warm_up_are_refused():
    other = _run("2026-12-04 13:00:00Z", "ddddddd", [("local", 4, 1.0, 1.0)], warm_up=False)
    with pytest.raises(MergeRefused, match="runs differ"):
        merge_documents([OLD, other])


def test_a_result_of_another_benchmark_is_refused():
    with pytest.raises(MergeRefused, match="not a policy result"):
        merge_documents([OLD, {"benchmark": "barrier", "config": {}, "meta": {}, "points": []}])


def test_merge_writes_the_json_markdown_and_plot_and_replots_with_the_runs_listed(tmp_path):
    paths = []
    for name, doc in (("old.json", OLD), ("new.json", NEW)):
        (tmp_path / name).write_text(json.dumps(doc))
        paths.append(str(tmp_path / name))
    out = tmp_path / "out" / "policy_bench.json"
    assert main(["--merge", *paths, "--out", str(out)]) == 0
    assert {p["run"] for p in json.loads(out.read_text())["points"]} == {
        "aaaaaaa 2026-12-04 10:00",
        "bbbbbbb 2026-12-04 12:00",
    }
    assert out.with_suffix(".png").stat().st_size > 0
    assert "Merged from 2 runs" in out.with_suffix(".md").read_text()
    again = tmp_path / "again" / "policy_bench.json"
    assert main(["--replot", str(out), "--out", str(again)]) == 0
    assert "`run at aaaaaaa`" in again.with_suffix(".md").read_text()


def test_merge_of_a_file_that_is_not_there_exits_naming_it(tmp_path):
    with pytest.raises(SystemExit, match="missing.json"):
        main(["--merge", str(tmp_path / "missing.json"), "--out", str(tmp_path / "o.json")])
