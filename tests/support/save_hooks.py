"""Save hooks for crash tests: awaited by the save just before COMMIT (``SaveParticipants.before_commit``)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HoldSaveBeforeCommit:
    """Holds the save of ``step`` before its COMMIT until the process is killed, after touching
    ``marker`` so a test knows the moment has come. Picklable: it travels to the controller actor."""

    step: int
    marker: str

    async def __call__(self, step: int) -> None:
        if step != self.step:
            return
        logger.warning("holding the save of step %d before COMMIT until this process is killed", step)
        Path(self.marker).touch()
        await asyncio.Event().wait()  # nothing ever sets it
