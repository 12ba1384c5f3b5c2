"""The trainer group as the controller and the driver see it: N ``TrainerRank`` Ray actors in one gloo
group (``TrainerGroup`` starts them on the driver), reached through a picklable ``TrainerGroupHandle``
(the controller's) — or one rank in this process (``LocalTrainerGroup``, the fast test harness).

Every call goes to all ranks at once (they are collectives) and is awaited with a timeout, so a rank
that dies or hangs turns into a ``TrainerGroupError`` naming the call and each failed rank, never a
hang. The policy never passes through the controller: a save hands each rank the transaction's
handle and gets receipts back (``StagedRankPolicy``); a restore hands each rank the bundle's location.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from rlckpt.checkpoint.restore import PolicyLocation
from rlckpt.controller.ranks.capacity import RANK_MEMORY_BYTES
from rlckpt.controller.ranks.trainer_rank import GROUP_TIMEOUT_S, SavePlannerFactory, TrainerRank
from rlckpt.errors import TrainerGroupError
from rlckpt.grpo import GRPOConfig, TrainBatch
from rlckpt.store import BundleTransaction, Receipt

logger = logging.getLogger(__name__)

# How long the controller waits for every rank to answer one call (a train step of the tiny policy takes
# well under a second; a save of it about one). A dead rank is reported at once; this bounds a hung one.
RANK_CALL_TIMEOUT_S = 180.0


class _RankCalls(ABC):
    """What the controller's loop, the save and the restore call on the trainer group; each method
    runs on every rank (``_call_all``) and answers with rank 0's result."""

    timeout_s: float

    @property
    @abstractmethod
    def world_size(self) -> int: ...

    @abstractmethod
    async def _call_all(self, what: str, method: str, *args: Any, save_group: bool = False) -> list[Any]:
        """Call ``method(*args)`` on every rank at once; every rank's result, or TrainerGroupError."""

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        return (await self._call_all("train step", "train_step", batch))[0]

    async def weights(self) -> tuple[dict[str, torch.Tensor], int]:
        return (await self._call_all("gathering the weights", "weights"))[0]

    async def policy_sha256(self) -> str:
        return (await self._call_all("digest of the weights", "policy_sha256"))[0]

    async def stage_policy(self) -> StagedRankPolicy:
        """Every rank copies its shards to host memory; returns once all have, so the trainer may step
        while the copies are written (``StagedRankPolicy.write``)."""
        copy = uuid.uuid4().hex[:12]
        await self._call_all(f"staging policy copy {copy}", "stage_policy", copy)
        return StagedRankPolicy(self, copy)

    async def load_policy(self, location: PolicyLocation) -> None:
        """Every rank loads its shards of a verified bundle's policy (any saved world size)."""
        versions = await self._call_all(f"loading the policy of step {location.step}", "load_policy", location)
        if len(set(versions)) != 1:
            raise TrainerGroupError(f"trainer ranks loaded step {location.step} at different versions {versions}")


@dataclass
class StagedRankPolicy:
    """The policy of one save, staged on every rank; ``write`` waits for the ranks' writes."""

    ranks: _RankCalls
    copy: str  # names this staging (a rank refuses to write any other copy than the one it holds)

    async def write(self, txn: BundleTransaction) -> list[Receipt]:
        """Every rank writes its copy into ``txn`` as participant ``rank<r>``; every rank's receipt (rank
        0's with ``policy/.metadata``). TrainerGroupError if any rank failed, in which case no receipt
        is returned and the caller aborts the whole transaction."""
        handle = txn.handle()
        receipts: list[Receipt] = await self.ranks._call_all(
            f"writing the policy of step {txn.step}", "write_policy", handle, self.copy, save_group=True
        )
        names = [r.participant for r in receipts]
        expected = [f"rank{i}" for i in range(self.ranks.world_size)]
        if names != expected:
            raise TrainerGroupError(f"step {txn.step}: trainer ranks sent receipts of {names}, expected {expected}")
        return receipts

    async def discard(self) -> None:
        """Every rank drops its copy (the save failed before writing it)."""
        await self.ranks._call_all(f"dropping policy copy {self.copy}", "discard_policy", self.copy)


@dataclass
class TrainerGroupHandle(_RankCalls):
    """The trainer ranks' Ray actor handles (picklable: it travels to the controller actor)."""

    ranks: tuple[Any, ...]  # ray.actor.ActorHandle of TrainerRank, by rank
    timeout_s: float = RANK_CALL_TIMEOUT_S

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    async def _call_all(self, what: str, method: str, *args: Any, save_group: bool = False) -> list[Any]:
        refs = []
        for actor in self.ranks:
            bound = getattr(actor, method)
            if save_group:
                bound = bound.options(concurrency_group="save")
            refs.append(bound.remote(*args))
        return await gather_ranks(what, [asyncio.wrap_future(ref.future()) for ref in refs], self.timeout_s)


async def gather_ranks(what: str, calls: list[asyncio.Future[Any]], timeout_s: float) -> list[Any]:
    """Wait for every rank's call (not just the first failure: a dead rank makes the others fail too, and
    the report should name the dead one), at most ``timeout_s``; TrainerGroupError naming each failure.

    A caller cancelled meanwhile still waits, at most ``timeout_s`` more, for the ranks to finish what they
    were asked before it goes on cancelling: what it does next (a save's abort, which removes what the
    transaction holds) must not run while a rank still writes into it, or the rank's files would land
    after the abort and stay behind. A second cancel stops that wait."""
    try:
        done, pending = await asyncio.wait(calls, timeout=timeout_s)
    except asyncio.CancelledError:
        unfinished = [call for call in calls if not call.done()]
        if unfinished:
            logger.info("%s: cancelled; waiting for %d trainer rank(s) to finish first", what, len(unfinished))
            await asyncio.wait(unfinished, timeout=timeout_s)
        raise
    failures = []
    for rank, call in enumerate(calls):
        if call in pending:
            call.cancel()
            failures.append(f"rank {rank}: no answer within {timeout_s:.0f}s")
        elif call.exception() is not None:
            failures.append(f"rank {rank}: {_rank_failure(call.exception())}")  # type: ignore[arg-type]
    if failures:
        message = f"{what} failed on {len(failures)} of {len(calls)} trainer ranks: " + "; ".join(failures)
        logger.error("%s", message)
        raise TrainerGroupError(message)
    return [call.result() for call in calls]


def _rank_failure(exc: BaseException) -> str:
    """What went wrong on one rank, in one line: it died, or what it raised."""
    import ray.exceptions

    if isinstance(exc, ray.exceptions.RayActorError):
        return "died (its actor process exited)"
    cause = getattr(exc, "cause", None) if isinstance(exc, ray.exceptions.RayTaskError) else exc
    cause = cause if isinstance(cause, BaseException) else exc
    return f"{type(cause).__name__}: {str(cause).strip().splitlines()[0] if str(cause).strip() else ''}"


class TrainerGroup:
    """Driver side: starts the N rank actors, forms their gloo group, and stops them."""

    def __init__(
        self,
        config: GRPOConfig,
        *,
        ranks: int,
        resources: dict[str, float] | None = None,
        timeout_s: float = RANK_CALL_TIMEOUT_S,
        save_planner: SavePlannerFactory | None = None,
        form: bool = True,
        compression: str | None = None,
        reuse: bool = False,
    ) -> None:
        """Start the ranks (each asking Ray for RANK_MEMORY_BYTES of memory and ``resources``, Ray custom
        resources, e.g. one per node) and, unless ``form`` is False (the caller starts something else while
        the ranks boot, then calls ``form()``), form the group; TrainerGroupError if a rank does not come up
        or join within ``timeout_s``. ``compression``, ``reuse``: how the ranks store the policy's shard
        files (BundleStorageWriter's)."""
        import ray

        if ranks < 1:
            raise TrainerGroupError(f"a trainer group needs at least 1 rank, got {ranks}")
        # write_policy runs in the "save" group, beside training calls. Ray's type stubs have no overload
        # of ray.remote for the (documented) concurrency_groups keyword, hence the untyped name.
        remote: Any = ray.remote
        actor_class = remote(concurrency_groups={"save": 1})(TrainerRank).options(
            num_cpus=0, memory=RANK_MEMORY_BYTES, resources=dict(resources or {})
        )
        self.actors: list[Any] = [
            actor_class.remote(config, rank, ranks, save_planner, compression, reuse) for rank in range(ranks)
        ]
        self.handle = TrainerGroupHandle(tuple(self.actors), timeout_s)
        if form:
            self.form()

    def form(self) -> None:
        """Wait for the ranks to come up and join one gloo group; on a failure every rank is killed."""
        import ray

        ranks = len(self.actors)
        try:
            address, port = ray.get(self.actors[0].rendezvous.remote(), timeout=self.handle.timeout_s)
            joining = self.handle._call_all("forming the trainer group", "join_group", address, port, GROUP_TIMEOUT_S)
            asyncio.run(joining)
        except Exception as exc:
            self.shutdown()
            if isinstance(exc, TrainerGroupError):
                raise
            raise TrainerGroupError(f"starting {ranks} trainer ranks failed: {exc}") from exc
        logger.info("trainer group of %d ranks formed at %s:%d", ranks, address, port)

    async def load_policy(self, location: PolicyLocation) -> None:
        """Restore: every rank loads its shards (the driver's ``TrainerStateSink``)."""
        await self.handle.load_policy(location)

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)


class LocalTrainerGroup(_RankCalls):
    """In-process trainer for tests: one ``TrainerRank`` (world size 1, no process group), run in threads."""

    def __init__(self, config: GRPOConfig, timeout_s: float = RANK_CALL_TIMEOUT_S) -> None:
        self.rank = TrainerRank(config, 0, 1)
        self.rank.start_alone()
        self.timeout_s = timeout_s
        self._lock = asyncio.Lock()  # like an actor's one thread: one training call at a time

    @property
    def world_size(self) -> int:
        return 1

    async def _call_all(self, what: str, method: str, *args: Any, save_group: bool = False) -> list[Any]:
        call = getattr(self.rank, method)
        if save_group:  # the actor's "save" concurrency group: beside training calls
            task = asyncio.ensure_future(asyncio.to_thread(call, *args))
        else:
            async with self._lock:
                task = asyncio.ensure_future(asyncio.to_thread(call, *args))
                await asyncio.wait([task])
        return await gather_ranks(what, [task], self.timeout_s)
