"""examples/single_controller_minimal.py, the walk-through of docs/trainer.md for a NeMo-RL-style single
controller, runs as documented on local disk and on S3 (moto): its bundles restore into a fresh data plane with
the same rows, index, loader position and policy."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from support.dcp_ranks import quiet_dcp_warnings

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "single_controller_minimal.py"


def test_the_single_controller_example_restores_what_it_saved(store_location, capsys):
    url, options = store_location
    main = runpy.run_path(str(EXAMPLE))["main"]
    storage = ["--storage-options", json.dumps(options)] if options else []
    assert main(["--run-dir", url, "--steps", "2", *storage]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary == {
        "bundles": [1, 2],
        "restored_step": 2,
        "restored_groups": 2,  # the rollouts for step 2, generated ahead of the trainer
        "loader": {"position": 6},
        "rows_match": True,
        "policy_match": True,
    }
