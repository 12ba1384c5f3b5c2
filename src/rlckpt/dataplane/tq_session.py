"""A real TransferQueue on a private local Ray cluster for one process: started, emptied between uses, a
connect-only client on it, stopped. What `rlckpt bench barrier`, the benchmarks and the tests' session
fixture (tests/support/tq.py) start TransferQueue with."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
