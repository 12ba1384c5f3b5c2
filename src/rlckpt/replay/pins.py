"""Pins: what a pinned checkpoint holds in place until its copy of the rows has been made.

A pinned save captures the index at one instant (no waiting on the data plane) and then copies the
captured groups' rows while rollouts keep committing. Until a group's rows are copied, the replay
buffer keeps them exactly as captured:

- removing the group drops it from the index at once, but clearing its rows waits for the copy;
- writing a column the group was committed with waits for the copy (a new column, such as
  ``advantages``, does not: the copy reads only the columns the group was committed with);
- new groups are not pinned at all (they are not part of the capture).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Pins:
    """The groups of one pinned capture whose rows are not copied yet."""

    pending: set[str]
    deferred: dict[str, tuple[str, ...]] = field(default_factory=dict)  # group -> rows to clear once copied
    _copied: dict[str, asyncio.Event] = field(default_factory=dict)

    @classmethod
    def of(cls, group_ids: Iterable[str]) -> Pins:
        return cls(pending=set(group_ids))

    def holds(self, group_id: str) -> bool:
        return group_id in self.pending

    async def wait_copied(self, group_id: str) -> None:
        """Return once `group_id` is no longer pinned."""
        if group_id in self.pending:
            await self._copied.setdefault(group_id, asyncio.Event()).wait()

    def release(self, group_id: str) -> tuple[str, ...]:
        """Unpin one group (its rows are copied, or the save gave up); the rows whose clear it deferred."""
        self.pending.discard(group_id)
        event = self._copied.pop(group_id, None)
        if event is not None:
            event.set()
        return self.deferred.pop(group_id, ())
