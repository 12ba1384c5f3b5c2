"""A Checkpointer bundle and its record: what it holds and what the manifest's metadata says of it.

```
step_<N>/
  state/.metadata, __<r>_<n>.distcp   the ranks' DCP checkpoint of the state dict, one participant per rank
  extra/<name>.json | .pt             the coordinator's (rank 0's) extra pieces, one copy (pieces.py)
  extra/rank<r>/<name>.json | .pt     each rank's own pieces (RNG states): participant rank<r>-extra
  manifest.json, COMMIT
```

The record (``CHECKPOINTER_BUNDLE``) is declared once here; a restore checks it before it reads a byte, and a
save checks what it is about to commit, so a bundle no restore would read is never committed. A bundle of
`rlckpt train` (a run bundle) is not a Checkpointer bundle, and the other way round: each refuses the other's
by name (BundleFormatError).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import rlckpt
from rlckpt.checkpoint.kinds import CHECKPOINTER_FORMAT_KEY
from rlckpt.errors import BundleFormatError, CorruptBundleError, ExtraPieceError, UnreadableBundleError
from rlckpt.formats import Anything, Field, Int, ListOf, MapOf, Number, Record, Str
from rlckpt.store import Bundle
from rlckpt.store.records.manifest import check_metadata

from .pieces import KINDS, NAME_PATTERN, piece_path

STATE_DIR = "state"  # the DCP checkpoint's directory inside the bundle
STATE_METADATA = f"{STATE_DIR}/.metadata"
FORMAT_KEY = CHECKPOINTER_FORMAT_KEY
# The Checkpointer-bundle format written today. 1: state/ (DCP) + extra pieces in json or pt.
CHECKPOINTER_BUNDLE_FORMAT = 1

_PIECES = MapOf(Str(choices=KINDS), key=Str(pattern=NAME_PATTERN, meaning="a piece name (1-64 of [A-Za-z0-9_-])"))

CHECKPOINTER_BUNDLE = Record(
    "checkpointer-bundle metadata",
    CHECKPOINTER_BUNDLE_FORMAT,
    (
        Field("world_size", Int(minimum=1), "how many ranks saved `state/` (a restore may use another count)"),
        Field("extra", _PIECES, "the coordinator's extra pieces, name → form: the file `extra/<name>.<form>`"),
        Field(
            "rank_extra",
            ListOf(_PIECES),
            "each rank's own pieces, by rank (empty, or one entry per rank): `extra/rank<r>/<name>.<form>`",
        ),
        Field(
            "metrics",
            MapOf(Number()),
            "the numbers the save recorded (`save(metrics=...)`): what retention's `keep_best` ranks by",
            False,
        ),
        Field("user", Anything(), "the caller's JSON metadata (`save(metadata=...)`), handed back by restore", False),
    ),
    CorruptBundleError,
    version_key=FORMAT_KEY,
    constant="CHECKPOINTER_BUNDLE_FORMAT",
    stored_in="`manifest.json`, its `metadata` (the store's user metadata)",
    writer="`rlckpt.checkpointer` (`Checkpointer.save`, on the coordinator)",
    doc=(
        "What a restore of a `rlckpt.Checkpointer` bundle needs to know before it reads a byte: how many ranks "
        "wrote the DCP checkpoint under `state/`, and which extra pieces there are, in which form (`json`: "
        "read with `json.loads`; `pt`: tensors, read with `torch.load(weights_only=True)` behind the tensor "
        "allowlist). Every piece it names must be in the manifest. A newer format, or none (a run bundle of "
        "`rlckpt train`), is refused in one line (`BundleFormatError`)."
    ),
    written_by="rlckpt 0.1.0, from 03b0043",
)


@dataclass(frozen=True)
class CheckpointerBundle:
    """What a Checkpointer bundle's record says."""

    step: int
    world_size: int
    extra: dict[str, str]  # name -> kind
    rank_extra: list[dict[str, str]]  # by rank
    metrics: dict[str, float] = field(default_factory=dict)
    user: Any = None

    def files(self) -> list[str]:
        """Every piece file the record names (the DCP checkpoint's are named by its `.metadata`)."""
        out = [piece_path(name, kind) for name, kind in self.extra.items()]
        for rank, pieces in enumerate(self.rank_extra):
            out.extend(piece_path(name, kind, rank) for name, kind in pieces.items())
        return out


def metadata_of(
    world_size: int,
    extra: Mapping[str, str],
    rank_extra: list[dict[str, str]],
    metrics: Mapping[str, float] | None,
    user: Any,
) -> dict[str, Any]:
    """The manifest metadata of a save, checked as a restore will read it: against today's declaration, and
    as the manifest will hold it (JSON, nested no deeper than readers take). `metrics` holds only finite
    numbers by now (the save dropped the others: store.finite_metrics).

    Raises:
        ExtraPieceError: the metrics or the caller's metadata would not be read; the save refuses it, naming
            the path inside it (``metadata['seen']: a builtins.set (not JSON)``).
    """
    meta: dict[str, Any] = {
        FORMAT_KEY: CHECKPOINTER_BUNDLE_FORMAT,
        "world_size": world_size,
        "extra": dict(extra),
        "rank_extra": rank_extra if any(rank_extra) else [],
    }
    if metrics:
        meta["metrics"] = dict(metrics)
    if user is not None:
        meta["user"] = user
    try:
        check_metadata(user, "metadata")  # the caller's own names first: metadata['seen'], not ['user']['seen']
        check_metadata(dict(metrics or {}), "metrics")
        CHECKPOINTER_BUNDLE.check(meta, "the metadata about to be committed")
        check_metadata(meta)
    except (CorruptBundleError, UnreadableBundleError, TypeError, ValueError) as exc:
        raise ExtraPieceError(f"the save's metrics or metadata would not be read by a restore: {exc}") from None
    return meta


def read_record(step: int, metadata: Mapping[str, Any]) -> CheckpointerBundle:
    """The Checkpointer record of a manifest's metadata.

    Raises:
        BundleFormatError: a format newer than this rlckpt reads, or none at all (not a Checkpointer bundle).
        CorruptBundleError: a field missing, of another type or unknown (named with its path).
    """
    found = metadata.get(FORMAT_KEY)
    if found is None:
        raise BundleFormatError(
            f"step {step} is not a Checkpointer bundle: its manifest names no format under {FORMAT_KEY!r} "
            "(a run bundle of `rlckpt train` is resumed by `rlckpt train`)"
        )
    if type(found) is int and found > CHECKPOINTER_BUNDLE_FORMAT:
        raise BundleFormatError(
            f"step {step}: checkpointer-bundle format {found} was written by a newer rlckpt than this one "
            f"({rlckpt.__version__}, which reads format {CHECKPOINTER_BUNDLE_FORMAT}); restore it with that rlckpt"
        )
    CHECKPOINTER_BUNDLE.check(dict(metadata), f"step {step}: manifest metadata")
    return CheckpointerBundle(
        step,
        metadata["world_size"],
        dict(metadata["extra"]),
        [dict(p) for p in metadata["rank_extra"]],
        dict(metadata.get("metrics", {})),
        metadata.get("user"),
    )


def check_bundle(bundle: Bundle) -> CheckpointerBundle:
    """What the manifest alone tells of a Checkpointer bundle: its record, and every file it names listed.

    Raises:
        BundleFormatError, CorruptBundleError: as `read_record`; CorruptBundleError also for a piece or the
            DCP metadata missing from the manifest, or `rank_extra` of another length than `world_size`.
    """
    record = read_record(bundle.step, bundle.manifest.metadata)
    where = f"step {bundle.step} at {bundle.url}"
    if record.rank_extra and len(record.rank_extra) != record.world_size:
        raise CorruptBundleError(
            f"{where}: rank_extra names {len(record.rank_extra)} ranks, the bundle was saved by {record.world_size}"
        )
    missing = [rel for rel in (STATE_METADATA, *record.files()) if rel not in bundle.manifest.files]
    if missing:
        raise CorruptBundleError(f"{where}: a Checkpointer bundle without {missing[:10]}")
    return record


def check_and_verify(bundle: Bundle) -> CheckpointerBundle:
    """`check_bundle`, then every file's digest (all of the bundle's bytes read once): what "verifies" means
    for the restore's choice, before any rank loads a tensor of it.

    Raises:
        CorruptBundleError: a file differs from the manifest (named); and what `check_bundle` raises.
    """
    record = check_bundle(bundle)
    bundle.verify()
    return record
