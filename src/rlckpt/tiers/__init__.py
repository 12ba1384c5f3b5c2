"""Two tiers (docs/tiers.md): every save commits to a fast local tier; committed bundles are replicated in the
background into a remote tier through its own transaction (the same bundle, store/upkeep/replica.py). Above the
store, below the checkpoint procedures and the controller; no torch, Ray or TransferQueue here."""

from .config import DEFAULT_COPY_WORKERS, ReplicationConfig
from .holds import ReplicaState, replication_holds, same_bundle
from .identity import check_one_run, one_run
from .queue import ReplicationQueue, Replicator, ThreadReplicator, describe_failure
from .replicate import BundleReplicator, ReplicationReport

__all__ = [
    "DEFAULT_COPY_WORKERS",
    "BundleReplicator",
    "ReplicaState",
    "ReplicationConfig",
    "ReplicationQueue",
    "ReplicationReport",
    "Replicator",
    "ThreadReplicator",
    "check_one_run",
    "describe_failure",
    "one_run",
    "replication_holds",
    "same_bundle",
]
