"""One listing of a run, grouped by what each path belongs to (steps, intents, staging dirs); shared by
`entries()`, `steps()` and `gc()`."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .paths import COMMIT_NAME, PROBE_DIR, TMP_DIR, TXN_DIR, parse_step_dirname


@dataclass
class Inventory:
    """What a listing of the run found: per step the relpaths and sizes; intent names; staging dirs; others."""

    steps: dict[int, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    intents: list[str] = field(default_factory=list)  # full paths of _txn/*.json
    tmp_dirs: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))  # name -> {path: size}
    probes: dict[str, float | None] = field(default_factory=dict)  # create-exclusive probe keys -> mtime

    def committed_marker(self, step: int) -> bool:
        return COMMIT_NAME in self.steps.get(step, {})


def scan(fs: Any, root: str) -> Inventory:
    """List everything under `root` once (one paginated LIST on S3) and group it."""
    inv = Inventory()
    try:
        listed = fs.find(root, detail=True)
    except FileNotFoundError:
        return inv
    for path, info in listed.items():
        if not path.startswith(root + "/"):
            continue
        rel = path[len(root) + 1 :]
        head, _, rest = rel.partition("/")
        if head == TXN_DIR and rest:
            inv.intents.append(path)
        elif head == PROBE_DIR and rest:
            inv.probes[path] = _mtime(info)
        elif head == TMP_DIR and rest:
            inv.tmp_dirs[rest.split("/", 1)[0]][path] = int(info.get("size") or 0)
        else:
            step = parse_step_dirname(head)
            if step is not None and rest:
                inv.steps[step][rest] = int(info.get("size") or 0)
    if fs_is_local(fs):
        _add_empty_dirs(fs, root, inv)
    return inv


def fs_is_local(fs: Any) -> bool:
    from .backends import is_local_fs

    return is_local_fs(fs)


def _add_empty_dirs(fs: Any, root: str, inv: Inventory) -> None:
    """Local disk: empty step_/tmp dirs do not show in find(); list the top level for them."""
    try:
        top = fs.ls(root, detail=True)
    except FileNotFoundError:
        return
    for info in top:
        name = info["name"].rstrip("/").rsplit("/", 1)[-1]
        if info.get("type") != "directory":
            continue
        step = parse_step_dirname(name)
        if step is not None:
            inv.steps.setdefault(step, {})
        elif name == TMP_DIR:
            for sub in fs.ls(info["name"], detail=True):
                inv.tmp_dirs.setdefault(sub["name"].rstrip("/").rsplit("/", 1)[-1], {})


def _mtime(info: dict[str, Any]) -> float | None:
    """Modification time (unix) from an fsspec info dict: `mtime` (local) or `LastModified` (S3)."""
    if isinstance(info.get("mtime"), (int, float)):
        return float(info["mtime"])
    last = info.get("LastModified")
    return last.timestamp() if hasattr(last, "timestamp") else None
