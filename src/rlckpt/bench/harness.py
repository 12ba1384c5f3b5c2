"""What a benchmark run needs around it: a private Ray + TransferQueue, a moto server, destinations.

The CLI uses these; smoke tests use pytest's session fixtures instead (one TQ per test session).
"""

from __future__ import annotations

import contextlib
import platform
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlckpt.bench.destinations import Destination, local_destination, moto_server, s3_destination


@contextlib.contextmanager
def private_transfer_queue() -> Iterator[None]:
    """A local Ray cluster and a bootstrap TransferQueue owned by this process, shut down on exit."""
    from rlckpt.dataplane.tq_session import start_tq_session, stop_tq_session

    session = start_tq_session(Path(tempfile.mkdtemp(prefix="rlckpt-bench-", dir="/tmp")))
    try:
        yield
    finally:
        stop_tq_session(session)


@dataclass
class DestinationSet:
    """The destinations of one run and the scratch dir the local one lives in."""

    destinations: list[Destination]
    scratch: Path


@contextlib.contextmanager
def destinations(
    names: list[str],
    *,
    scratch_root: str | None = None,
    rgw_endpoint: str | None = None,
    rgw_key: str = "testing",
    rgw_secret: str = "testing",
) -> Iterator[DestinationSet]:
    """``local`` (a scratch dir on disk), ``s3`` (a moto server on loopback) and, with an endpoint, RGW."""
    scratch = Path(tempfile.mkdtemp(prefix="rlckpt-bench-dest-", dir=scratch_root))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, scratch, ignore_errors=True)
        out: list[Destination] = []
        if "local" in names:
            out.append(local_destination(scratch / "local"))
        if "s3" in names:
            endpoint = stack.enter_context(moto_server())
            out.append(s3_destination("s3-moto", endpoint))
        if rgw_endpoint:
            out.append(s3_destination("s3-rgw", rgw_endpoint.rstrip("/"), rgw_key, rgw_secret))
        yield DestinationSet(out, scratch)


def run_metadata(command: list[str]) -> dict[str, Any]:
    """Machine and software facts stored beside every result."""
    import os

    import ray
    import torch

    try:
        from importlib.metadata import version

        tq_version = version("transferqueue")
    except Exception:
        tq_version = "unknown"
    return {
        "command": shlex.join(command),  # quoted: it can be pasted back
        "git_commit": _git_commit(),
        "load_average_1m": os.getloadavg()[0],
        "row_parser": "numpy (TransferQueueClient default)",
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%SZ"),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "ray": ray.__version__,
        "transferqueue": tq_version,
    }


def _git_commit() -> str:
    """HEAD of the source tree the benchmark ran from, with ``+dirty`` when files differ."""
    import subprocess

    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty.strip() else "")
