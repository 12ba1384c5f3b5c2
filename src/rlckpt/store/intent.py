"""The write-ahead intent (`_txn/step_<N>.json`): who writes which step since when; it doubles as the step's claim."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass

from .manifest import canonical_json
from .paths import validate_step

DEFAULT_STALE_AFTER = 3600.0  # seconds; a transaction older than this with no COMMIT is presumed dead


@dataclass(frozen=True)
class Intent:
    """Recorded before the first data byte of a transaction; removed when it commits or aborts."""

    step: int
    txid: str
    host: str
    pid: int
    started: float  # unix time

    @classmethod
    def new(cls, step: int, txid: str) -> Intent:
        return cls(step=step, txid=txid, host=socket.gethostname(), pid=os.getpid(), started=time.time())

    def to_bytes(self) -> bytes:
        return canonical_json(asdict(self))

    @classmethod
    def from_bytes(cls, data: bytes) -> Intent:
        obj = json.loads(data.decode("utf-8"))
        return cls(
            step=validate_step(obj["step"]),
            txid=str(obj["txid"]),
            host=str(obj["host"]),
            pid=int(obj["pid"]),
            started=float(obj["started"]),
        )

    def is_stale(self, stale_after: float, now: float | None = None) -> bool:
        """Presumed dead: older than `stale_after` seconds, or its writer was on this host and has exited."""
        now = time.time() if now is None else now
        if now - self.started >= stale_after:
            return True
        return self.host == socket.gethostname() and not _pid_alive(self.pid)

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started))
        return f"txid {self.txid} (host {self.host}, pid {self.pid}, started {started})"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
