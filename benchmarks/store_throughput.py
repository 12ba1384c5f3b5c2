"""Store throughput: save and load a bundle of many mixed-size files through rlckpt's BundleStore and,
in the same run, as a raw fsspec copy of the same files (no manifest, no digests, no commit).

    .venv/bin/python benchmarks/store_throughput.py                  # 64 and 512 MiB, local + moto
    .venv/bin/python benchmarks/store_throughput.py --sizes 64 --backends local
    .venv/bin/python benchmarks/store_throughput.py --rgw-endpoint http://127.0.0.1:7480   # + Ceph RGW
    .venv/bin/python benchmarks/store_throughput.py --quick          # tiny smoke run

The target is store/raw <= 1.15 for save and load. Results: a table on stdout,
benchmarks/results/store_throughput.json and .md (see --out-dir).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fsspec

from rlckpt.s3local import moto_server, s3_env_vars, s3_options_for
from rlckpt.store import BundleStore
from rlckpt.store.io.digest import WRITE_ALGORITHM, new_hasher

MiB = 1 << 20
KiB = 1 << 10
TARGET_RATIO = 1.15
QUICK_SIZE_MIB = 2.0
DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "results"
BUCKET = "rlckpt-bench"


# --- the file set ---------------------------------------------------------------------------------


def file_sizes(total: int, seed: int = 0) -> dict[str, int]:
    """A checkpoint-like mix adding up to `total` bytes: ~50 % in 4 weight shards, ~35 % in 1–8 MiB
    data-plane parts, ~15 % in 4–256 KiB small files (configs, indexes, tokenizer bits)."""
    rng = random.Random(seed)
    sizes: dict[str, int] = {}
    for i in range(4):
        sizes[f"policy/shard_{i:02d}.bin"] = total // 8
    remaining_medium = int(total * 0.35)
    i = 0
    while remaining_medium > 0:
        size = min(remaining_medium, rng.randint(1 * MiB, 8 * MiB))
        sizes[f"data_plane/part_{i:04d}.bin"] = size
        remaining_medium -= size
        i += 1
    remaining_small = total - sum(sizes.values())
    i = 0
    while remaining_small > 0:
        size = min(remaining_small, rng.randint(4 * KiB, 256 * KiB))
        sizes[f"misc/{i // 100:02d}/item_{i:05d}.bin"] = size
        remaining_small -= size
        i += 1
    return sizes


def make_source(root: Path, total: int, seed: int = 0) -> dict[str, int]:
    """Write the file set under `root` with incompressible bytes; return relpath -> size."""
    sizes = file_sizes(total, seed)
    for rel, size in sizes.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    return sizes


# --- backends -------------------------------------------------------------------------------------


@dataclass
class Target:
    """Where one backend's bundles go: a store URL and storage options, plus a raw fsspec filesystem."""

    name: str
    store_url: str
    raw_url: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    def filesystem(self) -> Any:
        protocol = fsspec.utils.get_protocol(self.raw_url)
        return fsspec.filesystem(protocol, **self.storage_options)


def s3_target(name: str, endpoint: str, key: str, secret: str, run_id: str) -> Target:
    opts = s3_options_for(endpoint, key, secret)
    fs = fsspec.filesystem("s3", **opts)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    return Target(name, f"s3://{BUCKET}/{run_id}/store", f"s3://{BUCKET}/{run_id}/raw", opts)


# --- one measurement ------------------------------------------------------------------------------


@dataclass
class Row:
    """Median timings of one backend at one size."""

    backend: str
    size_mib: float
    files: int
    repeats: int
    store_save_s: float
    raw_save_s: float
    store_load_s: float
    raw_load_s: float
    save_ratio: float = 0.0
    load_ratio: float = 0.0
    store_save_mib_s: float = 0.0
    raw_save_mib_s: float = 0.0
    store_load_mib_s: float = 0.0
    raw_load_mib_s: float = 0.0
    floor_save_s: float | None = None  # local: raw copy + digest + fsync (what any durable digested save costs)
    floor_load_s: float | None = None  # local: raw copy + digest of the copy
    samples: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.save_ratio = self.store_save_s / self.raw_save_s
        self.load_ratio = self.store_load_s / self.raw_load_s
        self.store_save_mib_s = self.size_mib / self.store_save_s
        self.raw_save_mib_s = self.size_mib / self.raw_save_s
        self.store_load_mib_s = self.size_mib / self.store_load_s
        self.raw_load_mib_s = self.size_mib / self.raw_load_s


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def store_save(store: BundleStore, step: int, src: Path) -> None:
    with store.begin(step) as tx:
        tx.put_dir("", src)
        tx.commit({"benchmark": "store_throughput"})


def store_load(store: BundleStore, step: int, dst: Path) -> None:
    bundle = store.open(step)
    bundle.get_dir("", dst)


def raw_save(fs: Any, src: Path, dst_url: str) -> None:
    fs.put(str(src) + "/", dst_url, recursive=True)


def raw_load(fs: Any, src_url: str, dst: Path) -> None:
    fs.get(src_url + "/", str(dst) + "/", recursive=True)


def _digest_file(path: Path) -> str:
    """The digest the store writes (BLAKE3, through the store's own hasher) of one file."""
    hasher = new_hasher(WRITE_ALGORITHM, path.stat().st_size)
    with open(path, "rb") as f:
        while chunk := f.read(8 * MiB):
            hasher.update(chunk)
    return hasher.hexdigest()


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def floor_save(fs: Any, src: Path, dst: str) -> None:
    """Local only: the least a durable, digested save must do — raw copy, the digest of every file, fsync
    of every file and directory (8 threads, as the store)."""
    raw_save(fs, src, dst)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(_digest_file, _files(src)))
        list(pool.map(_fsync, [*_files(Path(dst)), *(p for p in Path(dst).rglob("*") if p.is_dir()), Path(dst)]))


def floor_load(fs: Any, src_url: str, dst: Path) -> None:
    """Local only: the least a verified load must do — raw copy, then the digest of every loaded file."""
    raw_load(fs, src_url, dst)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(_digest_file, _files(dst)))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def strip_protocol(fs: Any, url: str) -> str:
    return fs._strip_protocol(url)


def check_same_tree(expected: dict[str, int], root: Path, what: str) -> None:
    """Guard against a benchmark that measures nothing: every file arrived with its size."""
    got = {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*") if p.is_file()}
    if got != expected:
        missing = sorted(set(expected) - set(got))[:3]
        extra = sorted(set(got) - set(expected))[:3]
        raise RuntimeError(f"{what}: loaded tree differs (missing {missing}, extra {extra})")


def measure(target: Target, src: Path, sizes: dict[str, int], scratch: Path, repeats: int) -> Row:
    """Interleave raw and store save/load `repeats` times (alternating which goes first); medians."""
    fs = target.filesystem()
    total = sum(sizes.values())
    label = f"mib_{total / MiB:g}"  # a fresh run per size: step numbers restart at 0
    store_url, raw_url = f"{target.store_url}/{label}", f"{target.raw_url}/{label}"
    store = BundleStore(store_url, storage_options=dict(target.storage_options))
    if "://" not in store_url:
        os.makedirs(store_url, exist_ok=True)
    store.steps()  # construct + first request (and any probe) outside the timings
    fs.makedirs(strip_protocol(fs, raw_url), exist_ok=True)  # same warm-up for the raw side
    samples: dict[str, list[float]] = {k: [] for k in ("store_save", "raw_save", "store_load", "raw_load")}
    for rep in range(repeats):
        raw_dst = f"{strip_protocol(fs, raw_url)}/rep_{rep}"
        store_dir, raw_dir = scratch / f"load_store_{rep}", scratch / f"load_raw_{rep}"
        ops: list[tuple[str, Callable[[], None]]] = [
            ("raw_save", functools.partial(raw_save, fs, src, raw_dst)),
            ("store_save", functools.partial(store_save, store, rep, src)),
        ]
        loads: list[tuple[str, Callable[[], None]]] = [
            ("raw_load", functools.partial(raw_load, fs, raw_dst, raw_dir)),
            ("store_load", functools.partial(store_load, store, rep, store_dir)),
        ]
        if rep % 2:
            ops.reverse()
            loads.reverse()
        local = "://" not in store_url
        floor_dst, floor_dir = f"{strip_protocol(fs, raw_url)}/floor_{rep}", scratch / f"load_floor_{rep}"
        if local:
            ops.append(("floor_save", functools.partial(floor_save, fs, src, floor_dst)))
            loads.append(("floor_load", functools.partial(floor_load, fs, raw_dst, floor_dir)))
        for name, op in ops + loads:
            samples.setdefault(name, []).append(timed(op))
        if local:
            shutil.rmtree(floor_dir)
            fs.rm(floor_dst, recursive=True)
        check_same_tree(sizes, store_dir, f"{target.name} store load")
        check_same_tree(sizes, raw_dir, f"{target.name} raw load")
        shutil.rmtree(store_dir)
        shutil.rmtree(raw_dir)
        fs.rm(raw_dst, recursive=True)
        store.gc(keep_last=1)  # keep object-store servers from holding every repeat in RAM
    fs.rm(strip_protocol(fs, store_url), recursive=True)
    return Row(
        backend=target.name,
        size_mib=total / MiB,
        files=len(sizes),
        repeats=repeats,
        store_save_s=statistics.median(samples["store_save"]),
        raw_save_s=statistics.median(samples["raw_save"]),
        store_load_s=statistics.median(samples["store_load"]),
        raw_load_s=statistics.median(samples["raw_load"]),
        floor_save_s=statistics.median(samples["floor_save"]) if "floor_save" in samples else None,
        floor_load_s=statistics.median(samples["floor_load"]) if "floor_load" in samples else None,
        samples=samples,
    )


# --- reporting ------------------------------------------------------------------------------------

HEADERS = [
    "backend",
    "MiB",
    "files",
    "save store s",
    "save raw s",
    "save ×",
    "load store s",
    "load raw s",
    "load ×",
    "save MiB/s store/raw",
    "load MiB/s store/raw",
    "store / floor save, load",
]


def table_cells(row: Row) -> list[str]:
    return [
        row.backend,
        f"{row.size_mib:g}",
        str(row.files),
        f"{row.store_save_s:.3f}",
        f"{row.raw_save_s:.3f}",
        f"{row.save_ratio:.2f}",
        f"{row.store_load_s:.3f}",
        f"{row.raw_load_s:.3f}",
        f"{row.load_ratio:.2f}",
        f"{row.store_save_mib_s:.0f} / {row.raw_save_mib_s:.0f}",
        f"{row.store_load_mib_s:.0f} / {row.raw_load_mib_s:.0f}",
        "-"
        if row.floor_save_s is None or row.floor_load_s is None
        else f"{row.store_save_s / row.floor_save_s:.2f}, {row.store_load_s / row.floor_load_s:.2f}",
    ]


def text_table(rows: list[Row]) -> str:
    cells = [table_cells(r) for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(HEADERS)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(HEADERS, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def markdown_table(rows: list[Row], meta: dict[str, Any]) -> str:
    lines = [
        "# Store throughput",
        "",
        f"`benchmarks/store_throughput.py`, {meta['when']}, {meta['cpus']} CPUs "
        f"(load average {meta['load_average_1m']}), "
        f"median of {meta['repeats']} runs. "
        f"Ratio = store time / raw fsspec copy time (target ≤ {TARGET_RATIO}). Local disk also has a *floor*: "
        "the raw copy plus the store's digest (BLAKE3) of every file (and fsync of every file on save) — the "
        "least any durable, digest-checked save or load costs; `store / floor` shows the store's own overhead.",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "|".join("---:" if i else "---" for i in range(len(HEADERS))) + "|",
    ]
    lines += ["| " + " | ".join(table_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_results(rows: list[Row], meta: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "store_throughput.json").write_text(
        json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n"
    )
    (out_dir / "store_throughput.md").write_text(markdown_table(rows, meta))


# --- main -----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,512", help="comma-separated total sizes in MiB (default: 64,512)")
    parser.add_argument(
        "--quick", action="store_true", help=f"one tiny size ({QUICK_SIZE_MIB:g} MiB), one repeat: a smoke test"
    )
    parser.add_argument(
        "--backends", default="local,s3", help="comma-separated from local, s3 (moto), rgw (default: local,s3)"
    )
    parser.add_argument("--rgw-endpoint", help="also run against this Ceph RGW endpoint (scripts/rgw.sh start)")
    parser.add_argument("--rgw-key", default="testing")
    parser.add_argument("--rgw-secret", default="testing")
    parser.add_argument("--repeats", type=int, default=3, help="runs per size and backend; medians are reported")
    parser.add_argument("--workdir", help="scratch directory on local disk (default: a temp dir)")
    parser.add_argument("--out-dir", default=str(DEFAULT_OUT_DIR), help="where the .json and .md results go")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats = str(QUICK_SIZE_MIB), 1
    args.size_list = [float(s) for s in args.sizes.split(",") if s.strip()]
    args.backend_list = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.rgw_endpoint and "rgw" not in args.backend_list:
        args.backend_list.append("rgw")
    unknown = set(args.backend_list) - {"local", "s3", "rgw"}
    if unknown:
        parser.error(f"unknown backends: {sorted(unknown)}")
    if "rgw" in args.backend_list and not args.rgw_endpoint:
        parser.error("the rgw backend needs --rgw-endpoint (start one with: bash scripts/rgw.sh start)")
    return args


@contextmanager
def targets(names: list[str], scratch: Path, args: argparse.Namespace, run_id: str) -> Iterator[list[Target]]:
    """Build each backend's Target, starting (and later stopping) a moto server when s3 is asked for."""
    built: list[Target] = []
    with ExitStack() as stack:
        for name in names:
            if name == "local":
                root = scratch / "local"
                built.append(Target("local", str(root / "store"), f"file://{root / 'raw'}", {"auto_mkdir": True}))
            elif name == "s3":
                endpoint = stack.enter_context(moto_server())
                built.append(s3_target("s3 (moto)", endpoint, "testing", "testing", run_id))
            elif name == "rgw":
                built.append(s3_target("s3 (ceph rgw)", args.rgw_endpoint, args.rgw_key, args.rgw_secret, run_id))
        yield built


def s3_environment() -> None:
    """Credentials and region for botocore without touching the user's AWS config (set values win)."""
    for name, value in s3_env_vars().items():
        os.environ.setdefault(name, value)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    s3_environment()
    run_id = f"run-{int(time.time())}-{os.getpid()}"
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="rlckpt-bench-", dir=args.workdir) as tmp:
        scratch = Path(tmp)
        with targets(args.backend_list, scratch, args, run_id) as built:
            for size_mib in args.size_list:
                src = scratch / f"src_{size_mib:g}"
                sizes = make_source(src, int(size_mib * MiB))
                for target in built:
                    print(f"# {target.name}: {size_mib:g} MiB in {len(sizes)} files ...", file=sys.stderr, flush=True)
                    rows.append(measure(target, src, sizes, scratch, args.repeats))
                shutil.rmtree(src)
    meta = {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),  # other work on the machine skews the figures
        "python": platform.python_version(),
        "fsspec": fsspec.__version__,
        "repeats": args.repeats,
        "target_ratio": TARGET_RATIO,
        "argv": sys.argv[1:] if argv is None else argv,
    }
    print(text_table(rows))
    write_results(rows, meta, Path(args.out_dir))
    worst = max(max(r.save_ratio, r.load_ratio) for r in rows)
    print(f"worst store/raw ratio {worst:.2f} (target <= {TARGET_RATIO})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
