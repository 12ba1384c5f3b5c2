"""rlckpt's benchmarks, each run from the repository's root as `python -m benchmarks.NAME --help`:

    save_restore       a whole bundle's save/restore vs a raw copy; --async: train-pump downtime; --two-tier
    policy             sharded policy (FSDP2 + AdamW) save/load: rlckpt.dcp vs DCP's writers and the AWS connector
    store_scale        commit cost by number of participants, and a writer's cost by number of files
    s3_ceiling         raw PUT/GET of the same bytes: the S3 server's ceiling
    s3_save_occupancy  what an S3 save occupies (threads, buffers) while it runs
    store_throughput   the store's raw write/read throughput, local and S3
    stop_bound         how long `rlckpt train` takes to stop on SIGTERM while S3 is silent
    silent_remote      two tiers with a remote that stops answering
    dataplane_snapshot TransferQueue's snapshot sizes and times
    manifest_parse     manifest parse time by file count
    grpo_reward_curve  the GRPO job's reward over steps

`rlckpt bench barrier` (the barrier window's stall, a job users run) stays a command of the package
(rlckpt.bench). Shared parts: `benchmarks.lib` (the measurements behind each benchmark here),
rlckpt.bench.harness (destinations, servers, run metadata), rlckpt.bench.report (JSON, Markdown, plots).
Results: benchmarks/results/ (docs/benchmarks.md). The benchmarks reuse the tests' rank and fault helpers
(tests/support, imported as `support`), put on the path here.
"""

from __future__ import annotations

import sys
from pathlib import Path

_SUPPORT = str(Path(__file__).resolve().parents[1] / "tests")
if _SUPPORT not in sys.path:
    sys.path.append(_SUPPORT)
