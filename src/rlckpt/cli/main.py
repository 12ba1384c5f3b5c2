"""Entry point of the `rlckpt` console script: builds the argparse tree and maps errors to exit codes.

Adding a subcommand is one line: append its module to SUBCOMMANDS. A subcommand module exposes
`add_parser(subparsers)`, which registers its parser and sets `func=<callable(args) -> int>`.
Modules keep heavy imports (torch, ray, the store) inside their run function so `rlckpt --help`
and `rlckpt ls` stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from rlckpt.cli import _common
from rlckpt.errors import (
    ClusterConfigError,
    CorruptBundleError,
    KeyFileError,
    RlckptError,
    StoreConfigError,
    UncommittedBundleError,
)

# One line per subcommand, in the order `rlckpt --help` lists them.
SUBCOMMANDS: tuple[str, ...] = (
    "rlckpt.cli.ls",
    "rlckpt.cli.verify",
    "rlckpt.cli.gc",
    "rlckpt.cli.copy",
    "rlckpt.cli.export",
    "rlckpt.cli.train",
    "rlckpt.cli.keygen",
    "rlckpt.cli.bench",
)

EPILOG = """\
examples:
  rlckpt ls /data/run1
  rlckpt ls s3://bucket/run1 --json
  rlckpt verify s3://bucket/run1 --step 200
  rlckpt gc /data/run1 --keep-last 3 --dry-run
  rlckpt keygen --out ~/.rlckpt/run1 && rlckpt ls /data/run1 --verify-key ~/.rlckpt/run1/signing.pub
  rlckpt copy /nvme/run1 s3://bucket/run1 --step 200
  rlckpt export /data/run1 --out /models/run1 --dtype bf16

exit codes: 0 ok, 1 corrupt bundle, 2 uncommitted or missing bundle, 3 other error (store
unreachable or forbidden, bucket missing, no Ray cluster at --ray-address, a store of another run than
the one asked for: a --replicated-to, --replicate-to or copy DST of another run), 64 bad command line or
store configuration (empty or malformed URL, unknown protocol, endpoint not an http(s) URL, unknown
storage option), a key file that cannot be used (missing, a private key others may read, not an
Ed25519 key) or a Ray cluster that cannot hold the run (too many --trainer-ranks, a
--trainer-resources resource no node offers), 130 interrupted, 143 `rlckpt train` stopped by SIGTERM
without its final save, or a bench run stopped by SIGTERM. With --verify-key an unsigned or badly
signed bundle counts as corrupt.
Run `rlckpt COMMAND --help` for the options of one command.
"""

log = logging.getLogger("rlckpt.cli")


def build_parser() -> argparse.ArgumentParser:
    """The full parser: global options plus every module in SUBCOMMANDS."""
    parser = _common.UsageExitParser(
        prog="rlckpt",
        description="Transactional checkpoints for RL post-training runs: inspect, verify and clean a bundle store.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_common.UsageExitParser
    )
    for module_name in SUBCOMMANDS:
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("rlckpt")
    except Exception:  # not installed (running from a source tree)
        return "unknown"


def exit_code_for(exc: BaseException) -> int:
    """The documented exit code for an error that escaped a subcommand."""
    if isinstance(exc, CorruptBundleError):
        return _common.EXIT_CORRUPT
    if isinstance(exc, UncommittedBundleError):
        return _common.EXIT_MISSING
    if isinstance(exc, (StoreConfigError, ClusterConfigError, KeyFileError)):  # the command line must change
        return _common.EXIT_USAGE
    return _common.EXIT_ERROR


def unexpected_error(exc: Exception, args: argparse.Namespace) -> RlckptError | None:
    """What an exception that is not ours amounts to for the command's store (unavailable, misconfigured),
    or None when it is a plain bug."""
    url = getattr(args, "url", None) or getattr(args, "run_dir", None)
    if url is None:
        return None
    from rlckpt.store import as_store_error

    return as_store_error(exc, url, f"running {args.command}")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), run the subcommand and return its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _common.configure_logging(getattr(args, "verbose", 0))
    try:
        return int(args.func(args))
    except RlckptError as exc:
        log.debug("%s failed", args.command, exc_info=True)
        print(f"rlckpt {args.command}: error: {_common.printable(exc)}", file=sys.stderr)
        return exit_code_for(exc)
    except KeyboardInterrupt:
        print(f"rlckpt {args.command}: interrupted", file=sys.stderr)
        return _common.EXIT_INTERRUPTED
    except BrokenPipeError:  # `rlckpt ls ... | head`
        return _common.EXIT_OK
    except Exception as exc:  # not raised on purpose: still one line and a documented code, never Python's 1
        log.debug("%s failed", args.command, exc_info=True)
        ours = unexpected_error(exc, args)
        if ours is not None:
            print(f"rlckpt {args.command}: error: {_common.printable(ours)}", file=sys.stderr)
            return exit_code_for(ours)
        message = f"unexpected {type(exc).__name__}: {exc} (-vv logs the traceback)"
        print(f"rlckpt {args.command}: error: {_common.printable(message)}", file=sys.stderr)
        return _common.EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
