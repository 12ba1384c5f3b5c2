"""S3 through s3fs: the object-store protocol plus what only S3 has (a bucket to check, incomplete
multipart uploads to list and abort), request-saving forms of s3fs calls, and files written and read
several requests at a time (s3_io.py): parts and files upload in parallel beside the writing, ranged GETs
of one read in parallel beside the hashing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlckpt.errors import StoreUnavailableError
from rlckpt.store.backends.base import HeldFile, Listing, PendingWrite
from rlckpt.store.backends.object_store import ObjectBackend
from rlckpt.store.backends.s3_io import (
    PART_BUFFERS,
    READ_PIECE,
    READS_IN_FLIGHT,
    UPLOAD_SLOTS,
    PartBuffers,
    S3Upload,
    StreamedObject,
    is_invalid_range,
    read_ranges,
)


class S3Backend(ObjectBackend):
    """s3fs (possibly behind a wrapper that forwards its attributes)."""

    streams_in_order = True

    def __init__(self, fs: Any, root: str) -> None:
        super().__init__(fs, root)
        # What bounds a process's uploads and reads (s3_io.py); a test may give one store smaller parts.
        self.part_buffers: PartBuffers = PART_BUFFERS
        self.upload_slots = UPLOAD_SLOTS
        self.read_piece = READ_PIECE
        self.reads_in_flight = READS_IN_FLIGHT

    def check_reachable(self, url: str) -> None:
        bucket = self.fs.split_path(self.root)[0]
        try:
            self.fs.call_s3("head_bucket", Bucket=bucket)
        except FileNotFoundError:
            raise StoreUnavailableError(f"store {url} unavailable: bucket {bucket!r} does not exist") from None

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """One ranged GET, no HEAD (s3fs only HEADs for an open-ended range)."""
        try:
            return bytes(self.fs.cat_file(path, start=start, end=end))
        except OSError as exc:
            if start == 0 and is_invalid_range(exc):
                return b""
            raise

    def read_into(
        self, path: str, view: memoryview, start: int = 0, on_chunk: Callable[[memoryview], object] | None = None
    ) -> int:
        """Ranged GETs of about `read_piece` bytes, `reads_in_flight` at once, straight into `view`; each piece is
        handed to `on_chunk` in order as it lands, while the next ones download."""
        return read_ranges(self.fs, path, view, start, on_chunk, self.read_piece, self.reads_in_flight)

    def hold(self, path: str) -> HeldFile:
        """`path` held for reads in order: one GET for all of them, kept open between them (StreamedObject)."""
        return StreamedObject(self, path)

    # --- writing --------------------------------------------------------------------------------
    def open_write(self, path: str) -> S3Upload:
        """Nothing is published until finish_write(ok=True)'s PendingWrite completes: no PUT, no completed
        multipart upload. A file dropped unfinished publishes nothing (an upload it began is gc's)."""
        return S3Upload(self.fs, path, self.upload_slots, self.part_buffers)

    def finish_write(self, raw: Any, path: str, ok: bool) -> PendingWrite | None:
        """Kept: send the rest (one PUT, or the last part); what completes it runs in the writer's background.
        Discarded: abort (the parts in flight are waited for, the multipart upload aborted)."""
        if ok:
            return raw.finish()
        raw.abort()
        return None

    def list_files(self, path: str) -> Listing:
        """One LIST, even when nothing is there (a plain find() of an empty prefix adds a HEAD and a
        second LIST to look for an object of that name)."""
        rel = self.rel(path)
        found = self.fs.find(self.root, prefix=f"{rel}/", detail=True)
        base = path + "/"
        return Listing(
            {full[len(base) :]: int(info.get("size") or 0) for full, info in found.items() if full.startswith(base)}, {}
        )

    def _find(self, path: str) -> dict[str, dict[str, Any]]:
        """The object at `path` and every object under `path/`, in one LIST (no HEAD)."""
        if path == self.root:
            return super()._find(path)
        found = self.fs.find(self.root, prefix=self.rel(path), detail=True)
        return {full: info for full, info in found.items() if full == path or full.startswith(path + "/")}

    def incomplete_uploads(self) -> list[tuple[str, str]]:
        bucket, prefix, _ = self.fs.split_path(self.root)
        out: list[tuple[str, str]] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix.rstrip("/") + "/" if prefix else ""}
        while True:
            page = self.fs.call_s3("list_multipart_uploads", **kwargs)
            out.extend((f"{bucket}/{u['Key']}", u["UploadId"]) for u in page.get("Uploads", []) or [])
            if not page.get("IsTruncated"):
                return out
            kwargs["KeyMarker"] = page.get("NextKeyMarker")
            kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker")

    def abort_upload(self, key: str, upload_id: str) -> None:
        bucket, path, _ = self.fs.split_path(key)
        self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=path, UploadId=upload_id)
