"""Where a benchmark writes bundles: a local directory, S3 on a moto server on loopback, or an
external S3 endpoint such as Ceph RGW. Each destination hands out fresh run URLs under it."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlckpt.s3local import AWS_ISOLATION_ENV, make_s3fs, moto_server, s3_options_for

__all__ = ["Destination", "local_destination", "moto_server", "s3_destination"]

BUCKET = "rlckpt-bench"


@dataclass
class Destination:
    """A named place for run dirs: ``root`` is a local path or ``s3://bucket/prefix``."""

    name: str
    root: str
    storage_options: dict[str, Any] | None = None
    # where s3torchconnector saves instead, when the server refuses its saves (Ceph 16's RGW: no ETag on
    # CompleteMultipartUpload): the ETag proxy in front of the same server; it still loads from `storage_options`
    s3tc_save_options: dict[str, Any] | None = None
    _counter: int = field(default=0, repr=False)
    _fs: Any = field(default=None, repr=False)

    @property
    def is_s3(self) -> bool:
        return self.root.startswith("s3://")

    def run_url(self, label: str) -> str:
        """A fresh, never used run URL under this destination (``label`` keeps it readable)."""
        self._counter += 1
        return f"{self.root.rstrip('/')}/{label}-{self._counter:03d}"

    def filesystem(self) -> Any:
        """The fsspec filesystem for raw copies to this destination (one per destination: it must
        outlive the benchmark's event loops, see ``barrier.run_point``)."""
        import fsspec

        if self._fs is None:
            if self.is_s3:
                self._fs = fsspec.filesystem("s3", **(self.storage_options or {}))
            else:
                self._fs = fsspec.filesystem("file", auto_mkdir=True)
        return self._fs


def local_destination(root: Path) -> Destination:
    """Bundles under ``root`` on local disk."""
    root.mkdir(parents=True, exist_ok=True)
    return Destination("local", str(root))


def s3_destination(name: str, endpoint: str, key: str = "testing", secret: str = "testing") -> Destination:
    """Bundles under a fresh prefix of the benchmark bucket on ``endpoint`` (bucket made if missing)."""
    # s3fs/boto must see only the benchmark's endpoint and credentials, never a user profile.
    for var, value in AWS_ISOLATION_ENV.items():
        os.environ.setdefault(var, value)
    options = s3_options_for(endpoint, key, secret)
    fs = make_s3fs(options)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    return Destination(name, f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}", options)
