"""Reports of `python -m benchmarks.policy`: markdown tables (S3 destinations and local disk), the target verdicts, the
systems skipped, and a plot."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from benchmarks.lib.policy import DCP, FSSPEC, LABELS, RLCKPT, S3TC, TARGETS, PointResult, TargetCheck
from rlckpt.bench.rows import MiB


def _limit(kind: str, op: str, against: str, memory: bool = False) -> float | None:
    for t in TARGETS:
        if (t.kind, t.op, t.against, t.memory) == (kind, op, against, memory):
            return t.limit
    return None


def _ratio(p: PointResult, op: str, against: str, memory: bool = False) -> str:
    """rlckpt over `against` at `p`, in bold when it misses its target; "-" where `against` was not measured, or
    not where rlckpt was (a save through the ETag proxy)."""
    if not p.compared(against, op):
        return "-"
    value = p.ratio(op, against, memory)
    if math.isnan(value):
        return "-"
    limit = _limit(p.kind, op, against, memory)
    text = f"{value:.2f}×"
    return text if limit is None or value <= limit else f"**{text}**"


def _shown(p: PointResult, system: str, op: str, text: str) -> str:
    """A figure as measured; in parentheses when it was not measured where rlckpt's was (the proxy)."""
    return text if p.compared(system, op) else f"({text})"


def _seconds(p: PointResult, system: str, op: str) -> str:
    return _shown(p, system, op, f"{p.median(system, op):.2f}") if p.measured(system) else "-"


def _mib(p: PointResult, system: str, op: str) -> str:
    value = p.memory(system, op) if p.measured(system) else float("nan")
    return "-" if math.isnan(value) else _shown(p, system, op, f"{value:.0f}")


def _run_column(points: Sequence[PointResult]) -> tuple[str, str]:
    """The header and separator of the `run` column, shown only in a result merged from several runs."""
    return (" run |", "---|") if any(p.run for p in points) else ("", "")


def _row_end(p: PointResult, points: Sequence[PointResult]) -> str:
    """The last cells of a point's row: verified, repeats, and its `run` when a point of the table has one."""
    verified = "yes" if all(m.verified for m in p.measurements) else "**NO**"
    run = f" {p.run or '-'} |" if any(q.run for q in points) else ""
    return f"| {verified} | {len(p.times(RLCKPT, 'save'))} |{run}"


def s3_table(points: Sequence[PointResult]) -> str:
    """One row per S3 point: median save and load (s) of rlckpt, s3torchconnector and DCP's fsspec writer, the
    ratios the targets judge (**bold**: missed), the extra memory per rank (MiB, the largest rank's)."""
    s3 = [p for p in points if p.kind == "s3"]
    header = (
        "| destination | ranks | state | save s: rlckpt / s3tc / fsspec | save / s3tc | save / fsspec "
        "| load s: rlckpt / s3tc / fsspec | load / s3tc | load / fsspec "
        "| save +MiB: rlckpt / s3tc / fsspec | load +MiB: rlckpt / s3tc / fsspec | verified | n |{}\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|{}\n"
    ).format(*_run_column(s3))
    lines = []
    for p in sorted(s3, key=lambda p: (p.destination, p.size_mib, p.ranks)):
        systems = (RLCKPT, S3TC, FSSPEC)
        lines.append(
            f"| {p.destination} | {p.ranks} | {p.state_bytes / MiB:.0f} MiB "
            f"| {' / '.join(_seconds(p, s, 'save') for s in systems)} "
            f"| {_ratio(p, 'save', S3TC)} | {_ratio(p, 'save', FSSPEC)} "
            f"| {' / '.join(_seconds(p, s, 'load') for s in systems)} "
            f"| {_ratio(p, 'load', S3TC)} | {_ratio(p, 'load', FSSPEC)} "
            f"| {' / '.join(_mib(p, s, 'save') for s in systems)} "
            f"| {' / '.join(_mib(p, s, 'load') for s in systems)} " + _row_end(p, s3)
        )
    return header + "\n".join(lines) + "\n" if lines else ""


def local_table(points: Sequence[PointResult]) -> str:
    """One row per local-disk point: rlckpt against DCP's FileSystemWriter/Reader and the checked floor (DCP's
    load + one BLAKE3 pass), and the extra memory per rank."""
    local = [p for p in points if p.kind == "local"]
    header = (
        "| destination | ranks | state | save s: rlckpt / DCP | save / DCP | load s: rlckpt / DCP / checked floor "
        "| load / floor | load / DCP | save +MiB: rlckpt / DCP | load +MiB: rlckpt / DCP | verified | n |{}\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|{}\n"
    ).format(*_run_column(local))
    lines = []
    for p in sorted(local, key=lambda p: (p.destination, p.size_mib, p.ranks)):
        floor = f"{p.floor:.2f}" if p.floor_times() else "-"
        lines.append(
            f"| {p.destination} | {p.ranks} | {p.state_bytes / MiB:.0f} MiB "
            f"| {_seconds(p, RLCKPT, 'save')} / {_seconds(p, DCP, 'save')} | {_ratio(p, 'save', DCP)} "
            f"| {_seconds(p, RLCKPT, 'load')} / {_seconds(p, DCP, 'load')} / {floor} "
            f"| {_ratio(p, 'load', 'floor')} | {_ratio(p, 'load', DCP)} "
            f"| {_mib(p, RLCKPT, 'save')} / {_mib(p, DCP, 'save')} "
            f"| {_mib(p, RLCKPT, 'load')} / {_mib(p, DCP, 'load')} " + _row_end(p, local)
        )
    return header + "\n".join(lines) + "\n" if lines else ""


def policy_table(points: Sequence[PointResult]) -> str:
    """Both tables, S3 first."""
    return "\n".join(t for t in (s3_table(points), local_table(points)) if t)


def skipped_note(points: Sequence[PointResult]) -> str:
    """One line per destination, system and reason not measured (a reason of the whole destination once, a
    failure at one point once per point)."""
    seen = dict.fromkeys((p.destination, system, why) for p in points for system, why in p.skipped.items())
    return "".join(f"- {dest}: {LABELS.get(system, system)} not measured: {why}\n" for dest, system, why in seen)


def proxied_note(points: Sequence[PointResult]) -> str:
    """One line per destination where a system saved through the ETag proxy: its save is shown in parentheses,
    not compared, and its load was measured direct, beside rlckpt's."""
    seen = dict.fromkeys((p.destination, system) for p in points for system in p.proxied_saves if p.measured(system))
    return "".join(
        f"- {dest}: {LABELS.get(system, system)} saved through the ETag proxy (the server refuses its saves "
        "directly) and loaded direct, as rlckpt does: its saves are in parentheses and not compared\n"
        for dest, system in seen
    )


def targets_summary(checks: Sequence[TargetCheck]) -> str:
    """Per destination and target: how many points met it, and the worst ratio."""
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


_STYLE = {RLCKPT: ("C0", "o"), DCP: ("C2", "s"), FSSPEC: ("C2", "s"), S3TC: ("C3", "^")}


def policy_plot(points: Sequence[PointResult], path: Path) -> Path:
    """PNG: per destination (columns) and size (rows), aggregate save (solid) and load (dashed) throughput
    (MiB/s) of every system against the rank count; the checked floor dotted on local disk."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    destinations = sorted({p.destination for p in points})
    sizes = sorted({p.size_mib for p in points})
    fig, axes = plt.subplots(
        len(sizes), len(destinations), figsize=(4.4 * len(destinations), 3.4 * len(sizes)), squeeze=False
    )
    for row, size in enumerate(sizes):
        for col, dest in enumerate(destinations):
            ax = axes[row][col]
            series = sorted((p for p in points if p.destination == dest and p.size_mib == size), key=lambda p: p.ranks)
            ranks = [p.ranks for p in series]
            systems = [s for s in (RLCKPT, S3TC, FSSPEC, DCP) if any(p.measured(s) for p in series)]
            for system in systems:
                color, marker = _STYLE[system]
                for op, line in (("save", "-"), ("load", "--")):
                    if not any(p.compared(system, op) for p in series):
                        continue  # e.g. the connector's saves through the proxy, on the direct destination
                    ax.plot(
                        ranks,
                        [p.mib_per_s(system, op) if p.compared(system, op) else float("nan") for p in series],
                        line,
                        color=color,
                        marker=marker,
                        label=f"{LABELS[system].split(' ')[0] if system != FSSPEC else 'DCP fsspec'} {op}",
                    )
            if series and all(p.floor_times() for p in series):
                floor = [p.state_bytes / MiB / p.floor for p in series]
                ax.plot(ranks, floor, ":", color="C1", marker="v", label="checked floor (DCP load + BLAKE3)")
            ax.set_xticks(ranks)
            ax.set_title(f"{dest}, {size:g} MiB state")
            ax.set_xlabel("ranks")
            ax.set_ylabel("aggregate MiB/s")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle("sharded policy (FSDP2 + AdamW) save / load: rlckpt.dcp and its peers (python -m benchmarks.policy)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
