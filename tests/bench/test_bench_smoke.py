"""Smoke runs of `rlckpt bench barrier` and `python -m benchmarks.save_restore` at a tiny size on the session's real
TransferQueue, local disk and the moto server, so the benchmarks cannot rot. No timing assertions."""

from __future__ import annotations

import asyncio
import json

import pytest
from benchmarks.lib.save_downtime import DowntimeConfig, downtime_table, run_downtime
from benchmarks.lib.save_downtime import result_document as result_document_downtime
from benchmarks.lib.save_restore import SaveRestoreConfig, run_save_restore
from benchmarks.lib.two_tiers import run_two_tiers, two_tier_document, two_tier_table

from rlckpt.bench.barrier import (
    BarrierConfig,
    evaluate_targets,
    result_document,
    run_sweep,
)
from rlckpt.bench.destinations import local_destination, s3_destination
from rlckpt.bench.report import (
    barrier_plot,
    barrier_table,
    save_restore_table,
    targets_table,
    write_json,
)
from rlckpt.bench.rows import RowShape
from rlckpt.checkpoint.row_copy import start_ray_row_copier
from rlckpt.controller.connect import ConnectOnlyDataPlane
from rlckpt.store import BundleStore
from support.tq import connect_client, reset_tq_state

TINY_ROWS = RowShape(prompt_len=16, completion_len=64, group_size=4)


@pytest.fixture
def destinations(tmp_path, s3_endpoint):
    return [local_destination(tmp_path / "local"), s3_destination("s3-moto", s3_endpoint)]


def test_barrier_sweep_measures_every_point_and_writes_its_reports(tq_session, destinations, tmp_path):
    config = BarrierConfig(
        sizes_mib=[0.25], saves=1, save_gap_s=0.2, warmup_s=0.1, tail_s=0.1, policy_mib=0.25, shape=TINY_ROWS
    )
    copier = start_ray_row_copier(ConnectOnlyDataPlane())
    points = run_sweep(config, destinations, connect=connect_client, reset=reset_tq_state, row_copier=copier)

    assert [(p.destination, p.upload_timing) for p in points] == [
        ("local", "inline"),
        ("local", "staged"),
        ("local", "pinned"),
        ("s3-moto", "inline"),
        ("s3-moto", "staged"),
        ("s3-moto", "pinned"),
    ]
    for p in points:
        assert len(p.saves) == 1 and p.saves[0].bytes_written > 0
        if p.upload_timing != "pinned":  # a pinned save holds no window to split
            assert p.saves[0].pre_list_ms >= 0 and p.saves[0].list_ms > 0 and p.saves[0].post_snapshot_ms >= 0
        assert p.groups == TINY_ROWS.groups_for(0.25)
        assert p.commits > 0 and p.commits_idle.n + p.commits_during_save.n == p.commits
        assert p.latency_idle.n + p.latency_during_save.n == p.commits
    write_json(tmp_path / "out.json", result_document(points, config, {"command": "test"}))
    document = json.loads((tmp_path / "out.json").read_text())
    assert {t["target"] for t in document["targets"]} == {
        "staged S3 p99 <= 1.25x staged local",
        "staged >= 5x lower p99 than inline on S3",
        "window <= TQ snapshot + 10 ms",
        "pinned: p99 commit wait during a save <= 2 ms",
    }
    assert barrier_table(points).count("\n") == 2 + len(points)
    assert "window <= TQ snapshot" in targets_table(evaluate_targets(points))
    assert barrier_plot(points, tmp_path / "plot.png").stat().st_size > 0


def test_save_restore_round_trips_through_rlckpt_and_raw_copy_on_each_destination(tq_session, destinations):
    config = SaveRestoreConfig(size_mib=0.25, policy_mib=0.25, repeats=1, shape=TINY_ROWS)
    results = run_save_restore(config, destinations, connect=connect_client, reset=reset_tq_state)

    assert [r.destination for r in results] == ["local", "s3-moto"]
    for r in results:
        assert len(r.save_s) == len(r.raw_save_s) == len(r.restore_s) == len(r.raw_restore_s) == 1
        assert r.snapshot_bytes > 0 and r.bundle_bytes > 0
    for dest in destinations:  # the rlckpt bundle it restored from is committed and verifiable
        (run,) = [u for u in dest_runs(dest) if u.rsplit("/", 1)[-1].startswith("save-")]
        store = BundleStore(run, dest.storage_options)
        assert store.steps() == [1]
        store.open(1).verify()
    assert save_restore_table(results, None).count("\n") == 2 + len(results)


def dest_runs(dest):
    """Run URLs under a destination (the benchmark makes them in order: save-001, raw-002, ...)."""
    fs = dest.filesystem()
    prefix = "s3://" if dest.is_s3 else ""
    return [prefix + p for p in fs.ls(dest.root, detail=False)]


def test_save_downtime_measures_sync_and_async_saves_on_each_destination(tq_session, destinations, tmp_path):
    config = DowntimeConfig(size_mib=0.25, policy_mib=0.25, repeats=1, shape=TINY_ROWS)
    copier = start_ray_row_copier(ConnectOnlyDataPlane())
    reset_tq_state()
    keepalive: list = []
    try:
        results = asyncio.run(run_downtime(connect_client(), config, destinations, copier, keepalive))
    finally:
        keepalive.clear()
        reset_tq_state()

    assert [(r.destination, r.mode) for r in results] == [
        ("local", "sync"),
        ("local", "async"),
        ("s3-moto", "sync"),
        ("s3-moto", "async"),
    ]
    for r in results:
        assert len(r.staging_s) == len(r.downtime_s) == len(r.total_s) == 1
        assert r.staging_s[0] > 0 and r.downtime_s[0] > 0
    for dest in destinations:  # every save committed; retention kept the newest
        (run,) = [u for u in dest_runs(dest) if u.rsplit("/", 1)[-1].startswith("downtime-")]
        store = BundleStore(run, dest.storage_options)
        assert store.steps() == [2]
        store.open(2).verify()
    write_json(tmp_path / "downtime.json", result_document_downtime(results, config, {"command": "test"}))
    assert json.loads((tmp_path / "downtime.json").read_text())["benchmark"] == "save_downtime"
    assert downtime_table(results).count("| async |") == 2


def test_two_tier_save_measures_each_way_and_replicates_every_measured_bundle(tq_session, destinations, tmp_path):
    local, remote = destinations
    config = DowntimeConfig(size_mib=0.25, policy_mib=0.25, repeats=1, shape=TINY_ROWS)
    copier = start_ray_row_copier(ConnectOnlyDataPlane())
    reset_tq_state()
    try:
        result = run_two_tiers(connect_client(), config, local, remote, copier, lambda line: None)
    finally:
        reset_tq_state()

    assert len(result.local_downtime_s) == len(result.two_tier_downtime_s) == len(result.s3_save_s) == 1
    assert len(result.lag_s) == len(result.copy_s) == 1 and result.replicated_bytes > 0
    (replicas,) = [u for u in dest_runs(remote) if u.rsplit("/", 1)[-1].startswith("two-tier-")]
    replica_store = BundleStore(replicas, remote.storage_options)
    assert replica_store.steps() == [1, 2]  # the warm-up and the measured replication, both committed
    replica_store.open(2).verify()
    document = two_tier_document(result, config, {"command": "test"})
    assert document["benchmark"] == "save_two_tier"
    assert "lag / direct S3 save" in two_tier_table(result)
