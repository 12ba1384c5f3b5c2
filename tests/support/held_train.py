"""``python -m support.held_train STEP MARKER train ARGS...``: the real ``rlckpt train``
command, with the save of STEP held just before its COMMIT (touching MARKER) until the process
is killed — how the crash tests kill a real run in the middle of a save.
"""

from __future__ import annotations

import argparse
import logging
import sys

from rlckpt.cli import train
from support.save_hooks import HoldSaveBeforeCommit


def main(argv: list[str] | None = None) -> int:
    """Parse ``STEP MARKER train ARGS...`` and run ``rlckpt train ARGS...`` with the hold installed."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3:
        raise SystemExit(f"usage: python -m {__spec__.name if __spec__ else __name__} STEP MARKER train ARGS...")
    step, marker, *rlckpt_argv = argv
    parser = argparse.ArgumentParser(prog="rlckpt")
    train.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(rlckpt_argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return train.run(args, before_commit=HoldSaveBeforeCommit(int(step), marker))


if __name__ == "__main__":
    raise SystemExit(main())
