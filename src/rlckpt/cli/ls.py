"""`rlckpt ls URL`: every step-like thing in a store with its state, size, file count and creation time; with
--replicated-to, a two-tier run's both tiers side by side (docs/tiers.md)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from rlckpt.checkpoint.kinds import KIND_KEYS, bundle_kind
from rlckpt.checkpoint.layout import META_FORMAT
from rlckpt.cli import _common

EPILOG = """\
examples:
  rlckpt ls /data/run1
  rlckpt ls s3://bucket/run1 --storage-options '{"endpoint_url": "http://127.0.0.1:7480"}'
  rlckpt ls /data/run1 --json | jq '.[] | select(.state == "committed") | .step'
  rlckpt ls /nvme/run1 --replicated-to s3://bucket/run1   # both tiers: local, remote, lag

Only bundles in state "committed" are ever resumed; the others are what a crashed or running
writer left and `rlckpt gc` cleans up. SIGNATURE is signed, unsigned or bad: with --verify-key
(or RLCKPT_VERIFY_KEY) "signed" means signed by that key for this run, and an unsigned or badly
signed bundle is "corrupt"; without one, "signed (unchecked)" only says COMMIT carries a signature.
"""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "ls",
        help="list the bundles of a store and their state",
        description=(
            "List every step found in a store, committed or not: step, state, signature, size,\n"
            "unchanged (bytes in files the bundle before also holds: with reuse on, taken from it\n"
            "rather than written), files, creation time. States: committed, corrupt, newer,\n"
            "uncommitted, writing, stale.\n"
            "--json also shows what wrote each committed bundle: manifest_format, digest,\n"
            "bundle_kind (run, checkpointer) and bundle_format, run_format, writer_version, and\n"
            "its signer: signed_by (a key id), run (the run id),\n"
            "signature_checked."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common.add_common_arguments(parser)
    _common.add_remote_tier_arguments(parser, "show both tiers side by side (local state, remote state, lag)")
    parser.add_argument("--json", action="store_true", help="print a JSON list of records instead of a table")
    parser.set_defaults(func=run)


def entry_record(entry: Any, signature_checked: bool = False) -> dict[str, Any]:
    """A store entry as a plain dict (the --json form): what wrote a committed bundle shows as its manifest
    format, digest algorithm, kind and that kind's format (`bundle_kind`, `bundle_format`; `run_format` the
    run-bundle format alone, as written) and writer version; `signature_checked` says whether its signature
    was checked (a verify key was given)."""
    record = (
        dataclasses.asdict(entry)
        if dataclasses.is_dataclass(entry) and not isinstance(entry, type)
        else dict(vars(entry))
    )
    metadata = record.pop("metadata", None) or {}
    record["run_format"] = metadata.get(META_FORMAT)
    kind = bundle_kind(metadata)
    record["bundle_kind"], record["bundle_format"] = kind.kind, kind.format
    record["signature_checked"] = signature_checked
    return record


def _signature(record: dict[str, Any]) -> str:
    shown = record.get("signature") or "-"
    return f"{shown} (unchecked)" if shown == "signed" and not record.get("signature_checked") else shown


def render(records: list[dict[str, Any]]) -> str:
    """The human table: one row per entry, ascending step; DETAIL says why an entry is corrupt or who
    holds a transaction (render_table escapes the names in it)."""
    rows = [
        [
            str(r.get("step")),
            str(r.get("state")),
            _signature(r),
            _common.format_size(r.get("size")),
            "-" if r.get("unchanged") is None else _common.format_size(r.get("unchanged")),
            "-" if r.get("files") is None else str(r.get("files")),
            _common.format_time(r.get("created")),
            str(r.get("detail") or ""),
        ]
        for r in records
    ]
    headers = ["STEP", "STATE", "SIGNATURE", "SIZE", "UNCHANGED", "FILES", "CREATED (UTC)", "DETAIL"]
    return _common.render_table(headers, rows, right_align={0, 3, 4, 5})


def tier_records(rows: list[Any]) -> list[dict[str, Any]]:
    """Both tiers' rows as plain dicts (the --json form of --replicated-to)."""
    return [
        {
            "step": row.step,
            "local": None if row.local is None else entry_record(row.local),
            "remote": None if row.remote is None else entry_record(row.remote),
            "replicated": row.replicated,
            "skipped_for": row.skipped_for,
            "lag_s": row.lag_s,
        }
        for row in rows
    ]


def render_tiers(records: list[dict[str, Any]]) -> str:
    """The two-tier table: a step's state on each tier, its size, its local creation time, the seconds
    from its local COMMIT to its remote one, and a step passed over for a newer one."""

    def state(entry: dict[str, Any] | None) -> str:
        return "-" if entry is None else str(entry.get("state"))

    rows = []
    for r in records:
        either = r["local"] or r["remote"] or {}
        details = [str(e["detail"]) for e in (r["local"], r["remote"]) if e and e.get("detail")]
        if state(r["local"]) == state(r["remote"]) == "committed" and not r["replicated"]:
            details.append("another bundle of this step on each tier")
        if r["skipped_for"] is not None:
            details.append(f"not replicated: skipped for step {r['skipped_for']}")
        detail = " / ".join(details)
        lag = "-" if r["lag_s"] is None else f"{r['lag_s']:.1f}s"
        rows.append(
            [
                str(r["step"]),
                state(r["local"]),
                state(r["remote"]),
                _common.format_size(either.get("size")),
                _common.format_time(either.get("created")),
                lag,
                detail,
            ]
        )
    headers = ["STEP", "LOCAL", "REMOTE", "SIZE", "CREATED (UTC)", "LAG", "DETAIL"]
    return _common.render_table(headers, rows, right_align={0, 3, 5})


def lag_line(lag: Any, remote_url: str) -> str:
    """One line: how far the remote tier is behind the local one (by the same bundle of the run on both)."""
    where = _common.printable(remote_url)
    if not lag.not_replicated:
        if lag.local_newest is None:
            return f"the local tier holds no committed bundle; remote tier {where}: nothing to replicate"
        return f"remote tier {where} holds the newest local bundle (step {lag.local_newest})"
    if lag.replicated_newest is None:
        held = "no committed bundle" if lag.remote_newest is None else "no bundle of the local tier"
    else:
        held = f"the local bundles up to step {lag.replicated_newest}"
    steps = ", ".join(str(s) for s in lag.not_replicated)
    return f"remote tier {where} holds {held}; not replicated yet: step(s) {steps}"


def run_tiers(args: argparse.Namespace, local: Any) -> int:
    from rlckpt.tiers.status import side_by_side

    remote = _common.open_remote(args)
    _common.check_one_run(local, remote, "nothing listed")
    rows, lag = side_by_side(local, remote)
    records = tier_records(rows)
    if args.json:
        _common.print_json(
            {
                "local": args.url,
                "remote": args.remote,
                "steps": records,
                "local_newest": lag.local_newest,
                "remote_newest": lag.remote_newest,
                "replicated_newest": lag.replicated_newest,
                "not_replicated": lag.not_replicated,
            }
        )
        return _common.EXIT_OK
    if records:
        print(render_tiers(records))
    print(lag_line(lag, args.remote))
    return _common.EXIT_OK


def run(args: argparse.Namespace) -> int:
    store = _common.open_store(args)
    if args.remote is not None:
        return run_tiers(args, store)
    checked = store.verify_key is not None
    records = [entry_record(e, checked) for e in store.entries(metadata_keys=KIND_KEYS)]
    if args.json:
        _common.print_json(records)
    elif records:
        print(render(records))
    else:
        print(f"no bundles in {_common.printable(args.url)}")
    return _common.EXIT_OK
