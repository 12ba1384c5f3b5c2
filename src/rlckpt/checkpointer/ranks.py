"""The ranks of a job as the Checkpointer sees them: its place in the default process group, and two gloo
groups of its own.

- the *save* group carries DCP's collectives and the Checkpointer's exchanges of a save or restore (which may
  run in the save's background thread);
- the *control* group carries the stop agreement (``SaveAndStop.should_stop``), polled by the training loop
  while a save may be in flight on the other group: one group per thread, so their collectives never
  interleave, and none of them on the trainer's own groups (NCCL, or gloo busy with training).

What ranks exchange is JSON (a transaction handle, receipts, outcomes, error messages) sent as bytes in
tensors: nothing is pickled between ranks. Without torch.distributed initialized the job is one process and
every exchange is local.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rlckpt.errors import RankDiedError, RankGroupError, RankTimeoutError

logger = logging.getLogger(__name__)

DEFAULT_GROUP_TIMEOUT_S = 900.0  # a collective waits this long for a peer (a rank still uploading its shards)

# How gloo words what happened to a collective (its C++ transport's messages, as torch 2.13 raises them).
_GLOO_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused")
_GLOO_TIMED_OUT = ("Timed out", "timed out", "Application timeout caused pair closure")


class RankGroup:
    """This process's rank, the job's world size, and the Checkpointer's two gloo groups (None, and every
    exchange local, for one process without torch.distributed). ``of_job`` makes them on every rank at once
    (``new_group`` is a collective of the default group): every rank makes its Checkpointer at the same point.
    """

    def __init__(
        self,
        rank: int = 0,
        world_size: int = 1,
        *,
        save_group: Any = None,
        control_group: Any = None,
        timeout_s: float = DEFAULT_GROUP_TIMEOUT_S,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.save_group, self.control_group = save_group, control_group
        self.distributed = save_group is not None
        self.timeout_s = timeout_s

    @classmethod
    def of_job(cls, timeout_s: float = DEFAULT_GROUP_TIMEOUT_S) -> RankGroup:
        """This process's place in the job: the default process group's rank and size and two new gloo groups
        over all of its ranks (a collective: every rank at once), or one process alone without
        torch.distributed.

        Raises:
            RankGroupError: the groups could not be made (a rank missing, the store unreachable).
        """
        if not (dist.is_available() and dist.is_initialized()):
            return cls(timeout_s=timeout_s)
        rank, world_size = dist.get_rank(), dist.get_world_size()
        timeout = timedelta(seconds=timeout_s)
        try:
            save_group = dist.new_group(backend="gloo", timeout=timeout)
            control_group = dist.new_group(backend="gloo", timeout=timeout)
        except Exception as exc:
            raise RankGroupError(f"rank {rank}: making the Checkpointer's gloo groups failed: {exc}") from exc
        return cls(rank, world_size, save_group=save_group, control_group=control_group, timeout_s=timeout_s)

    def close(self) -> None:
        """Destroy the two groups `of_job` made, here rather than at the interpreter's exit: a gloo group still
        alive then aborted a rank now and then as its process ended ("terminate called without an active
        exception"). An exchange after it raises RankGroupError. Idempotent."""
        groups = [g for g in (self.save_group, self.control_group) if g is not None]
        self.save_group = self.control_group = None
        if groups and dist.is_available() and dist.is_initialized():
            for group in groups:
                dist.destroy_process_group(group)

    def _check_open(self, group: Any, what: str) -> None:
        if group is None:  # closed: the default group must not stand in for the Checkpointer's own
            raise RankGroupError(f"rank {self.rank}: {what}: the Checkpointer's groups are closed")

    @classmethod
    def alone(cls) -> RankGroup:
        """One process, no collectives (a SaveAndStop without a Checkpointer)."""
        return cls()

    @property
    def is_coordinator(self) -> bool:
        return self.rank == 0

    def all_gather(self, value: Any, group: Any, what: str) -> list[Any]:
        """Every rank's JSON `value`, by rank (a collective of `group`; `what` names the call in errors).

        Raises:
            RankGroupError: a peer died or did not reach this call within the group's timeout.
        """
        if not self.distributed:
            return [json.loads(json.dumps(value))]
        self._check_open(group, what)
        data = json.dumps(value).encode()
        try:
            size = torch.tensor([len(data)], dtype=torch.int64)
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
            dist.all_gather(sizes, size, group=group)
            longest = int(max(int(s.item()) for s in sizes))
            mine = torch.zeros(longest, dtype=torch.uint8)
            mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            theirs = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world_size)]
            dist.all_gather(theirs, mine, group=group)
        except Exception as exc:  # gloo raises RuntimeError (DistBackendError) for a dead or late peer
            raise self._failed(what, exc) from exc
        return [json.loads(bytes(t[: int(s.item())].numpy())) for t, s in zip(theirs, sizes, strict=True)]

    def broadcast(self, value: Any, group: Any, what: str) -> Any:
        """Rank 0's JSON `value` on every rank (the others pass None).

        Raises:
            RankGroupError: as `all_gather`.
        """
        if not self.distributed:
            return json.loads(json.dumps(value))
        self._check_open(group, what)
        data = json.dumps(value).encode() if self.is_coordinator else b""
        try:
            size = torch.tensor([len(data)], dtype=torch.int64)
            dist.broadcast(size, src=0, group=group)
            buffer = torch.zeros(int(size.item()), dtype=torch.uint8)
            if self.is_coordinator:
                buffer[:] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            dist.broadcast(buffer, src=0, group=group)
        except Exception as exc:
            raise self._failed(what, exc) from exc
        return json.loads(bytes(buffer.numpy()))

    def any(self, flag: bool, group: Any, what: str) -> bool:
        """True on every rank when `flag` is True on any (an all-reduce of `group`).

        Raises:
            RankGroupError: as `all_gather`.
        """
        return self.most(int(flag), group, what) > 0

    def most(self, value: int, group: Any, what: str) -> int:
        """The largest of every rank's `value`, on every rank.

        Raises:
            RankGroupError: as `all_gather`.
        """
        if not self.distributed:
            return value
        tensor = torch.tensor([value], dtype=torch.int64)
        try:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
        except Exception as exc:
            raise self._failed(what, exc) from exc
        return int(tensor.item())

    def _failed(self, what: str, exc: Exception) -> RankGroupError:
        """What a failed collective means, in words: a peer that died (gloo saw its connection close), one
        that did not come within the timeout, or gloo's own reason."""
        detail = _first_sentence(exc)
        where = f"rank {self.rank} of {self.world_size}: {what}"
        # of two ranks, the peer is the other one; of more, gloo's message names an address, not a rank
        peer = f"rank {1 - self.rank}" if self.world_size == 2 else "a rank"
        if any(mark in detail for mark in _GLOO_PEER_GONE):
            return RankDiedError(
                f"{where}: {peer} died: its connection closed in the call (killed, crashed, or exited without "
                f"closing its Checkpointer; see its log) (gloo: {detail})"
            )
        if any(mark in detail for mark in _GLOO_TIMED_OUT):
            return RankTimeoutError(
                f"{where}: {peer} did not reach the same call within {self.timeout_s:.0f}s: alive but elsewhere "
                f"(every rank makes the same Checkpointer calls in the same order) (gloo: {detail})"
            )
        return RankGroupError(f"{where}: the collective failed ({type(exc).__name__}: {detail})")


def _first_sentence(exc: Exception) -> str:
    """gloo's message without its source location and its advice: ``Connection closed by peer [127.0.0.1]:4779``."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    if text.startswith("[") and "] " in text:  # [/__w/pytorch/.../pair.cc:553] Connection closed by peer ...
        text = text.split("] ", 1)[1]
    return text.split(". ", 1)[0].rstrip(".")
