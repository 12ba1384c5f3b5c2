"""The bundles older rlckpt versions wrote (``tests/fixtures/run_format_<N>/``, made by the old code; the
README there says how), and a rank body that loads their one-file policy into spawned trainer ranks.

The rank bodies live in the package, not in a test module, because spawned ranks unpickle them by module
name (see ``testing/trainer_ranks.py``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlckpt.checkpoint import layout
from rlckpt.checkpoint.restore import PolicyLocation
from rlckpt.checkpoint.run_format import POLICY_WHOLE
from rlckpt.controller.ranks.trainer_rank import TrainerRank
from rlckpt.grpo import GRPOConfig
from rlckpt.store import BundleStore
from support.dcp_ranks import flat_tensors, full_state

SAVED_STEP = 2  # every fixture holds one bundle: step 2 of `rlckpt train --steps 2` run by the old code
CONFIG = GRPOConfig()  # what `rlckpt train` trained them with


@dataclass(frozen=True)
class OldBundle:
    """One fixture dir (``tests/fixtures/run_format_<N>/``): ``run/``, the old code's run dir, and its
    ``--json`` summaries: ``old_run.json`` (the run that wrote the bundle) and ``old_resume_to_4.json``
    (the old code resuming a copy of it to step 4)."""

    path: Path
    run_format: int

    def summary(self, name: str = "old_run") -> dict[str, Any]:
        summary: dict[str, Any] = json.loads((self.path / f"{name}.json").read_text())
        return summary

    def copy_run(self, dest: Path) -> str:
        """A copy of the run dir under `dest` (a test never writes into the fixture itself)."""
        target = dest / self.path.name
        shutil.copytree(self.path / "run", target)
        return str(target)


def whole_policy_location(run_dir: str) -> PolicyLocation:
    return PolicyLocation(BundleStore(run_dir).url, {}, SAVED_STEP, layout.POLICY_FILE, POLICY_WHOLE)


def load_whole_policy_into_ranks(rank: int, world_size: int, port: int, run_dir: str, out: str) -> None:
    """A trainer rank in a gloo group of `world_size` (as `rlckpt train --trainer-ranks` forms it) loads
    the fixture's one-file policy; rank 0 writes the loaded digest, version and full state to `out`."""
    trainer_rank = TrainerRank(CONFIG, rank, world_size)
    trainer_rank.join_group("127.0.0.1", port)
    try:
        version = trainer_rank.load_policy(whole_policy_location(run_dir))
        trainer = trainer_rank.trainer
        full = flat_tensors(full_state(trainer.model, trainer.optimizer))  # a collective: every rank
        sha = trainer_rank.policy_sha256()
        if rank == 0:
            torch.save({"sha": sha, "version": version, "full": full}, out)
    finally:
        trainer_rank.leave_group()
