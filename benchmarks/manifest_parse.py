"""Manifest parse: how long a reader takes to check a manifest of many files (``Manifest.from_bytes``: canonical
JSON, every field against its format's declaration, every path against the others). Every open, verify and
commit pays it once per bundle, and a bundle can hold ~180,000 files (MANIFEST_MAX_BYTES).

    PYTHONPATH=src .venv/bin/python benchmarks/manifest_parse.py                 # 100,000 files, best of 5
    PYTHONPATH=src .venv/bin/python benchmarks/manifest_parse.py --files 180000 --repeat 3

Prints the manifest's size and the best and median parse time; nothing is written.
"""

from __future__ import annotations

import argparse
import statistics
import time

from rlckpt.store import Digest, FileEntry, Manifest


def manifest_of(files: int) -> bytes:
    """A format-2 manifest of `files` entries laid out as DCP shards of 64 ranks."""
    entries = {
        f"policy/__{i % 64}_{i}.distcp/part-{i:06d}.bin": FileEntry(
            size=7 * i + 1, digest=Digest.of(i.to_bytes(8, "little")), logical_size=7 * i + 1
        )
        for i in range(files)
    }
    return Manifest(step=3, txid="t" * 32, created="2026-12-02T00:00:00Z", files=entries, metadata={"k": 1}).to_bytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    data = manifest_of(args.files)
    seconds = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        Manifest.from_bytes(data)
        seconds.append(time.perf_counter() - start)
    print(
        f"{args.files} files, {len(data) / 1e6:.1f} MB: Manifest.from_bytes best {min(seconds):.3f} s, "
        f"median {statistics.median(seconds):.3f} s"
    )


if __name__ == "__main__":
    main()
