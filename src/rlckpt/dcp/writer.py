"""BundleStorageWriter: `torch.distributed.checkpoint`'s StorageWriter on top of the store's participants.

Every rank writes its shard files (`<prefix>/__{rank}_{n}.distcp`, DCP's own format) straight into one
transaction through its participant writer, so each file's sha256 is computed while it streams out and
nothing is written in place over an older checkpoint. The coordinator's `finish()` writes
`<prefix>/.metadata`. Two modes (docs/sharded-policy.md):

- joined: the writer joins a transaction the caller began (`TransactionHandle`), as `participant`;
  after `dcp.save` returns, `writer.receipt` is this rank's receipt (rank 0's includes `.metadata`),
  which the caller passes to `txn.commit(receipts=...)` with the others.
- standalone: the writer owns the transaction of `step`: the coordinator begins it while planning, the
  handle reaches every rank with the global plan, every rank's receipt rides back with its write
  results, and `finish()` commits once. Any failure commits nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import uuid
import weakref
from collections import OrderedDict
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from rlckpt.errors import ShardedCheckpointError
from rlckpt.store import (
    BundleStore,
    BundleTransaction,
    Manifest,
    ParticipantWriter,
    Receipt,
    TransactionHandle,
    join_relpath,
    validate_step,
)

from ._format import (
    DEFAULT_MAX_SHARD_BYTES,
    DEFAULT_PREFIX,
    METADATA_NAME,
    metadata_bytes,
    shard_compression,
    shard_plan,
    write_shards,
)
from ._plan import RankPlan, receipt_result, split_receipts

log = logging.getLogger(__name__)

# How a rank compresses its shard files (docs/sharded-policy.md#compression): "off" (or None), "auto" (on
# object stores only: there the bytes saved are upload time; on local disk they only cost CPU) or "on".
# Where it compresses, each file is stored in byte planes + zstd if its first MiB shrank (raw otherwise).
POLICY_COMPRESSIONS = ("off", "auto", "on")


def check_policy_compression(
    mode: str | None, error: type[Exception] = ShardedCheckpointError, what: str = "compression"
) -> str:
    """`mode` as one of POLICY_COMPRESSIONS (None is "off"); otherwise `error` naming the option `what` (configs
    raise ValueError naming their own field)."""
    mode = "off" if mode is None else mode
    if mode not in POLICY_COMPRESSIONS:
        raise error(f"{what} must be one of {', '.join(POLICY_COMPRESSIONS)} (or None), got {mode!r}")
    return mode


def compresses(mode: str, local: bool) -> bool:
    """Whether a rank writing to a store (`local`: on local disk) compresses under `mode`."""
    return mode == "on" or (mode == "auto" and not local)


# Stores a process keeps for the joined writers of its saves, by run URL and options: a trainer rank makes a new
# writer per save, and a new store would build a new S3 client (about 0.3 s, and new connections) each time.
_STORES: OrderedDict[tuple[str, str], BundleStore] = OrderedDict()
_STORES_MAX = 4
_STORES_LOCK = threading.Lock()


def process_store(url: str, storage_options: dict[str, Any]) -> BundleStore:
    """The store this process uses for `url` with these options: made once, then reused (connections kept)."""
    key = (url, json.dumps(storage_options, sort_keys=True, default=repr))
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is not None:
            _STORES.move_to_end(key)
            return store
    store = BundleStore(url, storage_options)
    with _STORES_LOCK:
        _STORES[key] = store
        while len(_STORES) > _STORES_MAX:
            _STORES.popitem(last=False)
    return store


def _abort_left_open(txn: BundleTransaction) -> None:
    """Finalizer of a standalone writer whose save failed on another rank: DCP then never calls the
    coordinator's writer again, so the transaction it began is aborted when the writer goes away."""
    try:
        txn.abort()
    except Exception:
        log.warning("aborting the transaction of step %s left by a failed dcp.save failed", txn.step, exc_info=True)


class BundleStorageWriter(StorageWriter, BlockingAsyncStager):
    """A DCP StorageWriter whose checkpoint is (part of) one committed bundle.

    Joined: `BundleStorageWriter(handle, participant="rank3", prefix="policy")`.
    Standalone: `BundleStorageWriter("s3://bucket/run", step=100, storage_options={...})`, or a BundleStore.
    """

    def __init__(
        self,
        target: TransactionHandle | BundleStore | str | os.PathLike[str],
        step: int | None = None,
        *,
        participant: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        storage_options: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        thread_count: int = 1,
        max_shard_bytes: int | None = DEFAULT_MAX_SHARD_BYTES,
        per_thread_copy_ahead: int = 10_000_000,
        cache_staged_state_dict: bool = False,
        compression: str | None = None,
        reuse: bool = False,
    ) -> None:
        """
        Args:
            target: a TransactionHandle to join (joined mode), or the run (URL or BundleStore) whose step
                this writer saves and commits (standalone mode).
            step: standalone: the step to save (or pass it later as `dcp.save(checkpoint_id=step)`);
                joined: None or the handle's step.
            participant: joined: this rank's participant name (1-64 of [A-Za-z0-9_-]), e.g. f"rank{rank}".
                Standalone ranks are named rank0..rankN-1 by their place in the process group.
            prefix: the directory of the checkpoint inside the bundle ("" for the bundle root).
            storage_options: fsspec options for a URL target (ignored for a handle, which carries its own).
            metadata: standalone: JSON-able user metadata for the manifest (kept beside a "dcp" entry).
            thread_count: shard files per rank written in parallel, as FileSystemWriter's thread_count.
            max_shard_bytes: a shard file holds about this many bytes of tensors at most (a bigger tensor
                gets a file of its own); None: DCP's own split (one file per writing thread).
            per_thread_copy_ahead, cache_staged_state_dict: as DCP's FileSystemWriter.
            compression: "off" (None, the default), "auto" (on object stores) or "on": shard files stored in
                byte planes + zstd where that pays (lossless; DCP's own FileSystemReader cannot read them).
            reuse: each tensor chunk of 1 MiB or more is a file of its own, so that one unchanged since the
                previous bundle is taken from it rather than written (docs/sharded-policy.md#reuse). Standalone,
                the writer begins its transaction with reuse; joined, the coordinator's `begin(step,
                reuse=True)` gives the files to take from, and every rank's writer should say `reuse=True`.
        Raises:
            ShardedCheckpointError: a missing or contradictory argument.
            InvalidPathError: `prefix` is not a safe relative path.
        """
        BlockingAsyncStager.__init__(self, cache_staged_state_dict=cache_staged_state_dict)
        if prefix:
            join_relpath(prefix, METADATA_NAME)  # InvalidPathError now rather than at the first write
        if thread_count < 1:
            raise ShardedCheckpointError(f"thread_count must be >= 1, got {thread_count}")
        self.prefix = prefix.strip("/")
        self.thread_count = thread_count
        self.max_shard_bytes = max_shard_bytes
        self.per_thread_copy_ahead = per_thread_copy_ahead
        self.compression = check_policy_compression(compression)
        self.reuse = reuse
        self.user_metadata = dict(metadata or {})
        self._handle: TransactionHandle | None = None
        self._store: BundleStore | None = None
        self._url: str
        self._storage_options: dict[str, Any]
        if isinstance(target, TransactionHandle):
            if participant is None:
                raise ShardedCheckpointError(
                    "a BundleStorageWriter joining a transaction needs participant=<name of this rank>"
                )
            if step is not None and step != target.step:
                raise ShardedCheckpointError(f"step={step} contradicts the handle, which is of step {target.step}")
            if metadata:
                raise ShardedCheckpointError(
                    "metadata= belongs to the caller's txn.commit() when joining a transaction"
                )
            self._handle = target
            self._url, self._storage_options = target.url, dict(target.storage_options)
            self.participant: str | None = participant
            self._step: int | None = target.step
        else:
            if participant is not None:
                raise ShardedCheckpointError(
                    "participant= is only for joining a transaction (standalone ranks are rank0..rankN-1)"
                )
            if isinstance(target, BundleStore):
                self._store = target
                self._url, self._storage_options = target.url, dict(target.storage_options)
            else:
                self._url, self._storage_options = os.fspath(target), dict(storage_options or {})
            self.participant = None
            self._step = None if step is None else validate_step(step)
        self._save_id = uuid.uuid4().hex
        self._new_save_state()
        self._saves_begun = 0

    def _new_save_state(self) -> None:
        self._is_coordinator = False
        self._rank = 0
        self._part: ParticipantWriter | None = None
        self._txn: BundleTransaction | None = None
        self._finalizer: weakref.finalize | None = None
        self._receipt: Receipt | None = None
        self._manifest: Manifest | None = None

    # --- what callers read ----------------------------------------------------------------------
    @property
    def joined(self) -> bool:
        """True when this writer joins a caller's transaction; False when it owns one (standalone)."""
        return self._handle is not None

    @property
    def step(self) -> int | None:
        return self._step

    @property
    def receipt(self) -> Receipt | None:
        """Joined mode: this rank's receipt once its part of `dcp.save` succeeded (rank 0's includes
        `.metadata`); None before, after a failure on this rank, and in standalone mode. If `dcp.save`
        raised on any rank, do not commit: a rank that sealed before another failed still has one."""
        return self._receipt

    @property
    def manifest(self) -> Manifest | None:
        """Standalone mode, coordinator: the committed manifest once `dcp.save` returned."""
        return self._manifest

    @property
    def checkpoint_id(self) -> str:
        """Where the checkpoint goes, for DCP's logs: `<run>/step_<N>/<prefix>`."""
        step = "?" if self._step is None else self._step
        return "/".join(p for p in (self._url.rstrip("/"), f"step_{step}", self.prefix) if p)

    # --- ending a save that DCP will not finish -------------------------------------------------
    def abort(self) -> None:
        """Drop what this writer's current save wrote and has not sealed: this rank's files and,
        standalone on the coordinator, the whole transaction. A receipt already handed out is forgotten,
        its files are left to the transaction (they may be committed). Call it when `dcp.save` raised;
        idempotent."""
        self._receipt = None
        part, txn, finalizer = self._part, self._txn, self._finalizer
        self._part, self._txn, self._finalizer = None, None, None
        if finalizer is not None:
            finalizer.detach()
        if part is not None:
            part.abort()
        if txn is not None:
            txn.abort()

    def __enter__(self) -> BundleStorageWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None or self._txn is not None:
            self.abort()

    def __getstate__(self) -> dict[str, Any]:
        # dcp.async_save(async_checkpointer_type=PROCESS) pickles the writer into its own process: ship
        # the configuration, not a live store, transaction or file handles.
        state = dict(self.__dict__)
        state.update(_store=None, _part=None, _txn=None, _finalizer=None, _receipt=None, _manifest=None)
        return state

    # --- StorageWriter --------------------------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike[str] | int | None = None) -> None:
        """DCP calls this when `dcp.save(checkpoint_id=...)` is given: standalone, it is the step."""
        self._save_id = uuid.uuid4().hex
        if checkpoint_id is None:
            return
        if self.joined:
            raise ShardedCheckpointError(
                f"a joined BundleStorageWriter writes into step {self._step} of its transaction; "
                "do not pass checkpoint_id"
            )
        text = os.fspath(checkpoint_id) if not isinstance(checkpoint_id, int) else checkpoint_id
        try:
            self._step = validate_step(int(text))
        except (TypeError, ValueError):
            raise ShardedCheckpointError(
                f"checkpoint_id of a standalone BundleStorageWriter is a step, got {checkpoint_id!r}"
            ) from None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never picked by DCP from a bare checkpoint_id: pass the writer explicitly

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self._save_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if not kwargs.get("use_collectives", True):
            raise ShardedCheckpointError(
                "dcp.save(use_collectives=False) writes per-rank metadata with no coordinator; rlckpt.dcp needs one"
            )
        if self._txn is not None or self._part is not None:
            log.warning(
                "%s: the previous save through this writer did not finish; aborting what it left", self.checkpoint_id
            )
            self.abort()
        if self.joined and self._saves_begun:
            txid = self._handle.txid if self._handle is not None else "?"
            raise ShardedCheckpointError(
                f"participant {self.participant} already saved into transaction {txid} of step {self._step}; "
                "a joined BundleStorageWriter saves once (make a new one for the next transaction)"
            )
        if self._step is None:
            raise ShardedCheckpointError(
                f"no step to save at {self._url}: pass step= or dcp.save(checkpoint_id=<step>)"
            )
        self._new_save_state()
        self._saves_begun += 1
        self._is_coordinator = is_coordinator
        self._rank = int(kwargs.get("rank") or 0)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        if self.joined:
            # Join while planning: a transaction that is not running stops every rank before any byte is written.
            assert self._handle is not None
            self._part = process_store(self._handle.url, self._handle.storage_options).participant(
                self._handle,
                self.participant,  # type: ignore[arg-type]
            )
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        txn = None
        if not self.joined:
            self._txn = self._standalone_store().begin(self._step, reuse=self.reuse)  # type: ignore[arg-type]
            self._finalizer = weakref.finalize(self, _abort_left_open, self._txn)
            txn = self._txn.handle()
        return [
            dataclasses.replace(
                plan,
                storage_data=RankPlan(
                    prefix=f"__{i}_",
                    participant=f"rank{i}",
                    step=None if txn is None else txn.step,
                    txid=None if txn is None else txn.txid,
                    base_step=None if txn is None else txn.base_step,
                    base_txid=None if txn is None else txn.base_txid,
                ),
            )
            for i, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        rank_plan = plan.storage_data
        if not isinstance(rank_plan, RankPlan):
            raise ShardedCheckpointError(
                f"{self.checkpoint_id}: rank {self._rank} got a save plan not prepared by a BundleStorageWriter "
                "(every rank must save through one; DCP plan caching is not supported)"
            )
        try:
            part = self._join_for_write(rank_plan)
            files = shard_plan(
                rank_plan.prefix, plan.items, self.thread_count, self.max_shard_bytes, for_reuse=self.reuse
            )
            compress = compresses(self.compression, part.backend.local)
            kinds = {name: shard_compression(items) if compress else None for name, items in files}
            results = write_shards(
                lambda name: part.open(join_relpath(self.prefix, name), compression=kinds[name], only_if_pays=True),
                files,
                planner,
                self.thread_count,
                self.per_thread_copy_ahead,
            )
            if not self.joined:
                results.append(receipt_result(self._seal()))
            elif not self._is_coordinator:
                self._receipt = self._seal()  # rank 0 seals in finish(), after `.metadata`
        except BaseException:
            self._fail_save()
            raise
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def _join_for_write(self, rank_plan: RankPlan) -> ParticipantWriter:
        if self.joined:
            assert self._part is not None, "prepare_local_plan joins first"
            return self._part
        if rank_plan.step != self._step:
            raise ShardedCheckpointError(
                f"rank {self._rank} was asked to write step {rank_plan.step} into {self._url}, "
                f"but saves step {self._step}: every rank's writer must name the same step"
            )
        store = self._standalone_store()
        handle = TransactionHandle(
            self._url,
            self._storage_options,
            rank_plan.step,  # type: ignore[arg-type]
            rank_plan.txid,  # type: ignore[arg-type]
            base_step=rank_plan.base_step,
            base_txid=rank_plan.base_txid,
        )
        self._part = store.participant(handle, rank_plan.participant)
        return self._part

    def _seal(self) -> Receipt:
        """Seal this rank's part. From here on its files belong to whoever holds the receipt: they may be
        committed already, so an abort must never remove them (it forgets the receipt only)."""
        assert self._part is not None
        receipt = self._part.seal()
        self._part = None
        return receipt

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        records, receipts = split_receipts(results)
        data = metadata_bytes(metadata, records, self.storage_meta())
        relpath = join_relpath(self.prefix, METADATA_NAME)
        try:
            if self.joined:
                assert self._part is not None
                self._part.write_bytes(relpath, data)
                self._receipt = self._seal()
            else:
                assert self._txn is not None, "prepare_global_plan began the transaction"
                self._txn.write_bytes(relpath, data)
                world = len(results)
                meta = {
                    **self.user_metadata,
                    "dcp": {"prefix": self.prefix, "world_size": world, "version": metadata.version},
                }
                self._manifest = self._txn.commit(
                    meta, receipts=receipts, participants={f"rank{i}" for i in range(world)}
                )
                self._txn = None
                if self._finalizer is not None:
                    self._finalizer.detach()
        except BaseException:
            self._fail_save()
            raise
        finally:
            self._save_id = uuid.uuid4().hex

    def _fail_save(self) -> None:
        """This rank's part failed: its files go (and, on a standalone coordinator, the transaction)."""
        try:
            self.abort()
        except Exception:
            log.warning("%s: cleaning up after a failed save failed", self.checkpoint_id, exc_info=True)

    def _standalone_store(self) -> BundleStore:
        if self._store is None:
            self._store = BundleStore(self._url, self._storage_options)
        return self._store
