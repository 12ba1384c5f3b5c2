"""Start and stop a private, loopback-only local Ray cluster the way TransferQueue needs it here.

Every caller (main job, tests, benchmarks) uses this so a run never attaches to another user's
cluster (``address="local"``), stays on 127.0.0.1, and keeps its sockets and logs in a temp dir
the caller owns. docs/dataplane.md (Ray) says why each setting is there.

SIGTERM is the caller's (docs/architecture.md, Stopping): every process of a private cluster starts
with SIGTERM blocked, as Ray's own children start with SIGINT blocked, so a job-wide SIGTERM (Slurm
signals every process of the job) reaches only the driver, which drives the stop; and the handler
``ray.init`` installs in the caller (``sys.exit(15)``) is replaced by the caller's own again. The
cluster dies with the driver, however the driver ends: a reaper (``cluster_reaper``) kills what
``ray.shutdown`` or a SIGKILL of the driver leaves behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlckpt.dataplane import cluster_reaper
from rlckpt.errors import ClusterConfigError, ClusterUnavailableError

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

# How long joining a cluster may take to find out that no Ray answers at the address. ray.init alone
# retries for many minutes there (20 tries of up to 40 s each, printing warnings, raising nothing).
DEFAULT_CONNECT_TIMEOUT_S = 30.0
# How much of a gRPC or Ray error a refusal quotes (its first line).
_CAUSE_CHARS = 200
_reaper: cluster_reaper.ClusterReaper | None = None  # the private cluster this process started, if any


@contextlib.contextmanager
def _cluster_marked(temp_dir: Path) -> Iterator[None]:
    """``CLUSTER_ENV`` set while Ray starts its processes (the raylet passes it on to every worker it starts
    later), and only then: other programs this process starts are not the cluster's."""
    before = os.environ.get(cluster_reaper.CLUSTER_ENV)
    os.environ[cluster_reaper.CLUSTER_ENV] = str(temp_dir)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(cluster_reaper.CLUSTER_ENV, None)
        else:
            os.environ[cluster_reaper.CLUSTER_ENV] = before


@contextlib.contextmanager
def _sigterm_left_to_caller() -> Iterator[None]:
    """SIGTERM blocked while Ray starts: every process started meanwhile inherits the block (the kernel
    keeps a blocked signal pending, never delivered), and so do the workers the raylet starts later.
    The caller's SIGTERM handler is put back over the one ``ray.init`` installs, and a SIGTERM that came
    meanwhile is delivered to it when the block ends."""
    in_main = threading.current_thread() is threading.main_thread()  # where handlers can be set
    previous = signal.getsignal(signal.SIGTERM) if in_main else None
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


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
    remove_temp_dir: bool = False,
) -> LocalRayCluster:
    """Start a new local Ray cluster on loopback in ``temp_dir`` and connect this process to it.

    Its processes leave SIGTERM to this one, and its reaper kills them when this process ends or calls
    ``stop_local_ray`` (module doc); with ``remove_temp_dir`` the reaper then removes ``temp_dir`` too.
    Refuses when this process is already connected to a Ray cluster: a second ``ray.init`` would
    either fail or silently reuse it.
    """
    temp_dir = Path(temp_dir).resolve()
    if len(str(temp_dir)) > _MAX_TEMP_DIR_LEN:
        raise ClusterConfigError(
            f"start_local_ray: temp dir {temp_dir} is {len(str(temp_dir))} chars; Ray's unix sockets "
            f"need it under {_MAX_TEMP_DIR_LEN} (use e.g. tempfile.mkdtemp(dir='/tmp'))"
        )
    temp_dir.mkdir(parents=True, exist_ok=True)
    import ray

    if ray.is_initialized():
        raise RuntimeError("start_local_ray: this process is already connected to a Ray cluster")
    logger.info("starting local Ray cluster in %s (num_cpus=%d)", temp_dir, num_cpus)
    global _reaper
    with _sigterm_left_to_caller(), _cluster_marked(temp_dir):
        _reaper = cluster_reaper.ClusterReaper(temp_dir, remove_dir=remove_temp_dir)
        try:
            context: Any = ray.init(  # a RayContext; its address_info is not in the type stubs
                address="local",
                num_cpus=num_cpus,
                _node_ip_address="127.0.0.1",
                include_dashboard=False,
                _temp_dir=str(temp_dir),
                log_to_driver=log_to_driver,
            )
        except BaseException:
            stop_local_ray()  # whatever part of a cluster ray.init started before it failed
            raise
    return LocalRayCluster(temp_dir=temp_dir, address=str(context.address_info.get("gcs_address", "")))


def split_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of a Ray cluster's GCS address ``host:port`` (``[v6]:port`` for IPv6).

    Raises:
        ClusterConfigError: anything else (no port, a port out of range, a scheme such as ``ray://``).
    """
    try:
        parts = urllib.parse.urlsplit(f"//{address}")
        host, port = parts.hostname, parts.port  # .port raises ValueError for a port that is no port
    except ValueError as exc:
        raise ClusterConfigError(f"{address!r} is not a Ray address host:port ({exc})") from None
    if not host or port is None or port == 0 or parts.path or parts.query or parts.fragment or "@" in address:
        raise ClusterConfigError(f"{address!r} is not a Ray address host:port (the GCS address `ray start` prints)")
    return host, port


def connect_ray(address: str, *, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S, log_to_driver: bool = False) -> None:
    """Join an existing Ray cluster at ``address`` (``rlckpt train --ray-address``) instead of starting
    one; ``stop_local_ray`` then only disconnects (the cluster is not ours to stop).

    The cluster's nodes need the environment above set when they were started (``ray start``), and
    TransferQueue's named controller makes it one run per cluster at a time.

    Raises:
        ClusterConfigError: ``address`` is not ``host:port``.
        ClusterUnavailableError: no Ray cluster answers there within ``timeout_s`` (asked before
            ``ray.init``, which alone would retry for minutes), or joining it failed.
    """
    import ray

    if ray.is_initialized():
        raise RuntimeError("connect_ray: this process is already connected to a Ray cluster")
    host, _port = split_address(address)
    logger.info("joining the Ray cluster at %s", address)
    _probe_gcs(address, timeout_s)
    node_ip = "127.0.0.1" if host in ("127.0.0.1", "localhost") else None  # a loopback cluster: stay on it
    try:
        with _sigterm_left_to_caller():
            ray.init(address=address, include_dashboard=False, log_to_driver=log_to_driver, _node_ip_address=node_ip)
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError ... with pages of advice
        raise ClusterUnavailableError(f"joining the Ray cluster at {address} failed: {_first_line(exc)}") from exc


def _probe_gcs(address: str, timeout_s: float) -> None:
    """ClusterUnavailableError unless the Ray GCS at ``address`` answers one request within ``timeout_s``.

    A refused connection or an unknown host fails at once, an address that takes the connection and says
    nothing after ``timeout_s``. The channel is Ray's own (its options, TLS when RAY_USE_TLS is set)."""
    import grpc
    from ray._private.gcs_utils import create_gcs_channel  # Ray's channel to its GCS; not a public API
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    messages: Any = gcs_service_pb2  # protobuf builds its classes at import: nothing for a type checker to see
    channel = create_gcs_channel(address)
    try:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        stub.GetClusterId(messages.GetClusterIdRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:
        code = exc.code()  # a failed call is also a grpc.Call
        if code == grpc.StatusCode.UNAUTHENTICATED:  # a GCS that wants a token: ray.init brings it
            return
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise ClusterUnavailableError(
                f"no Ray cluster answered at {address} within {timeout_s:g}s (--ray-connect-timeout)"
            ) from None
        details = _first_line(exc.details() or code.name)
        if code == grpc.StatusCode.UNAVAILABLE:  # gRPC's own words end with the cause: "...: Connection refused"
            cause = details.rsplit(": ", 1)[-1].strip("[] ") or details
            raise ClusterUnavailableError(f"no Ray cluster at {address}: {cause}") from None
        raise ClusterUnavailableError(
            f"what answers at {address} is not a Ray cluster ({code.name}: {details})"
        ) from None
    finally:
        channel.close()


def _first_line(exc: BaseException | str) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= _CAUSE_CHARS else line[:_CAUSE_CHARS] + "…"


def stop_local_ray() -> None:
    """Disconnect, stopping the cluster if this process started it: every process of it, the ones
    ``ray.shutdown`` leaves included (no-op when not connected and no cluster is left)."""
    import ray

    global _reaper
    if ray.is_initialized():
        _skip_graceful_kills()
        ray.shutdown()
        logger.info("local Ray cluster stopped")
    reaper, _reaper = _reaper, None
    if reaper is not None:
        reaper.reap()


def _skip_graceful_kills() -> None:
    """``ray.shutdown`` stops each process it started with SIGTERM, waits a second, then SIGKILLs it. The
    processes of a private cluster have SIGTERM blocked, so that second is lost five times over: go
    straight to the kill (Ray's own ``allow_graceful=False``) on the node object Ray keeps for them."""
    import ray._private.worker as ray_worker  # Ray's handle on the processes it started; not a public API

    node = getattr(ray_worker, "_global_node", None)
    kill_all = getattr(node, "kill_all_processes", None)
    if _reaper is None or kill_all is None:  # a joined cluster, or a Ray without it: Ray's own way
        return

    def kill_at_once(**kwargs: Any) -> None:
        kill_all(**{**kwargs, "allow_graceful": False})

    node.kill_all_processes = kill_at_once  # type: ignore[union-attr]
