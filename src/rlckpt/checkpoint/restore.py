"""The restore procedure (driver side, once, before the controller actor exists): restore steps
1–3 of docs/architecture.md.

1. pick the newest committed bundle that verifies; the store checks marker → manifest digest → listing.
   A newer bundle that fails any check of steps 1–2 is skipped, loudly (logged, and listed in
   ``RestoredRun.skipped``); ``resume_step`` pins one step instead and fails if it does not verify
2. fetch every piece, verifying every digest (``policy/`` checked in place: the trainer ranks
   read it themselves; loader and replay index into memory; ``data_plane/`` into local staging);
   check the run-bundle format, the rollout order and the pairing: the manifest, TransferQueue's
   ``metadata.json`` and the replay index must name the same index digest (a sidecar/data-plane
   pair from different saves is refused here)
3. trainer state (every trainer rank loads its shards with ``dcp.load``, digest-checked again, at
   any world size) and dataloader position; then the bootstrap data-plane client loads the
   snapshot → the metadata it was saved with

The restore phase moves NOT_STARTED → RESTORING → RESTORED (or FAILED) around 3, so the
connect-only client and the replay buffer can only be built afterwards (step 4, controller.setup).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rlckpt.checkpoint import codec, layout
from rlckpt.checkpoint.phase import RestorePhase
from rlckpt.checkpoint.staging import staging_dir
from rlckpt.dataplane.base import DataPlaneClient
from rlckpt.dataplane.rows_snapshot import restore_snapshot
from rlckpt.dataplane.snapshot_metadata import read_snapshot_metadata
from rlckpt.dataplane.threads import run_blocking
from rlckpt.errors import CheckpointError, CorruptBundleError, DataPlaneError, UncommittedBundleError
from rlckpt.replay import groups_digest
from rlckpt.store import Bundle, BundleStore, Manifest, StoreEntry

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PolicyLocation:
    """Where a committed bundle's policy checkpoint is: plain data, sent to every trainer rank, which
    opens the bundle itself (commit check, digests) and loads its shards. No policy byte passes
    through the driver on its way to the ranks."""

    url: str
    storage_options: dict[str, Any]
    step: int
    prefix: str = layout.POLICY_DIR


class TrainerStateSink(Protocol):
    """The trainer side of a restore: loads the policy checkpoint of a verified bundle."""

    async def load_policy(self, location: PolicyLocation) -> None: ...


@dataclass(frozen=True)
class SkippedBundle:
    """A committed bundle newer than the one resumed, passed over because it does not verify."""

    step: int
    reason: str


@dataclass
class RestoredRun:
    """What the driver hands the controller actor after a restore."""

    step: int
    manifest: Manifest
    loader_state: dict[str, Any]
    replay_state: dict[str, Any]
    data_plane_metadata: dict[str, Any]
    seconds: float
    skipped: list[SkippedBundle] = field(default_factory=list)

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


async def restore_run(
    store: BundleStore,
    *,
    trainer: TrainerStateSink,
    bootstrap: DataPlaneClient,
    phase: RestorePhase,
    staging_root: str | None = None,
    expected_rollout_order: str | None = None,
    resume_step: int | None = None,
) -> RestoredRun | None:
    """Restore the newest committed bundle that verifies, or mark the run fresh and return None if the
    store holds no committed bundle.

    Args:
        resume_step: restore exactly this step (no fallback); by default the newest that verifies.
    Returns:
        What was restored (with the newer bundles skipped and why), or None for a fresh run.
    Raises:
        CheckpointError: `resume_step` does not verify, is not committed, or newer bundles that
            verify would collide with the resumed run's saves; or no committed bundle verifies.
        CorruptBundleError: a check after the data plane loaded the snapshot failed.
    """
    started = time.perf_counter()
    entries = await run_blocking(store.entries)  # 1
    candidates = [e for e in entries if e.state in ("committed", "corrupt")]
    if resume_step is None and not candidates:
        phase.start_fresh()
        logger.info("no committed bundle at %s: starting fresh", store.url)
        return None
    with staging_dir(staging_root, prefix="rlckpt-restore-") as staging:
        bundle, pieces, replay_state, skipped = await _first_that_verifies(
            store, candidates, staging, expected_rollout_order, resume_step
        )
        step = bundle.step
        phase.begin_restore(step)
        try:
            await trainer.load_policy(PolicyLocation(store.url, dict(store.storage_options), step))  # 3
            loader_state = codec.loads(pieces.loader, origin=f"step {step}: {layout.LOADER_FILE}")
            metadata = await restore_snapshot(bootstrap, pieces.snapshot_dir)  # 3: TQ restored
            if metadata.get(layout.META_INDEX_DIGEST) != replay_state["digest"]:
                raise CorruptBundleError(
                    f"step {step}: the data plane loaded a snapshot for index "
                    f"{metadata.get(layout.META_INDEX_DIGEST)}, the replay index is {replay_state['digest']}"
                )
        except BaseException:
            phase.fail()
            raise
        phase.finish_restore()
    seconds = time.perf_counter() - started
    logger.info("restored step %d (%d groups) in %.2fs", step, len(replay_state["groups"]), seconds)
    return RestoredRun(step, bundle.manifest, loader_state, replay_state, metadata, seconds, skipped)


async def _first_that_verifies(
    store: BundleStore,
    candidates: list[StoreEntry],
    staging: Path,
    expected_rollout_order: str | None,
    resume_step: int | None,
) -> tuple[Bundle, _FetchedPieces, dict[str, Any], list[SkippedBundle]]:
    """Steps 1-2 for each candidate, newest first, until one verifies; the newer ones are skipped."""
    if resume_step is not None:
        return (*await _pinned(store, candidates, staging, expected_rollout_order, resume_step), [])
    skipped: list[SkippedBundle] = []
    for entry in reversed(candidates):
        try:
            if entry.state == "corrupt":
                raise CorruptBundleError(entry.detail)
            bundle = await run_blocking(store.open, entry.step)
            return (*await _fetch_and_check(bundle, staging, expected_rollout_order), skipped)
        except CorruptBundleError as exc:
            logger.warning(
                "SKIPPING step %d at %s: it does not verify (%s); trying an older bundle", entry.step, store.url, exc
            )
            skipped.append(SkippedBundle(entry.step, str(exc)))
    reasons = "; ".join(f"step {s.step}: {s.reason}" for s in skipped)
    raise CheckpointError(
        f"no committed bundle at {store.url} verifies ({reasons}); nothing was restored. Move the bundles "
        "aside (or use a new run dir) to start over"
    )


def check_resume_step(store: BundleStore, step: int, entries: list[StoreEntry] | None = None) -> Bundle:
    """The checks of a pinned resume that need no cluster: no newer committed bundle the resumed run
    would save over, and `step` opens (marker → manifest digest → listing). Its digests are checked
    when it is fetched. `rlckpt train` runs this before Ray starts, so a wrong step fails in a second.

    Raises:
        CheckpointError: naming the step, the store and why (also: not a run bundle of this format).
    """
    entries = store.entries() if entries is None else entries
    newer = [e.step for e in entries if e.step > step and e.state == "committed"]
    if newer:
        raise CheckpointError(
            f"cannot resume step {step} at {store.url}: newer committed bundles {newer} exist, and the resumed run "
            "would save over their steps; move them aside or resume in a new run dir"
        )
    try:
        bundle = store.open(step)
        check_run_bundle(bundle)
    except (CorruptBundleError, UncommittedBundleError) as exc:
        raise _does_not_verify(store, step, exc) from exc
    return bundle


def check_run_bundle(bundle: Bundle) -> None:
    """What the manifest alone tells: a run bundle of RUN_BUNDLE_FORMAT that lists every piece a restore
    reads. Checked before anything is fetched, so a bundle another tool committed is refused by name.

    Raises:
        CheckpointError: the manifest names another format (or none: not written by `rlckpt train`).
        CorruptBundleError: a run bundle of this format without one of its pieces.
    """
    _check_run_bundle_format(bundle, bundle.manifest.metadata.get(layout.META_FORMAT))
    missing = [rel for rel in layout.RUN_BUNDLE_PIECES if rel not in bundle.manifest.files]
    if missing:
        raise CorruptBundleError(
            f"step {bundle.step} at {bundle.url}: a run bundle of format {layout.RUN_BUNDLE_FORMAT} without {missing}"
        )


async def _pinned(
    store: BundleStore, candidates: list[StoreEntry], staging: Path, expected_rollout_order: str | None, step: int
) -> tuple[Bundle, _FetchedPieces, dict[str, Any]]:
    """`resume_step`: that step or an error, never another one; and no newer bundle it would collide with."""
    bundle = await run_blocking(check_resume_step, store, step, candidates)
    try:
        return await _fetch_and_check(bundle, staging, expected_rollout_order)
    except (CorruptBundleError, UncommittedBundleError) as exc:
        raise _does_not_verify(store, step, exc) from exc


def _does_not_verify(store: BundleStore, step: int, cause: Exception) -> CheckpointError:
    return CheckpointError(f"cannot resume step {step} at {store.url}: it does not verify ({cause})")


async def _fetch_and_check(
    bundle: Bundle, staging: Path, expected_rollout_order: str | None
) -> tuple[Bundle, _FetchedPieces, dict[str, Any]]:
    """Fetch every piece of an opened bundle digest-checked and check the pairing; nothing is loaded yet."""
    logger.info("restoring step %d from %s", bundle.step, bundle.url)
    check_run_bundle(bundle)
    pieces = await run_blocking(_fetch_verified, bundle, staging / f"step_{bundle.step}")  # 2
    return bundle, pieces, _check_pairing(bundle.manifest, pieces, expected_rollout_order)  # 2


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


def _check_pairing(manifest: Manifest, pieces: _FetchedPieces, expected_rollout_order: str | None) -> dict[str, Any]:
    """Refuse a bundle of another rollout order, or whose replay index and data-plane snapshot come from
    different saves (its format was checked before it was fetched: check_run_bundle)."""
    step = manifest.step
    meta = manifest.metadata
    manifest_digest = meta.get(layout.META_INDEX_DIGEST)
    try:
        snapshot_meta = read_snapshot_metadata(pieces.snapshot_dir)
    except DataPlaneError as exc:
        raise CorruptBundleError(f"step {step}: {layout.DATA_PLANE_METADATA} is unreadable: {exc}") from exc
    snapshot_digest = snapshot_meta.get(layout.META_INDEX_DIGEST)
    replay_state = codec.loads(pieces.replay, origin=f"step {step}: {layout.REPLAY_FILE}")
    if not isinstance(replay_state, dict) or "groups" not in replay_state:
        raise CorruptBundleError(f"step {step}: {layout.REPLAY_FILE} is not a replay index")
    replay_digest = groups_digest(replay_state["groups"])
    if not (manifest_digest == snapshot_digest == replay_digest == replay_state.get("digest")):
        raise CorruptBundleError(
            f"step {step}: replay index and data-plane snapshot come from different saves: "
            f"manifest names index {manifest_digest}, {layout.DATA_PLANE_METADATA} names {snapshot_digest}, "
            f"{layout.REPLAY_FILE} holds {replay_digest}; refusing to load anything"
        )
    saved_order = meta.get(layout.META_ROLLOUT_ORDER)
    if expected_rollout_order is not None and saved_order != expected_rollout_order:
        raise CheckpointError(
            f"step {step}: bundle was saved with rollout order {saved_order!r}, this run asks for "
            f"{expected_rollout_order!r}; resume with --mode {saved_order}"
        )
    return replay_state


def _check_run_bundle_format(bundle: Bundle, found: Any) -> None:
    """CheckpointError naming both formats unless the manifest metadata is of RUN_BUNDLE_FORMAT."""
    if found == layout.RUN_BUNDLE_FORMAT:
        return
    where = f"step {bundle.step} at {bundle.url}"
    if found is None:
        raise CheckpointError(
            f"{where} is not a run bundle: its manifest names no run-bundle format (`rlckpt train` writes format "
            f"{layout.RUN_BUNDLE_FORMAT} under {layout.META_FORMAT!r}); another program committed it"
        )
    if isinstance(found, int) and 0 < found < layout.RUN_BUNDLE_FORMAT:
        what = "names the rollout order 'mode'" if found == 1 else "holds the policy as one file, policy/state.pt"
        why = f"an older rlckpt wrote it (format {found} {what}); resume it with that version, or start a new run dir"
    else:
        why = "not a bundle written by `rlckpt train`?"
    raise CheckpointError(
        f"{where}: manifest metadata has run-bundle format {found!r}, this rlckpt reads format "
        f"{layout.RUN_BUNDLE_FORMAT} ({why})"
    )
