"""Visibility: the one check that decides whether a step is a committed bundle (docs/store-protocol.md,
"Reading"). COMMIT parses and names this step; manifest.json has the digest COMMIT names (under the
algorithm it names), parses, and
agrees with COMMIT; and, when a listing is given, the step holds exactly the manifest's files, all
regular, with their stored sizes. Used by open(), steps(), entries() and gc alike, and by the commit on
the bytes and files it is about to publish: a commit that returns is a bundle that opens."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rlckpt.errors import (
    CorruptBundleError,
    InvalidPathError,
    NewerFormatError,
    UncommittedBundleError,
    UnsafeObjectError,
)

from .backends import Backend, CommitView, Listing
from .digest import Digest
from .manifest import COMMIT_MAX_BYTES, MANIFEST_MAX_BYTES, CommitMarker, FileEntry, Manifest
from .paths import COMMIT_NAME, MANIFEST_NAME, step_dirname


@dataclass(frozen=True)
class CommitRecords:
    """A committed bundle's COMMIT and manifest.json exactly as stored, and the manifest they passed the
    commit check as: what a replica publishes verbatim (replica.py), digests and signatures untouched."""

    marker: bytes
    manifest_bytes: bytes
    manifest: Manifest


def load_checked_manifest(backend: Backend, url: str, step: int, with_listing: bool = True) -> Manifest:
    """The manifest of a committed step, after every check; UncommittedBundleError or CorruptBundleError."""
    return load_checked_records(backend, url, step, with_listing).manifest


def load_checked_records(backend: Backend, url: str, step: int, with_listing: bool = True) -> CommitRecords:
    """COMMIT and manifest of a committed step as stored, after every check (load_checked_manifest's).

    An object store fetches COMMIT, manifest and listing in one round trip; what was fetched beside
    COMMIT may predate a commit finishing meanwhile, so a failed check on it is decided again on a
    manifest and listing fetched after COMMIT."""
    where = f"step {step} at {url}"
    view = _fetch(backend, step, where, with_listing, in_order=False)
    try:
        return _records(view, check_commit(backend, step, view, where))
    except CorruptBundleError:
        if not view.early:
            raise
    view = _fetch(backend, step, where, with_listing, in_order=True)
    return _records(view, check_commit(backend, step, view, where))


def _records(view: CommitView, manifest: Manifest) -> CommitRecords:
    assert view.marker is not None and view.manifest is not None, "check_commit passed a view without records"
    return CommitRecords(view.marker, view.manifest, manifest)


def _fetch(backend: Backend, step: int, where: str, with_listing: bool, in_order: bool) -> CommitView:
    try:
        return backend.fetch_commit_view(
            step_dirname(step), COMMIT_MAX_BYTES, MANIFEST_MAX_BYTES, with_listing, in_order
        )
    except UnsafeObjectError as exc:
        raise CorruptBundleError(f"{where}: {exc}") from exc


def check_commit(backend: Backend, step: int, view: CommitView, where: str) -> Manifest:
    """Decide on fetched bytes: the parsed manifest, or the error that names what is wrong."""
    if view.marker is None:
        step_path = backend.path(step_dirname(step))
        state = "exists without COMMIT (uncommitted)" if backend.exists(step_path) else "does not exist"
        raise UncommittedBundleError(f"{where}: {step_path} {state}")
    if view.manifest is None:
        _marker(step, view.marker, where)  # a malformed COMMIT is named first
        raise CorruptBundleError(f"{where}: {MANIFEST_NAME} is missing but {COMMIT_NAME} exists")
    manifest = check_records(step, view.marker, view.manifest, where)
    if view.listing is not None:
        check_listing(manifest, backend.bundle_view(view.listing, manifest.txid), where)
    return manifest


def check_records(step: int, marker_bytes: bytes, manifest_bytes: bytes, where: str) -> Manifest:
    """Everything a reader decides on the bytes of COMMIT and manifest.json: within their caps, COMMIT
    well-formed and naming this step and the manifest's digest (computed under the algorithm COMMIT
    names), the manifest well-formed (every entry, every path, no clash) and of COMMIT's step and txid.
    The commit runs this very check on the bytes it is about to publish. Returns the manifest;
    CorruptBundleError names what is wrong, NewerFormatError a record this rlckpt cannot read."""
    marker = _marker(step, marker_bytes, where)
    if len(manifest_bytes) > MANIFEST_MAX_BYTES:
        raise CorruptBundleError(
            f"{where}: {MANIFEST_NAME} is {len(manifest_bytes)} bytes, over its cap of {MANIFEST_MAX_BYTES}"
        )
    actual = Digest.of(manifest_bytes, marker.manifest.algorithm)
    if actual != marker.manifest:
        raise CorruptBundleError(f"{where}: {MANIFEST_NAME} has {actual}, {COMMIT_NAME} names {marker.manifest}")
    try:
        manifest = Manifest.from_bytes(manifest_bytes)
    except NewerFormatError as exc:
        raise NewerFormatError(f"{where}: {MANIFEST_NAME}: {exc}") from None
    except (ValueError, KeyError, InvalidPathError) as exc:
        raise CorruptBundleError(f"{where}: {MANIFEST_NAME} is invalid: {exc}") from exc
    if manifest.step != step or manifest.txid != marker.txid:
        raise CorruptBundleError(
            f"{where}: {MANIFEST_NAME} is for step {manifest.step} txid {manifest.txid}, "
            f"{COMMIT_NAME} for step {marker.step} txid {marker.txid}"
        )
    return manifest


def _marker(step: int, marker_bytes: bytes, where: str) -> CommitMarker:
    if len(marker_bytes) > COMMIT_MAX_BYTES:
        raise CorruptBundleError(
            f"{where}: {COMMIT_NAME} is {len(marker_bytes)} bytes, over its cap of {COMMIT_MAX_BYTES}"
        )
    try:
        marker = CommitMarker.from_bytes(marker_bytes)
    except NewerFormatError as exc:
        raise NewerFormatError(f"{where}: {COMMIT_NAME}: {exc}") from None
    except (ValueError, KeyError) as exc:
        raise CorruptBundleError(f"{where}: {COMMIT_NAME} is malformed: {exc}") from exc
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
