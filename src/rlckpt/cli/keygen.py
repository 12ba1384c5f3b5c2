"""`rlckpt keygen --out DIR`: a new Ed25519 key pair for signed bundles (docs/security.md)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rlckpt.cli import _common

EPILOG = """\
examples:
  rlckpt keygen --out ~/.rlckpt/run1
  rlckpt train --run-dir s3://bucket/run1 --signing-key ~/.rlckpt/run1/signing.key
  rlckpt verify s3://bucket/run1 --verify-key ~/.rlckpt/run1/signing.pub

signing.key (mode 0600) stays with whoever runs `rlckpt train`: the controller signs each
bundle's COMMIT with it. signing.pub goes to everyone who reads the run (--verify-key or
RLCKPT_VERIFY_KEY): they then read only bundles that key signed for that run.
"""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "keygen",
        help="make an Ed25519 key pair for signed bundles",
        description=(
            "Write a new Ed25519 key pair into DIR (created mode 0700 if missing): signing.key, the\n"
            "private key (mode 0600), and signing.pub, the public key. Existing key files are never\n"
            "overwritten (exit 64)."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="the directory to write the key pair into")
    parser.add_argument("--json", action="store_true", help="print the paths and the key id as JSON")
    _common.add_verbose_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlckpt.store import write_key_pair

    written = write_key_pair(args.out)
    if args.json:  # paths and the key id only: never key material
        print(
            json.dumps(
                {"signing_key": written.signing_key, "verify_key": written.verify_key, "key_id": written.key_id},
                sort_keys=True,
            )
        )
        return _common.EXIT_OK
    name = _common.printable
    print(f"key id {written.key_id}")
    print(f"  {name(written.signing_key)}  private: for `rlckpt train --signing-key`; keep it mode 0600")
    print(f"  {name(written.verify_key)}  public: for --verify-key on every command that reads the run")
    return _common.EXIT_OK
