"""A fault-injecting wrapper around a real fsspec filesystem: counts storage calls and fails the k-th.

Every method call on the filesystem and on the files it opens (write/read/flush/close/commit/discard)
is one "storage call"; an S3 request made through s3fs's client (`call_s3` or its async `_call_s3`, as the
store's parallel uploads make them) is recorded with its operation, e.g. `_call_s3:upload_part`.
`fail_at=k` makes call number k (1-based) raise InjectedFault; with `sticky=True` every later call fails
too (a process that died at call k). With `only="upload_part"`, only the calls whose name ends so are
counted for `fail_at` (the k-th part uploaded fails, wherever it falls among the other calls). The wrapped
filesystem is real (local disk, s3fs): nothing of fsspec is mocked.
"""

from __future__ import annotations

import threading
from typing import Any

S3_REQUESTS = frozenset({"call_s3", "_call_s3"})  # s3fs's client: the first argument names the operation
FILE_METHODS = frozenset({"write", "read", "flush", "close", "commit", "discard", "readinto", "seek"})
PASSTHROUGH = frozenset(
    {"protocol", "root_marker", "sep", "_strip_protocol", "_parent", "split_path", "unstrip_protocol"}
)


class InjectedFault(OSError):
    """The failure a FaultyFileSystem injects."""


class FaultPlan:
    """Shared counter of storage calls and the rule for which one fails."""

    def __init__(self, fail_at: int | None = None, sticky: bool = False, only: str | None = None) -> None:
        self.fail_at = fail_at
        self.sticky = sticky
        self.only = only
        self.calls: list[str] = []
        self._counted = 0
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        return len(self.calls)

    def tick(self, name: str) -> None:
        with self._lock:
            self.calls.append(name)
            if self.only is None or name.endswith(self.only):
                self._counted += 1
            elif not (self.sticky and self.fail_at is not None and self._counted >= self.fail_at):
                return
            n = self._counted
        if self.fail_at is not None and (n == self.fail_at or (self.sticky and n > self.fail_at)):
            raise InjectedFault(f"injected fault at storage call {n} ({name})")


class _FaultyFile:
    def __init__(self, inner: Any, plan: FaultPlan) -> None:
        self._inner = inner
        self._plan = plan

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance() sees the real file's class, as code under test expects
        return type(self._inner)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name in FILE_METHODS and callable(attr):

            def call(*args: Any, **kwargs: Any) -> Any:
                self._plan.tick(f"file.{name}")
                return attr(*args, **kwargs)

            return call
        return attr

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._inner, name, value)

    def __enter__(self) -> _FaultyFile:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close()


class FaultyFileSystem:
    """Proxy over a real fsspec filesystem that counts calls and fails according to a FaultPlan."""

    def __init__(self, inner: Any, plan: FaultPlan | None = None) -> None:
        self._inner = inner
        self.plan = plan or FaultPlan()

    @property
    def inner(self) -> Any:
        return self._inner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name in PASSTHROUGH or name.startswith("__") or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.plan.tick(f"{name}:{args[0]}" if name in S3_REQUESTS and args else name)
            result = attr(*args, **kwargs)
            return _FaultyFile(result, self.plan) if name == "open" else result

        return call
