"""The restore procedure (driver side, once, before the controller actor exists): restore steps
1–3 of docs/architecture.md.

1. pick the newest committed bundle that verifies (checkpoint/choice.py, shared with rlckpt.checkpointer);
   the store checks marker → manifest digest → (with a verify key) signature → listing.
   A newer bundle that fails any check of steps 1–2 is skipped, loudly (logged, and listed in
   ``RestoredRun.skipped``); ``resume_step`` pins one step instead and fails if it does not verify.
   A two-tier run (docs/tiers.md) looks at every tier: the newest bundle that verifies on any of them,
   the first tier's (local) copy on a tie; the log says which tier and why
2. fetch every piece, verifying every digest (``policy/`` checked in place: the trainer ranks
   read it themselves; loader and replay index into memory; ``data_plane/`` into local staging);
   read the run-bundle record in whichever format wrote it (``run_format``); check every record
   against its declaration (the data plane's ``metadata.json`` and rows headers, the replay index, the
   loader state when the caller names its formats), the rollout order, and the pairing: the manifest,
   TransferQueue's ``metadata.json`` and the replay index must name the same index digest (a
   sidecar/data-plane pair from different saves is refused here); an index of an older format is read
   into today's (``replay.index_formats``)
3. trainer state (every trainer rank loads its shards with ``dcp.load``, digest-checked again, at
   any world size; a policy saved whole by run formats 1-2 is loaded whole and sharded by the ranks)
   and dataloader position; then the bootstrap data-plane client loads the snapshot → the metadata
   it was saved with

The restore phase moves NOT_STARTED → RESTORING → RESTORED (or FAILED) around 3, so the
connect-only client and the replay buffer can only be built afterwards (step 4, controller.setup).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rlckpt.checkpoint import codec, layout
from rlckpt.checkpoint.choice import SkippedBundle, as_tiers, candidates, choose, list_tiers, openings
from rlckpt.checkpoint.phase import RestorePhase
from rlckpt.checkpoint.run_format import INDEX_1_COMMIT_FIELDS, POLICY_DCP, PolicyForm, RunBundle, read_run_bundle
from rlckpt.checkpoint.staging import staging_dir
from rlckpt.dataplane.base import DataPlaneClient
from rlckpt.dataplane.rows_snapshot import check_rows_snapshot, is_rows_snapshot, restore_snapshot
from rlckpt.dataplane.snapshot_metadata import read_snapshot_metadata
from rlckpt.dataplane.threads import run_blocking
from rlckpt.errors import (
    CheckpointError,
    CorruptBundleError,
    DataPlaneError,
    ReplayStateError,
)
from rlckpt.formats import Record, read_format
from rlckpt.replay import groups_digest
from rlckpt.replay.index_formats import check_index, upgrade_index
from rlckpt.store import Bundle, BundleStore, Manifest, StoreEntry, VerifyKey

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PolicyLocation:
    """Where a committed bundle's policy checkpoint is: plain data, sent to every trainer rank, which
    opens the bundle itself (commit check, signature with the run's verify key, digests) and loads its
    shards. No policy byte passes through the driver on its way to the ranks, and no signing key: a
    verify key is a public key."""

    url: str
    storage_options: dict[str, Any]
    step: int
    prefix: str = layout.POLICY_DIR  # the DCP checkpoint's directory, or the file of a whole policy
    form: PolicyForm = POLICY_DCP  # "whole": one file of the trainer's unsharded state (run formats 1-2)
    verify_key: VerifyKey | None = None  # the driver's store's: the ranks refuse what it would refuse
    run_id: str | None = None  # the driver's store's pinned run, if any


class TrainerStateSink(Protocol):
    """The trainer side of a restore: loads the policy checkpoint of a verified bundle."""

    async def load_policy(self, location: PolicyLocation) -> None: ...


@dataclass
class RestoredRun:
    """What the driver hands the controller actor after a restore: what was restored, from which tier
    (`url`) and why that one (`why`)."""

    step: int
    manifest: Manifest
    loader_state: dict[str, Any]
    replay_state: dict[str, Any]
    data_plane_metadata: dict[str, Any]
    seconds: float
    skipped: list[SkippedBundle] = field(default_factory=list)
    url: str = ""
    why: str = ""

    @property
    def index_digest(self) -> str:
        return str(self.data_plane_metadata[layout.META_INDEX_DIGEST])

    @property
    def group_count(self) -> int:
        return int(self.data_plane_metadata[layout.META_GROUP_COUNT])


@dataclass
class _FetchedPieces:
    """Verified bytes of one bundle, before anything is deserialized."""

    loader: bytes
    replay: bytes
    snapshot_dir: Path


@dataclass
class _CheckedBundle:
    """A bundle whose pieces verified, read as their records and pair up; nothing is loaded yet."""

    bundle: Bundle
    pieces: _FetchedPieces
    run: RunBundle
    index: dict[str, Any]  # the replay index in today's format
    saved_index_digest: str  # the digest it was saved (and paired with its snapshot) under
    loader_state: Any  # the loader state as saved (checked when the caller named its formats)


async def restore_run(
    stores: BundleStore | Sequence[BundleStore],
    *,
    trainer: TrainerStateSink,
    bootstrap: DataPlaneClient,
    phase: RestorePhase,
    staging_root: str | None = None,
    expected_rollout_order: str | None = None,
    resume_step: int | None = None,
    loader_formats: Sequence[Record] = (),
) -> RestoredRun | None:
    """Restore the newest committed bundle that verifies, or mark the run fresh and return None if no
    store holds a committed bundle.

    Args:
        stores: the run's store, or its tiers (docs/tiers.md) in order of preference: the newest bundle
            that verifies on any of them is restored, from the first that holds that step on a tie.
        resume_step: restore exactly this step (no fallback); by default the newest that verifies.
        loader_formats: the declarations of every format of the loader state the caller reads (oldest
            first): it is then checked with the other records, before anything is loaded. Without them
            the loader state is handed back unchecked (the caller's own to read).
    Returns:
        What was restored (with the newer bundles skipped and why), or None for a fresh run.
    Raises:
        CheckpointError: `resume_step` does not verify, is not committed, or newer bundles that
            verify would collide with the resumed run's saves; or no committed bundle verifies.
        BundleFormatError: the newest bundle that opens (or `resume_step`) is of a run-bundle format
            this rlckpt does not read (a newer one): nothing is loaded, and no older bundle is tried.
        NewerFormatError: the same for the newest bundle's COMMIT or manifest (a store format).
        CorruptBundleError: a check after the data plane loaded the snapshot failed. (A bundle whose
            record does not read — a field missing, of another type or unknown, named with its record
            and path — counts as not verifying: it is skipped, or refused with `resume_step`.)
    """
    started = time.perf_counter()
    tiers = as_tiers(stores)
    listed = await run_blocking(list_tiers, tiers)  # 1
    if resume_step is None and not candidates(tiers, listed):
        phase.start_fresh()
        logger.info("no committed bundle at %s: starting fresh", " or ".join(s.url for s in tiers))
        return None
    with staging_dir(staging_root, prefix="rlckpt-restore-") as staging:
        reading = _Reading(expected_rollout_order, tuple(loader_formats))
        check = functools.partial(_fetch_and_check, staging=staging, reading=reading)
        chosen = await run_blocking(
            choose, tiers, check, listed=listed, resume_step=resume_step, accept=check_run_bundle
        )
        assert chosen is not None, "a candidate was listed, or the step is pinned"
        store, checked, skipped, why = chosen.store, chosen.checked, chosen.skipped, chosen.why
        logger.info("resuming step %d from %s: %s", chosen.step, store.url, why)
        step, pieces, run = checked.bundle.step, checked.pieces, checked.run
        phase.begin_restore(step)
        try:
            location = PolicyLocation(
                store.url,
                dict(store.storage_options),
                step,
                run.policy_path,
                run.policy_form,
                store.verify_key,
                store.run_id,
            )
            await trainer.load_policy(location)  # 3
            loader_state = checked.loader_state
            metadata = await restore_snapshot(bootstrap, pieces.snapshot_dir)  # 3: TQ restored
            if metadata.get(layout.META_INDEX_DIGEST) != checked.saved_index_digest:
                raise CorruptBundleError(
                    f"step {step}: the data plane loaded a snapshot for index "
                    f"{metadata.get(layout.META_INDEX_DIGEST)}, the replay index is {checked.saved_index_digest}"
                )
        except BaseException:
            phase.fail()
            raise
        phase.finish_restore()
    # An index read from an older format has a digest of its own: the controller checks it against this.
    metadata = {**metadata, layout.META_INDEX_DIGEST: checked.index["digest"]}
    seconds = time.perf_counter() - started
    logger.info("restored step %d (%d groups) in %.2fs", step, len(checked.index["groups"]), seconds)
    return RestoredRun(
        step, checked.bundle.manifest, loader_state, checked.index, metadata, seconds, skipped, store.url, why
    )


@dataclass(frozen=True)
class _Reading:
    """What the caller asks of the bundle it resumes: its rollout order, the loader state's formats."""

    rollout_order: str | None
    loader_formats: tuple[Record, ...]


def check_resume_step(
    stores: BundleStore | Sequence[BundleStore], step: int, listed: Sequence[list[StoreEntry]] | None = None
) -> Bundle:
    """The checks of a pinned resume that need no cluster: no newer committed bundle on any tier that the
    resumed run would save over, and `step` opens (marker → manifest digest → listing) on the first tier
    where it does. Its digests are checked when it is fetched. `rlckpt train` runs this before Ray starts,
    so a wrong step fails in a second.

    Raises:
        CheckpointError: naming the step, the stores and why (also: not a run bundle this rlckpt reads).
    """
    return openings(as_tiers(stores), step, listed, accept=check_run_bundle)[0][1]


def check_run_bundle(bundle: Bundle) -> RunBundle:
    """What the manifest alone tells: the run-bundle record, in a format this rlckpt reads, and every
    piece a restore of that format reads listed. Checked before anything is fetched, so a bundle another
    tool committed is refused by name.

    Raises:
        BundleFormatError: a format this rlckpt does not read (or none: not written by `rlckpt train`).
        CorruptBundleError: a run bundle without one of its pieces.
    """
    run = read_run_bundle(bundle.step, bundle.manifest.metadata)
    missing = run.missing_pieces(bundle.manifest.files.keys())
    if missing:
        raise CorruptBundleError(
            f"step {bundle.step} at {bundle.url}: a run bundle of format {run.format} without {missing}"
        )
    return run


def _fetch_and_check(bundle: Bundle, *, staging: Path, reading: _Reading) -> _CheckedBundle:
    """Fetch every piece of an opened bundle digest-checked, read its records and check the pairing;
    nothing is loaded yet (in choose's thread: blocking)."""
    logger.info("restoring step %d from %s", bundle.step, bundle.url)
    run = check_run_bundle(bundle)  # 2: before any byte is fetched
    pieces = _fetch_verified(bundle, staging / f"step_{bundle.step}")  # 2
    snapshot_metadata = _check_data_plane(bundle.step, run, pieces.snapshot_dir)  # 2
    saved_index = _check_pairing(bundle.manifest, run, pieces, snapshot_metadata, reading.rollout_order)  # 2
    loader_state = _loader_state(bundle.step, pieces.loader, reading.loader_formats)  # 2
    index = _current_index(bundle.step, saved_index)
    return _CheckedBundle(bundle, pieces, run, index, saved_index["digest"], loader_state)


def _fetch_verified(bundle: Bundle, staging: Path) -> _FetchedPieces:
    """Read every piece through the store, which checks each digest before handing bytes out. The
    policy is only checked here (the ranks read it): a bundle whose policy does not verify is skipped
    before anything is loaded, like any other corrupt piece."""
    bundle.verify(under=layout.POLICY_DIR)
    snapshot_dir = staging / layout.DATA_PLANE_DIR
    bundle.get_dir(layout.DATA_PLANE_DIR, snapshot_dir)
    return _FetchedPieces(
        loader=bundle.read_bytes(layout.LOADER_FILE),
        replay=bundle.read_bytes(layout.REPLAY_FILE),
        snapshot_dir=snapshot_dir,
    )


def _check_pairing(
    manifest: Manifest,
    run: RunBundle,
    pieces: _FetchedPieces,
    snapshot_metadata: dict[str, Any],
    expected_rollout_order: str | None,
) -> dict[str, Any]:
    """The replay index as saved; refuses a bundle of another rollout order, or whose replay index and
    data-plane snapshot come from different saves."""
    step = manifest.step
    manifest_digest = manifest.metadata[layout.META_INDEX_DIGEST]  # read_run_bundle checked it is there
    snapshot_digest = snapshot_metadata[layout.META_INDEX_DIGEST]
    where = f"step {step}: {layout.REPLAY_FILE}"
    replay_state = codec.loads(pieces.replay, origin=where)
    try:
        check_index(replay_state, where)  # every field before the digest: a tensor has no JSON to digest
    except ReplayStateError as exc:
        raise CorruptBundleError(str(exc)) from exc
    replay_digest = groups_digest(replay_state["groups"])
    if not (manifest_digest == snapshot_digest == replay_digest == replay_state.get("digest")):
        raise CorruptBundleError(
            f"step {step}: replay index and data-plane snapshot come from different saves: "
            f"manifest names index {manifest_digest}, {layout.DATA_PLANE_METADATA} names {snapshot_digest}, "
            f"{layout.REPLAY_FILE} holds {replay_digest}; refusing to load anything"
        )
    if expected_rollout_order is not None and run.rollout_order != expected_rollout_order:
        raise CheckpointError(
            f"step {step}: bundle was saved with rollout order {run.rollout_order!r}, this run asks for "
            f"{expected_rollout_order!r}; resume with --mode {run.rollout_order}"
        )
    return replay_state


def _check_data_plane(step: int, run: RunBundle, snapshot_dir: Path) -> dict[str, Any]:
    """The data plane's records, before anything of it is loaded: ``metadata.json`` and the data-plane
    metadata in it (in the run-bundle format's shape, returned), and a rows snapshot's every header."""
    where = f"step {step}: {layout.DATA_PLANE_METADATA}"
    try:
        user_metadata = read_snapshot_metadata(snapshot_dir)
        if is_rows_snapshot(snapshot_dir):
            check_rows_snapshot(snapshot_dir)
    except DataPlaneError as exc:
        raise CorruptBundleError(f"step {step}: {layout.DATA_PLANE_DIR}/ does not read: {exc}") from exc
    run.data_plane_record.check(user_metadata, where)
    return user_metadata


def _loader_state(step: int, data: bytes, formats: Sequence[Record]) -> Any:
    """The loader state as saved, checked against the caller's declarations of it when there are any."""
    where = f"step {step}: {layout.LOADER_FILE}"
    state = codec.loads(data, origin=where)
    if formats:
        try:
            read_format(formats, state, where)
        except formats[-1].error as exc:
            raise CorruptBundleError(str(exc)) from exc
    return state


def _current_index(step: int, saved: dict[str, Any]) -> dict[str, Any]:
    """The saved replay index in today's format (an older one read by ``upgrade_index``; the commits of
    `rlckpt train` that saved a format-1 index wrote ``INDEX_1_COMMIT_FIELDS``)."""
    try:
        return upgrade_index(saved, commit_fields=INDEX_1_COMMIT_FIELDS, where=f"step {step}: {layout.REPLAY_FILE}")
    except ReplayStateError as exc:
        raise CorruptBundleError(str(exc)) from exc
