"""BundleStorageReader: `torch.distributed.checkpoint`'s StorageReader over one committed bundle.

It is DCP's own FileSystemReader (same slicing, transforms, `torch.load(weights_only=True)` per item,
so resharding is DCP's) with its filesystem replaced by the bundle: every byte torch sees was checked
against the manifest first. `.metadata` is read digest-checked once, when the reader is made, and only
then unpickled; each shard file a rank needs is fetched once, digest-checked, and sliced by the
offset/length DCP recorded. Files are fetched a few ahead of the read loop (see _prefetch.py), into reused
buffers, hashed as they arrive; on local disk a file holding large tensors is read front to back instead, its
tensors straight into the tensors they load into (_direct.py), so no buffer of a tensor's size is held.

A digest proves a bundle intact, not who wrote it, so nothing of it is unpickled where code could run:
`.metadata` only through an allowlist unpickler, and a non-tensor item reaches the caller's planner only
after it loaded weights-only (see _safe_unpickle.py; the reader guarantees it, whatever the planner).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index  # where DCP's read loop imports it from
from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem

from rlckpt.errors import RlckptError, ShardedCheckpointError, UncommittedBundleError
from rlckpt.store import Bundle, BundleStore, VerifyKey, join_relpath, validate_relpath

from . import _prefetch
from ._direct import (
    DIRECT_MIN,
    FileItem,
    InMemoryOverBudget,
    Pieces,
    host_bytes,
    in_place,
    load_placed,
    locate,
    locate_head,
    read_items,
)
from ._format import DEFAULT_PREFIX, METADATA_NAME, load_tensor_view
from ._plan import BundleRef
from ._prefetch import BufferStream, InOrderJob, Prefetch, ReadInOrder
from ._safe_unpickle import VettedBytesPlanner, load_metadata
from ._slices import check_slices, unloadable_item

# Shard files a rank fetches at once, by default. On local disk 3 keep the next files' reads and digests beside
# loading the current one. An object store serves each file as one streamed GET, whose rate a relay or a
# distant server bounds per stream: more at once load faster there, at no cost in memory (a streamed file's
# tensors land in place; what it holds besides counts against READ_AHEAD_BYTES as before). 1 GiB on one rank
# through RGW's ETag proxy: 2.42 s with 3, 2.20 s with 6, 2.07 s with 10; direct 1.14-1.15 s with each.
FETCH_WORKERS_LOCAL = 3
FETCH_WORKERS_OBJECT_STORE = 8


class _BundleFiles(FileSystemBase):
    """The read side of DCP's FileSystemBase over one committed bundle; paths are bundle relpaths, and
    every stream it opens is a digest-checked local copy (from the load's Prefetch)."""

    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self.prefetch: Prefetch | None = None
        # The item DCP's read loop is on in the open file (set as the reader slices it, cleared when the
        # next file opens): what a failure inside torch is blamed on, and nothing else.
        self.item: tuple[str, MetadataIndex, Any] | None = None

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if mode != "rb":
            raise ShardedCheckpointError(
                f"step {self.bundle.step} at {self.bundle.url} is committed and read-only (mode {mode!r})"
            )
        if self.prefetch is None:
            raise ShardedCheckpointError("shard files are read only inside BundleStorageReader.read_data")
        self.item = None
        with self.prefetch.take(os.fspath(path)) as stream:
            yield stream

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str:
        return join_relpath(os.fspath(path), suffix) if os.fspath(path) else validate_relpath(suffix)

    def init_path(self, path: str | os.PathLike[str]) -> str:
        return os.fspath(path)

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        raise ShardedCheckpointError("a committed bundle is read-only")

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        raise ShardedCheckpointError("a committed bundle is read-only")

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return os.fspath(path) in self.bundle.manifest.files

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        raise ShardedCheckpointError("a committed bundle is read-only")


class BundleStorageReader(FileSystemReader):
    """A DCP StorageReader of the checkpoint under `prefix` in one committed bundle; any world size.

    `BundleStorageReader("s3://bucket/run", step=None, storage_options={...}, prefix="policy")` reads the
    newest committed step; `source` may also be a BundleStore or an opened Bundle. With `verify_key`, only a
    bundle that key signed for the run is read (step=None: the newest such bundle).
    """

    def __init__(
        self,
        source: Bundle | BundleStore | str | os.PathLike[str],
        step: int | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        prefix: str = DEFAULT_PREFIX,
        fetch_workers: int | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        verify_key: VerifyKey | str | os.PathLike[str] | None = None,
        run_id: str | None = None,
    ) -> None:
        """Open the bundle and read its `.metadata` (digest-checked) now, once for this reader.

        Args:
            source: the run (URL or BundleStore), or a Bundle already opened (then `step` must be None
                or its step).
            step: the step to read; None: the newest committed one.
            storage_options: fsspec options for a URL source.
            prefix: the checkpoint's directory inside the bundle ("" for the bundle root).
            fetch_workers: shard files each rank fetches (and digest-checks) at once, ahead of loading,
                within READ_AHEAD_BYTES; None: FETCH_WORKERS_LOCAL (3) on local disk, FETCH_WORKERS_OBJECT_STORE
                (8) on an object store, whose streamed GETs load faster several at once.
            spool_dir: where a load keeps checked copies of shard files above 64 MiB (smaller ones are
                held in memory), a few at a time (default: the system temp dir).
            verify_key: a VerifyKey (or its file) for a URL source: the bundle must be one it signed for
                the run. A BundleStore or Bundle source was opened with its own key (or none): passing one
                here as well is refused rather than ignored.
            run_id: with `verify_key`, the run the bundle must be signed for (the pin of docs/security.md),
                whatever the run's `_run.json` says.
        Raises:
            UncommittedBundleError: the step is not committed, or (step=None) no step is.
            UnsignedBundleError, BadSignatureError: with `verify_key`, the step is not a bundle it signed
                for this run (CorruptBundleErrors).
            KeyFileError: `verify_key` names a file that holds no usable public key.
            CorruptBundleError: the bundle or its `.metadata` fails its digest check (names the file).
            UnsafeContentError: `.metadata` names a global outside DCP's metadata classes (a
                CorruptBundleError; names the file and the global).
            ShardedCheckpointError: the bundle holds no `.metadata` under `prefix`.
            StoreUnavailableError: the store cannot be reached.
        """
        self.prefix = prefix.strip("/")
        self.fetch_workers = fetch_workers
        self.spool_dir = None if spool_dir is None else os.fspath(spool_dir)
        self._metadata_relpath = join_relpath(self.prefix, METADATA_NAME)
        self._store: BundleStore | None = None
        if (verify_key is not None or run_id is not None) and isinstance(source, (Bundle, BundleStore)):
            raise ShardedCheckpointError(
                f"verify_key and run_id go with a run URL; the {type(source).__name__} given was opened with "
                "its own (pass them to the BundleStore)"
            )
        if isinstance(source, Bundle):
            if step is not None and step != source.step:
                raise ShardedCheckpointError(f"step={step} contradicts the bundle given, which is step {source.step}")
            bundle = source
        else:
            self._store = (
                source
                if isinstance(source, BundleStore)
                else BundleStore(source, storage_options, verify_key=verify_key, run_id=run_id)
            )
            bundle = self._open(step)
        super().__init__(self.prefix)
        self._use(bundle)

    def _open(self, step: int | None) -> Bundle:
        assert self._store is not None
        if step is None:
            step = self._store.latest()
            if step is None:
                raise UncommittedBundleError(f"no committed bundle at {self._store.url}: nothing to load")
        return self._store.open(step)

    def _use(self, bundle: Bundle) -> None:
        try:
            self._metadata_bytes = bundle.read_bytes(self._metadata_relpath)  # digest-checked before any unpickling
        except FileNotFoundError:
            raise ShardedCheckpointError(
                f"step {bundle.step} at {bundle.url} holds no DCP checkpoint under {self.prefix or 'its root'!r} "
                f"(no {self._metadata_relpath}); files: {bundle.files_under(self.prefix)[:5]}"
            ) from None
        # refused here, before any load begins; the first read_metadata hands this one on, later ones unpickle anew
        self._unread_metadata: Metadata | None = load_metadata(self._metadata_bytes, self._metadata_origin(bundle))
        self._relpaths: dict[str, str] = {}  # a storage record's relative_path -> its checked bundle relpath
        self.bundle = bundle
        self._files = _BundleFiles(bundle)
        # DCP types its reader's fs as its own FileSystem; its read loop only uses the FileSystemBase API
        self.fs = self._files  # type: ignore[assignment]
        self.path = self.prefix

    def _metadata_origin(self, bundle: Bundle) -> str:
        return f"step {bundle.step} at {bundle.url}: {self._metadata_relpath}"

    def _item_origin(self, item: ReadItem) -> str:
        relpath = self._relpath(self.storage_data[item.storage_index])
        return f"step {self.bundle.step} at {self.bundle.url}: {relpath}, item {item.storage_index.fqn!r}"

    @property
    def step(self) -> int:
        return self.bundle.step

    @property
    def checkpoint_id(self) -> str:
        """Where the checkpoint is read from, for DCP's logs: `<run>/step_<N>/<prefix>`."""
        return "/".join(p for p in (self.bundle.url.rstrip("/"), f"step_{self.bundle.step}", self.prefix) if p)

    def reset(self, checkpoint_id: str | os.PathLike[str] | int | None = None) -> None:
        """DCP calls this when `dcp.load(checkpoint_id=...)` is given: it is a step of the same run."""
        super().reset(None)
        if checkpoint_id is None:
            return
        if self._store is None:
            raise ShardedCheckpointError(
                "a BundleStorageReader made from a Bundle reads that bundle only; do not pass checkpoint_id"
            )
        try:
            step = int(checkpoint_id if isinstance(checkpoint_id, int) else os.fspath(checkpoint_id))
        except (TypeError, ValueError):
            raise ShardedCheckpointError(
                f"checkpoint_id of a BundleStorageReader is a step, got {checkpoint_id!r}"
            ) from None
        self._use(self._open(step))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never picked by DCP from a bare checkpoint_id: pass the reader explicitly

    def read_metadata(self) -> Metadata:  # no **kwargs: DCP must not fall back to rank-local metadata
        metadata, self._unread_metadata = self._unread_metadata, None
        if metadata is None:  # DCP may change what it was given: each later call gets its own
            metadata = load_metadata(self._metadata_bytes, self._metadata_origin(self.bundle))  # allowlist unpickler
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        ref = BundleRef(self.bundle.url, self.bundle.step, self.bundle.manifest.txid)
        return LoadPlan(plan.items, storage_data=ref, planner_data=plan.planner_data)

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """Every rank must read the same bundle: with step=None two ranks can see different newest steps
        if a save commits while they open theirs. Refused rather than loaded as a mix."""
        refs = {plan.storage_data for plan in plans}
        if len(refs) > 1:
            seen = ", ".join(sorted(f"step {r.step} (txid {r.txid})" for r in refs if isinstance(r, BundleRef)))
            raise ShardedCheckpointError(
                f"ranks opened different bundles ({seen}): a save committed while the load started; "
                "pass an explicit step"
            )
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Any:
        """DCP's own read loop (FileSystemReader.read_data: per file, per item, DCP's slicing, transforms and
        `torch.load(weights_only=True)`) over checked copies of the shard files, which are fetched ahead in the
        order the loop wants them, within READ_AHEAD_BYTES. Every item's slice is checked against its file's
        size first; a tensor item of a file held in memory is loaded by torch's weights-only loader with its
        storage viewing the checked buffer (`load_tensor_view`: no copy between the fetch and the caller's
        tensor but DCP's own `copy_`); on local disk a file with large tensor items is read in order by a fetch
        thread, those tensors into the planner's tensors (`_in_order_job`); the planner sees non-tensor items only
        through VettedBytesPlanner; what torch raises for an item becomes a CorruptBundleError naming the item and
        its file."""
        planned = [item.storage_index for item in plan.items]
        check_slices(self.storage_data, planned, self.bundle, self.prefix, self._metadata_relpath)
        # no two items share a record now (check_slices refuses overlaps), so a record names its item
        self._items = {id(info): index for index, info in self.storage_data.items()}
        self._files.item = None
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self._relpath(self.storage_data[item.storage_index]), []).append(item)
        targets: dict[str, dict[int, torch.Tensor]] = {}  # the planner's tensors asked for ahead, by file
        jobs = {
            rel: self._in_order_job(rel, requests, targets.setdefault(rel, {}), planner)
            for rel, requests in per_file.items()
            if self._in_order_candidate(rel, requests)
        }
        workers = self.fetch_workers
        if workers is None:
            workers = FETCH_WORKERS_LOCAL if self.bundle.backend.local else FETCH_WORKERS_OBJECT_STORE
        prefetch = Prefetch(
            self.bundle, list(per_file), workers, self.spool_dir, self._single_items(per_file), None, jobs
        )
        self._files.prefetch = prefetch
        vetted = VettedBytesPlanner(planner, self._item_origin)
        try:
            for relpath, requests in per_file.items():
                given = targets.get(relpath, {})
                if relpath in jobs:
                    with prefetch.take(relpath) as read:
                        items = cast(ReadInOrder, read).items
                        if items is not None:
                            self._load_read_in_order(relpath, requests, items, given, vetted)
                            continue
                with self._files.create_stream(relpath, "rb") as stream:
                    for n, request in enumerate(requests):
                        self._load_item(stream, request, vetted, given.get(n))
        except RlckptError:
            raise
        except Exception as exc:
            if self._files.item is None:  # not inside an item (a fetch, a plan lookup): not the bundle's fault
                raise
            relpath, index, info = self._files.item
            raise unloadable_item(self.bundle, relpath, index, info, exc) from exc
        finally:
            self._files.item = None
            self._files.prefetch = None
            prefetch.close()
        done: torch.futures.Future[None] = torch.futures.Future()
        done.set_result(None)
        return done

    def _relpath(self, info: Any) -> str:
        """The bundle relpath of a storage record's file (validated once per name: every item asks)."""
        name = info.relative_path
        relpath = self._relpaths.get(name) if isinstance(name, str) else None
        if relpath is None:
            relpath = os.fspath(self.fs.concat_path(self.path, name))
            if isinstance(name, str):
                self._relpaths[name] = relpath
        return relpath

    def _load_item(
        self, stream: io.IOBase, request: ReadItem, planner: LoadPlanner, target: torch.Tensor | None = None
    ) -> None:
        """One item, as DCP's FileSystemReader.read_data loads it (the same checks and calls, in order);
        `target`: the planner's tensor for it, when it was asked already."""
        info = self.storage_data[request.storage_index]
        if request.type == LoadItemType.BYTE_IO:
            source = self.transforms.transform_load_stream(
                request, info.transform_descriptors or (), self._slice_file(stream, info)
            )
            data = io.BytesIO(source.read(-1))
            data.seek(0)
            planner.load_bytes(request, data)
            return
        tensor = self._tensor(stream, request, info)
        self._place(tensor, request, planner, planner.resolve_tensor(request).detach() if target is None else target)
        # `tensor` may view the pooled buffer of `stream`: it ends here, before the stream gives the buffer back

    @staticmethod
    def _place(tensor: torch.Tensor, request: ReadItem, planner: LoadPlanner, target: torch.Tensor) -> None:
        """A loaded tensor item into the planner's tensor as DCP puts it there: narrowed to the request, its size
        checked, copied, committed."""
        tensor = narrow_tensor_by_index(tensor, request.storage_offsets, request.lengths)
        if target.size() != tensor.size():
            raise AssertionError(f"req {request.storage_index} mismatch sizes {target.size()} vs {tensor.size()}")
        target.copy_(tensor)
        planner.commit_tensor(request, target)

    def _single_items(self, per_file: dict[str, list[ReadItem]]) -> frozenset[str]:
        """The files of the plan that hold one item (any rank's) and are held in memory whatever their size."""
        items_in: Counter[str] = Counter(self._relpath(info) for info in self.storage_data.values())
        return frozenset(rel for rel in per_file if items_in[rel] == 1)

    def _in_order_candidate(self, relpath: str, requests: list[ReadItem]) -> bool:
        """A file to read front to back at its turn, its large tensors straight into their tensors (_direct.py):
        stored uncompressed, holding a plain tensor item of at least DIRECT_MIN bytes, on a store that reads a held
        file's pieces in order cheaply (local disk; S3, in one GET: on another object store each small read would
        be a request of its own, which costs more than the copy it spares)."""
        entry = self.bundle.manifest.files.get(relpath)
        if not self.bundle.backend.streams_in_order or entry is None or entry.compression is not None:
            return False
        return any(self._placeable(request) for request in requests)

    def _placeable(self, request: ReadItem) -> bool:
        info = self.storage_data[request.storage_index]
        return request.type == LoadItemType.TENSOR and not info.transform_descriptors and info.length >= DIRECT_MIN

    def _in_order_job(
        self, relpath: str, requests: list[ReadItem], targets: dict[int, torch.Tensor], planner: LoadPlanner
    ) -> InOrderJob:
        """The prefetch's job for a file read in order: the planner is asked here, in the loop's thread, for the
        tensors of the items that can be placed (`targets`, by request index: asked once, whichever way the file is
        then read); the job, in a fetch thread, places them (`_read_in_order`). Its cost: the bytes of the items
        that will not be placed."""
        for n, request in enumerate(requests):
            if self._placeable(request):
                targets[n] = planner.resolve_tensor(request).detach()
        places = {n: place for n, target in targets.items() if (place := host_bytes(target)) is not None}
        cost = sum(self.storage_data[r.storage_index].length for n, r in enumerate(requests) if n not in places)
        return InOrderJob(functools.partial(self._read_in_order, relpath, requests, places), cost)

    def _read_in_order(
        self, relpath: str, requests: list[ReadItem], places: dict[int, memoryview]
    ) -> list[tuple[int, FileItem]] | None:
        """The file read front to back (_direct.py): each item given a place whose file lays it out for it read
        into that place, the others into memory; checked. None when what goes into memory would exceed
        READ_AHEAD_BYTES (the file is then read the common way): known before anything is read on local disk, where
        each item's directory is peeked at first; on S3, where items are located as the read reaches them, it may
        be known only partway (the placed tensors so far are then loaded again the common way)."""
        entry = self.bundle.manifest.files[relpath]
        order = sorted(range(len(requests)), key=lambda n: self.storage_data[requests[n].storage_index].offset)
        items: list[tuple[int, FileItem]] = []
        peek_ends = self.bundle.backend.small_reads_cheap  # else each item is located as the read reaches it
        with self.bundle.read_in_order(relpath) as read:
            for n in order:
                info = self.storage_data[requests[n].storage_index]
                item = FileItem(info.offset, info.length, place=places.get(n))
                if peek_ends and item.place is not None:
                    item.layout = locate(read, info.offset, info.length, len(item.place))
                    if item.layout is None:
                        item.place = None
                items.append((n, item))
            if sum(item.length for _n, item in items if item.place is None) > _prefetch.READ_AHEAD_BYTES:
                return None
            try:
                read_items(
                    read,
                    entry.size,
                    [item for _n, item in items],
                    None if peek_ends else locate_head,
                    _prefetch.READ_AHEAD_BYTES,
                )
            except InMemoryOverBudget:
                return None  # items that were to be placed were not: the file is read the common way instead
        return items

    def _load_read_in_order(
        self,
        relpath: str,
        requests: list[ReadItem],
        items: list[tuple[int, FileItem]],
        targets: dict[int, torch.Tensor],
        planner: LoadPlanner,
    ) -> None:
        """A file's items after its read in order checked out: a placed tensor is committed where it landed (or
        copied there as DCP would, when it is stored in another dtype or layout); the others load from memory as
        DCP loads them."""
        size = self.bundle.manifest.files[relpath].size
        for n, item in items:
            request = requests[n]
            info = self.storage_data[request.storage_index]
            self._files.item = (relpath, self._items[id(info)], info)
            if not item.placed:
                self._load_item(item.stream(size), request, planner, targets.get(n))
                continue
            loaded = load_placed(item)
            if in_place(loaded, targets[n]):
                planner.commit_tensor(request, targets[n])
            else:  # stored in another dtype or layout: DCP's own narrowing and copy, from a copy of what landed
                self._place(loaded.clone(), request, planner, targets[n])

    def _tensor(self, stream: io.IOBase, request: ReadItem, info: Any) -> torch.Tensor:
        """A tensor item: viewing the checked buffer when the file is in memory and the item is stored plain
        (no transform), else through DCP's transforms and torch.load, as DCP loads it."""
        file_slice = self._slice_file(stream, info)  # remembers the item being loaded
        if not info.transform_descriptors and info.length > 0:
            if isinstance(stream, BufferStream):
                return load_tensor_view(stream.view[info.offset : info.offset + info.length])
            view = stream.span(info.offset, info.length) if isinstance(stream, Pieces) else None
            if view is not None:
                return load_tensor_view(view)
        source = self.transforms.transform_load_stream(request, info.transform_descriptors or (), file_slice)
        if not source.seekable():
            source = io.BytesIO(source.read(-1))
            source.seek(0)
        return cast(torch.Tensor, torch.load(source, map_location="cpu", weights_only=True))

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        """DCP's slice of one item (bounds checked in read_data), remembered as the item being loaded."""
        self._files.item = (self._relpath(sinfo), self._items[id(sinfo)], sinfo)
        return super()._slice_file(file, sinfo)
