"""The Checkpointer's multi-rank scenarios, run once per backend in one spawn of two ranks (a spawn costs
seconds: each rank imports torch). Each rank records what it saw into `<workdir>/rank<r>.json`; the tests in
tests/checkpointer/test_multi_rank.py assert one behaviour each on those records and on the store.

In order, on both ranks (an FSDP2 MLP + AdamW on a CPU mesh, gloo on 127.0.0.1):
 1. restore step 1, saved by the test process at world size 1 (resharded to 2 ranks)
 2. a step of training; async save of step 2 (shared piece, each rank's own piece, metrics); wait
 3. save of step 4 with a piece on rank 1 that would need pickle: refused before anything is written
 4. save of step 4 whose DCP write fails on rank 1 (its planner): the save fails on both at wait(); then
    one whose planner rank 1 cannot even make: the same, at once on both (checkpoint/rank_save.py)
 5. stop agreement: rank 1 alone asks; both polls answer the same
 6. save of step 6 (the state of step 2): goes through after the failures
 7. in a run of its own (`closing_url`), a save of step 10 after which rank 1 raises inside its `with` block
    while its write is still held (released once its close waits): rank 1's close finishes the save, rank 0's
    wait returns the commit
 8. save of step 8 during which rank 1 dies (os._exit in its planner): rank 0's wait fails, without a hang
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from rlckpt import Checkpointer
from rlckpt.checkpointer import SaveAndStop
from support.checkpointer import DEPTH, WIDTH
from support.dcp_ranks import (
    apply_policy_state,
    bitwise_equal,
    flat_tensors,
    full_state,
    policy_state,
    process_group,
    quiet_dcp_warnings,
    sharded_policy,
    train_step,
)
from support.pause import PauseAt

DEAD_RANK_EXIT = 17


@dataclass(frozen=True)
class RanksSpec:
    """The run both ranks save into, and where they record what they saw (and the full states they saved)."""

    url: str
    storage_options: dict[str, Any] | None
    workdir: str

    @property
    def closing_url(self) -> str:
        """The run of scenario 7 (a rank that raises with a save in flight)."""
        return self.url + "-closing"


class _Planners:
    """The save planner each save gets: DCP's own, or one that breaks rank 1 ("fail": raises while planning;
    "die": ends its process; "refuse": rank 1 cannot make one)."""

    how: str | None = None

    def __call__(self) -> DefaultSavePlanner:
        import torch.distributed as dist

        if self.how == "refuse" and dist.get_rank() == 1:
            raise RuntimeError("injected: rank 1 cannot make its planner")
        return _RankOnePlanner(self.how) if self.how else DefaultSavePlanner()


class _RankOnePlanner(DefaultSavePlanner):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def finish_plan(self, new_plan: Any) -> Any:
        import torch.distributed as dist

        if dist.get_rank() == 1:
            if self.how == "die":
                os._exit(DEAD_RANK_EXIT)
            raise RuntimeError("injected: rank 1 fails to plan its write")
        return super().finish_plan(new_plan)


def _outcome(call: Any) -> dict[str, Any]:
    """What a call returned or raised, as JSON."""
    try:
        value = call()
    except BaseException as exc:
        cause = exc.__cause__
        return {"raised": type(exc).__name__, "message": str(exc), "cause": type(cause).__name__ if cause else None}
    return {"raised": None, "value": value}


def _raise_with_a_save_in_flight(rank: int, spec: RanksSpec, state: dict[str, Any]) -> dict[str, Any]:
    """Scenario 7 on one rank: what it saw (rank 0: its wait's outcome; rank 1: what left its `with` block)."""
    closing = Checkpointer(spec.closing_url, storage_options=spec.storage_options, group_timeout_s=60)
    if rank == 0:
        with closing:
            closing.save(10, state)
            return {"wait": _outcome(lambda: getattr(closing.wait(), "step", None))}
    with PauseAt(dcp, "save") as write:
        original = closing.wait

        def wait(timeout: float | None = None) -> Any:  # the write goes on once the close waits for it
            write.release()
            return original(timeout)

        closing.wait = wait  # type: ignore[method-assign]
        try:
            with closing:
                closing.save(10, state)
                write.wait_reached()  # staged, not written yet
                raise ValueError("injected: rank 1's next forward fails")
        except ValueError as exc:
            return {"raised": str(exc), "committed_step": closing.committed_step}
    return {"raised": None}


def run(rank: int, world_size: int, port: int, spec: RanksSpec) -> None:
    quiet_dcp_warnings()
    records: dict[str, Any] = {}
    path = os.path.join(spec.workdir, f"rank{rank}.json")

    def record(name: str, value: Any) -> None:
        records[name] = value
        with open(path, "w") as out:  # after every scenario: a rank that dies leaves what it saw so far
            json.dump(records, out)

    with process_group(rank, world_size, port) as mesh:
        model, optim = sharded_policy(mesh, WIDTH, DEPTH, seed=5)
        planners = _Planners()
        # a short group timeout: a rank that waits for one that never comes fails the test in a minute
        ckpt = Checkpointer(spec.url, storage_options=spec.storage_options, save_planner=planners, group_timeout_s=60)

        # 1: a bundle of one rank, at two
        state = policy_state(model, optim)
        restored = ckpt.restore(state, step=1)
        assert restored is not None
        apply_policy_state(model, optim, state)
        expected = flat_tensors(torch.load(os.path.join(spec.workdir, "full_1.pt"), weights_only=True))
        full = flat_tensors(full_state(model, optim))  # a collective; the full state lands on rank 0 only
        record(
            "restore_1",
            {
                "step": restored.step,
                "differs": bitwise_equal(full, expected) if rank == 0 else None,
                "extra": restored.extra,
                "rank_extra": restored.rank_extra,
                "saved_world_size": restored.saved_world_size,
            },
        )

        # 2: a good save at two ranks
        train_step(model, optim, WIDTH, seed=2)
        rng = torch.get_rng_state()
        ckpt.save(
            2,
            policy_state(model, optim),
            extra={"loader": {"position": 2}} if rank == 0 else {"loader": {"position": -1}},
            rank_extra={"rng": rng, "rank": rank},
            metrics={"loss": 0.5},
        )
        result = ckpt.wait()
        assert result is not None
        record("save_2", {"digest": result.manifest_digest, "world_size": result.world_size})
        full = full_state(model, optim)
        if rank == 0:
            torch.save(full, os.path.join(spec.workdir, "full_2.pt"))

        # 3: one rank fails before the exchange
        bad = {"order": np.arange(3)} if rank == 1 else {"order": [0, 1, 2]}
        record("save_4_piece", _outcome(lambda: ckpt.save(4, policy_state(model, optim), rank_extra={"x": bad})))

        # 4: one rank's write fails
        planners.how = "fail"
        started = _outcome(lambda: ckpt.save(4, policy_state(model, optim)))
        record("save_4_write", {"save": started, "wait": _outcome(lambda: ckpt.wait() and None)})
        planners.how = "refuse"
        started = _outcome(lambda: ckpt.save(4, policy_state(model, optim)))
        record("save_4_planner", {"save": started, "wait": _outcome(lambda: ckpt.wait() and None)})
        planners.how = None

        # 5: a stop asked on one rank
        stop = SaveAndStop(ckpt)
        before = stop.should_stop()
        if rank == 1:
            stop.request()
        record("stop", {"before": before, "after": stop.should_stop(), "reason": stop.reason})

        # 6: saves go through after the failures
        shared = {"loader": {"position": 6 if rank == 0 else -1}}  # only rank 0's is saved
        record("save_6", _outcome(lambda: ckpt.save(6, policy_state(model, optim), extra=shared, block=True) and None))

        # 7: rank 1 raises right after save() returned, its write still held: its close finishes the save
        record("save_10_raise", _raise_with_a_save_in_flight(rank, spec, policy_state(model, optim)))

        # 8: a rank dies mid-save
        planners.how = "die"
        started = _outcome(lambda: ckpt.save(8, policy_state(model, optim)))
        record("save_8_dead_rank", {"save": started, "wait": _outcome(lambda: ckpt.wait() and None)})
        ckpt.close(timeout=0)
