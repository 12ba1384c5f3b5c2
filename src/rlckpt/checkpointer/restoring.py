"""The restore protocol of a Checkpointer on one rank.

Rank 0 chooses — the newest bundle that verifies on any tier (its record read, every digest checked), or a
pinned step — by checkpoint/choice.py, the code path `rlckpt train` resumes by, and broadcasts the choice (or
its failure, rebuilt as the same rlckpt error class on every rank). Then, each phase ended by one exchange of
its failures so no rank waits for another that failed: every rank opens the chosen bundle itself (with the
run's verify key), loads its shards with ``dcp.load`` (DCP reshards; a failure on one rank is DCP's collective
error on all), and reads the pieces (digest-checked, decoded without pickle: pieces.py).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import rlckpt.errors
from rlckpt.checkpoint.choice import SkippedBundle, choose
from rlckpt.dcp import BundleStorageReader
from rlckpt.errors import CheckpointerError, RlckptError
from rlckpt.store import BundleStore

from .config import CheckpointerConfig
from .pieces import decode_piece, piece_path
from .ranks import RankGroup
from .record import STATE_DIR, CheckpointerBundle, check_and_verify, check_bundle
from .results import Restored
from .saving import describe

logger = logging.getLogger(__name__)


def restore(
    config: CheckpointerConfig, ranks: RankGroup, tiers: Sequence[BundleStore], state: Any, step: int | None
) -> Restored | None:
    """Checkpointer.restore on this rank (its docstring says what it raises)."""
    started = time.perf_counter()
    choice = _agreed_choice(ranks, tiers, step)
    if choice.get("fresh"):
        logger.info("rank %d: no committed bundle at %s: a fresh start", ranks.rank, _where(tiers))
        return None
    tier, chosen = tiers[choice["tier"]], int(choice["step"])
    where = f"step {chosen} at {tier.url}"
    record: CheckpointerBundle | None = None
    try:
        record = check_bundle(tier.open(chosen))
        opened = None
    except Exception as exc:
        opened = exc
    _agree(ranks, opened, f"opening {where}")
    assert record is not None
    try:
        planner = config.load_planner() if config.load_planner is not None else None
        reader = BundleStorageReader(tier, step=chosen, prefix=STATE_DIR)
        dcp.load(state, storage_reader=reader, planner=planner, process_group=ranks.save_group)
        loaded = None
    except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
        loaded = exc
    _agree(ranks, loaded, f"loading the state of {where}")
    pieces: dict[str, Any] = {}
    own: dict[str, Any] | None = None
    try:
        pieces, own = _read_pieces(tier, record, ranks)
        read = None
    except Exception as exc:
        read = exc
    _agree(ranks, read, f"reading the pieces of {where}")
    restored = Restored(
        chosen,
        tier.url,
        choice["why"],
        [SkippedBundle(**skipped) for skipped in choice["skipped"]],
        pieces,
        own,
        record.metrics,
        record.user,
        record.world_size,
        time.perf_counter() - started,
    )
    if ranks.is_coordinator:
        logger.info(
            "restored step %d from %s (%s) at world size %d (saved by %d) in %.2fs",
            chosen,
            tier.url,
            restored.why,
            ranks.world_size,
            record.world_size,
            restored.seconds,
        )
    return restored


def _agreed_choice(ranks: RankGroup, tiers: Sequence[BundleStore], step: int | None) -> dict[str, Any]:
    """Rank 0's choice on every rank: {"fresh": True}, or the tier, step, why and the bundles skipped; its
    failure raised on every rank (rank 0's own exception there, the same class elsewhere)."""
    choice: dict[str, Any] | None = None
    failure: BaseException | None = None
    if ranks.is_coordinator:
        try:
            chosen = choose(tiers, check_and_verify, resume_step=step, accept=check_bundle)
            if chosen is None:
                choice = {"fresh": True}
            else:
                skipped = [dataclasses.asdict(s) for s in chosen.skipped]
                choice = {"tier": chosen.candidate.tier, "step": chosen.step, "why": chosen.why, "skipped": skipped}
        except Exception as exc:
            choice, failure = {"failed": {"type": type(exc).__name__, "message": str(exc)}}, exc
    choice = ranks.broadcast(choice, ranks.save_group, "choosing the bundle to restore")
    assert choice is not None
    if "failed" in choice:
        if failure is not None:
            raise failure
        raise rebuilt(choice["failed"], f"rank {ranks.rank}: rank 0 could not choose a bundle to restore")
    return choice


def _read_pieces(
    tier: BundleStore, record: CheckpointerBundle, ranks: RankGroup
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The shared pieces, and this rank's own when the bundle was saved at this world size: digest-checked."""
    bundle = tier.open(record.step)
    where = f"step {record.step} at {tier.url}"

    def load(name: str, kind: str, rank: int | None = None) -> Any:
        rel = piece_path(name, kind, rank)
        return decode_piece(kind, bundle.read_bytes(rel), f"{where}: {rel}")

    pieces = {name: load(name, kind) for name, kind in record.extra.items()}
    if record.world_size != ranks.world_size:
        return pieces, None
    mine = record.rank_extra[ranks.rank] if record.rank_extra else {}
    return pieces, {name: load(name, kind, ranks.rank) for name, kind in mine.items()}


def _agree(ranks: RankGroup, local: BaseException | None, what: str) -> None:
    """Every rank learns whether `what` failed anywhere; each raises the same CheckpointerError if so, this
    rank's own failure as its cause."""
    mine = {"rank": ranks.rank, "error": None if local is None else describe(local)}
    everyone = ranks.all_gather(mine, ranks.save_group, what)
    problems = [f"rank {m['rank']}: {m['error']}" for m in everyone if m["error"]]
    if problems:
        raise CheckpointerError(
            f"{what} failed: {'; '.join(problems)}; the state passed in may be partly loaded"
        ) from local


def rebuilt(message: Mapping[str, str], context: str) -> Exception:
    """Rank 0's failure on another rank: the same rlckpt error class (looked up by name in rlckpt.errors)
    with its message; anything else becomes a CheckpointerError naming it."""
    kind = getattr(rlckpt.errors, message["type"], None)
    if isinstance(kind, type) and issubclass(kind, RlckptError):
        try:
            return kind(message["message"])
        except TypeError:
            pass
    return CheckpointerError(f"{context}: {message['type']}: {message['message']}")


def _where(tiers: Sequence[BundleStore]) -> str:
    return " or ".join(store.url for store in tiers)
