"""Retention: which committed bundles gc keeps (docs/store-protocol.md, gc). Each rule keeps some bundles and
gc deletes what no rule keeps; without any rule nothing is deleted.

- `keep_last` K: the K newest bundles that fully verify;
- `keep_every` N: every bundle whose step is a multiple of N, forever;
- `keep_best` K by `metric`: the K bundles that fully verify with the best value of the number the run
  recorded in the manifest's metadata under `metrics.<metric>` (highest, or lowest with `lower_is_better`);
- `holds`: steps the caller needs kept, each with its reason (a tier's bundles not yet replicated).

Whatever the rules, the newest bundle that verifies is kept, and a bundle that fails a check is never
deleted (kept and reported as corrupt).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

METRICS_KEY = "metrics"  # manifest metadata: {"metrics": {"reward": 0.81, ...}}

logger = logging.getLogger(__name__)


def finite_metrics(metrics: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`metrics` without its NaN and infinite numbers (a diverged run's loss), each dropped with one warning
    naming them: a diverged run still checkpoints, JSON holds no such number, and `keep_best` ranks only
    bundles that record a finite value. Anything else is kept, for the record's own check to judge.

    Raises:
        TypeError: `metrics` is not a mapping.
    """
    if not isinstance(metrics, Mapping):
        raise TypeError(f"{where}: metrics must be a mapping of name -> number, got {type(metrics).__name__}")
    dropped = {name: value for name, value in metrics.items() if isinstance(value, float) and not math.isfinite(value)}
    if dropped:
        shown = ", ".join(f"{name}={value}" for name, value in dropped.items())
        logger.warning("%s: metrics not recorded, not finite: %s (keep_best passes over this bundle)", where, shown)
    return {name: value for name, value in metrics.items() if name not in dropped}


@dataclass(frozen=True)
class Retention:
    """The retention rules of one gc (module doc)."""

    keep_last: int | None = None
    keep_every: int | None = None
    keep_best: int | None = None
    metric: str | None = None
    lower_is_better: bool = False
    holds: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("keep_last", "keep_every", "keep_best"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1 (the newest good bundle is never deleted), got {value!r}")
        if (self.keep_best is None) != (self.metric is None):
            raise ValueError(
                f"keep_best and metric go together: keep the K best by a metric (got keep_best={self.keep_best!r}, "
                f"metric={self.metric!r})"
            )
        if self.metric is not None and (not isinstance(self.metric, str) or not self.metric):
            raise ValueError(f"metric must be a non-empty name, got {self.metric!r}")

    @property
    def deletes(self) -> bool:
        """Whether any rule is given: without one, gc deletes no committed bundle."""
        return any(rule is not None for rule in (self.keep_last, self.keep_every, self.keep_best))

    def metric_value(self, metadata: Mapping[str, Any]) -> float | None:
        """The value of `metric` a manifest's metadata records, or None when it holds no finite number there."""
        metrics = metadata.get(METRICS_KEY)
        value = metrics.get(self.metric) if isinstance(metrics, Mapping) and self.metric is not None else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        return float(value)

    def describe(self) -> str:
        """The rules in words, for the reason a bundle is deleted."""
        rules = []
        if self.keep_last is not None:
            rules.append(f"not among the {self.keep_last} newest good bundles")
        if self.keep_every is not None:
            rules.append(f"its step not a multiple of {self.keep_every}")
        if self.keep_best is not None:
            order = "lowest" if self.lower_is_better else "highest"
            rules.append(f"not among the {self.keep_best} good bundles of {order} {self.metric}")
        return ", ".join(rules) or "no rule keeps it"
