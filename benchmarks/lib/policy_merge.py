"""One policy result out of several runs: the policy benchmark is run lane by lane (RGW needs its own server, a
full matrix takes hours), and `python -m benchmarks.policy --merge A.json B.json ...` keeps, for each
(destination, ranks, size), the point of the latest run that measured it, each point naming its run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks.lib.digest_speed import DigestSpeed
from benchmarks.lib.policy import PointResult, points_from_document

# The settings a merged table states once: runs that differ in any of them are not merged.
SHARED_SETTINGS = ("repeats", "warm_up", "thread_count", "verify")


class MergeRefused(ValueError):
    """Runs that cannot share one table (different settings, or not policy results)."""


@dataclass(frozen=True)
class Merged:
    """The points kept (each with its run's label in `run`), the runs they came from, newest last."""

    points: list[PointResult]
    runs: list[dict[str, Any]]
    config: dict[str, Any]
    digests: list[DigestSpeed]


def run_label(meta: dict[str, Any]) -> str:
    """A run's name in a merged table: its commit and UTC date, e.g. `2754daf 2026-12-04 22:26`."""
    return f"{meta.get('git_commit', '?')} {str(meta.get('date_utc', '?'))[:16]}"


def merge_documents(documents: list[dict[str, Any]]) -> Merged:
    """Every point of the latest run that measured it; runs that kept no point are left out of `runs`."""
    if not documents:
        raise MergeRefused("nothing to merge")
    for doc in documents:
        if doc.get("benchmark") != "policy":
            raise MergeRefused(f"not a policy result: benchmark {doc.get('benchmark')!r}")
    settings = {tuple(doc["config"].get(k) for k in SHARED_SETTINGS) for doc in documents}
    if len(settings) > 1:
        raise MergeRefused(f"runs differ in {', '.join(SHARED_SETTINGS)}: {sorted(map(str, settings))}")
    ordered = sorted(documents, key=lambda d: str(d["meta"].get("date_utc", "")))
    kept: dict[tuple[str, int, float], tuple[PointResult, int]] = {}
    for index, doc in enumerate(ordered):
        for p in points_from_document(doc):
            p.run = run_label(doc["meta"])
            kept[(p.destination, p.ranks, p.size_mib)] = (p, index)
    used = sorted({index for _, index in kept.values()})
    config = dict(ordered[-1]["config"])
    config["sizes_mib"] = sorted({p.size_mib for p, _ in kept.values()})
    config["ranks"] = sorted({p.ranks for p, _ in kept.values()})
    config["rgw_reclaim"] = next((d["config"]["rgw_reclaim"] for d in ordered if d["config"].get("rgw_reclaim")), None)
    return Merged(
        points=[p for p, _ in kept.values()],
        runs=[ordered[i]["meta"] for i in used],
        config=config,
        digests=[DigestSpeed(**d) for d in ordered[used[-1]].get("digests", [])],
    )


def runs_list(runs: list[dict[str, Any]]) -> str:
    """Markdown: one line per merged run, its label, command and load average."""
    return "".join(
        f"- `{run_label(m)}`: `{m.get('command', '?')}` (load average {m.get('load_average_1m', float('nan')):.1f} "
        f"at start)\n"
        for m in runs
    )
