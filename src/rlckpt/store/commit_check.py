"""Visibility: the one check that decides whether a step is a committed bundle (docs/store-protocol.md,
"Reading"). COMMIT parses and names this step; manifest.json has the sha256 COMMIT names, parses, and
agrees with COMMIT; and, when a listing is given, the step holds exactly the manifest's files, all
regular, with their stored sizes. Used by open(), steps(), entries() and gc alike."""

from __future__ import annotations

from rlckpt.errors import CorruptBundleError, InvalidPathError, UncommittedBundleError, UnsafeObjectError

from .backends import Backend, CommitView, Listing
from .manifest import COMMIT_MAX_BYTES, MANIFEST_MAX_BYTES, CommitMarker, Manifest, sha256_hex
from .paths import COMMIT_NAME, MANIFEST_NAME, step_dirname


def load_checked_manifest(backend: Backend, url: str, step: int, with_listing: bool = True) -> Manifest:
    """The manifest of a committed step, after every check; UncommittedBundleError or CorruptBundleError.

    An object store fetches COMMIT, manifest and listing in one round trip; what was fetched beside
    COMMIT may predate a commit finishing meanwhile, so a failed check on it is decided again on a
    manifest and listing fetched after COMMIT."""
    where = f"step {step} at {url}"
    view = _fetch(backend, step, where, with_listing, in_order=False)
    try:
        return check_commit(backend, step, view, where)
    except CorruptBundleError:
        if not view.early:
            raise
    return check_commit(backend, step, _fetch(backend, step, where, with_listing, in_order=True), where)


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
    try:
        marker = CommitMarker.from_bytes(view.marker)
    except (ValueError, KeyError) as exc:
        raise CorruptBundleError(f"{where}: {COMMIT_NAME} is malformed: {exc}") from exc
    if marker.step != step:
        raise CorruptBundleError(f"{where}: {COMMIT_NAME} names step {marker.step}, not {step}")
    if view.manifest is None:
        raise CorruptBundleError(f"{where}: {MANIFEST_NAME} is missing but {COMMIT_NAME} exists")
    actual = sha256_hex(view.manifest)
    if actual != marker.manifest_sha256:
        raise CorruptBundleError(
            f"{where}: {MANIFEST_NAME} has sha256 {actual}, {COMMIT_NAME} names {marker.manifest_sha256}"
        )
    try:
        manifest = Manifest.from_bytes(view.manifest)
    except (ValueError, KeyError, InvalidPathError) as exc:
        raise CorruptBundleError(f"{where}: {MANIFEST_NAME} is invalid: {exc}") from exc
    if manifest.step != step or manifest.txid != marker.txid:
        raise CorruptBundleError(
            f"{where}: {MANIFEST_NAME} is for step {manifest.step} txid {manifest.txid}, "
            f"{COMMIT_NAME} for step {marker.step} txid {marker.txid}"
        )
    if view.listing is not None:
        check_listing(manifest, backend.bundle_view(view.listing, manifest.txid), where)
    return manifest


def check_listing(manifest: Manifest, listing: Listing, where: str) -> None:
    """Every manifest file is present, regular and of its stored size, and nothing else is in the bundle
    (`listing`: the bundle's view of its step, see Backend.bundle_view)."""
    if listing.strangers:
        raise CorruptBundleError(
            f"{where}: {listing.strangers[0]} is not part of the bundle (strangers: {list(listing.strangers[:10])})"
        )
    if listing.irregular:
        rel, kind = sorted(listing.irregular.items())[0]
        raise CorruptBundleError(f"{where}: {rel or 'the step directory'} is a {kind}, not a regular file")
    for rel, entry in sorted(manifest.files.items()):
        if rel not in listing.sizes:
            raise CorruptBundleError(f"{where}: {rel} is in the manifest but missing from the bundle")
        if listing.sizes[rel] != entry.size:
            raise CorruptBundleError(f"{where}: {rel} has {listing.sizes[rel]} bytes, the manifest says {entry.size}")
    extra = sorted(rel for rel in listing.sizes if rel not in manifest.files)
    if extra:
        raise CorruptBundleError(f"{where}: {extra[0]} is not in the manifest (extra files: {extra[:10]})")
