"""Start and stop a private, loopback-only local Ray cluster the way TransferQueue needs it here.

Every caller (main job, tests, benchmarks) uses this so a run never attaches to another user's
cluster (``address="local"``), stays on 127.0.0.1, and keeps its sockets and logs in a temp dir
the caller owns. docs/dataplane.md (Ray) says why each setting is there.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Ray reads these at import / start time; the raylet (and so TQ's storage-unit workers) inherits
# this process's environment. Set them before anything imports ray. setdefault keeps an explicit user choice.
RAY_ENV_DEFAULTS: dict[str, str] = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",
    "TQ_NUM_THREADS": "2",
}
for _name, _value in RAY_ENV_DEFAULTS.items():
    os.environ.setdefault(_name, _value)

# TQ's controller and each storage unit ask for num_cpus=1; Ray's CPU count is only a scheduling
# label, and with the machine's real 2 cores tq.init() hangs silently. 4 leaves room for them.
DEFAULT_NUM_CPUS = 4

# Unix socket paths under the temp dir must stay below ~107 bytes.
_MAX_TEMP_DIR_LEN = 60


@dataclass(frozen=True)
class LocalRayCluster:
    """What start_local_ray started: its temp dir and the address drivers in it use."""

    temp_dir: Path
    address: str


def start_local_ray(
    temp_dir: str | Path,
    *,
    num_cpus: int = DEFAULT_NUM_CPUS,
    log_to_driver: bool = False,
) -> LocalRayCluster:
    """Start a new local Ray cluster on loopback in ``temp_dir`` and connect this process to it.

    Refuses when this process is already connected to a Ray cluster: a second ``ray.init`` would
    either fail or silently reuse it.
    """
    temp_dir = Path(temp_dir).resolve()
    if len(str(temp_dir)) > _MAX_TEMP_DIR_LEN:
        raise ValueError(
            f"start_local_ray: temp dir {temp_dir} is {len(str(temp_dir))} chars; Ray's unix sockets "
            f"need it under {_MAX_TEMP_DIR_LEN} (use e.g. tempfile.mkdtemp(dir='/tmp'))"
        )
    temp_dir.mkdir(parents=True, exist_ok=True)
    import ray

    if ray.is_initialized():
        raise RuntimeError("start_local_ray: this process is already connected to a Ray cluster")
    logger.info("starting local Ray cluster in %s (num_cpus=%d)", temp_dir, num_cpus)
    context: Any = ray.init(  # a RayContext; its address_info is not in the type stubs
        address="local",
        num_cpus=num_cpus,
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        _temp_dir=str(temp_dir),
        log_to_driver=log_to_driver,
    )
    return LocalRayCluster(temp_dir=temp_dir, address=str(context.address_info.get("gcs_address", "")))


def connect_ray(address: str, *, log_to_driver: bool = False) -> None:
    """Join an existing Ray cluster at ``address`` (``rlckpt train --ray-address``) instead of starting
    one; ``stop_local_ray`` then only disconnects (the cluster is not ours to stop).

    The cluster's nodes need the environment above set when they were started (``ray start``), and
    TransferQueue's named controller makes it one run per cluster at a time.
    """
    import ray

    if ray.is_initialized():
        raise RuntimeError("connect_ray: this process is already connected to a Ray cluster")
    logger.info("joining the Ray cluster at %s", address)
    host = address.rsplit(":", 1)[0]
    node_ip = "127.0.0.1" if host in ("127.0.0.1", "localhost") else None  # a loopback cluster: stay on it
    ray.init(address=address, include_dashboard=False, log_to_driver=log_to_driver, _node_ip_address=node_ip)


def stop_local_ray() -> None:
    """Disconnect, stopping the cluster if this process started it (no-op when not connected)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
        logger.info("local Ray cluster stopped")
