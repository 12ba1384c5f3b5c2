"""BundleStorageReader: `torch.distributed.checkpoint`'s StorageReader over one committed bundle.

It is DCP's own FileSystemReader (same slicing, transforms, `torch.load(weights_only=True)` per item,
so resharding is DCP's) with its filesystem replaced by the bundle: every byte torch sees was checked
against the manifest first. `.metadata` is read digest-checked once, when the reader is made, and only
then unpickled; each shard file a rank needs is fetched once (`Bundle.open`: spooled to a temp file
when large, digest-checked before it is returned) and sliced by the offset/length DCP recorded.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
from collections.abc import Iterator
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan

from rlckpt.errors import CorruptBundleError, ShardedCheckpointError, UncommittedBundleError
from rlckpt.store import Bundle, BundleStore
from rlckpt.store.paths import join_relpath

from ._format import DEFAULT_PREFIX, METADATA_NAME
from ._plan import BundleRef


class _BundleFiles(FileSystemBase):
    """The read side of DCP's FileSystemBase over one committed bundle; paths are bundle relpaths."""

    def __init__(self, bundle: Bundle, metadata_relpath: str) -> None:
        self.bundle = bundle
        self.metadata_relpath = metadata_relpath

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if mode != "rb":
            raise ShardedCheckpointError(f"step {self.bundle.step} at {self.bundle.url} is committed and read-only (mode {mode!r})")
        relpath = os.fspath(path)
        try:
            stream = self.bundle.open(relpath)  # fetched whole and digest-checked before it is returned
        except FileNotFoundError:
            raise CorruptBundleError(
                f"step {self.bundle.step} at {self.bundle.url}: {self.metadata_relpath} names {relpath}, which the bundle does not hold"
            ) from None
        with stream:
            yield stream  # type: ignore[misc]

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str:
        return join_relpath(os.fspath(path), suffix)

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
    newest committed step; `source` may also be a BundleStore or an opened Bundle.
    """

    def __init__(
        self,
        source: Bundle | BundleStore | str | os.PathLike[str],
        step: int | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        """Open the bundle and read its `.metadata` (digest-checked) now, once for this reader.

        Args:
            source: the run (URL or BundleStore), or a Bundle already opened (then `step` must be None
                or its step).
            step: the step to read; None: the newest committed one.
            storage_options: fsspec options for a URL source.
            prefix: the checkpoint's directory inside the bundle ("" for the bundle root).
        Raises:
            UncommittedBundleError: the step is not committed, or (step=None) no step is.
            CorruptBundleError: the bundle or its `.metadata` fails its digest check (names the file).
            ShardedCheckpointError: the bundle holds no `.metadata` under `prefix`.
            StoreUnavailableError: the store cannot be reached.
        """
        self.prefix = prefix.strip("/")
        self._metadata_relpath = join_relpath(self.prefix, METADATA_NAME)
        self._store: BundleStore | None = None
        if isinstance(source, Bundle):
            if step is not None and step != source.step:
                raise ShardedCheckpointError(f"step={step} contradicts the bundle given, which is step {source.step}")
            bundle = source
        else:
            self._store = source if isinstance(source, BundleStore) else BundleStore(source, storage_options)
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
        self.bundle = bundle
        self.fs = _BundleFiles(bundle, self._metadata_relpath)
        self.path = self.prefix

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
            raise ShardedCheckpointError("a BundleStorageReader made from a Bundle reads that bundle only; do not pass checkpoint_id")
        try:
            step = int(checkpoint_id if isinstance(checkpoint_id, int) else os.fspath(checkpoint_id))
        except (TypeError, ValueError):
            raise ShardedCheckpointError(f"checkpoint_id of a BundleStorageReader is a step, got {checkpoint_id!r}") from None
        self._use(self._open(step))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never picked by DCP from a bare checkpoint_id: pass the reader explicitly

    def read_metadata(self) -> Metadata:  # no **kwargs: DCP must not fall back to rank-local metadata
        metadata = pickle.loads(self._metadata_bytes)  # bytes whose sha256 the manifest vouched for
        if not isinstance(metadata, Metadata):
            raise CorruptBundleError(f"step {self.bundle.step} at {self.bundle.url}: {self._metadata_relpath} is not DCP metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
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
                f"ranks opened different bundles ({seen}): a save committed while the load started; pass an explicit step"
            )
        return plans
