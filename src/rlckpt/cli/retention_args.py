"""The retention flags `rlckpt train` and `rlckpt gc` share (store/upkeep/retention.py): keep the last K, every
N-th step forever, the best K by a metric the run records; `rlckpt train` takes them again with
`--replica-` for its remote tier (docs/tiers.md)."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import storage_options_arg

# What `rlckpt train` records in each manifest (controller.config.RUN_METRICS; not imported: torch)
RUN_METRICS = ("reward", "loss")


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_retention_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    prefix: str = "",
    tier: str = "",
    metric_source: str = f"a number each manifest records under metrics ({', '.join(RUN_METRICS)})",
) -> None:
    """--{prefix}keep-last, --{prefix}keep-every, --{prefix}keep-best; `prefix` "" also adds --metric (ranking by
    `metric_source`) and --lower-is-better (one metric for every tier of a run)."""
    where = f" of the {tier}" if tier else ""
    parser.add_argument(
        f"--{prefix}keep-last",
        type=positive_int,
        default=None,
        metavar="K",
        help=f"keep the K newest committed bundles{where} that verify",
    )
    parser.add_argument(
        f"--{prefix}keep-every",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"keep every bundle{where} whose step is a multiple of N, forever",
    )
    parser.add_argument(
        f"--{prefix}keep-best",
        type=positive_int,
        default=None,
        metavar="K",
        help=f"keep the K bundles{where} with the best --metric",
    )
    if prefix:
        return
    parser.add_argument(
        "--metric",
        default=None,
        metavar="NAME",
        help=f"what --keep-best ranks by: {metric_source}",
    )
    parser.add_argument(
        "--lower-is-better", action="store_true", help="--keep-best keeps the lowest --metric (default: highest)"
    )


def add_replication_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--replicate-to URL, --replicate-every K, --replicate-storage-options JSON and the --replica-keep-* rules:
    the remote tier of a run (`rlckpt train`'s and the Checkpointer's alike, docs/tiers.md)."""
    parser.add_argument(
        "--replicate-to",
        default=None,
        metavar="URL",
        help="replicate committed bundles in the background to this remote tier (e.g. s3://bucket/run1)",
    )
    parser.add_argument(
        "--replicate-every",
        type=positive_int,
        default=1,
        metavar="K",
        help=(
            "replicate at most every K-th save, and the last one (default 1: every save, but a save still "
            "waiting while a newer one is due is skipped for it; ls --replicated-to names it)"
        ),
    )
    parser.add_argument(
        "--replicate-storage-options",
        type=storage_options_arg,
        default=None,
        metavar="JSON",
        help="fsspec options of the remote tier, as --storage-options",
    )
    add_retention_arguments(parser, prefix="replica-", tier="remote tier")


def retention_fields(args: argparse.Namespace, *, prefix: str = "") -> dict[str, Any]:
    """The flags as keyword arguments of store.Retention (or TrainConfig with the `prefix`), unchecked."""
    name = prefix.replace("-", "_")
    return {
        f"{name}keep_last": getattr(args, f"{name}keep_last"),
        f"{name}keep_every": getattr(args, f"{name}keep_every"),
        f"{name}keep_best": getattr(args, f"{name}keep_best"),
    }


def metric_fields(args: argparse.Namespace) -> dict[str, Any]:
    """--metric and --lower-is-better as keyword arguments."""
    return {"metric": args.metric, "lower_is_better": args.lower_is_better}
