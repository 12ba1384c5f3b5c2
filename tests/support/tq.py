"""pytest plugin: one real TransferQueue on a private local Ray cluster for the whole session.

Starting Ray + TQ costs ~15-20 s, so tests share one bootstrap client (``tq_session``) and get an
empty TQ and a fresh connect-only client from ``tq_plane``. Tests that need a *fresh cluster*
(a real restore) run ``restore_in_fresh_cluster`` (a subprocess with its own Ray).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlckpt.dataplane.tq_session import TQSession, connect_client, reset_tq_state, start_tq_session, stop_tq_session

RESTORE_TIMEOUT_S = 180


def restore_in_fresh_cluster(
    snapshot_dir: Path,
    out_file: Path,
    *,
    partition_id: str,
    replay_state_file: Path | None = None,
) -> dict[str, Any]:
    """Restore ``snapshot_dir`` into a new Ray cluster + TQ in a subprocess; return its report.

    The report (see ``support.tq_restore``) holds the restored metadata, sample ids and
    rows (loaded from ``out_file`` with torch.load) and, with a replay state, the index digest.
    """
    import torch

    cmd = [sys.executable, "-m", "support.tq_restore", str(snapshot_dir), partition_id, str(out_file)]
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
