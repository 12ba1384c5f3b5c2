"""Writing benchmark results: JSON, a markdown table and the stall-vs-size plot."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlckpt.bench.barrier import PointResult, TargetCheck
from rlckpt.bench.rows import MiB


def write_json(path: Path, document: dict[str, Any]) -> Path:
    """Indented, key-sorted JSON (stable diffs between runs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, sort_keys=True, default=str) + "\n")
    return path


def _ms(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def barrier_table(points: Sequence[PointResult]) -> str:
    """One markdown row per point: stalls (ms), window vs snapshot (ms), save and upload (s), bytes."""
    header = (
        "| data plane | destination | upload timing | commits idle p99 | during save p50 / p99 / max | "
        "whole commit p99 idle / during save | longest window | its snapshot (pinned: copy) | "
        "window − snapshot median / worst | upload (max) | save total (max) | written |\n"
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for p in points:
        d = p.commits_during_save
        upload = max(s.upload_s for s in p.saves) if p.saves else 0.0
        total = max(s.total_s for s in p.saves) if p.saves else 0.0
        written = max(s.bytes_written for s in p.saves) / MiB if p.saves else 0.0
        lines.append(
            f"| {p.data_plane_bytes / MiB:.0f} MiB | {p.destination} | {p.upload_timing} | "
            f"{_ms(p.commits_idle.p99_ms)} ms | {_ms(d.p50_ms)} / {_ms(d.p99_ms)} / {_ms(d.max_ms)} ms | "
            f"{_ms(p.latency_idle.p99_ms)} / {_ms(p.latency_during_save.p99_ms)} ms | "
            f"{_ms(p.window_ms)} ms | {_ms(p.snapshot_ms)} ms | "
            f"{p.window_excess_median_ms:+.1f} / {p.window_excess_ms:+.1f} ms | {upload:.2f} s | {total:.2f} s | "
            f"{written:.0f} MiB |"
        )
    return header + "\n".join(lines) + "\n"


def targets_table(checks: Sequence[TargetCheck]) -> str:
    """Markdown table of the targets: measured value against its limit, met or missed."""
    header = "| target | where | measured | limit | met | detail |\n|---|---|---:|---:|---|---|\n"
    lines = [
        f"| {c.target} | {c.where} | {c.value:.2f} | {c.limit:g} | {'yes' if c.met else '**no**'} | {c.detail} |"
        for c in checks
    ]
    return header + "\n".join(lines) + "\n"


# The plot's panels: (PointResult field, summary statistic, title). The first two are the wait at the
# barrier; the third the whole commit, put included, so a stall moved into slower puts shows too.
BARRIER_PANELS = (
    ("commits_during_save", "p99_ms", "p99 wait at the barrier during saves"),
    ("commits_during_save", "max_ms", "max wait at the barrier during saves"),
    ("latency_during_save", "p99_ms", "p99 whole commit (put included) during saves"),
)


def barrier_plot(points: Sequence[PointResult], path: Path) -> Path:
    """PNG: vs data-plane size, one line per upload timing × destination, one panel per BARRIER_PANELS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(BARRIER_PANELS), figsize=(15, 5.2), sharey=True)
    keys = sorted({(p.upload_timing, p.destination) for p in points})
    for timing, dest in keys:
        series = sorted(
            (p for p in points if p.upload_timing == timing and p.destination == dest), key=lambda p: p.size_mib
        )
        sizes = [p.data_plane_bytes / MiB for p in series]
        style = {"staged": "-", "inline": "--", "pinned": "-."}.get(timing, ":")
        marker = {"local": "o", "s3-moto": "s", "s3-rgw": "^"}.get(dest, "x")
        for ax, (field, metric, _title) in zip(axes, BARRIER_PANELS, strict=True):
            values = [max(getattr(getattr(p, field), metric), 0.01) for p in series]
            ax.plot(sizes, values, style, marker=marker, label=f"{timing} · {dest}")
    snapshots = sorted(
        (
            p.data_plane_bytes / MiB,
            1e3 * statistics.median(s.snapshot_s for s in p.saves),
            1e3 * max(s.snapshot_s for s in p.saves),
        )
        for p in points
        if p.upload_timing == "staged" and p.saves and p.destination == "local"
    )
    if snapshots:
        xs = [x for x, _, _ in snapshots]
        for ax in axes:
            ax.plot(xs, [m for _, m, _ in snapshots], ":", color="gray", label="TQ snapshot, median save (local)")
            ax.plot(xs, [w for _, _, w in snapshots], ":", color="black", label="TQ snapshot, slowest save (local)")
    idle: dict[float, list[float]] = {}  # local whole-commit p99 outside saves, every upload timing's point
    for p in points:
        if p.destination == "local":
            idle.setdefault(p.data_plane_bytes / MiB, []).append(p.latency_idle.p99_ms)
    if idle:
        xs = sorted(idle)
        median = [statistics.median(idle[x]) for x in xs]
        axes[-1].plot(xs, median, "-", color="silver", lw=3, label="whole commit p99, no save (local)")
    all_sizes = sorted({p.data_plane_bytes / MiB for p in points})
    for ax, (_field, _metric, title) in zip(axes, BARRIER_PANELS, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_sizes, [f"{x:.0f}" for x in all_sizes])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("data plane (MiB)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("ms")
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle("rollout commits while a checkpoint is saved (rlckpt bench barrier)")
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def save_restore_table(results: Sequence[Any], first_step: Any | None) -> str:
    """Markdown: rlckpt vs raw save and restore per destination (best of the repeats), and the
    fresh-cluster resume figures when measured."""
    header = (
        "| destination | data plane + policy | rlckpt bundle | rlckpt save | raw save (snapshot + copy) | "
        "raw copy only | rlckpt restore | raw restore (download + load) | raw download only |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for r in results:
        lines.append(
            f"| {r.destination} | {(r.data_plane_bytes + r.policy_bytes) / MiB:.0f} MiB | "
            f"{r.bundle_bytes / MiB:.0f} MiB | "
            f"{min(r.save_s):.2f} s | {min(r.raw_save_s):.2f} s | {min(r.raw_copy_s):.2f} s | "
            f"{min(r.restore_s):.2f} s | {min(r.raw_restore_s):.2f} s | {min(r.raw_download_s):.2f} s |"
        )
    text = header + "\n".join(lines) + "\n"
    if first_step is not None:
        text += (
            "\nFresh cluster, resume from S3 (`rlckpt train`, empty staging dir), seconds after process start:\n\n"
            "| resumed step | restore_run (driver's figure) | Ray + TQ up and bundle restored | "
            "first train step done |\n"
            "|---:|---:|---:|---:|\n"
            f"| {first_step.resumed_step} | {first_step.restore_s:.2f} s | {first_step.to_resumed_s:.1f} s | "
            f"{first_step.to_first_step_s:.1f} s |\n"
        )
    return text
