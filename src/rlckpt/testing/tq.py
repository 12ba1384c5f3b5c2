"""pytest plugin: one real TransferQueue on a private local Ray cluster for the whole session.

Starting Ray + TQ costs ~15-20 s, so tests share one bootstrap client (``tq_session``) and get an
empty TQ and a fresh connect-only client from ``tq_plane``. Tests that need a *fresh cluster*
(a real restore) run ``restore_in_fresh_cluster`` (a subprocess with its own Ray).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

RESTORE_TIMEOUT_S = 180


@dataclass
class TQSession:
    """The session's Ray temp dir and the bootstrap client that owns TransferQueue."""

    temp_dir: Path
    bootstrap_client: Any  # rlckpt.dataplane.tq_client.TransferQueueClient


def start_tq_session(temp_dir: Path, config: dict[str, Any] | None = None) -> TQSession:
    """Start a local Ray cluster in ``temp_dir`` and a bootstrap TransferQueue on it."""
    from rlckpt.dataplane.ray_cluster import start_local_ray, stop_local_ray
    from rlckpt.dataplane.tq_client import TransferQueueClient

    start_local_ray(temp_dir, log_to_driver=False)
    try:
        client = TransferQueueClient(config, bootstrap=True)
    except BaseException:
        stop_local_ray()
        raise
    return TQSession(temp_dir=temp_dir, bootstrap_client=client)


def stop_tq_session(session: TQSession) -> None:
    """Shut TransferQueue and the Ray cluster down and remove the temp dir."""
    import asyncio

    from rlckpt.dataplane.ray_cluster import stop_local_ray

    try:
        asyncio.run(session.bootstrap_client.close())
    finally:
        stop_local_ray()
        shutil.rmtree(session.temp_dir, ignore_errors=True)


def reset_tq_state() -> None:
    """Remove every partition from the running TransferQueue (rows and partition entries).

    TQ keeps an emptied partition listed and refuses to clear a partition without rows, so an
    empty one gets a throw-away row first.
    """
    import torch
    import transfer_queue as tq
    from tensordict import TensorDict

    client = tq.get_client()
    for partition_id, rows in (tq.kv_list() or {}).items():
        if not rows:
            tq.kv_batch_put(
                keys=["__reset__"], partition_id=partition_id, fields=TensorDict({"x": torch.zeros(1)}, batch_size=[1])
            )
        client.clear_partition(partition_id)
    leftover = tq.kv_list() or {}
    if leftover:
        raise RuntimeError(f"reset_tq_state: partitions left after reset: {sorted(leftover)}")


def connect_client() -> Any:
    """A new connect-only TransferQueueClient with clean per-client flags."""
    from rlckpt.dataplane.tq_client import TransferQueueClient

    return TransferQueueClient(bootstrap=False)


def restore_in_fresh_cluster(
    snapshot_dir: Path,
    out_file: Path,
    *,
    partition_id: str,
    replay_state_file: Path | None = None,
) -> dict[str, Any]:
    """Restore ``snapshot_dir`` into a new Ray cluster + TQ in a subprocess; return its report.

    The report (see ``rlckpt.testing.tq_restore``) holds the restored metadata, sample ids and
    rows (loaded from ``out_file`` with torch.load) and, with a replay state, the index digest.
    """
    import torch

    cmd = [sys.executable, "-m", "rlckpt.testing.tq_restore", str(snapshot_dir), partition_id, str(out_file)]
    if replay_state_file is not None:
        cmd += ["--replay-state", str(replay_state_file)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RESTORE_TIMEOUT_S, env=dict(os.environ))
    if proc.returncode != 0:
        raise RuntimeError(f"restore subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return torch.load(out_file, weights_only=True)


@pytest.fixture(scope="session")
def tq_session() -> Iterator[TQSession]:
    """Ray + a bootstrap TransferQueue (1 storage unit) for the whole test session."""
    temp_dir = Path(tempfile.mkdtemp(prefix="rlckpt-tq-", dir="/tmp"))
    session = start_tq_session(temp_dir)
    try:
        yield session
    finally:
        stop_tq_session(session)


@pytest.fixture
def tq_plane(tq_session: TQSession) -> Iterator[Any]:
    """An empty TransferQueue and a fresh connect-only client on it."""
    reset_tq_state()
    yield connect_client()
    reset_tq_state()


def write_json(path: Path, data: Any) -> Path:
    """Write ``data`` as JSON (for handing replay state to the restore subprocess)."""
    path.write_text(json.dumps(data))
    return path
