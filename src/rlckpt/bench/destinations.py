"""Where a benchmark writes bundles: a local directory, S3 on a moto server on loopback, or an
external S3 endpoint such as Ceph RGW. Each destination hands out fresh run URLs under it."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

BUCKET = "rlckpt-bench"
# s3fs/boto must see only the benchmark's endpoint and credentials, never a user profile.
_AWS_ISOLATION = {
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
}


@dataclass
class Destination:
    """A named place for run dirs: ``root`` is a local path or ``s3://bucket/prefix``."""

    name: str
    root: str
    storage_options: dict[str, Any] | None = None
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
    from rlckpt.testing.s3 import make_s3fs

    for var, value in _AWS_ISOLATION.items():
        os.environ.setdefault(var, value)
    options = {
        "endpoint_url": endpoint,
        "key": key,
        "secret": secret,
        "skip_instance_cache": True,
        "use_listings_cache": False,
    }
    fs = make_s3fs(options)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    return Destination(name, f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}", options)


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server subprocess on 127.0.0.1 for the duration of the block; yields its URL."""
    from rlckpt.testing.s3 import _free_port, _moto_server_command, _wait_http

    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        _moto_server_command(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        _wait_http(endpoint, proc)
        logger.info("moto server on %s (pid %d)", endpoint, proc.pid)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
