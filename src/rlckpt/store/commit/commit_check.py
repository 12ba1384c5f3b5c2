"""Visibility: the one check that decides whether a step is a committed bundle (docs/store-protocol.md,
"Reading"). COMMIT parses and names this step; manifest.json has the digest COMMIT names (under the
algorithm it names); with a verify key (`Trust`), COMMIT's signature is the key's, over this run, this
step and that digest; the manifest parses and agrees with COMMIT; and, when a listing is given, the step
holds exactly the manifest's files, all regular, with their stored sizes. Used by open(), steps(),
entries() and gc alike, and by the commit on the bytes and files it is about to publish: a commit that
returns is a bundle that opens."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rlckpt.errors import (
    BadSignatureError,
    CorruptBundleError,
    NewerFormatError,
    UncommittedBundleError,
    UnsafeObjectError,
    UnsignedBundleError,
)
from rlckpt.store.backends import Backend, CommitView, Listing
from rlckpt.store.io.digest import Digest
from rlckpt.store.paths.paths import COMMIT_NAME, MANIFEST_NAME, step_dirname
from rlckpt.store.records.manifest import COMMIT_MAX_BYTES, MANIFEST_MAX_BYTES, CommitMarker, FileEntry, Manifest
from rlckpt.store.records.run_record import RUN_RECORD_NAME
from rlckpt.store.signing import VerifyKey, bundle_message


@dataclass(frozen=True)
class Trust:
    """What a reader with a verify key accepts: bundles signed by `key` for run `run_id` — the reader's own
    pin when `pinned`, else the id the run's record names. `run_id` is None when the run has no readable
    record and no pin (`run_problem` says why): then no signed bundle can be shown to be this run's, and
    none is accepted."""

    key: VerifyKey
    run_id: str | None
    run_problem: str = ""
    pinned: bool = False


@dataclass(frozen=True)
class CheckedCommit:
    """A step that passed the commit check: its manifest and the COMMIT that names it."""

    manifest: Manifest
    marker: CommitMarker


@dataclass(frozen=True)
class CommitRecords:
    """A committed bundle's COMMIT and manifest.json exactly as stored, and the records they passed the
    commit check as: what a replica publishes verbatim (replica.py), digests and signatures untouched, and
    what tells two copies of a step apart (the run and the manifest digest COMMIT names: tiers/holds.py)."""

    marker: bytes
    manifest_bytes: bytes
    manifest: Manifest
    commit: CommitMarker


def load_checked_manifest(
    backend: Backend, url: str, step: int, with_listing: bool = True, trust: Trust | None = None
) -> Manifest:
    """The manifest of a committed step, after every check (see load_checked)."""
    return load_checked(backend, url, step, with_listing, trust).manifest


def load_checked(
    backend: Backend, url: str, step: int, with_listing: bool = True, trust: Trust | None = None
) -> CheckedCommit:
    """A committed step's manifest and COMMIT, after every check (see load_checked_records)."""
    return _load(backend, url, step, with_listing, trust)[1]


def load_checked_records(
    backend: Backend, url: str, step: int, with_listing: bool = True, trust: Trust | None = None
) -> CommitRecords:
    """COMMIT and manifest.json of a committed step as stored, after every check (the signature's too,
    given `trust`); UncommittedBundleError, CorruptBundleError (SignatureError: unsigned or badly signed) or
    NewerFormatError.

    An object store fetches COMMIT, manifest and listing in one round trip; what was fetched beside
    COMMIT may predate a commit finishing meanwhile, so a failed check on it is decided again on a
    manifest and listing fetched after COMMIT."""
    view, checked = _load(backend, url, step, with_listing, trust)
    assert view.marker is not None and view.manifest is not None, "the commit check passed a view without records"
    return CommitRecords(view.marker, view.manifest, checked.manifest, checked.marker)


def _load(
    backend: Backend, url: str, step: int, with_listing: bool, trust: Trust | None
) -> tuple[CommitView, CheckedCommit]:
    where = f"step {step} at {url}"
    view = _fetch(backend, step, where, with_listing, in_order=False)
    try:
        return view, check_commit(backend, step, view, where, trust)
    except CorruptBundleError:
        if not view.early:
            raise
    view = _fetch(backend, step, where, with_listing, in_order=True)
    return view, check_commit(backend, step, view, where, trust)


def _fetch(backend: Backend, step: int, where: str, with_listing: bool, in_order: bool) -> CommitView:
    try:
        return backend.fetch_commit_view(
            step_dirname(step), COMMIT_MAX_BYTES, MANIFEST_MAX_BYTES, with_listing, in_order
        )
    except UnsafeObjectError as exc:
        raise CorruptBundleError(f"{where}: {exc}") from exc


def check_commit(
    backend: Backend, step: int, view: CommitView, where: str, trust: Trust | None = None
) -> CheckedCommit:
    """Decide on fetched bytes: the parsed manifest and COMMIT, or the error that names what is wrong."""
    if view.marker is None:
        step_path = backend.path(step_dirname(step))
        state = "exists without COMMIT (uncommitted)" if backend.exists(step_path) else "does not exist"
        raise UncommittedBundleError(f"{where}: {step_path} {state}")
    if view.manifest is None:
        _marker(step, view.marker, where, trust)  # a malformed COMMIT is named first
        raise CorruptBundleError(f"{where}: {MANIFEST_NAME} is missing but {COMMIT_NAME} exists")
    checked = check_records(step, view.marker, view.manifest, where, trust)
    if view.listing is not None:
        check_listing(checked.manifest, backend.bundle_view(view.listing, checked.manifest.txid), where)
    return checked


def check_records(
    step: int, marker_bytes: bytes, manifest_bytes: bytes, where: str, trust: Trust | None = None
) -> CheckedCommit:
    """Everything a reader decides on the bytes of COMMIT and manifest.json: within their caps, COMMIT
    well-formed and naming this step and the manifest's digest (computed under the algorithm COMMIT
    names), with `trust` its signature (before the manifest is parsed: nothing of a bundle its key did
    not sign is read further), the manifest well-formed (every entry, every path, no clash) and of
    COMMIT's step and txid. The commit runs this very check on the bytes it is about to publish.
    CorruptBundleError names what is wrong (SignatureError: the signature), NewerFormatError a record
    this rlckpt cannot read. With `trust` the signature decides first: a COMMIT of a format this rlckpt does
    not read cannot have its signature checked, so it is a bad signature, not a newer bundle."""
    marker = _marker(step, marker_bytes, where, trust)
    if len(manifest_bytes) > MANIFEST_MAX_BYTES:
        raise CorruptBundleError(
            f"{where}: {MANIFEST_NAME} is {len(manifest_bytes)} bytes, over its cap of {MANIFEST_MAX_BYTES}"
        )
    actual = Digest.of(manifest_bytes, marker.manifest.algorithm)
    if actual != marker.manifest:
        raise CorruptBundleError(f"{where}: {MANIFEST_NAME} has {actual}, {COMMIT_NAME} names {marker.manifest}")
    if trust is not None:
        check_signature(marker, trust, where)
    manifest = Manifest.from_bytes(manifest_bytes, f"{where}: {MANIFEST_NAME}")
    if manifest.step != step or manifest.txid != marker.txid:
        raise CorruptBundleError(
            f"{where}: {MANIFEST_NAME} is for step {manifest.step} txid {manifest.txid}, "
            f"{COMMIT_NAME} for step {marker.step} txid {marker.txid}"
        )
    return CheckedCommit(manifest, marker)


def check_signature(marker: CommitMarker, trust: Trust, where: str) -> None:
    """COMMIT's signature is `trust.key`'s over this COMMIT's run, step and manifest digest, and that run is
    this one. UnsignedBundleError or BadSignatureError, in one line saying which and why."""
    signature = marker.signature
    if signature is None:
        why = "it was written without a signing key" if marker.format >= 3 else f"COMMIT format {marker.format}"
        raise UnsignedBundleError(
            f"{where}: unsigned ({why}): the verify key {trust.key.key_id} accepts only bundles it signed"
        )
    if signature.key_id != trust.key.key_id:
        raise BadSignatureError(
            f"{where}: bad signature: signed by another key ({signature.key_id}), not the verify key's "
            f"({trust.key.key_id})"
        )
    assert marker.run is not None  # a signature is in COMMIT format 3 only, which names its run
    if not trust.key.verifies(bundle_message(marker.run, marker.step, marker.manifest), signature.value):
        raise BadSignatureError(
            f"{where}: bad signature: {COMMIT_NAME}'s signature by key {signature.key_id} does not match its "
            "run, step and manifest digest (altered, or moved from another step)"
        )
    if trust.run_id is None:
        raise BadSignatureError(
            f"{where}: bad signature: signed for run {marker.run}, and this run's identity is unknown "
            f"({trust.run_problem})"
        )
    if marker.run != trust.run_id:
        source = "the run this reader pinned" if trust.pinned else RUN_RECORD_NAME
        raise BadSignatureError(
            f"{where}: bad signature: signed for another run ({marker.run}); this run is {trust.run_id} ({source})"
        )


def _marker(step: int, marker_bytes: bytes, where: str, trust: Trust | None = None) -> CommitMarker:
    """COMMIT of `step`, parsed. With `trust`, a format this rlckpt does not read is a BadSignatureError:
    whoever can write the storage can declare any format, and a signature this rlckpt cannot check proves
    nothing, so such a bundle is skipped like any other that does not verify instead of stopping a resume
    as a newer rlckpt's bundle would (docs/security.md)."""
    if len(marker_bytes) > COMMIT_MAX_BYTES:
        raise CorruptBundleError(
            f"{where}: {COMMIT_NAME} is {len(marker_bytes)} bytes, over its cap of {COMMIT_MAX_BYTES}"
        )
    try:
        marker = CommitMarker.from_bytes(marker_bytes, f"{where}: {COMMIT_NAME}")
    except NewerFormatError as exc:
        if trust is None:
            raise
        newer = str(exc).removeprefix(f"{where}: {COMMIT_NAME}: ")
        raise BadSignatureError(
            f"{where}: bad signature: not checked ({newer}); the verify key {trust.key.key_id} accepts only "
            "bundles whose signature this rlckpt checked"
        ) from None
    if marker.step != step:
        raise CorruptBundleError(f"{where}: {COMMIT_NAME} names step {marker.step}, not {step}")
    return marker


def check_listing(manifest: Manifest, listing: Listing, where: str) -> None:
    """Every manifest file is present, regular and of its stored size, and nothing else is in the bundle
    (`listing`: the bundle's view of its step, see Backend.bundle_view)."""
    problem = listing_problem(manifest.files, listing)
    if problem is not None:
        raise CorruptBundleError(f"{where}: {problem}")


def listing_problem(files: Mapping[str, FileEntry], listing: Listing) -> str | None:
    """What makes a bundle's view of its step differ from `files`, or None. The one listing check: readers
    run it on a committed bundle, the commit on what it is about to publish."""
    if listing.strangers:
        return f"{listing.strangers[0]} is not part of the bundle (strangers: {list(listing.strangers[:10])})"
    if listing.irregular:
        rel, kind = sorted(listing.irregular.items())[0]
        return f"{rel or 'the step directory'} is a {kind}, not a regular file"
    for rel, entry in sorted(files.items()):
        if rel not in listing.sizes:
            return f"{rel} is in the manifest but missing from the bundle"
        if listing.sizes[rel] != entry.size:
            return f"{rel} has {listing.sizes[rel]} bytes, the manifest says {entry.size}"
    extra = sorted(rel for rel in listing.sizes if rel not in files)
    if extra:
        return f"{extra[0]} is not in the manifest (extra files: {extra[:10]})"
    return None


def committed_txid(backend: Backend, step: int) -> str | None:
    """The txid COMMIT of `step` names, or None when there is no COMMIT (CorruptBundleError if it is
    unreadable): what gc compares with the bundle it planned to delete."""
    where = f"step {step} at {backend.root}"
    try:
        data = backend.read_object(backend.path(step_dirname(step), COMMIT_NAME), COMMIT_MAX_BYTES, COMMIT_NAME)
    except FileNotFoundError:
        return None
    except UnsafeObjectError as exc:
        raise CorruptBundleError(f"{where}: {exc}") from exc
    return _marker(step, data, where).txid
