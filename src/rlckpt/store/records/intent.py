"""The write-ahead intent (`_txn/step_<N>.json`): who writes which step since when. It doubles as the
step's claim (claims.py), and its liveness decides what gc and a second writer may take over."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict, dataclass

from rlckpt.errors import MalformedRecordError
from rlckpt.formats import Field, Int, Nullable, Number, Record, Str, read_format
from rlckpt.store.paths.paths import TXID_PATTERN
from rlckpt.store.records.manifest import canonical_json, parse_canonical

INTENT_FORMAT = 1
INTENT_MAX_BYTES = 64 << 10
DEFAULT_STALE_AFTER = 3600.0  # seconds; a transaction older than this with no COMMIT is presumed dead
CLOCK_SKEW = 300.0  # seconds; a start time further in the future than this is not believed
MAX_PID = 2**31 - 1  # pids are C ints; anything larger is not a pid

INTENT = Record(
    "intent",
    INTENT_FORMAT,
    (
        Field("step", Int(minimum=0), "the step being written"),
        Field("txid", Str(pattern=TXID_PATTERN, meaning="txid (1-64 of A-Z a-z 0-9 _ -)"), "the transaction"),
        Field("host", Str(), "the writer's host name"),
        Field("pid", Int(minimum=1, maximum=MAX_PID), "the writer's process id on that host"),
        Field("started", Number(), "when the transaction began (unix time, the writer's clock)"),
        Field(
            "pid_start",
            Nullable(Int(minimum=0)),
            "the writer process's start (clock ticks since boot), so a recycled pid is not taken for it",
            required=False,
        ),
    ),
    MalformedRecordError,
    constant="INTENT_FORMAT",
    stored_in="`_txn/step_<N>.json`: canonical JSON, at most 64 KiB",
    writer="`rlckpt.store.records.intent.Intent` (`BundleStore.begin`; gc claims a step with one too)",
    doc=(
        "The write-ahead intent of a running save, and the claim of its step: created before the first "
        "data byte, removed when the save commits or aborts. An intent that does not read (malformed, "
        "over the cap, of a format this rlckpt does not read) still holds its step: it ages by its "
        "modification time (docs/store-protocol.md)."
    ),
    written_by="rlckpt 0.1.0, from deb1516 (`pid_start` from 39291ce)",
    changes="the first",
)
INTENT_FORMATS = (INTENT,)  # every format this rlckpt reads, oldest first


@dataclass(frozen=True)
class Intent:
    """Recorded before the first data byte of a transaction; removed when it commits or aborts.

    `pid_start` is the writer process's start time (clock ticks since boot, from /proc), so that a
    recycled pid on the writer's host is not mistaken for the writer."""

    step: int
    txid: str
    host: str
    pid: int
    started: float  # unix time
    pid_start: int | None = None
    format: int = INTENT_FORMAT

    @classmethod
    def new(cls, step: int, txid: str) -> Intent:
        pid = os.getpid()
        return cls(
            step=step, txid=txid, host=socket.gethostname(), pid=pid, started=time.time(), pid_start=process_start(pid)
        )

    def to_bytes(self) -> bytes:
        return canonical_json(asdict(self))

    @classmethod
    def from_bytes(cls, data: bytes) -> Intent:
        """Parse and check against ``INTENT``; ValueError (MalformedRecordError naming the field) on anything
        that is not an intent this version reads."""
        try:
            obj = parse_canonical(data, "intent")
        except ValueError as exc:  # not JSON, nested too deeply, not canonical: the record's own error
            raise MalformedRecordError(str(exc)) from None
        read_format(INTENT_FORMATS, obj)
        return cls(
            step=obj["step"],
            txid=obj["txid"],
            host=obj["host"],
            pid=obj["pid"],
            started=float(obj["started"]),
            pid_start=obj.get("pid_start"),
        )

    def stale_reason(self, stale_after: float, mtime: float | None = None, now: float | None = None) -> str | None:
        """Why the writer is presumed dead, or None while it may be alive.

        On the writer's own host the process table decides (age does not: a live writer is live however
        long it takes). Elsewhere age decides, measured from the earlier of the recorded start and the
        object's modification time (a start dated in the future cannot keep a claim forever)."""
        now = time.time() if now is None else now
        if self.host == socket.gethostname():
            if not pid_alive(self.pid):
                return f"its writer (pid {self.pid}) on this host has exited"
            if self.pid_start is not None and process_start(self.pid) not in (None, self.pid_start):
                return f"pid {self.pid} on this host now belongs to another process"
            return None
        return age_reason(now - min(self.started, mtime if mtime is not None else self.started), stale_after)

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started))
        return f"txid {self.txid} (host {self.host}, pid {self.pid}, started {started})"


def age_reason(age: float, stale_after: float) -> str | None:
    """Staleness by age alone: too old, or dated implausibly far in the future."""
    if age >= stale_after:
        return f"older than {stale_after:g}s"
    if age < -CLOCK_SKEW:
        return f"dated {-age:.0f}s in the future"
    return None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True


def process_start(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (Linux /proc), or None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            fields = stat_file.read().rsplit(b")", 1)[1].split()
        return int(fields[19])  # field 22 of proc(5); fields[0] is field 3
    except (OSError, IndexError, ValueError):
        return None
