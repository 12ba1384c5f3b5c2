"""Faults inside one trainer rank's DCP save, for crash tests: a save planner that raises, or ends the
rank's process with ``os._exit``, while the rank writes its shards (DCP calls ``resolve_data`` for every
item inside the storage writer's ``write_data``, in the save's background thread); or a planner the rank
cannot make at all (``refuse``: the factory raises).

``python -m support.rank_faults STEP RANK HOW train ARGS...`` is the real ``rlckpt train`` with
that fault installed (HOW: ``raise`` or ``exit``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Literal

from torch.distributed.checkpoint import DefaultSavePlanner

logger = logging.getLogger(__name__)

FaultKind = Literal["raise", "exit", "refuse"]
EXIT_CODE = 17


class InjectedRankFault(RuntimeError):
    """The fault a test asked for; never raised by rlckpt itself."""


class _FaultingPlanner(DefaultSavePlanner):
    """DCP's default planner, failing at the first item this rank writes."""

    def __init__(self, rank: int, step: int, how: FaultKind) -> None:
        super().__init__()
        self.rank, self.step, self.how = rank, step, how

    def resolve_data(self, write_item: Any) -> Any:
        if self.how == "exit":
            logger.warning("rank %d: exiting in the middle of the save of step %d (test fault)", self.rank, self.step)
            os._exit(EXIT_CODE)
        raise InjectedRankFault(f"rank {self.rank}: injected failure while writing step {self.step}")


@dataclass(frozen=True)
class FailRankSave:
    """Give rank ``rank``'s save of ``step`` a planner that fails as ``how`` says (picklable: it travels
    to the rank actors). A ``SavePlannerFactory`` for ``TrainerRank``."""

    step: int
    rank: int
    how: FaultKind = "raise"

    def __call__(self, rank: int, step: int) -> DefaultSavePlanner | None:
        if (rank, step) != (self.rank, self.step):
            return None
        if self.how == "refuse":
            raise InjectedRankFault(f"rank {rank}: injected: no planner for step {step}")
        return _FaultingPlanner(rank, step, self.how)


def main(argv: list[str] | None = None) -> int:
    """Parse ``STEP RANK HOW train ARGS...`` and run ``rlckpt train ARGS...`` with the fault installed."""
    from rlckpt.cli import train

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 4 or argv[2] not in ("raise", "exit"):
        module = __spec__.name if __spec__ else __name__
        raise SystemExit(f"usage: python -m {module} STEP RANK raise|exit train ARGS...")
    step, rank, how, *rlckpt_argv = argv
    parser = argparse.ArgumentParser(prog="rlckpt")
    train.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(rlckpt_argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return train.run(args, save_planner=FailRankSave(int(step), int(rank), how))  # type: ignore[arg-type]


if __name__ == "__main__":
    raise SystemExit(main())
