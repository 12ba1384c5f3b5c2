"""Reports of `rlckpt bench policy`: a markdown table per point, the target verdicts, and a plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlckpt.bench.policy import SYSTEMS, PointResult, TargetCheck
from rlckpt.bench.rows import MiB


def policy_table(points: Sequence[PointResult]) -> str:
    """One row per (destination, ranks, size): median save and load of both systems, the checked floor (local
    disk: DCP's load + one BLAKE3 pass), the ratios the targets judge (**bold**: missed), aggregate MiB/s."""
    header = (
        "| destination | ranks | state | rlckpt save | DCP save | save / DCP | rlckpt load | DCP load | checked floor "
        "| load / DCP | load / floor | save MiB/s rlckpt / DCP | load MiB/s rlckpt / DCP | verified | n |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n"
    )
    lines = []
    for p in sorted(points, key=lambda p: (p.destination, p.size_mib, p.ranks)):
        verified = all(m.verified for m in p.measurements)
        n = len(p.times("rlckpt", "save"))
        local = bool(p.floor_times())
        floor = f"{p.floor:.3f} s" if local else "-"
        load_limit = p.target("load")[0]
        load_vs_dcp = _ratio(p.ratio("load"), None if local else load_limit)
        load_vs_floor = _ratio(p.target_ratio("load"), load_limit) if local else "-"
        lines.append(
            f"| {p.destination} | {p.ranks} | {p.state_bytes / MiB:.0f} MiB | {p.median('rlckpt', 'save'):.3f} s | "
            f"{p.median('dcp', 'save'):.3f} s | {_ratio(p.ratio('save'), p.target('save')[0])} | "
            f"{p.median('rlckpt', 'load'):.3f} s | {p.median('dcp', 'load'):.3f} s | {floor} | "
            f"{load_vs_dcp} | {load_vs_floor} | "
            f"{p.mib_per_s('rlckpt', 'save'):.0f} / {p.mib_per_s('dcp', 'save'):.0f} | "
            f"{p.mib_per_s('rlckpt', 'load'):.0f} / {p.mib_per_s('dcp', 'load'):.0f} | "
            f"{'yes' if verified else '**NO**'} | {n} |"
        )
    return header + "\n".join(lines) + "\n"


def _ratio(value: float, limit: float | None) -> str:
    """A ratio, in bold when it misses `limit` (None: no target judges it)."""
    text = f"{value:.2f}×"
    return text if limit is None or value <= limit else f"**{text}**"


def targets_summary(checks: Sequence[TargetCheck]) -> str:
    """Per destination and operation: how many points met the target, and the worst ratio."""
    groups: dict[tuple[str, str], list[TargetCheck]] = {}
    for c in checks:
        groups.setdefault((c.where.split(",")[0], c.target), []).append(c)
    lines = ["| destination | target | points met | worst ratio (where) |", "|---|---|---:|---|"]
    for (dest, target), items in sorted(groups.items()):
        worst = max(items, key=lambda c: c.ratio)
        met = sum(c.met for c in items)
        lines.append(
            f"| {dest} | {target} | {met} / {len(items)} | {worst.ratio:.2f}× ({worst.where.split(', ', 1)[1]}) |"
        )
    return "\n".join(lines) + "\n"


def policy_plot(points: Sequence[PointResult], path: Path) -> Path:
    """PNG: per destination, aggregate save and load throughput (MiB/s) of both systems against the rank
    count, one panel per size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    destinations = sorted({p.destination for p in points})
    sizes = sorted({p.size_mib for p in points})
    fig, axes = plt.subplots(
        len(sizes), len(destinations), figsize=(4.2 * len(destinations), 3.4 * len(sizes)), squeeze=False
    )
    style = {
        ("rlckpt", "save"): ("C0", "-", "o"),
        ("dcp", "save"): ("C0", "--", "s"),
        ("rlckpt", "load"): ("C1", "-", "o"),
        ("dcp", "load"): ("C1", "--", "s"),
    }
    for row, size in enumerate(sizes):
        for col, dest in enumerate(destinations):
            ax = axes[row][col]
            series = sorted((p for p in points if p.destination == dest and p.size_mib == size), key=lambda p: p.ranks)
            ranks = [p.ranks for p in series]
            for op in ("save", "load"):
                for system in SYSTEMS:
                    color, line, marker = style[(system, op)]
                    label = f"{'rlckpt' if system == 'rlckpt' else 'DCP'} {op}"
                    ax.plot(
                        ranks, [p.mib_per_s(system, op) for p in series], line, color=color, marker=marker, label=label
                    )
            if series and all(p.floor_times() for p in series):
                floor = [p.state_bytes / MiB / p.floor for p in series]
                ax.plot(ranks, floor, ":", color="C1", marker="^", label="checked floor (DCP load + BLAKE3)")
            ax.set_xticks(ranks)
            ax.set_title(f"{dest}, {size:g} MiB state")
            ax.set_xlabel("ranks")
            ax.set_ylabel("aggregate MiB/s")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.suptitle("sharded policy (FSDP2 + AdamW) save / load: rlckpt.dcp vs DCP's own writer (rlckpt bench policy)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
