"""examples/fsdp2_torchrun.py with one rank's forward raising at a chosen step, to run under torchrun:

    torchrun ... tests/e2e/example_crashing_at.py RANK STEP <the example's arguments>

The example itself is untouched; the fault is put into its model class before its `main` runs.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fsdp2_torchrun.py"


def _load_example() -> Any:
    spec = importlib.util.spec_from_file_location("fsdp2_torchrun", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _raise_at(example: Any, rank: int, step: int) -> None:
    """Rank `rank`'s forward of step `step` (counted from the first step this process trains) raises."""
    forward = example.TinyTransformer.forward
    calls = {"n": 0}

    def failing(self: Any, tokens: Any) -> Any:
        calls["n"] += 1
        if int(os.environ["RANK"]) == rank and calls["n"] == step:
            raise RuntimeError(f"injected: rank {rank}'s forward of step {step} fails")
        return forward(self, tokens)

    example.TinyTransformer.forward = failing


if __name__ == "__main__":
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    example = _load_example()
    _raise_at(example, int(sys.argv[1]), int(sys.argv[2]))
    sys.exit(example.main(sys.argv[3:]))
