"""One listing of a run, grouped by what each path belongs to: steps, intents, staging dirs, probes, and
paths that are not regular files. Shared by `entries()`, `steps()` and gc."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from rlckpt.store.paths.paths import COMMIT_NAME, PROBE_DIR, QUARANTINE_DIR, TMP_DIR, TXN_DIR, parse_step_dirname

FILE = "file"
DIRECTORY = "directory"


@dataclass(frozen=True)
class ListedPath:
    """One path a backend listed, relative to the run root; kind is file, directory, or what else it is
    (symlink, fifo, socket, device: local disk only)."""

    rel: str
    kind: str
    size: int = 0
    mtime: float | None = None


@dataclass
class Inventory:
    """What a listing of the run found."""

    steps: dict[int, dict[str, int]] = field(default_factory=dict)  # step -> relpath -> size (regular files)
    intents: dict[str, float | None] = field(default_factory=dict)  # _txn/step_<N>.json paths -> mtime
    intent_temps: dict[str, float | None] = field(default_factory=dict)  # leftovers of atomic intent writes
    tmp_dirs: dict[str, dict[str, int]] = field(default_factory=dict)  # staging dir name -> {path: size}
    rosters: set[str] = field(default_factory=set)  # txids with a roster `_txn/<txid>/` (participants)
    probes: dict[str, float | None] = field(default_factory=dict)  # create-exclusive probe keys -> mtime
    quarantined: set[str] = field(default_factory=set)  # names under _quarantine/
    irregular: dict[str, str] = field(default_factory=dict)  # run-relative path -> kind (never followed)

    def committed_marker(self, step: int) -> bool:
        """True when the step has a COMMIT object (whether or not it names its manifest)."""
        return COMMIT_NAME in self.steps.get(step, {})

    def irregular_steps(self) -> dict[int, str]:
        """Steps with a non-regular path at or under `step_<N>` (the step dir itself may be a symlink),
        each with the first such path described."""
        out: dict[int, str] = {}
        for path, kind in sorted(self.irregular.items()):
            step = parse_step_dirname(path.split("/", 1)[0])
            if step is not None and step not in out:
                out[step] = f"{path} is a {kind}, not a regular file"
        return out


def group(listed: Iterable[ListedPath], root: str) -> Inventory:
    """Sort a flat listing into an Inventory; `root` (the run's full path) prefixes the intent/probe paths."""
    inv = Inventory()
    for item in listed:
        head, _, rest = item.rel.partition("/")
        if item.kind not in (FILE, DIRECTORY):
            inv.irregular[item.rel] = item.kind
            if head == TMP_DIR and rest:  # keep the staging dir known (gc must not think it gone)
                inv.tmp_dirs.setdefault(rest.split("/", 1)[0], {})
            if head == TXN_DIR and rest and "/" not in rest and not rest.startswith("."):
                inv.intents[f"{root}/{item.rel}"] = item.mtime  # an unreadable intent: it still holds its step
            continue
        step = parse_step_dirname(head)
        if step is not None:
            files = inv.steps.setdefault(step, {})
            if rest and item.kind == FILE:
                files[rest] = item.size
        elif head == TXN_DIR and rest and ("/" in rest or item.kind == DIRECTORY):
            inv.rosters.add(rest.split("/", 1)[0])
        elif head == TXN_DIR and rest and item.kind == FILE:
            full = f"{root}/{item.rel}"
            if "/" not in rest and rest.startswith("."):
                inv.intent_temps[full] = item.mtime
            else:
                inv.intents[full] = item.mtime
        elif head == TMP_DIR and rest:
            name, _, inner = rest.partition("/")
            files = inv.tmp_dirs.setdefault(name, {})
            if inner and item.kind == FILE:
                files[f"{root}/{item.rel}"] = item.size
        elif head == PROBE_DIR and rest and item.kind == FILE:
            inv.probes[f"{root}/{item.rel}"] = item.mtime
        elif head == QUARANTINE_DIR and rest:
            inv.quarantined.add(rest.split("/", 1)[0])
    return inv
