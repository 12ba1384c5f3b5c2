"""`rlckpt bench policy` at a tiny size on local disk and the session's moto server, so it cannot rot:
both systems measured at every point, every load verified, the reports written. No timing assertions."""

from __future__ import annotations

import json

from rlckpt.bench.destinations import local_destination, s3_destination
from rlckpt.bench.digest_speed import digest_table, measure_digests
from rlckpt.bench.policy import PolicyBenchConfig, evaluate_targets, points_from_document, result_document, run_sweep
from rlckpt.bench.policy_report import policy_plot, policy_table, targets_summary
from rlckpt.bench.report import write_json


def test_policy_bench_measures_both_systems_verifies_every_load_and_writes_its_reports(tmp_path, s3_endpoint):
    destinations = [local_destination(tmp_path / "local"), s3_destination("s3-moto", s3_endpoint)]
    config = PolicyBenchConfig(sizes_mib=[0.5], ranks=[1], repeats=2)
    workdir = tmp_path / "work"
    workdir.mkdir()

    points = run_sweep(config, destinations, str(workdir))

    assert [(p.destination, p.ranks) for p in points] == [("local", 1), ("s3-moto", 1)]
    for p in points:
        assert sorted((m.system, m.repeat) for m in p.measurements) == [
            ("dcp", 0),
            ("dcp", 1),
            ("rlckpt", 0),
            ("rlckpt", 1),
        ]
        assert all(m.verified and m.save_s > 0 and m.load_s > 0 for m in p.measurements)
        assert p.state_bytes > 0
        floor_measured = [m.digest_s is not None for m in p.measurements if m.system == "dcp"]
        assert floor_measured == [p.destination == "local"] * 2  # the checked floor: local disk only
    write_json(tmp_path / "policy.json", result_document(points, config, {"command": "test"}))
    document = json.loads((tmp_path / "policy.json").read_text())
    assert len(document["targets"]) == 2 * len(points)
    assert [p.destination for p in points_from_document(document)] == ["local", "s3-moto"]
    assert policy_table(points).count("\n") == 2 + len(points)
    summary = targets_summary(evaluate_targets(points))
    assert "save <= 1.10x DCP" in summary and "load <= 1.15x checked floor" in summary
    assert policy_plot(points, tmp_path / "policy.png").stat().st_size > 0


def test_digest_speeds_cover_sha256_and_blake3_on_one_and_all_threads():
    speeds = measure_digests(mib=1, repeats=1)
    assert [(s.algorithm, s.threads > 1) for s in speeds] == [("sha256", False), ("blake3", False), ("blake3", True)]
    assert all(s.median_mib_s > 0 for s in speeds)
    assert digest_table(speeds).count("\n") == 2 + len(speeds)
