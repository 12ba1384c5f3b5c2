"""Reports of `python -m benchmarks.compression`: one row per point (rlckpt with and without byte-plane compression
beside the other systems), the goals of issue 40 judged at every point, and the S3 PUT ceiling they are held to."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.lib.policy import DCP, FSSPEC, RLCKPT, RLCKPT_Z, S3TC, PointResult
from rlckpt.bench.rows import MiB

GiB = 1024 * MiB
# The destinations whose raw PUT ceiling `python -m benchmarks.s3_ceiling` measured, by the path it names them.
CEILING_PATHS = {"s3-rgw": "direct", "s3-rgw-etag-proxy": "etag-proxy"}


@dataclass(frozen=True)
class Goal:
    """One goal at one point: `value` (a ratio) at most `limit`."""

    goal: str
    where: str
    value: float
    limit: float
    detail: str

    @property
    def met(self) -> bool:
        return self.value <= self.limit


def ceilings(path: Path) -> dict[str, float]:
    """MiB/s of the fastest raw PUT (any number in flight) per destination, from an s3_ceiling result ({} if none)."""
    try:
        results = json.loads(path.read_text())["results"]
    except (OSError, ValueError, KeyError):
        return {}
    out = {}
    for dest, name in CEILING_PATHS.items():
        puts = [r["mib_per_s"] for r in results.get(name, []) if r.get("op") == "put"]
        if puts:
            out[dest] = max(puts)
    return out


def _stored_ratio(p: PointResult) -> float:
    return p.median_of(RLCKPT_Z, "stored_bytes") / p.median_of(RLCKPT, "stored_bytes")


def _ratio(p: PointResult, op: str, against: str) -> float:
    if not p.compared(against, op):
        return math.nan
    return p.median(RLCKPT_Z, op) / p.median(against, op)


def goals(points: Sequence[PointResult], ceiling: dict[str, float]) -> list[Goal]:
    """Issue 40's goals at each point they apply to: trained bf16 (bytes stored, S3 save against the connector and
    the raw PUT ceiling of the raw bytes, load against rlckpt uncompressed) and random bits (bytes stored, save)."""
    out: list[Goal] = []
    for p in points:
        if not (p.measured(RLCKPT) and p.measured(RLCKPT_Z)):
            continue
        where = f"{p.destination}, {p.ranks} ranks, {p.state_bytes / MiB:.0f} MiB {p.draw}"
        stored = _stored_ratio(p)
        if p.draw == "trained-bf16":
            out.append(Goal("stored <= 0.80x raw", where, stored, 0.80, f"{stored:.3f}"))
            if p.kind == "s3" and not math.isnan(r := _ratio(p, "save", S3TC)):
                out.append(Goal("S3 save <= 0.85x s3torchconnector", where, r, 0.85, _secs(p, RLCKPT_Z, S3TC, "save")))
            if p.destination in ceiling:
                floor_s = p.state_bytes / MiB / ceiling[p.destination]
                r = p.median(RLCKPT_Z, "save") / floor_s
                out.append(
                    Goal(
                        "S3 save <= 0.85x the raw PUT ceiling",
                        where,
                        r,
                        0.85,
                        f"{p.median(RLCKPT_Z, 'save'):.2f} s vs {floor_s:.2f} s ({ceiling[p.destination]:.0f} MiB/s)",
                    )
                )
            r = _ratio(p, "load", RLCKPT)
            out.append(Goal("load <= 1.10x uncompressed", where, r, 1.10, _secs(p, RLCKPT_Z, RLCKPT, "load")))
        if p.draw.startswith("random-"):
            out.append(Goal("stored <= 1.001x raw", where, stored, 1.001, f"{stored:.4f}"))
            r = _ratio(p, "save", RLCKPT)
            out.append(Goal("save <= 1.05x uncompressed", where, r, 1.05, _secs(p, RLCKPT_Z, RLCKPT, "save")))
    return out


def _secs(p: PointResult, system: str, against: str, op: str) -> str:
    return f"{p.median(system, op):.2f} s vs {p.median(against, op):.2f} s"


def _s(p: PointResult, system: str, op: str) -> str:
    if not p.measured(system):
        return "-"
    text = f"{p.median(system, op):.2f}"
    return text if p.compared(system, op) else f"({text})"


def _x(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}×"


def _cpu_per_gib(p: PointResult, system: str) -> str:
    value = p.median_of(system, "save_cpu_s")
    return "-" if math.isnan(value) else f"{value / (p.state_bytes / GiB):.2f}"


def table(points: Sequence[PointResult]) -> str:
    """One row per point: bytes stored, save and load times of rlckpt raw and compressed beside the others."""
    header = (
        "| destination | ranks | draw | state | stored: zstd / raw | save s: raw / zstd / s3tc / fsspec or DCP "
        "| zstd / raw | zstd / s3tc | load s: raw / zstd | zstd / raw | save CPU s per GiB: raw / zstd | verified |\n"
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
    )
    lines = []
    for p in sorted(points, key=lambda p: (p.destination, p.draw, p.ranks, p.size_mib)):
        other = DCP if p.kind == "local" else FSSPEC
        verified = "yes" if all(m.verified for m in p.measurements) else "**NO**"
        lines.append(
            f"| {p.destination} | {p.ranks} | {p.draw} | {p.state_bytes / MiB:.0f} MiB | {_x(_stored_ratio(p))} "
            f"| {' / '.join(_s(p, s, 'save') for s in (RLCKPT, RLCKPT_Z, S3TC, other))} "
            f"| {_x(_ratio(p, 'save', RLCKPT))} | {_x(_ratio(p, 'save', S3TC))} "
            f"| {_s(p, RLCKPT, 'load')} / {_s(p, RLCKPT_Z, 'load')} | {_x(_ratio(p, 'load', RLCKPT))} "
            f"| {_cpu_per_gib(p, RLCKPT)} / {_cpu_per_gib(p, RLCKPT_Z)} | {verified} |"
        )
    return header + "\n".join(lines) + "\n" if lines else "Nothing measured.\n"


def goals_table(checks: Sequence[Goal]) -> str:
    if not checks:
        return "No goal applies to the points measured.\n"
    rows = [
        f"| {g.goal} | {g.where} | {g.value:.3f} | {'met' if g.met else '**missed**'} | {g.detail} |" for g in checks
    ]
    return "| goal | where | value | verdict | detail |\n|---|---|---:|---|---|\n" + "\n".join(rows) + "\n"
