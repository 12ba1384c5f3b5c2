"""End-to-end save/restore benchmark: a thin wrapper over `rlckpt bench save` (code in rlckpt.bench).

    .venv/bin/python benchmarks/save_restore.py                  # 256 MiB data plane + 64 MiB policy
    .venv/bin/python benchmarks/save_restore.py --size 64 --no-first-step
    .venv/bin/python benchmarks/save_restore.py --help

Results: benchmarks/results/save_restore.{json,md}; see docs/benchmarks.md.
"""

import sys

from rlckpt.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "save", *sys.argv[1:]]))
