"""PathSet: the relpaths of one bundle and the directories they imply, so that a path written twice, or
a file where another path needs a directory, is found in time proportional to the path's depth rather
than to the number of files (a bundle can hold 150,000). Writers, the commit's merge of receipts and
the manifest reader all decide clashes here."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from rlckpt.formats.json_text import quoted


def parents(relpath: str) -> Iterator[str]:
    """Every proper ancestor directory of `relpath`, shortest first: 'a', 'a/b' for 'a/b/c'."""
    cut = relpath.find("/")
    while cut != -1:
        yield relpath[:cut]
        cut = relpath.find("/", cut + 1)


@dataclass(frozen=True)
class Clash:
    """`path` cannot join the set: `other` (added by `other_owner`) is the same path, a file above it, or
    a file below it (then `path` would have to be both a file and that file's directory)."""

    path: str
    other: str
    other_owner: str

    @property
    def duplicate(self) -> bool:
        return self.path == self.other

    def describe(self) -> str:
        """What is wrong, in the words every reader of a manifest uses."""
        if self.duplicate:
            return f"{quoted(self.path)} is listed twice"
        inner, outer = (self.path, self.other) if self.path.startswith(self.other + "/") else (self.other, self.path)
        return f"{quoted(inner)} lies under {quoted(outer)}, which is a file"


class PathSet:
    """Files of one bundle (each with the name of whoever added it) and a count of files below each
    directory they imply."""

    def __init__(self) -> None:
        self._owners: dict[str, str] = {}
        self._below: dict[str, int] = {}  # directory -> number of files under it

    def __len__(self) -> int:
        return len(self._owners)

    def __contains__(self, relpath: object) -> bool:
        return relpath in self._owners

    def clash(self, relpath: str) -> Clash | None:
        """Why `relpath` cannot be added, or None."""
        if relpath in self._owners:
            return Clash(relpath, relpath, self._owners[relpath])
        for parent in parents(relpath):
            if parent in self._owners:
                return Clash(relpath, parent, self._owners[parent])
        if self._below.get(relpath):
            prefix = relpath + "/"
            other = next(p for p in self._owners if p.startswith(prefix))  # only on refusal: a scan is fine
            return Clash(relpath, other, self._owners[other])
        return None

    def add(self, relpath: str, owner: str = "") -> Clash | None:
        """Add `relpath` unless it clashes; the clash, or None when added."""
        clash = self.clash(relpath)
        if clash is None:
            self._owners[relpath] = owner
            for parent in parents(relpath):
                self._below[parent] = self._below.get(parent, 0) + 1
        return clash

    def remove(self, relpath: str) -> None:
        """Forget `relpath` (a write that failed frees its name); nothing if it is not there."""
        if self._owners.pop(relpath, None) is None:
            return
        for parent in parents(relpath):
            left = self._below[parent] - 1
            if left:
                self._below[parent] = left
            else:
                del self._below[parent]
