"""`python -m benchmarks.policy` at a tiny size on local disk and the session's S3 server, so it cannot rot: every
system measured at every point (rlckpt and DCP's writer on local disk; rlckpt, DCP's fsspec writer and, when installed,
s3torchconnector on S3), times and extra memory recorded, every load verified, the reports written, and the
full matrix's command line parsed as the lead runs it. No timing assertions."""

from __future__ import annotations

import json

import pytest
from benchmarks.lib.digest_speed import digest_table, measure_digests
from benchmarks.lib.etag_proxy import nginx_conf
from benchmarks.lib.policy import (
    DCP,
    FSSPEC,
    RLCKPT,
    S3TC,
    PolicyBenchConfig,
    evaluate_targets,
    points_from_document,
    result_document,
    run_sweep,
    s3torchconnector_missing,
)
from benchmarks.lib.policy_report import policy_plot, policy_table, skipped_note, targets_summary
from benchmarks.policy import build_parser

from rlckpt.bench.destinations import local_destination, s3_destination
from rlckpt.bench.report import write_json


def test_policy_bench_measures_every_system_verifies_every_load_and_writes_its_reports(tmp_path, s3_endpoint):
    destinations = [local_destination(tmp_path / "local"), s3_destination("s3-moto", s3_endpoint)]
    config = PolicyBenchConfig(sizes_mib=[0.5], ranks=[1], repeats=2)
    workdir = tmp_path / "work"
    workdir.mkdir()

    points = run_sweep(config, destinations, str(workdir))

    s3_systems = [RLCKPT, FSSPEC] if s3torchconnector_missing() else [RLCKPT, S3TC, FSSPEC]
    assert [(p.destination, p.ranks, p.kind) for p in points] == [("local", 1, "local"), ("s3-moto", 1, "s3")]
    local, s3 = points
    assert sorted(local.systems) == sorted([RLCKPT, DCP]) and sorted(s3.systems) == sorted(s3_systems)
    for p in points:
        assert sorted((m.system, m.repeat) for m in p.measurements) == sorted(
            (s, r) for s in p.systems for r in range(2)
        )
        assert all(m.verified and m.save_s > 0 and m.load_s > 0 for m in p.measurements)
        assert all(m.save_extra_mib is not None and m.load_extra_mib is not None for m in p.measurements)
        assert p.state_bytes > 0
    assert [m.digest_s is not None for m in local.measurements if m.system == DCP] == [True, True]  # the floor
    if s3torchconnector_missing():
        assert S3TC in s3.skipped
    write_json(tmp_path / "policy.json", result_document(points, config, {"command": "test"}))
    document = json.loads((tmp_path / "policy.json").read_text())
    assert [p.destination for p in points_from_document(document)] == ["local", "s3-moto"]
    assert policy_table(points).count("\n") == 3 + 1 + 3  # two tables (header and one row each), a blank line between
    summary = targets_summary(evaluate_targets(points))
    assert "save <= 0.80x fsspec" in summary and "load <= 0.50x fsspec" in summary
    assert "extra memory on load <= 1.00x fsspec" in summary and "load <= 1.15x checked floor" in summary
    assert ("s3torchconnector" in skipped_note(points)) == bool(s3torchconnector_missing())
    assert policy_plot(points, tmp_path / "policy.png").stat().st_size > 0


def test_the_full_matrix_command_line_is_accepted():
    """The command the lead runs on a quiet machine (docs/benchmarks.md), parsed as given."""
    import shlex

    command = (
        "--sizes 256,1024,2048 --ranks 1,2,4 --destinations local,moto,rgw,rgw-proxy "
        "--rgw-endpoint http://127.0.0.1:7480 --rgw-reclaim 'bash scripts/rgw.sh gc' --repeats 3"
    )
    args = build_parser().parse_args(shlex.split(command))
    assert (args.sizes, args.ranks, args.destinations, args.rgw_reclaim) == (
        [256.0, 1024.0, 2048.0],
        [1, 2, 4],
        ["local", "moto", "rgw", "rgw-proxy"],
        "bash scripts/rgw.sh gc",
    )


def test_the_etag_proxy_passes_everything_to_rgw_and_adds_an_etag_only_where_none_came():
    conf = nginx_conf("127.0.0.1:7480", 7481)
    assert "server 127.0.0.1:7480;" in conf and "listen 127.0.0.1:7481;" in conf
    assert '"" "\\"00000000000000000000000000000000-1\\""; default $upstream_http_etag;' in conf


def test_digest_speeds_cover_sha256_and_blake3_on_one_and_all_threads():
    speeds = measure_digests(mib=1, repeats=1)
    assert [(s.algorithm, s.threads > 1) for s in speeds] == [("sha256", False), ("blake3", False), ("blake3", True)]
    assert all(s.median_mib_s > 0 for s in speeds)
    assert digest_table(speeds).count("\n") == 2 + len(speeds)


def test_a_rank_count_that_fails_is_reported_and_the_sweep_goes_on_with_what_it_measured(tmp_path, monkeypatch):
    """A multi-hour sweep loses one spawn (a server falling over at 4 ranks), not every point before it."""
    import support.dcp_ranks as dcp_ranks

    def spawn(fn, ranks, job, timeout):
        if ranks == 2:
            raise RuntimeError("ranks exited with {0: 1}\n--- rank 0 ---\nReadTimeoutError: Read timeout on endpoint")
        with open(job.out_path, "w") as out:
            json.dump([], out)

    monkeypatch.setattr(dcp_ranks, "run_ranks", spawn)
    config = PolicyBenchConfig(sizes_mib=[0.5], ranks=[1, 2, 4], repeats=1)
    kept, failed = [], []

    run_sweep(
        config,
        [local_destination(tmp_path / "local")],
        str(tmp_path),
        on_points=lambda points: kept.append(points),
        on_failure=lambda ranks, exc: failed.append((ranks, str(exc))),
    )

    assert len(kept) == 2 and [ranks for ranks, _ in failed] == [2]
    assert "ReadTimeoutError" in failed[0][1]


def test_a_spawn_that_fails_partway_keeps_the_points_it_finished(tmp_path, monkeypatch):
    """RGW's OSD was OOM-killed at 4 ranks x 2 GiB, after five points of that spawn: they were lost with it when
    rank 0 wrote its points only at the spawn's end. Now each point is kept as it ends."""
    from benchmarks.lib import policy

    import support.dcp_ranks as dcp_ranks

    finished = {
        "size_mib": 256.0,
        "state_bytes": 1,
        "width": 8,
        "ranks": 4,
        "destination": "local",
        "kind": "local",
        "skipped": {},
        "proxied_saves": [],
        "measurements": [],
    }

    def spawn(fn, ranks, job, timeout):
        policy._write_points(job.out_path, [finished])  # as rank 0 does when a point ends
        raise RuntimeError("ranks exited with {1: -9}")

    monkeypatch.setattr(dcp_ranks, "run_ranks", spawn)
    config = PolicyBenchConfig(sizes_mib=[256.0, 2048.0], ranks=[4], repeats=1)
    kept, failed = [], []

    points = run_sweep(
        config,
        [local_destination(tmp_path / "local")],
        str(tmp_path),
        on_points=lambda p: kept.extend(p),
        on_failure=lambda ranks, exc: failed.append(ranks),
    )

    assert [(p.ranks, p.size_mib) for p in points] == [(4, 256.0)] and failed == [4]
    assert [(p.ranks, p.size_mib) for p in kept] == [(4, 256.0)]


def test_a_peer_that_fails_at_one_point_is_not_measured_there_and_the_sweep_goes_on(tmp_path, monkeypatch):
    """A server that times the connector out once (4 ranks x 1 GiB through the proxy) costs that peer that
    point, not the rank count's other points nor rlckpt's measurements."""
    import torch
    from benchmarks.lib import policy

    from rlckpt.s3local import free_port
    from support.dcp_ranks import process_group

    real_save = policy._Systems.save

    def save(self, system, k, state):
        if system == DCP and 3 <= k <= 6:  # the first size's repeats (steps 1-2 are the warm-up)
            raise RuntimeError("Timed out waiting for first byte of HTTP response")
        return real_save(self, system, k, state)

    monkeypatch.setattr(policy._Systems, "save", save)
    dest = policy.DestinationJob("local", str(tmp_path / "run"), str(tmp_path / "peers"), None)
    job = policy.RankJob([dest], sizes_mib=[0.5, 1], repeats=2, verify=True, thread_count=1, out_path="-")
    threads = torch.get_num_threads()
    try:
        with process_group(0, 1, free_port()) as mesh:
            first, second = (
                policy.points_from_document({"points": [p]})[0]
                for p in policy._measure_destination(0, 1, mesh, dest, job)
            )
    finally:
        torch.set_num_threads(threads)

    assert first.systems == [RLCKPT] and len(first.measurements) == 2
    # the failed save had left the state zeroed, and every later system saved and loaded zeros: MISMATCH
    assert [m.verified for m in first.measurements + second.measurements] == [True] * 6
    assert first.skipped[DCP] == (
        "failed at 1 ranks, 0.5 MiB, repeat 1: Timed out waiting for first byte of HTTP response"
    )
    assert sorted(second.systems) == sorted([RLCKPT, DCP]) and DCP not in second.skipped
    assert skipped_note([first, second]).count("not measured") == 1


def test_every_system_saves_and_loads_each_sizes_state_once_untimed_before_its_timed_repeats(tmp_path, monkeypatch):
    """The first write of a size's bytes can cost several times the later ones (a VM's host backing freed memory
    again): whoever went first at a size paid it alone. Now every system first saves and loads the point's own
    state once, untimed, and only the repeats after it are measured."""
    import torch
    from benchmarks.lib import policy

    from rlckpt.s3local import free_port
    from support.dcp_ranks import flat_tensors, process_group

    calls: list[tuple[str, str, int]] = []
    real_save, real_load = policy._Systems.save, policy._Systems.load

    def nbytes(state):
        return sum(t.numel() * t.element_size() for t in flat_tensors(state).values())

    def save(self, system, k, state):
        calls.append(("save", system, nbytes(state)))
        return real_save(self, system, k, state)

    def load(self, system, k, state):
        calls.append(("load", system, nbytes(state)))
        return real_load(self, system, k, state)

    monkeypatch.setattr(policy._Systems, "save", save)
    monkeypatch.setattr(policy._Systems, "load", load)
    dest = policy.DestinationJob("local", str(tmp_path / "run"), str(tmp_path / "peers"), None)
    job = policy.RankJob([dest], [0.5], repeats=1, verify=True, thread_count=1, out_path="-", warm_up=True)
    threads = torch.get_num_threads()
    try:
        with process_group(0, 1, free_port()) as mesh:
            (point,) = points_from_document({"points": policy._measure_destination(0, 1, mesh, dest, job)})
    finally:
        torch.set_num_threads(threads)

    at_size = [(op, system) for op, system, n in calls if n == point.state_bytes]
    assert at_size == [("save", RLCKPT), ("load", RLCKPT), ("save", DCP), ("load", DCP)] * 2
    assert [(m.system, m.repeat) for m in point.measurements] == [(RLCKPT, 0), (DCP, 0)]
    assert all(m.verified for m in point.measurements)


@pytest.mark.parametrize("rank", [0, 1])
def test_removing_what_a_failed_save_never_wrote_still_meets_the_other_ranks(tmp_path, s3_endpoint, monkeypatch, rank):
    """A peer's save that failed before writing leaves nothing to remove: rank 0's removal must not skip the
    barrier every rank meets after it. It did once (s3fs refuses to remove a missing prefix), and rank 0 ran one
    collective ahead: the 4-rank sweep on RGW stalled with rank 0 in the next save's gather and the others in
    the barrier before it, or went on pairing the wrong collectives and reporting every load a MISMATCH."""
    import torch.distributed as dist
    from benchmarks.lib import policy

    met: list[int] = []
    monkeypatch.setattr(dist, "barrier", lambda *args, **kwargs: met.append(rank))
    dest = s3_destination("s3-moto", s3_endpoint)
    job = policy.DestinationJob(dest.name, dest.run_url("policy"), dest.run_url("peers"), dest.storage_options)
    policy._Systems(job, 1).remove(FSSPEC, 7, rank)
    assert met == [rank]


@pytest.mark.parametrize("rank", [0, 1])
def test_the_servers_reclaim_command_runs_on_rank_0_after_each_removal_before_the_ranks_meet(
    tmp_path, s3_endpoint, monkeypatch, rank
):
    """RGW frees deleted objects in a garbage collector that otherwise ran during the next measurement: the
    command that runs it now must run after the removal and before every rank goes on (the barrier), once."""
    import sys

    import torch.distributed as dist
    from benchmarks.lib import policy

    log = tmp_path / "reclaimed"
    at_barrier: list[str] = []
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: at_barrier.append(log.read_text() if log.exists() else ""))
    dest = s3_destination("s3-moto", s3_endpoint)
    command = f"{sys.executable} -c \"open({str(log)!r}, 'a').write('x')\""
    job = policy.DestinationJob(
        dest.name, dest.run_url("policy"), dest.run_url("peers"), dest.storage_options, reclaim_command=command
    )
    systems = policy._Systems(job, 1)
    systems.remove(FSSPEC, 7, rank)
    systems.remove(FSSPEC, 8, rank)
    assert at_barrier == (["x", "xx"] if rank == 0 else ["", ""])


def test_a_reclaim_command_that_fails_is_logged_and_the_sweep_goes_on(tmp_path, s3_endpoint, monkeypatch, caplog):
    import torch.distributed as dist
    from benchmarks.lib import policy

    monkeypatch.setattr(dist, "barrier", lambda *a, **k: None)
    dest = s3_destination("s3-moto", s3_endpoint)
    job = policy.DestinationJob(
        dest.name,
        dest.run_url("policy"),
        dest.run_url("peers"),
        dest.storage_options,
        reclaim_command=str(tmp_path / "no-such-command"),
    )
    with caplog.at_level("WARNING", logger=policy.__name__):
        policy._Systems(job, 1).remove(FSSPEC, 7, 0)
    assert "no-such-command" in caplog.text


def test_a_peer_save_through_the_proxy_is_shown_but_not_compared_and_its_direct_load_is():
    """On RGW reached directly the connector can only save through the ETag proxy: its save is not where
    rlckpt's ran, so no save target judges rlckpt against it and the table shows it in parentheses; its load
    ran direct, beside rlckpt's, and is judged."""
    from benchmarks.lib.policy import Measurement, PointResult
    from benchmarks.lib.policy_report import proxied_note

    def m(system, save_s, load_s):
        return Measurement(system, 0, save_s, load_s, True, save_extra_mib=10.0, load_extra_mib=10.0)

    point = PointResult(
        256, 256 << 20, 64, 1, "s3-rgw",
        [m(RLCKPT, 3.0, 1.0), m(S3TC, 2.0, 1.2), m(FSSPEC, 5.0, 4.0)],
        proxied_saves=[S3TC],
    )  # fmt: skip
    round_tripped = points_from_document(result_document([point], PolicyBenchConfig([256], [1]), {}))[0]

    targets = {c.target for c in evaluate_targets([round_tripped])}
    assert "save <= 0.90x s3torchconnector" not in targets
    assert {"load <= 0.90x s3torchconnector", "save <= 0.80x fsspec"} <= targets
    row = policy_table([round_tripped]).splitlines()[2]
    assert "| 3.00 / (2.00) / 5.00 | - | " in row and "| 1.00 / 1.20 / 4.00 | 0.83× |" in row
    assert "saved through the ETag proxy" in proxied_note([round_tripped])


def policy_cli(tmp_path, monkeypatch, sweep):
    """`python -m benchmarks.policy --quick` on local disk with `sweep` in place of the measuring: what main
    returns."""
    from benchmarks.lib import policy
    from benchmarks.policy import main

    monkeypatch.setattr(policy, "run_sweep", sweep)
    return main(["--quick", "--destinations", "local", "--out", str(tmp_path / "p.json")])


def test_a_sweep_that_measured_nothing_writes_its_table_and_no_plot(tmp_path, monkeypatch):
    def every_spawn_fails(config, destinations, workdir, on_points=None, on_failure=None, **_):
        for ranks in config.ranks:
            on_failure(ranks, RuntimeError("rank 0 died"))
        return []

    assert policy_cli(tmp_path, monkeypatch, every_spawn_fails) == 0
    assert "- 1 ranks: failed: rank 0 died" in (tmp_path / "p.md").read_text()
    assert not (tmp_path / "p.png").exists()


def test_sigterm_ends_a_bench_run_through_what_it_started_and_exits_143(tmp_path, monkeypatch):
    """SIGTERM unwinds the run like Ctrl-C: the servers and ranks it started are stopped on its way out (here
    the destinations' context, which holds moto and the scratch dir), and SIGTERM's handler is restored."""
    import contextlib
    import os
    import signal

    from rlckpt.bench import harness

    before = signal.getsignal(signal.SIGTERM)
    real, ended = harness.destinations, []

    @contextlib.contextmanager
    def recorded(*args, **kwargs):
        with real(*args, **kwargs) as dests:
            try:
                yield dests
            finally:
                ended.append(True)

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # os.kill runs the handler of a signal to itself before it returns
        raise AssertionError("SIGTERM did not end the run")

    monkeypatch.setattr(harness, "destinations", recorded)
    with pytest.raises(SystemExit) as stopped:
        policy_cli(tmp_path, monkeypatch, terminated)
    assert stopped.value.code == 143 and ended == [True]
    assert signal.getsignal(signal.SIGTERM) == before
