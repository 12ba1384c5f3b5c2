"""The multi-rank scenarios of tests/dcp, run once per backend in one spawn of two ranks (a spawn costs
seconds: torch is imported in every rank). Each rank records what happened, step by step, into
`<workdir>/rank<r>.pt`; the tests assert one behaviour each on those records.

In order, on every rank (an FSDP2 MLP + AdamW, gloo on 127.0.0.1):
 1. state A (one AdamW step); standalone rlckpt save of step 1; DCP's own writer saves A into `dcp_dir`
 2. state B (a second step); standalone save of step 2 with rank 1 failing before it writes (at
    `finish_plan`), and the same failure with DCP's own writer over A in `dcp_dir`
 3. load the newest bundle (rlckpt) and `dcp_dir` (DCP's reader) into fresh models
 4. `dcp.async_save` of B as step 3, loaded back
 5. joined: B into the caller's transaction `joined` (step 4); each rank records its receipt
 6. joined, failing: rank 1 fails inside its second shard file (thread_count=2) in transaction
    `joined_failing` (step 5); each rank records its receipt (or None)
 7. B as step 7 with a small shard-file cap; B as step 8 compressed (byte planes + zstd), loaded back
 8. standalone save of step 6 during which rank 1 dies (`os._exit`); rank 0 records what it raised
"""

from __future__ import annotations

import concurrent.futures
import os
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from rlckpt.dcp import BundleStorageReader, BundleStorageWriter
from rlckpt.store import BundleStore, TransactionHandle
from support.dcp_ranks import (
    bitwise_equal,
    flat_tensors,
    full_state,
    policy_state,
    process_group,
    quiet_dcp_warnings,
    sharded_policy,
    train_step,
)
from support.store_checks import stored_path

WIDTH, DEPTH = 256, 4  # weights above SMALL_ITEM_BYTES per rank, so each rank writes bulk and small files
DEAD_RANK_EXIT = 17
# A shard-file cap that holds two chunks of a weight at 2 ranks (128 KiB each, plus framing) but not two whole
# weights (256 KiB each): what a capped save packs shows by which of the two sizes an item was weighed.
CAPPED_SHARD_BYTES = 300_000


@dataclass(frozen=True)
class ScenarioSpec:
    """Where the scenarios write: the rlckpt run, DCP's own checkpoint dir (a local dir or an s3:// URL),
    the caller's two transactions for the joined scenarios, and the records' directory."""

    url: str
    storage_options: dict[str, Any] | None
    dcp_dir: str
    joined: TransactionHandle
    joined_failing: TransactionHandle
    workdir: str


class InjectedFault(RuntimeError):
    """The failure a scenario injects into one rank."""


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


class FailingPlanner(DefaultSavePlanner):
    """DCP's default planner, except on `rank`: `before_write` raises in finish_plan (the rank never reaches
    its storage writer), `second_file` raises while the rank writes its last shard file (one of its
    other files is complete by then), `exit` kills the rank (os._exit) while it writes its last shard file."""

    def __init__(self, rank: int, how: str, thread_count: int = 1) -> None:
        super().__init__()
        self.rank, self.how, self.thread_count = rank, how, thread_count
        self._doomed: set[Any] = set()

    def finish_plan(self, new_plan: Any) -> Any:
        plan = super().finish_plan(new_plan)
        if _rank() == self.rank:
            if self.how == "before_write":
                raise InjectedFault(f"rank {self.rank} fails before writing")
            from rlckpt.dcp._format import shard_plan  # how the writer puts items into files

            self._doomed = {item.index for item in shard_plan("", plan.items, self.thread_count)[-1][1]}
        return plan

    def resolve_data(self, write_item: Any) -> Any:
        if write_item.index in self._doomed:
            if self.how == "exit":
                os._exit(DEAD_RANK_EXIT)
            raise InjectedFault(f"rank {self.rank} fails inside its last shard file")
        return super().resolve_data(write_item)


class Recorder:
    """What one rank saw, written to `<workdir>/rank<r>.pt` after every entry (a rank may die later)."""

    def __init__(self, workdir: str, rank: int) -> None:
        self.path = os.path.join(workdir, f"rank{rank}.pt")
        self.data: dict[str, Any] = {}

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value
        tmp = self.path + ".tmp"
        torch.save(self.data, tmp)
        os.replace(tmp, self.path)


def _outcome(fn: Any) -> dict[str, Any]:
    """Run `fn`; what it raised (BaseException: DCP's CheckpointException is one) and how long it took."""
    start = time.monotonic()
    try:
        fn()
    except BaseException as exc:
        failures = getattr(exc, "failures", {}) or {}
        return {
            "raised": type(exc).__name__,
            "message": str(exc),
            "rank_errors": {rank: type(err[0]).__name__ + ": " + str(err[0]) for rank, err in failures.items()},
            "seconds": time.monotonic() - start,
            "traceback": traceback.format_exc(),
        }
    return {"raised": None, "seconds": time.monotonic() - start}


def _dcp_writer(spec: ScenarioSpec) -> Any:
    if spec.dcp_dir.startswith("s3://"):
        from torch.distributed.checkpoint._fsspec_filesystem import (
            FsspecWriter,
        )  # DCP's public S3 writer (module named _)

        return FsspecWriter(spec.dcp_dir, sync_files=False, **(spec.storage_options or {}))
    return dcp.FileSystemWriter(spec.dcp_dir)


def _dcp_reader(spec: ScenarioSpec) -> Any:
    if spec.dcp_dir.startswith("s3://"):
        from torch.distributed.checkpoint._fsspec_filesystem import (
            FsspecReader,
        )  # DCP's public S3 reader (module named _)

        return FsspecReader(spec.dcp_dir, **(spec.storage_options or {}))
    return dcp.FileSystemReader(spec.dcp_dir)


def _fresh(mesh: Any, seed: int) -> dict[str, Any]:
    """A state of the same shape and other values (another init, another step) to load into."""
    model, optim = sharded_policy(mesh, WIDTH, DEPTH, seed=seed)
    train_step(model, optim, WIDTH, seed=seed + 1)
    return policy_state(model, optim)


def run(rank: int, world_size: int, port: int, spec: ScenarioSpec) -> None:
    """Entry point of each spawned rank (see the module docstring)."""
    quiet_dcp_warnings()
    rec = Recorder(spec.workdir, rank)
    options = spec.storage_options
    with process_group(rank, world_size, port) as mesh:
        model, optim = sharded_policy(mesh, WIDTH, DEPTH, seed=0)
        train_step(model, optim, WIDTH, seed=1)
        state = policy_state(model, optim)
        a_local = flat_tensors(state)
        a_full = full_state(model, optim)
        if rank == 0:
            torch.save(a_full, os.path.join(spec.workdir, "full_A.pt"))

        # 1. step 1, and DCP's own checkpoint of A
        rec["save_1"] = _outcome(
            lambda: dcp.save(state, storage_writer=BundleStorageWriter(spec.url, step=1, storage_options=options))
        )
        rec["dcp_save_A"] = _outcome(lambda: dcp.save(state, storage_writer=_dcp_writer(spec)))

        # 2. state B; the same failure through rlckpt (step 2) and through DCP's writer (over A)
        train_step(model, optim, WIDTH, seed=2)
        state = policy_state(model, optim)
        b_local = flat_tensors(state)
        b_full = full_state(model, optim)
        if rank == 0:
            torch.save(b_full, os.path.join(spec.workdir, "full_B.pt"))

        def failing_save() -> None:
            with BundleStorageWriter(spec.url, step=2, storage_options=options) as writer:
                dcp.save(state, storage_writer=writer, planner=FailingPlanner(1, "before_write"))

        rec["save_2_failing"] = _outcome(failing_save)
        rec["dcp_save_B_failing"] = _outcome(
            lambda: dcp.save(state, storage_writer=_dcp_writer(spec), planner=FailingPlanner(1, "before_write"))
        )

        # 3. what each loads now
        loaded = _fresh(mesh, seed=40)
        reader_step: list[int] = []

        def load_newest() -> None:
            reader = BundleStorageReader(spec.url, step=None, storage_options=options)
            reader_step.append(reader.step)
            dcp.load(loaded, storage_reader=reader)

        rec["load_newest"] = _outcome(load_newest)
        rec["load_newest_step"] = reader_step[0] if reader_step else None
        rec["load_newest_differs_from_A"] = bitwise_equal(flat_tensors(loaded), a_local)
        mixed = _fresh(mesh, seed=50)
        rec["dcp_load"] = _outcome(lambda: dcp.load(mixed, storage_reader=_dcp_reader(spec)))
        got = flat_tensors(mixed)
        rec["dcp_load_tensors"] = len(got)
        rec["dcp_load_differs_from_A"] = bitwise_equal(got, a_local)
        rec["dcp_load_differs_from_B"] = bitwise_equal(got, b_local)

        # 4. async_save of B as step 3
        def async_save_3() -> None:
            future = dcp.async_save(
                state, storage_writer=BundleStorageWriter(spec.url, step=3, storage_options=options)
            )
            if not isinstance(future, concurrent.futures.Future):
                raise TypeError(f"dcp.async_save returned {type(future).__name__}, expected a Future")
            future.result(timeout=120)

        rec["async_save_3"] = _outcome(async_save_3)
        loaded3 = _fresh(mesh, seed=60)
        rec["load_3"] = _outcome(
            lambda: dcp.load(loaded3, storage_reader=BundleStorageReader(spec.url, step=3, storage_options=options))
        )
        rec["load_3_differs_from_B"] = bitwise_equal(flat_tensors(loaded3), b_local)

        # 5. joined: B into the caller's transaction
        joined = BundleStorageWriter(spec.joined, participant=f"rank{rank}")
        rec["joined_save"] = _outcome(lambda: dcp.save(state, storage_writer=joined))
        rec["joined_receipt"] = joined.receipt.to_json() if joined.receipt else None

        # 6. joined, rank 1 failing inside its second shard file
        failing = BundleStorageWriter(spec.joined_failing, participant=f"rank{rank}", thread_count=2)
        rec["joined_failing_save"] = _outcome(
            lambda: dcp.save(state, storage_writer=failing, planner=FailingPlanner(1, "second_file", thread_count=2))
        )
        rec["joined_failing_receipt"] = failing.receipt.to_json() if failing.receipt else None

        # 7. B as step 7 with a small shard-file cap
        rec["capped_save_7"] = _outcome(
            lambda: dcp.save(
                state,
                storage_writer=BundleStorageWriter(
                    spec.url, step=7, storage_options=options, max_shard_bytes=CAPPED_SHARD_BYTES
                ),
            )
        )

        rec["compressed_save_8"] = _outcome(
            lambda: dcp.save(
                state, storage_writer=BundleStorageWriter(spec.url, step=8, storage_options=options, compression="on")
            )
        )
        loaded8 = _fresh(mesh, seed=70)
        rec["load_8"] = _outcome(
            lambda: dcp.load(loaded8, storage_reader=BundleStorageReader(spec.url, step=8, storage_options=options))
        )
        rec["load_8_differs_from_B"] = bitwise_equal(flat_tensors(loaded8), b_local)

        # 8. rank 1 dies inside a standalone save of step 6 (rank 1 never returns from here)
        def dying_save() -> None:
            with BundleStorageWriter(spec.url, step=6, storage_options=options) as writer:
                dcp.save(state, storage_writer=writer, planner=FailingPlanner(1, "exit"))

        rec["dying_save"] = _outcome(dying_save)


# --- the caller's side (the test process) ------------------------------------------------------


def policy_dir(store: BundleStore, step: int, prefix: str = "policy") -> str:
    """Where the committed bundle's `prefix` directory is stored (an s3:// URL off local disk)."""
    where = stored_path(store, step, f"{prefix}/.metadata").rsplit("/", 1)[0]
    return where if store.is_local else f"s3://{where}"


def dcp_own_reader(store: BundleStore, step: int, storage_options: dict[str, Any] | None) -> Any:
    """DCP's own reader of a bundle's policy dir: FileSystemReader on local disk, FsspecReader on S3."""
    where = policy_dir(store, step)
    if store.is_local:
        return dcp.FileSystemReader(where)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(where, **(storage_options or {}))


def flip_bit(store: BundleStore, step: int, rel: str, position: int) -> None:
    """Flip the lowest bit of byte `position` of a stored file in place (same size, other content)."""
    path = stored_path(store, step, rel)
    data = bytearray(store.fs.cat_file(path))
    data[position] ^= 1
    store.fs.pipe_file(path, bytes(data))
