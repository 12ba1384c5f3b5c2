"""Gates for end-to-end tests: a real run waits at a named point until the test opens the gate.

A gate is two files in a directory both sides see: the run touches ``NAME.reached`` when it gets
there and waits until ``NAME.open`` exists. The test waits for ``.reached``, acts at exactly that
point (sends a SIGTERM), then opens the gate, or never does. ``GatedRun`` puts gates at the seams a
run has, as picklable hooks (they travel to the controller actor and the trainer ranks):

- ``generate``: the rollout pump, once batch STEP is drawn and reserved, before it is generated
- ``upload``: inside every trainer rank's write of the policy of step STEP (the background upload)
- ``commit``: the save of step STEP, every piece written, just before its COMMIT

and, in the driver's start-up (no STEP; the gate is named after the point):

- ``ray-init``: inside the private cluster's start, once ``ray.init`` has returned (its own SIGTERM
  handler installed, the cluster's processes running) and before the start is over
- ``setup``: Ray started, before TransferQueue, the trainer ranks and the restore

``python -m support.gates DIR POINT[:STEP][,POINT[:STEP]...] train ARGS...`` is the real
``rlckpt train`` with those gates in DIR, named ``POINT-STEP`` (``POINT`` at start-up).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import DefaultSavePlanner

logger = logging.getLogger(__name__)

POINTS = ("generate", "upload", "commit")
START_POINTS = ("ray-init", "setup")  # in the driver's start-up: no step
POLL_S = 0.05  # how often a waiting run looks for the open gate (a file another process creates)


@dataclass(frozen=True)
class Gate:
    """One named gate in ``directory``."""

    directory: str
    name: str

    @property
    def reached_path(self) -> Path:
        return Path(self.directory) / f"{self.name}.reached"

    @property
    def open_path(self) -> Path:
        return Path(self.directory) / f"{self.name}.open"

    def open(self) -> None:
        """The test side: let every run waiting here go on."""
        self.open_path.touch()

    async def pass_through(self) -> None:
        """The run side, on an event loop: say it is here, wait until the gate is open."""
        self._arrive()
        while not self.open_path.exists():
            await asyncio.sleep(POLL_S)

    def pass_through_blocking(self) -> None:
        """The run side, in a thread of its own (a trainer rank's save)."""
        self._arrive()
        while not self.open_path.exists():
            time.sleep(POLL_S)

    def _arrive(self) -> None:
        logger.warning("gate %s reached: waiting until the test opens it", self.name)
        self.reached_path.touch()


@dataclass(frozen=True)
class GatedRun:
    """The gates of one run: ``(point, step)`` pairs in ``directory``. Its methods are the run's hooks."""

    directory: str
    points: frozenset[tuple[str, int]]

    def gate(self, point: str, step: int) -> Gate:
        return Gate(self.directory, point if point in START_POINTS else f"{point}-{step}")

    def install_start_gates(self) -> None:
        """Wrap the driver's start-up calls at the start points asked for (this process only)."""
        import ray

        from rlckpt.controller import setup

        if ("ray-init", 0) in self.points:
            real_init, ray_init_gate = ray.init, self.gate("ray-init", 0)

            def gated_init(*args: Any, **kwargs: Any) -> Any:
                context = real_init(*args, **kwargs)
                ray_init_gate.pass_through_blocking()
                return context

            ray.init = gated_init
        if ("setup", 0) in self.points:
            real_setup, setup_gate = setup.setup_single_controller, self.gate("setup", 0)

            def gated_setup(*args: Any, **kwargs: Any) -> Any:
                setup_gate.pass_through_blocking()
                return real_setup(*args, **kwargs)

            setup.setup_single_controller = gated_setup

    async def before_generate(self, step: int) -> None:
        if ("generate", step) in self.points:
            await self.gate("generate", step).pass_through()

    async def before_commit(self, step: int) -> None:
        if ("commit", step) in self.points:
            await self.gate("commit", step).pass_through()

    def save_planner(self, rank: int, step: int) -> DefaultSavePlanner | None:
        """A ``SavePlannerFactory``: the rank's DCP save of ``step`` waits at its first item."""
        if ("upload", step) not in self.points:
            return None
        return _GatedPlanner(self.gate("upload", step))


class _GatedPlanner(DefaultSavePlanner):
    """DCP's default planner, waiting at a gate before the first item this rank writes (DCP calls
    ``resolve_data`` for every item inside the storage writer's ``write_data``)."""

    def __init__(self, gate: Gate) -> None:
        super().__init__()
        self.gate = gate
        self.passed = False

    def resolve_data(self, write_item: Any) -> Any:
        if not self.passed:
            self.gate.pass_through_blocking()
            self.passed = True
        return super().resolve_data(write_item)


def parse_points(text: str) -> frozenset[tuple[str, int]]:
    """``generate:5,commit:5,setup`` → {("generate", 5), ("commit", 5), ("setup", 0)}."""
    points = set()
    for item in text.split(","):
        point, _, step = item.partition(":")
        if point in START_POINTS and not step:
            points.add((point, 0))
            continue
        if point not in POINTS or not step.isdigit():
            raise ValueError(f"a gate is POINT:STEP with POINT one of {POINTS}, or one of {START_POINTS}, got {item!r}")
        points.add((point, int(step)))
    return frozenset(points)


def main(argv: list[str] | None = None) -> int:
    """Parse ``DIR POINTS train ARGS...`` and run ``rlckpt train ARGS...`` with the gates installed."""
    from rlckpt.cli import train

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3:
        module = __spec__.name if __spec__ else __name__
        raise SystemExit(f"usage: python -m {module} DIR POINT:STEP[,POINT:STEP...] train ARGS...")
    directory, points, *rlckpt_argv = argv
    gated = GatedRun(directory, parse_points(points))
    parser = argparse.ArgumentParser(prog="rlckpt")
    train.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(rlckpt_argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    gated.install_start_gates()
    return train.run(
        args,
        before_commit=gated.before_commit,
        save_planner=gated.save_planner,
        before_generate=gated.before_generate,
    )


if __name__ == "__main__":
    raise SystemExit(main())
