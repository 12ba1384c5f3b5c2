"""The benchmarks' own logic, without TransferQueue: commit-wait classification, target checks,
reading `rlckpt train`'s stderr, and the CLI's argument handling."""

from __future__ import annotations

import pytest
from benchmarks.lib.first_step import StderrWatch

from rlckpt.bench.barrier import (
    PointResult,
    SaveRecord,
    classify_commit_waits,
    evaluate_targets,
)
from rlckpt.bench.rows import RowShape, make_group
from rlckpt.bench.stats import summarize
from rlckpt.bench.timed_barrier import MutationEvent, WindowEvent
from rlckpt.cli.main import build_parser


def test_commit_waits_split_into_idle_during_save_and_window():
    events = [
        MutationEvent("commit", 1.0, 1.0),  # idle
        MutationEvent("commit", 5.2, 5.2),  # during the save, before its window
        MutationEvent("commit", 5.6, 6.0),  # arrived while the window (5.5-6.0) was held
        MutationEvent("remove", 5.7, 6.0),  # not a commit: ignored
    ]
    idle, during, in_window = classify_commit_waits(events, [(5.0, 7.0)], [WindowEvent(5.5, 6.0)])
    assert idle == [0.0]
    assert during == pytest.approx([0.0, 0.4])
    assert in_window == pytest.approx([0.4])


def test_a_commit_queued_before_the_window_and_let_in_after_it_counts_as_waiting_for_it():
    events = [MutationEvent("commit", 5.4, 6.1)]
    _, _, in_window = classify_commit_waits(events, [(5.0, 7.0)], [WindowEvent(5.5, 6.0)])
    assert in_window == pytest.approx([0.7])


def _point(dest: str, timing: str, p99_s: float, window_s: float = 0.1, snapshot_s: float = 0.1) -> PointResult:
    waits = summarize([0.0] * 99 + [p99_s] * 2)
    save = SaveRecord(1, window_s, snapshot_s, 0.0, 0.0, 1.0, 1, 1e3 * (window_s - snapshot_s))
    return PointResult(256.0, dest, timing, 1, 8, 1, 20.0, 101, waits, waits, waits, [save])


def test_targets_report_misses_with_their_ratio():
    points = [
        _point("local", "staged", 0.100),
        _point("s3-moto", "staged", 0.200, window_s=0.150),
        _point("s3-moto", "inline", 0.400),
    ]
    checks = {(c.target, c.where): c for c in evaluate_targets(points)}
    ratio = checks[("staged S3 p99 <= 1.25x staged local", "256 MiB s3-moto")]
    assert not ratio.met and ratio.value == pytest.approx(2.0, rel=0.05)
    lower = checks[("staged >= 5x lower p99 than inline on S3", "256 MiB s3-moto")]
    assert not lower.met and lower.value == pytest.approx(2.0, rel=0.05)
    window = checks[("window <= TQ snapshot + 10 ms", "256 MiB s3-moto")]
    assert not window.met and window.value == pytest.approx(50.0)
    assert checks[("window <= TQ snapshot + 10 ms", "256 MiB local")].met


def test_sub_millisecond_waits_do_not_count_as_a_ratio_miss():
    points = [_point("local", "staged", 0.00001), _point("s3-moto", "staged", 0.0005)]
    (ratio,) = [c for c in evaluate_targets(points) if c.target.startswith("staged S3")]
    assert ratio.met and ratio.value == pytest.approx(1.0)


def test_resume_stderr_gives_restore_time_and_first_step_after_the_resumed_one():
    watch = StderrWatch()
    watch.feed(b"rlckpt train: resumed step 2 from s3://b/run (3.4s)", 20.0)
    watch.feed("train:  50%|\u2588\u2588\u2588     | 2/4 [00:00<?, ?step/s]".encode(), 20.1)
    watch.feed("train:  75%|\u2588\u2588\u2588\u2588\u2588   | 3/4 [00:09<00:09, 9.3s/step]".encode(), 29.5)
    watch.feed("train: 100%|\u2588\u2588\u2588\u2588\u2588\u2588\u2588| 4/4 [00:18<00:00, 9.3s/step]".encode(), 39.0)
    assert (watch.resumed_step, watch.restore_s, watch.resumed_at) == (2, 3.4, 20.0)
    assert watch.first_step_at == 29.5


def test_rows_add_up_to_the_declared_size():
    shape = RowShape(prompt_len=8, completion_len=32, group_size=4)
    import torch

    rows = make_group(shape, 0, 0, torch.Generator().manual_seed(0))
    assert sum(t.nbytes for row in rows for t in row.values()) == shape.group_bytes
    assert shape.groups_for(1.0) * shape.group_bytes >= 1 << 20


@pytest.mark.parametrize("argv", [["bench", "barrier", "--sizes", "16,x"], ["bench", "nosuch"]])
def test_bad_bench_command_lines_exit_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 64


def test_bench_barrier_parses_sizes_and_destinations():
    args = build_parser().parse_args(["bench", "barrier", "--sizes", "16,64", "--destinations", "local"])
    assert args.sizes == [16.0, 64.0] and args.destinations == ["local"]
    assert args.upload_timings == ["inline", "staged", "pinned"]


def test_results_json_reads_back_into_the_same_points_for_replotting():
    import json

    from rlckpt.bench.barrier import (
        BarrierConfig,
        points_from_document,
        result_document,
    )

    points = [_point("local", "staged", 0.1), _point("s3-moto", "inline", 0.4)]
    document = json.loads(json.dumps(result_document(points, BarrierConfig(), {"command": "test"})))
    assert points_from_document(document) == points


def test_bench_barrier_still_accepts_the_old_modes_spelling_for_upload_timings():
    args = build_parser().parse_args(["bench", "barrier", "--modes", "staged"])
    assert args.upload_timings == ["staged"]


def test_replot_writes_the_table_and_plot_into_a_new_out_dir(tmp_path, capsys):
    import json

    from rlckpt.bench.barrier import BarrierConfig, result_document
    from rlckpt.cli.main import main

    points = [_point("local", "staged", 0.1), _point("local", "pinned", 0.0001)]
    results = tmp_path / "barrier_stall.json"
    results.write_text(json.dumps(result_document(points, BarrierConfig(), {"command": "test", "date_utc": "now"})))
    out = tmp_path / "new" / "dir"
    assert main(["bench", "barrier", "--replot", str(results), "--out-dir", str(out)]) == 0
    assert "| local | pinned |" in (out / "barrier_stall.md").read_text()
    assert (out / "barrier_stall.png").read_bytes().startswith(b"\x89PNG")


def test_the_save_benchmark_takes_its_modes_and_destinations_on_its_own_command_line():
    from benchmarks.save_restore import build_parser as save_parser

    args = save_parser().parse_args(["--async", "--policy-mib", "256", "--destinations", "local"])
    assert (args.async_saves, args.two_tier, args.policy_mib, args.destinations) == (True, False, 256.0, ["local"])


def test_rlckpt_bench_offers_the_barrier_benchmark_only():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "save"])
    assert build_parser().parse_args(["bench", "barrier"]).bench_command == "barrier"
