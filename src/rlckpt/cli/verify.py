"""`rlckpt verify URL`: check a bundle's marker, manifest and every file digest; the exit code says the verdict."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from typing import Any

from rlckpt.checkpoint.kinds import BundleKind, Kind, bundle_kind
from rlckpt.checkpoint.layout import META_FORMAT
from rlckpt.cli import _common
from rlckpt.errors import (
    BadSignatureError,
    CorruptBundleError,
    NewerFormatError,
    UncommittedBundleError,
    UnsignedBundleError,
)

# Bundles at least this large get a progress bar (on stderr, only when stderr is a terminal
# unless --progress forces it).
PROGRESS_MIN_BYTES = 64 << 20

EPILOG = """\
examples:
  rlckpt verify /data/run1                 # the newest committed bundle
  rlckpt verify s3://bucket/run1 --step 200
  rlckpt verify /data/run1 --all --json
  rlckpt verify /data/run1 --verify-key keys/signing.pub   # also: signed by that key, for this run

With --verify-key (or RLCKPT_VERIFY_KEY) a bundle must also be signed by that key for this run:
one that is not is "unsigned" or has a "bad signature" (another key, another run, altered).

exit codes: 0 every checked bundle is valid, 1 a bundle is corrupt (the message names the file
and what differs), unsigned or badly signed, 2 the step is uncommitted or missing (or the store
has no committed bundle), 3 the store could not be read, or a bundle is of a format only a newer
rlckpt reads, 64 bad command line, store configuration (URL, --storage-options) or a key file that
cannot be used.
"""


@dataclass(frozen=True)
class VerifyResult:
    """The verdict on one step: status is valid, corrupt, unsigned, bad_signature (those two only with a
    verify key), newer (written by a newer rlckpt: not read), uncommitted or missing. A bundle that opened
    also says what wrote it: manifest format, digest algorithm, its kind (`bundle_kind`: "run" for
    `rlckpt train`'s, "checkpointer" for a Checkpointer's, None for neither) and that kind's format
    (`bundle_format`; `run_format` is the run-bundle format alone, as earlier versions printed it), writer
    version; and who signed it: the key id (`signed_by`, None: unsigned), the run id its COMMIT names, and
    whether the signature was checked against a verify key."""

    step: int
    status: str
    files: int | None = None
    size: int | None = None
    error: str | None = None
    manifest_format: int | None = None
    digest: str | None = None
    run_format: Any = None
    bundle_kind: Kind | None = None
    bundle_format: Any = None
    writer_version: str | None = None
    signed_by: str | None = None
    run: str | None = None
    signature_checked: bool = False


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="verify a bundle's files against its manifest",
        description=(
            "Verify a committed bundle: COMMIT marker, manifest digest, then the size and digest\n"
            "of every file (BLAKE3, or sha256 in bundles of manifest format 1). Without --step:\n"
            "the newest committed bundle (the one a resume loads). Each verdict says what wrote\n"
            "the bundle: manifest format, digest algorithm, its kind and format (run bundle of\n"
            "`rlckpt train`, or Checkpointer bundle), writer version, and\n"
            "who signed it. With --verify-key the signature is checked first (signed by that key,\n"
            "for this run, over this step and manifest)."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common.add_common_arguments(parser)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, metavar="N", help="verify this step (default: the newest committed one)")
    which.add_argument("--all", action="store_true", help="verify every step that has a COMMIT marker")
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON on stdout")
    bar = parser.add_mutually_exclusive_group()
    bar.add_argument(
        "--progress", dest="progress", action="store_true", default=None, help="always show the progress bar"
    )
    bar.add_argument("--no-progress", dest="progress", action="store_false", help="never show the progress bar")
    parser.set_defaults(func=run)


def exit_code(results: list[VerifyResult]) -> int:
    """1 if anything is corrupt (unsigned or badly signed too), else 3 if anything is of a newer format,
    else 2 if anything is uncommitted/missing, else 0."""
    statuses = {r.status for r in results}
    if statuses & {"corrupt", "unsigned", "bad_signature"}:
        return _common.EXIT_CORRUPT
    if "newer" in statuses:
        return _common.EXIT_ERROR
    if statuses & {"uncommitted", "missing"} or not results:
        return _common.EXIT_MISSING
    return _common.EXIT_OK


def _show_progress(forced: bool | None, total: int) -> bool:
    if forced is not None:
        return forced
    return total >= PROGRESS_MIN_BYTES and sys.stderr.isatty()


def _verify_bundle(bundle: Any, step: int, progress: bool | None) -> None:
    """bundle.verify(), with a tqdm bar over stored bytes for large bundles."""
    total = bundle.manifest.total_size
    if not _show_progress(progress, total):
        bundle.verify()
        return
    from tqdm import tqdm

    with tqdm(
        total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"step {step}", file=sys.stderr, leave=False
    ) as bar:
        bundle.verify(progress=bar.update)


def _missing_or_uncommitted(store: Any, step: int) -> str:
    return "uncommitted" if any(e.step == step for e in store.entries()) else "missing"


def verify_step(store: Any, step: int, progress: bool | None) -> VerifyResult:
    """Open and fully verify one step, turning the store's refusals into a verdict."""
    from rlckpt.store import unavailable_as_store_error

    bundle = None
    try:
        bundle = store.open(step)
        # Bundle.verify reads every file outside the store's own error mapping: an outage or a
        # permission error there must be "unavailable" (exit 3), never a traceback with exit 1.
        with unavailable_as_store_error(store.url, f"verifying step {step}"):
            _verify_bundle(bundle, step, progress)
    except UnsignedBundleError as exc:
        return VerifyResult(step, "unsigned", error=str(exc), signature_checked=True)
    except BadSignatureError as exc:
        return VerifyResult(step, "bad_signature", error=str(exc), signature_checked=True)
    except CorruptBundleError as exc:
        return VerifyResult(step, "corrupt", error=str(exc), **_written_by(bundle))
    except NewerFormatError as exc:
        return VerifyResult(step, "newer", error=str(exc))
    except UncommittedBundleError as exc:
        return VerifyResult(step, _missing_or_uncommitted(store, step), error=str(exc))
    manifest = bundle.manifest
    return VerifyResult(
        step,
        "valid",
        files=len(manifest.files),
        size=manifest.total_size,
        signature_checked=store.verify_key is not None,
        **_written_by(bundle),
    )


def _written_by(bundle: Any) -> dict[str, Any]:
    """What wrote a bundle that opened, and who signed it (nothing when it did not open)."""
    if bundle is None:
        return {}
    manifest, commit = bundle.manifest, bundle.commit
    signature = None if commit is None else commit.signature
    kind = bundle_kind(manifest.metadata)
    return {
        "manifest_format": manifest.format,
        "digest": "+".join(manifest.digest_algorithms) or None,
        "run_format": manifest.metadata.get(META_FORMAT),
        "bundle_kind": kind.kind,
        "bundle_format": kind.format,
        "writer_version": manifest.writer_version,
        "signed_by": None if signature is None else signature.key_id,
        "run": None if commit is None else commit.run,
    }


def _steps_to_check(store: Any, args: argparse.Namespace) -> list[int]:
    if args.step is not None:
        return [args.step]
    if args.all:  # also the ones whose COMMIT fails its checks (or is not signed by the key): steps() hides those
        return [e.step for e in store.entries() if e.state in ("committed", "corrupt", "newer")]
    if store.verify_key is not None:  # the newest bundle a resume would look at, its signature refused or not
        signed = [e.step for e in store.entries() if e.state == "committed" or e.signature in ("unsigned", "bad")]
        return signed[-1:]
    latest = store.latest()
    return [] if latest is None else [latest]


def _describe(result: VerifyResult) -> str:
    if result.status == "valid":
        return (
            f"step {result.step}: valid ({result.files} files, {_common.format_size(result.size)}; "
            f"{_common.printable(_provenance(result))})"
        )
    label = result.status.upper().replace("_", " ")
    return f"{label}: {_common.printable(result.error)}"  # names step, URL and file


def _provenance(result: VerifyResult) -> str:
    kind = BundleKind(result.bundle_kind, result.bundle_format).describe()
    writer = f"written by rlckpt {result.writer_version}" if result.writer_version else "writer not recorded"
    if result.signed_by is None:
        signed = "unsigned"
    else:
        signed = f"signed by key {result.signed_by}" + ("" if result.signature_checked else " (not checked)")
    return f"manifest format {result.manifest_format}, {result.digest or 'no files'}, {kind}, {writer}, {signed}"


def run(args: argparse.Namespace) -> int:
    store = _common.open_store(args)
    steps = _steps_to_check(store, args)
    results = [verify_step(store, step, args.progress) for step in steps]
    code = exit_code(results)
    if args.json:
        _common.print_json({"url": args.url, "exit_code": code, "results": [asdict(r) for r in results]})
        return code
    if not results:
        print(f"rlckpt verify: no committed bundle in {_common.printable(args.url)}", file=sys.stderr)
    for result in results:
        print(_describe(result), file=sys.stdout if result.status == "valid" else sys.stderr)
    return code
