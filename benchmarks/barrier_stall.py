"""Barrier-window stall benchmark: a thin wrapper over `rlckpt bench barrier` (code in rlckpt.bench).

    .venv/bin/python benchmarks/barrier_stall.py                 # 16/64/256 MiB x local/S3 x inline/staged
    .venv/bin/python benchmarks/barrier_stall.py --saves 5
    .venv/bin/python benchmarks/barrier_stall.py --rgw-endpoint http://127.0.0.1:7480
    .venv/bin/python benchmarks/barrier_stall.py --help

Results: benchmarks/results/barrier_stall.{json,md,png}; see docs/benchmarks.md.
"""

import sys

from rlckpt.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "barrier", *sys.argv[1:]]))
