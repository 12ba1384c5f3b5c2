"""Command-line flags for a trainer's Checkpointer — the run-level flags of `rlckpt train`, with the same names:
storage options, retention, the remote tier, keys, sync saves, the stop's grace and deadline. It lives with
the `rlckpt` command's flags (it reuses them); the Checkpointer itself reads no command line.

    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", required=True)
    add_checkpointer_arguments(parser)
    args = parser.parse_args()
    ckpt = Checkpointer(config_from_args(args, args.run_dir))
    stop = SaveAndStop(ckpt, **stop_settings(args))
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from rlckpt.checkpoint.stopping import DEFAULT_GRACE_S
from rlckpt.checkpointer import CheckpointerConfig
from rlckpt.cli import _common, retention_args
from rlckpt.store import Retention
from rlckpt.tiers import ReplicationConfig


def add_checkpointer_arguments(parser: argparse.ArgumentParser) -> None:
    """--storage-options, --keep-last/--keep-every/--keep-best/--metric/--lower-is-better, --replicate-to and its
    --replicate-every/--replicate-storage-options/--replica-keep-*, --signing-key/--verify-key, --sync-saves,
    --compress-policy, --grace-seconds, --save-by-seconds."""
    group = parser.add_argument_group("checkpoints (rlckpt.Checkpointer)")
    group.add_argument(
        "--storage-options",
        metavar="JSON",
        type=_common.storage_options_arg,
        default=None,
        help="fsspec options of the run dir's filesystem, as a JSON object",
    )
    retention_args.add_retention_arguments(group, metric_source="a number the trainer passes as save(metrics=...)")
    retention_args.add_replication_arguments(group)
    group.add_argument(
        "--signing-key",
        metavar="PATH",
        default=None,
        help=f"private key (rlckpt keygen) to sign every bundle with (default: ${_common.SIGNING_KEY_ENV})",
    )
    _common.add_verify_key_argument(group)  # type: ignore[arg-type]  # an argument group takes arguments too
    group.add_argument("--sync-saves", action="store_true", help="wait for every save's commit (default: async)")
    _common.add_compress_policy_argument(group)  # type: ignore[arg-type]  # an argument group takes arguments too
    _common.add_reuse_argument(group)  # type: ignore[arg-type]
    group.add_argument(
        "--grace-seconds",
        type=_common.positive_seconds_arg,
        default=DEFAULT_GRACE_S,
        metavar="S",
        help=f"how long a stop (SIGTERM, deadline) may take to save (default {DEFAULT_GRACE_S:.0f})",
    )
    group.add_argument(
        "--save-by-seconds",
        type=_common.positive_seconds_arg,
        default=None,
        metavar="N",
        help="a deadline N seconds from now by which the run has saved and stopped",
    )


def config_from_args(args: argparse.Namespace, url: str) -> CheckpointerConfig:
    """The CheckpointerConfig the flags describe, for the run at `url`.

    Raises:
        ValueError: rules that do not go together (--metric without --keep-best, ...); StoreConfigError (a
            ValueError): a $RLCKPT_RUN_ID that is not a run id.
        KeyFileError: a key file that cannot be used.
    """
    if args.metric is not None and args.keep_best is None and args.replica_keep_best is None:
        raise ValueError(f"--metric {args.metric} is for --keep-best (or --replica-keep-best), and neither is given")
    signing_key = _common.signing_key(args)
    verify_key = _common.verify_key(args) or (signing_key.public if signing_key else None)
    run_id = _common.run_id(args)
    replication = None
    if args.replicate_to is not None:
        replication = ReplicationConfig(
            args.replicate_to,
            args.replicate_storage_options,
            every=args.replicate_every,
            retention=_retention(args, "replica_"),
            verify_key=verify_key,
            run_id=run_id,
        )
    elif any(getattr(args, f"replica_{rule}") is not None for rule in ("keep_last", "keep_every", "keep_best")):
        raise ValueError("--replica-keep-* rules need a remote tier (--replicate-to)")
    return CheckpointerConfig(
        url,
        args.storage_options,
        retention=_retention(args, ""),
        replication=replication,
        signing_key=signing_key,
        verify_key=verify_key,
        run_id=run_id,
        async_save=not args.sync_saves,
        compression=args.compress_policy,
        reuse=args.reuse_unchanged,
    )


def stop_settings(args: argparse.Namespace, clock_now: float | None = None) -> dict[str, Any]:
    """SaveAndStop's keyword arguments from --grace-seconds and --save-by-seconds (from `clock_now`, default now)."""
    now = time.time() if clock_now is None else clock_now
    save_by = None if args.save_by_seconds is None else now + args.save_by_seconds
    return {"grace_s": args.grace_seconds, "save_by": save_by}


def _retention(args: argparse.Namespace, prefix: str) -> Retention:
    best = getattr(args, f"{prefix}keep_best")
    return Retention(
        keep_last=getattr(args, f"{prefix}keep_last"),
        keep_every=getattr(args, f"{prefix}keep_every"),
        keep_best=best,
        metric=args.metric if best is not None else None,
        lower_is_better=args.lower_is_better,
    )
