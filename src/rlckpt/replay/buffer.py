"""ReplayBuffer: the controller's index of which data-plane rows form which prompt group.

Lifecycle of a group::

    gid = buf.reserve(weight_version=v, target_step=k)      # generation starts (no data yet)
    await buf.commit(gid, rows, start_weight=a, end_weight=b)  # rows -> data plane, index updated
    groups = await buf.take(n, target_step=k)               # trainer takes ready groups
    data = await buf.read_groups(groups)                    # dense tensors, group order
    await buf.write_fields(gid, {"advantages": ...})        # extra column on the same rows
    await buf.remove_group(gid)                             # after training: rows cleared

Two ways to feed a trainer:

* **in_order**: reserve every group of step ``k`` with ``weight_version=k, target_step=k``
  (in a fixed order); the trainer calls ``take(n, target_step=k)``, which waits for exactly
  those groups and returns them in reservation order, whatever order they finished in.
* **async** (bounded staleness ``s``): reserve with ``target_step=None``; the trainer at
  version ``v`` calls ``take(n, min_weight_version=v - s)``, which returns the ``n`` oldest
  committed groups whose ``start_weight >= v - s``; ``evict_stale(v - s)`` drops older ones.

Every data-plane write runs inside ``barrier.mutation()`` and updates the index in the same
critical section, so a caller holding ``barrier.checkpoint()`` sees index and data plane agree.
The index holds no tensors: rows are passed through to the data plane untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from rlckpt.errors import InventoryMismatchError, ReplayError, ReplayStateError
from rlckpt.formats import Refusal, plain_int, plain_optional_int, type_name
from rlckpt.replay.barrier import DataPlaneCheckpointBarrier
from rlckpt.replay.pins import Pins
from rlckpt.replay.records import (
    REPLAY_INDEX,
    GroupRecord,
    IndexCapture,
    groups_digest,
    sample_id,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _entry_int(convert: Callable[[Any, str], T], value: Any, op: str, name: str) -> T:
    """An argument that the index keeps, as a plain int (see formats.plain), or ReplayError naming it."""
    try:
        return convert(value, name)
    except Refusal as refusal:
        raise ReplayError(f"{op}: {refusal}") from None


def group_id_for(seq: int) -> str:
    """Group id of the ``seq``-th reservation; sorts in reservation order."""
    return f"g{seq:08d}"


class ReplayBuffer:
    """Group index over a DataPlaneClient (any object with its async methods)."""

    def __init__(
        self,
        data_plane: Any,
        barrier: DataPlaneCheckpointBarrier,
        *,
        partition_id: str,
        group_size: int,
        max_groups: int | None = None,
    ) -> None:
        group_size = _entry_int(plain_int, group_size, "ReplayBuffer", "group_size")
        if group_size < 1:
            raise ValueError(f"ReplayBuffer: group_size must be >= 1, got {group_size}")
        if type(partition_id) is not str:
            raise ReplayError(f"ReplayBuffer: partition_id: expected str, got {type_name(partition_id)}")
        self.data_plane = data_plane
        self.barrier = barrier
        self.partition_id = partition_id
        self.group_size = group_size
        self.max_groups = max_groups
        self._groups: dict[str, GroupRecord] = {}  # insertion order == seq order
        self._next_seq = 0
        self._taken: set[str] = set()
        self._busy: set[str] = set()  # groups with a commit/remove/write in progress
        self._changed = asyncio.Event()
        self._removing = 0  # removals of committed groups in flight (a pinned capture waits for them)
        self._pins: Pins | None = None
        self._running: dict[int, tuple[str, ...]] = {}  # data-plane mutations in flight -> their keys
        self._observers: list[set[str]] = []
        self._tokens = itertools.count()
        self._clearing: dict[asyncio.Future[None], list[str]] = {}  # deferred clears running -> their keys

    # --- inspection ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._groups)

    def group(self, group_id: str) -> GroupRecord:
        """The record of ``group_id`` (ReplayError if unknown)."""
        try:
            return self._groups[group_id]
        except KeyError:
            raise ReplayError(f"replay buffer (partition {self.partition_id!r}): unknown group {group_id!r}") from None

    def groups(self) -> list[GroupRecord]:
        """Every group, reserved or committed, in reservation order."""
        return list(self._groups.values())

    def pending_groups(self) -> list[GroupRecord]:
        """Reserved groups without rows yet (after a restore: the ones to generate again)."""
        return [g for g in self._groups.values() if not g.committed]

    def ready_groups(
        self, *, target_step: int | None = None, min_weight_version: int | None = None
    ) -> list[GroupRecord]:
        """Committed, not taken groups matching the filters, in reservation order."""
        out = []
        for g in self._groups.values():
            if not g.committed or g.group_id in self._taken:
                continue
            if target_step is not None and g.target_step != target_step:
                continue
            if min_weight_version is not None and (g.start_weight or 0) < min_weight_version:
                continue
            out.append(g)
        return out

    def sample_ids(self) -> list[str]:
        """Sorted data-plane keys of every committed group."""
        return sorted(s for g in self._groups.values() for s in g.sample_ids)

    def has_capacity(self) -> bool:
        """True while another group may be reserved."""
        return self.max_groups is None or len(self._groups) < self.max_groups

    # --- producer side -------------------------------------------------------------------------

    def reserve(self, weight_version: int, target_step: int | None = None) -> str:
        """Reserve the next group id for a generation started at ``weight_version``.

        A NumPy or tensor integer scalar is taken as the int it holds; anything else that is not an int
        (a bool, a float) is refused here with ReplayError, not by a save long after."""
        weight_version = _entry_int(plain_int, weight_version, "reserve", "weight_version")
        target_step = _entry_int(plain_optional_int, target_step, "reserve", "target_step")
        if not self.has_capacity():
            raise ReplayError(
                f"replay buffer (partition {self.partition_id!r}) is full: {len(self._groups)} groups "
                f"of max {self.max_groups}; take/remove groups before reserving more"
            )
        gid = group_id_for(self._next_seq)
        self._groups[gid] = GroupRecord(gid, self._next_seq, weight_version, target_step)
        self._next_seq += 1
        return gid

    async def commit(
        self,
        group_id: str,
        rows: Sequence[Mapping[str, Any]],
        start_weight: int,
        end_weight: int,
    ) -> GroupRecord:
        """Write a reserved group's rows (one mapping field->tensor per sample) and index them.

        Runs inside ``barrier.mutation()``. On any failure (or cancellation) the rows already
        written are cleared and the group stays reserved, so the caller may retry or remove it.
        The weights are taken as ``reserve`` takes its versions, and the field names must be str
        (ReplayError before anything is written).
        """
        start_weight = _entry_int(plain_int, start_weight, "commit", "start_weight")
        end_weight = _entry_int(plain_int, end_weight, "commit", "end_weight")
        record = self._claim(group_id, "commit")
        try:
            if record.committed:
                raise ReplayError(f"commit of group {group_id!r}: already committed")
            if len(rows) != self.group_size:
                raise ReplayError(f"commit of group {group_id!r}: {len(rows)} rows, group size is {self.group_size}")
            names = list(rows[0])
            if any(list(r) != names for r in rows):
                raise ReplayError(f"commit of group {group_id!r}: rows have different field sets")
            if not all(type(name) is str for name in names):
                shown = [type_name(n) for n in names if type(n) is not str]
                raise ReplayError(f"commit of group {group_id!r}: field names must be str, got {shown}")
            keys = [sample_id(group_id, i) for i in range(len(rows))]
            fields = {name: [row[name] for row in rows] for name in names}
            async with self.barrier.mutation():
                with self._mutating(keys):
                    try:
                        await self.data_plane.put_samples(self.partition_id, keys, fields)
                    except BaseException:
                        await self._rollback(group_id, keys)
                        raise
                record = replace(
                    record,
                    sample_ids=tuple(keys),
                    start_weight=start_weight,
                    end_weight=end_weight,
                    fields=tuple(sorted(names)),
                )
                self._groups[group_id] = record
        finally:
            self._release(group_id)
        self._notify()
        return record

    async def _rollback(self, group_id: str, keys: list[str]) -> None:
        try:
            await self.data_plane.clear_samples(self.partition_id, keys)
        except BaseException as exc:
            logger.error("rollback of group %s failed: %s: %s", group_id, type(exc).__name__, exc)

    # --- consumer side -------------------------------------------------------------------------

    async def take(
        self,
        count: int,
        *,
        target_step: int | None = None,
        min_weight_version: int | None = None,
    ) -> list[GroupRecord]:
        """Wait until ``count`` ready groups match, mark them taken and return them (oldest first).

        Taken groups stay in the index (and in checkpoints, as ready again) until removed.
        Cancelling the wait takes nothing.
        """
        while True:
            ready = self.ready_groups(target_step=target_step, min_weight_version=min_weight_version)
            if len(ready) >= count:
                chosen = ready[:count]
                self._taken.update(g.group_id for g in chosen)
                return chosen
            await self._wait_for_change()

    def untake(self, group_ids: Iterable[str]) -> None:
        """Make taken groups ready again (e.g. the training step that took them failed)."""
        for gid in group_ids:
            self._taken.discard(gid)
        self._notify()

    async def read_groups(self, groups: Sequence[GroupRecord | str], fields: Sequence[str] | None = None) -> Any:
        """Dense tensors of the groups' rows, concatenated in the given group order."""
        keys = [s for g in groups for s in self.group(g if isinstance(g, str) else g.group_id).sample_ids]
        return await self.data_plane.get_samples(self.partition_id, keys, fields)

    async def write_fields(self, group_id: str, fields: Mapping[str, Any]) -> None:
        """Add/overwrite columns (e.g. ``advantages``) on a committed group's rows, in a mutation.

        Overwriting a column the group was committed with waits while a pinned checkpoint has not
        copied the group yet; adding a new column does not (the copy reads only the group's own)."""
        record = self._claim(group_id, "write_fields")
        try:
            if not record.committed:
                raise ReplayError(f"write_fields on group {group_id!r}: not committed")
            if self._pins is not None and set(fields) & set(record.fields):
                await self._pins.wait_copied(group_id)
            async with self.barrier.mutation():
                with self._mutating(record.sample_ids):
                    await self.data_plane.put_samples(self.partition_id, list(record.sample_ids), fields)
        finally:
            self._release(group_id)

    async def remove_group(self, group_id: str, clear_data_plane: bool = True) -> None:
        """Drop a group from the index (and its rows from the data plane), in a mutation.

        If clearing fails the group stays indexed and the error propagates.
        """
        record = self._claim(group_id, "remove_group")
        try:
            if self._pins is not None and self._pins.holds(group_id):  # its rows stay until they are copied
                self._pins.deferred[group_id] = record.sample_ids if clear_data_plane else ()
                del self._groups[group_id]
                self._taken.discard(group_id)
                return
            self._removing += 1
            try:
                async with self.barrier.mutation():
                    if clear_data_plane and record.committed:
                        with self._mutating(record.sample_ids):
                            await self.data_plane.clear_samples(self.partition_id, list(record.sample_ids))
                    del self._groups[group_id]
                    self._taken.discard(group_id)
            finally:
                self._removing -= 1
        finally:
            self._release(group_id)
            self._notify()

    async def evict_stale(self, min_weight_version: int) -> list[str]:
        """Remove committed, not taken groups with ``start_weight < min_weight_version``."""
        stale = [
            g.group_id
            for g in self._groups.values()
            if g.committed and g.group_id not in self._taken and (g.start_weight or 0) < min_weight_version
        ]
        removed = []
        for gid in stale:
            if gid in self._groups and gid not in self._busy:
                await self.remove_group(gid)
                removed.append(gid)
        return removed

    # --- checkpoint ----------------------------------------------------------------------------

    def capture_index(self) -> IndexCapture:
        """The index at this instant, in O(groups) pointer copies (records are immutable).

        Cheap enough for the checkpoint window: serializing and digesting it
        (``IndexCapture.state_dict()``) can wait until the window is released.
        """
        return IndexCapture(self.partition_id, self.group_size, self._next_seq, tuple(self._groups.values()))

    async def settle_removals(self) -> None:
        """Return once no removal of a committed group is in flight (a pinned capture needs that: the
        rows of a group being removed may be half cleared)."""
        while self._removing:
            await self._wait_for_change()

    def pin_capture(self) -> IndexCapture:
        """Capture the index and pin its committed groups (see pins.py): one synchronous step of the
        event loop, nothing awaited. Call it right after ``settle_removals()`` with no await between.
        A commit in flight is not captured: its group is reserved in the capture, and a resumed run
        generates it again.
        """
        if self._pins is not None:
            raise ReplayError(f"replay buffer (partition {self.partition_id!r}): a pinned capture is still copying")
        if self._removing:
            raise ReplayError(f"replay buffer (partition {self.partition_id!r}): a removal is in flight")
        capture = self.capture_index()
        self._pins = Pins.of(g.group_id for g in capture.committed)
        return capture

    @property
    def pinned(self) -> set[str]:
        """Groups of the current pinned capture whose rows are not copied yet."""
        return set(self._pins.pending) if self._pins is not None else set()

    @property
    def deferred_sample_ids(self) -> set[str]:
        """Rows of removed groups whose clear waits for a pinned copy, or runs now."""
        waiting = list(self._pins.deferred.values()) if self._pins else []
        return {s for keys in waiting + list(self._clearing.values()) for s in keys}

    async def unpin(self, group_ids: Iterable[str]) -> None:
        """The rows of these pinned groups are copied: clear the ones whose removal was deferred."""
        if self._pins is None:
            return
        pins = self._pins
        await self._clear_deferred([key for gid in list(group_ids) for key in pins.release(gid)])

    async def end_pins(self) -> None:
        """The pinned copy is over (done or given up): unpin everything left and forget the capture."""
        pins, self._pins = self._pins, None
        if pins is None:
            return
        keys = [key for gid in list(pins.pending) + list(pins.deferred) for key in pins.release(gid)]
        self._notify()
        await self._clear_deferred(keys)

    async def _clear_deferred(self, keys: list[str]) -> None:
        """Clear rows of removed groups that a pin held, to the end even when the caller is cancelled (a
        save aborted mid-clear): their groups have left the index, so rows left behind would be strays
        that fail every later save's inventory check."""
        if not keys:
            return
        clear = asyncio.ensure_future(self._clear_rows(keys))
        self._clearing[clear] = keys  # held here too: a cancelled caller drops its reference
        clear.add_done_callback(lambda done: self._clearing.pop(done, None))
        await asyncio.shield(clear)

    async def _clear_rows(self, keys: list[str]) -> None:
        async with self.barrier.mutation():
            with self._mutating(keys):
                await self.data_plane.clear_samples(self.partition_id, keys)

    @contextlib.contextmanager
    def observe_mutations(self) -> Iterator[set[str]]:
        """A set that collects the keys of every data-plane mutation running now or started while open:
        the rows whose presence a listing taken meanwhile cannot tell."""
        seen = {k for keys in self._running.values() for k in keys}
        self._observers.append(seen)
        try:
            yield seen
        finally:
            self._observers.remove(seen)

    def check_no_strays(self, stored: Iterable[str], capture: IndexCapture, raced: set[str]) -> None:
        """The inventory check of a pinned save, on a listing taken after the capture while commits went
        on: every captured row is stored (pins keep them), and nothing is stored that neither the
        capture, the index now, a deferred clear, nor a mutation racing the listing accounts for."""
        stored = set(stored)
        captured = capture.sample_ids
        accounted = captured | set(self.sample_ids()) | self.deferred_sample_ids | raced
        missing = sorted(captured - stored - raced)  # a deferred clear may race the listing once unpinned
        strays = sorted(stored - accounted)
        if missing or strays:
            raise InventoryMismatchError(
                f"data plane partition {self.partition_id!r} disagrees with the captured replay index: "
                f"{len(missing)} captured rows missing {missing[:20]}, {len(strays)} rows no index accounts for "
                f"{strays[:20]}"
            )

    def metadata_state_dict(self) -> dict[str, Any]:
        """Index only (no tensors), with a sha256 digest of the canonical JSON of the groups.

        Hold ``barrier.checkpoint()`` while capturing this and snapshotting the data plane.
        Reserved-but-uncommitted groups are included (empty ``sample_ids``) so a resumed run
        can generate them again under the same ids and order (``pending_groups()``).
        """
        return self.capture_index().state_dict()

    def load_state_dict(self, state: Mapping[str, Any], *, expected_digest: str) -> None:
        """Install a saved index (``REPLAY_INDEX_FORMAT``; an older one goes through
        ``index_formats.upgrade_index`` first) into this empty buffer; never touches the data plane.

        ``expected_digest`` is the index digest recorded outside the state (e.g. in the data-plane
        snapshot's metadata), so an index from another save is refused. The saved partition and
        group size must be this buffer's and the groups fit its ``max_groups``. All groups come back
        not taken.

        Raises:
            ReplayStateError: before anything is installed: a field missing, of another type or unknown
                (its path named: ``groups[3].target_step``), another format, or a mismatch (digest,
                partition, group size, too many groups, sample ids), naming both values.
        """
        if self._groups or self._next_seq:
            raise ReplayStateError(
                f"load_state_dict: replay buffer (partition {self.partition_id!r}) is not empty "
                f"({len(self._groups)} groups); load only into a new buffer"
            )
        self._check_state_header(state, expected_digest)
        records = self._parse_groups(state["groups"])
        if self.max_groups is not None and len(records) > self.max_groups:
            raise ReplayStateError(f"load_state_dict: {len(records)} groups saved, max_groups is {self.max_groups}")
        next_seq = state["next_seq"]
        if records and next_seq <= max(r.seq for r in records):
            raise ReplayStateError(f"load_state_dict: next_seq {next_seq} does not follow the saved groups")
        self._groups = {r.group_id: r for r in sorted(records, key=lambda r: r.seq)}
        self._next_seq = next_seq
        self._taken.clear()
        self._notify()

    def _check_state_header(self, state: Mapping[str, Any], expected_digest: str) -> None:
        where = "load_state_dict"
        REPLAY_INDEX.check(state, where)  # every field's type first: a digest over a tensor cannot be computed
        actual = groups_digest(state["groups"])
        if actual != state["digest"]:
            raise ReplayStateError(f"{where}: groups digest {actual} != recorded digest {state['digest']}")
        if actual != expected_digest:
            raise ReplayStateError(f"{where}: groups digest {actual} != expected digest {expected_digest}")
        if state["partition_id"] != self.partition_id:
            raise ReplayStateError(
                f"{where}: saved partition {state['partition_id']!r} != this buffer's {self.partition_id!r}"
            )
        if state["group_size"] != self.group_size:
            raise ReplayStateError(
                f"{where}: saved group size {state['group_size']!r} != this buffer's {self.group_size}"
            )

    def _parse_groups(self, raw: list[dict[str, Any]]) -> list[GroupRecord]:
        records = [GroupRecord.from_json(g) for g in raw]
        if len({r.group_id for r in records}) != len(records):
            raise ReplayStateError("load_state_dict: duplicate group ids")
        for i, r in enumerate(records):
            expected = tuple(sample_id(r.group_id, i) for i in range(self.group_size)) if r.committed else ()
            if r.sample_ids != expected:
                raise ReplayStateError(
                    f"load_state_dict: replay index: groups[{i}].sample_ids: group {r.group_id!r} has sample ids "
                    f"{list(r.sample_ids)[:4]}..., expected {list(expected)[:4]}..."
                )
        return records

    def validate_inventory(self, sample_ids: Iterable[str]) -> None:
        """Raise InventoryMismatchError unless the stored ids equal the index's ids exactly."""
        stored = set(sample_ids)
        indexed = set(self.sample_ids())
        missing = sorted(indexed - stored)
        extra = sorted(stored - indexed)
        if missing or extra:
            raise InventoryMismatchError(
                f"data plane partition {self.partition_id!r} disagrees with the replay index: "
                f"{len(missing)} missing {missing[:20]}, {len(extra)} extra {extra[:20]}"
            )

    # --- internals -----------------------------------------------------------------------------

    def _claim(self, group_id: str, op: str) -> GroupRecord:
        record = self.group(group_id)
        if group_id in self._busy:
            raise ReplayError(f"{op} of group {group_id!r}: another operation on it is in progress")
        self._busy.add(group_id)
        return record

    def _release(self, group_id: str) -> None:
        self._busy.discard(group_id)

    @contextlib.contextmanager
    def _mutating(self, keys: Iterable[str]) -> Iterator[None]:
        """Record a data-plane mutation of `keys` while it runs (see observe_mutations)."""
        token, keys = next(self._tokens), tuple(keys)
        self._running[token] = keys
        for seen in self._observers:
            seen.update(keys)
        try:
            yield
        finally:
            del self._running[token]

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_for_change(self) -> None:
        await self._changed.wait()


__all__ = ["ReplayBuffer", "group_id_for"]
