"""Pieces every subcommand shares: store arguments, --storage-options parsing, key files, logging, sizes,
exit codes, and `printable`, which every human-readable line goes through."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from rlckpt.store import BundleStore, SigningKey, VerifyKey

EXIT_OK = 0
EXIT_CORRUPT = 1
EXIT_MISSING = 2
EXIT_ERROR = 3
EXIT_USAGE = 64  # sysexits EX_USAGE: argparse's usual 2 would collide with verify's "uncommitted"
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM: `rlckpt train` stopped without its final save, or a bench run stopped

# Where a key flag left unset is taken from (an empty value counts as unset).
VERIFY_KEY_ENV = "RLCKPT_VERIFY_KEY"
SIGNING_KEY_ENV = "RLCKPT_SIGNING_KEY"
RUN_ID_ENV = "RLCKPT_RUN_ID"  # and where --run-id left unset is taken from

# How deep a JSON argument may nest. fsspec's options go three levels deep (config_kwargs.retries.mode);
# a limit of our own (rlckpt.formats.json_depth) refuses a 1 000-deep one with a reason, not with Python's
# RecursionError.
MAX_JSON_DEPTH = 32
# How much of a refused JSON argument an error quotes.
_SHOWN_CHARS = 80


def printable(text: object) -> str:
    """`text` with every non-printable character escaped as Python writes it (`\\n`, `\\r`, `\\t`,
    `\\x1b`, `\\x85`, `\\u202e`, `\\udcff` for an undecodable byte), printable text (any script) unchanged.

    Names in a store (files, keys, txids, intent hosts) are anyone's bytes: printed raw, a newline
    forges an output line and an ANSI escape drives the terminal. Every human-readable line that can
    carry such a name goes through here; --json output is escaped by json.dumps and stays lossless.
    A backslash is not escaped, so messages stay readable (a name may contain a literal `\\n`)."""
    value = str(text)
    if value.isprintable():
        return value
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in value)


class _PrintableFormatter(logging.Formatter):
    """Log lines on stderr: a store name in a message is escaped like the rest of our output; a
    traceback (-vv) keeps its line breaks, but no line of it can carry a control character."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return "\n".join(printable(line) for line in super().formatException(ei).split("\n"))


class UsageExitParser(argparse.ArgumentParser):
    """ArgumentParser whose command-line errors are one line on stderr (which flag, what is wrong) and exit
    with EXIT_USAGE instead of 2; `--help` shows the usage argparse would print above it."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {printable(message)} (see {self.prog} --help)\n")


def json_object_arg(text: str) -> dict[str, Any]:
    """A command-line JSON object: strict JSON (no NaN or Infinity), nested at most MAX_JSON_DEPTH levels.
    argparse.ArgumentTypeError naming what is wrong (argparse adds the flag)."""

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    from rlckpt.formats import json_depth, quoted

    shown = quoted(text, _SHOWN_CHARS)
    if json_depth(text) > MAX_JSON_DEPTH:  # refused before json's decoder, which recurses per level
        raise argparse.ArgumentTypeError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg} at column {exc.colno}): {shown}") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {shown}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {type(value).__name__}: {shown}")
    return value


def storage_options_arg(text: str) -> dict[str, Any]:
    """argparse type for --storage-options: a JSON object, e.g. '{"endpoint_url": "http://..."}'."""
    return json_object_arg(text)


def positive_seconds_arg(text: str) -> float:
    """A flag's number of seconds: finite and > 0, refused in the user's words otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """URL, --storage-options, --verify-key and -v/--verbose: the options every store subcommand takes."""
    parser.add_argument(
        "url", metavar="URL", help="the store: a local path or an fsspec URL (s3://bucket/prefix, file://, memory://)"
    )
    parser.add_argument(
        "--storage-options",
        metavar="JSON",
        type=storage_options_arg,
        default=None,
        help='fsspec options for the filesystem as a JSON object, e.g. \'{"endpoint_url": "http://127.0.0.1:7480"}\'',
    )
    add_verify_key_argument(parser)
    add_verbose_argument(parser)


def add_compress_policy_argument(parser: argparse.ArgumentParser) -> None:
    """--compress-policy off|auto|on: how the policy's (the state's) shard files are stored (BundleStorageWriter's
    `compression`)."""
    parser.add_argument(
        "--compress-policy",
        choices=("off", "auto", "on"),
        default="off",
        help="the policy's shard files, losslessly: byte planes + zstd where a file's first MiB shrinks, on "
        "object stores only (auto), everywhere (on) or never (off, default: DCP's own reader then loads them)",
    )


def add_reuse_argument(parser: argparse.ArgumentParser) -> None:
    """--reuse-unchanged: files unchanged since the run's previous bundle are taken from it (store `reuse`)."""
    parser.add_argument(
        "--reuse-unchanged",
        action="store_true",
        help="take each file whose bytes did not change since the run's previous bundle (frozen weights, rows "
        "still held) from it instead of writing it again: a hard link on local disk, a copy inside the server "
        "on S3; each tensor chunk of 1 MiB or more is then a file of its own (default: every save writes all)",
    )


def add_verify_key_argument(parser: argparse.ArgumentParser) -> None:
    """--verify-key PATH (default: $RLCKPT_VERIFY_KEY): only bundles that key signed for the run are read;
    and --run-id ID (default: $RLCKPT_RUN_ID), which pins that run."""
    parser.add_argument(
        "--verify-key",
        metavar="PATH",
        default=None,
        help=f"public key (signing.pub): accept only bundles it signed for this run; unsigned and badly signed "
        f"ones do not verify (default: ${VERIFY_KEY_ENV})",
    )
    parser.add_argument(
        "--run-id",
        metavar="ID",
        type=run_id_arg,
        default=None,
        help=f"with a verify key: this run is run ID (32 hex digits: `run` in `rlckpt ls --json`, `run_id` in "
        f"`rlckpt train --json`), whatever its _run.json says, so a key shared by several runs cannot pass one "
        f"run's bundles for another's (default: ${RUN_ID_ENV})",
    )


def run_id_arg(text: str) -> str:
    """argparse type for --run-id: a run id, as `_run.json` holds it."""
    from rlckpt.errors import StoreConfigError
    from rlckpt.store.records.run_record import checked_run_id

    try:
        return checked_run_id(text)
    except StoreConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run_id(args: argparse.Namespace) -> str | None:
    """The run pinned by --run-id or $RLCKPT_RUN_ID (StoreConfigError: exit 64, for an id that is not one),
    or None."""
    from rlckpt.store.records.run_record import checked_run_id

    pinned = getattr(args, "run_id", None) or os.environ.get(RUN_ID_ENV)
    return checked_run_id(pinned, f"${RUN_ID_ENV}") if pinned else None


def verify_key(args: argparse.Namespace) -> VerifyKey | None:
    """The verify key named by --verify-key or $RLCKPT_VERIFY_KEY, loaded (KeyFileError: exit 64), or None."""
    from rlckpt.store import VerifyKey

    # getattr: a command built without add_common_arguments (or a hand-made Namespace) has no flag of its own
    path = getattr(args, "verify_key", None) or os.environ.get(VERIFY_KEY_ENV)
    return VerifyKey.load(path) if path else None


def signing_key(args: argparse.Namespace) -> SigningKey | None:
    """The signing key named by --signing-key or $RLCKPT_SIGNING_KEY, loaded (KeyFileError: exit 64), or None."""
    from rlckpt.store import SigningKey

    path = args.signing_key or os.environ.get(SIGNING_KEY_ENV)
    return SigningKey.load(path) if path else None


def add_verbose_argument(parser: argparse.ArgumentParser) -> None:
    """-v (info) / -vv (debug) logging to stderr."""
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log to stderr: -v info, -vv debug")


def configure_logging(verbosity: int) -> None:
    """Root logging to stderr: warnings by default, info with -v, debug with -vv (our loggers only)."""
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_PrintableFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
    logging.getLogger("rlckpt").setLevel(level)


def open_store(args: argparse.Namespace) -> BundleStore:
    """The BundleStore named by the URL and --storage-options of a parsed command line.

    On S3 the CLI gives up sooner than a training run (`open_location(fail_fast=True)`: 3 attempts,
    3 s connect timeout, unless the user set them): someone is waiting at a terminal, and a retry is
    one command away."""
    from rlckpt.store import BundleStore, open_location

    key = verify_key(args)  # a key file that cannot be used is refused before the store is reached
    pinned = run_id(args)
    fs, _root = open_location(args.url, args.storage_options, fail_fast=True)
    return BundleStore(args.url, storage_options=args.storage_options, fs=fs, verify_key=key, run_id=pinned)


def add_remote_tier_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """--replicated-to URL2 and --replicated-storage-options JSON: a two-tier run's remote tier (`what` it
    is for, in the help), opened by `open_remote`."""
    parser.add_argument(
        "--replicated-to", dest="remote", default=None, metavar="URL2", help=f"the run's remote tier: {what}"
    )
    parser.add_argument(
        "--replicated-storage-options",
        dest="remote_storage_options",
        type=storage_options_arg,
        default=None,
        metavar="JSON",
        help="fsspec options of --replicated-to, as --storage-options",
    )


def open_remote(args: argparse.Namespace) -> BundleStore:
    """The other store of a command that reads two (`ls`/`gc --replicated-to`, `copy`'s DST): the URL in
    `args.remote` with the options in `args.remote_storage_options`, opened as `open_store` opens URL —
    fail-fast on S3, and with the same verify key and pinned run (the tiers of one run accept the same
    bundles)."""
    remote = argparse.Namespace(
        url=args.remote,
        storage_options=getattr(args, "remote_storage_options", None),
        verify_key=getattr(args, "verify_key", None),
        run_id=getattr(args, "run_id", None),
    )
    return open_store(remote)


def check_one_run(local: BundleStore, remote: BundleStore, outcome: str) -> None:
    """Refuse a remote tier that is another run than `local` (tiers.check_one_run: its _run.json, or its
    newest COMMIT, names another run): what it holds says nothing of what `local` replicated. `outcome`
    says what the command did not do (RunIdentityError: exit 3)."""
    from rlckpt.errors import RunIdentityError
    from rlckpt.tiers import check_one_run as one_run

    try:
        one_run([local, remote])
    except RunIdentityError as exc:
        raise RunIdentityError(f"{remote.url} is not the remote tier of {local.url}: {exc}; {outcome}") from None


def format_size(nbytes: int | None) -> str:
    """Human-readable binary size: 0 B, 1.5 KiB, 12.0 MiB ... ('-' when unknown)."""
    if nbytes is None:
        return "-"
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_time(value: Any) -> str:
    """A timestamp (ISO string or unix seconds) as `YYYY-MM-DD HH:MM:SS` UTC ('-' when unknown)."""
    if value is None or value == "":
        return "-"
    if isinstance(value, (int, float)):
        moment = datetime.fromtimestamp(value, tz=UTC)
    else:
        try:
            moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            return str(value)
        if moment.tzinfo is not None:
            moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def render_table(headers: list[str], rows: list[list[str]], right_align: set[int] | None = None) -> str:
    """A plain aligned text table (no dependency), numeric columns right-aligned, every cell printable."""
    right_align = right_align or set()
    headers = [printable(h) for h in headers]
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        parts = [
            c.rjust(w) if i in right_align else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def print_json(obj: Any) -> None:
    """Stable, indented JSON on stdout (for scripts: `rlckpt ls URL --json | jq`)."""
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))
