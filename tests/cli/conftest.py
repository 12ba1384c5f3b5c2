"""Fixtures for the CLI tests: run `rlckpt` in-process, build bundles, reach files behind the store's back."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pytest

from rlckpt.cli.main import main
from rlckpt.store import BundleStore
from support.store_checks import stored_path


@dataclass
class CliResult:
    """What one `rlckpt ...` run produced."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@dataclass
class Run:
    """A run location (local or S3) with helpers to fill it and to run the CLI against it."""

    url: str
    storage_options: dict[str, Any] | None
    raw_writes: list[str] = field(default_factory=list)

    def store(self) -> BundleStore:
        return BundleStore(self.url, storage_options=self.storage_options)

    def options_args(self) -> list[str]:
        """The --storage-options argument the CLI needs to reach this location."""
        return ["--storage-options", json.dumps(self.storage_options)] if self.storage_options else []

    def commit(self, step: int, files: dict[str, bytes] | None = None, metadata: dict[str, Any] | None = None) -> None:
        """Commit `step` with the given files (default: two small files) and manifest metadata."""
        files = files if files is not None else {"policy/weights.bin": b"w" * 3000, "loader.pt": b"l" * 100}
        with self.store().begin(step) as tx:
            for rel, data in files.items():
                tx.write_bytes(rel, data)
            tx.commit({"step": step} if metadata is None else metadata)

    def raw_path(self, *parts: str) -> tuple[Any, str]:
        """(filesystem, path) of a path under the run, to tamper with it directly."""
        fs, root = fsspec.core.url_to_fs(self.url, **(self.storage_options or {}))
        return fs, "/".join([root.rstrip("/"), *parts])

    def stored_path(self, step: int, rel: str) -> tuple[Any, str]:
        """(filesystem, path) of the stored file `rel` of committed bundle `step`, to tamper with it."""
        store = self.store()
        return store.fs, stored_path(store, step, rel)

    def put_raw(self, data: bytes, *parts: str) -> None:
        """Write `data` at a path under the run behind the store's back (parent directories created)."""
        fs, path = self.raw_path(*parts)
        fs.makedirs(fs._parent(path), exist_ok=True)
        fs.pipe_file(path, data)
        self.raw_writes.append(path)

    def remove_raw_writes(self) -> None:
        """Delete what put_raw wrote, one object at a time: moto fails the batch delete that the
        bucket cleanup uses on keys with control characters (HTTP 500, retried for seconds)."""
        fs, _root = self.raw_path()
        for path in self.raw_writes:
            try:
                fs.rm_file(path)
            except FileNotFoundError:
                pass


@pytest.fixture
def run(store_location: tuple[str, dict[str, Any] | None]) -> Iterator[Run]:
    url, options = store_location
    location = Run(url, options)
    yield location
    location.remove_raw_writes()


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run `rlckpt *argv` in-process; returns exit code and captured stdout/stderr."""

    def invoke(*argv: str) -> CliResult:
        capsys.readouterr()
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse: --help, usage errors
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return invoke
