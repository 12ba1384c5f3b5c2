"""Small summaries of duration samples (seconds in, milliseconds out) for benchmark tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Summary:
    """Count and p50 / p99 / max of a set of durations, in milliseconds (0 when empty)."""

    n: int
    p50_ms: float
    p99_ms: float
    max_ms: float


def summarize(seconds: Sequence[float]) -> Summary:
    """p50, p99 (linear interpolation) and max of ``seconds``, reported in milliseconds."""
    if not seconds:
        return Summary(0, 0.0, 0.0, 0.0)
    values = np.asarray(seconds, dtype=float) * 1e3
    return Summary(
        n=int(values.size),
        p50_ms=float(np.percentile(values, 50)),
        p99_ms=float(np.percentile(values, 99)),
        max_ms=float(values.max()),
    )
