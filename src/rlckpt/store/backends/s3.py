"""S3 through s3fs: the object-store protocol plus what only S3 has (a bucket to check, incomplete
multipart uploads to list and abort) and request-saving forms of s3fs calls."""

from __future__ import annotations

from typing import Any

from rlckpt.errors import StoreUnavailableError

from ..storage_errors import service_error_code
from .base import Listing
from .object_store import ObjectBackend


def _is_invalid_range(exc: BaseException) -> bool:
    """S3 answers a ranged GET of an empty object with 416 InvalidRange (Ceph RGW's reaches us as
    `OSError: [Errno 22] None`, the code only in the cause)."""
    text = f"{type(exc).__name__}: {exc}"
    return (
        service_error_code(exc) == "InvalidRange"
        or "InvalidRange" in text
        or "416" in text
        or "not satisfiable" in text.lower()
    )


class S3Backend(ObjectBackend):
    """s3fs (possibly behind a wrapper that forwards its attributes)."""

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
            if start == 0 and _is_invalid_range(exc):
                return b""
            raise

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
