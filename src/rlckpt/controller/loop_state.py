"""The controller's own position (``LoopState``) and its record, the loader state of ``train_dataloader.pt``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlckpt.errors import LoaderStateError
from rlckpt.formats import Field, Int, MapOf, Obj, Record, read_format
from rlckpt.grpo.dataloader import PROMPT_LOADER, PromptLoader

LOADER_STATE_FORMAT = 1

PENDING_DRAW = Obj(
    "pending draw",
    (
        Field("draw_seq", Int(minimum=0), "the prompt's place in the draw order"),
        Field("prompt_id", Int(minimum=0), "the prompt the group generates for"),
    ),
)

LOADER_STATE = Record(
    "loader state",
    LOADER_STATE_FORMAT,
    (
        Field("loader", PROMPT_LOADER.body, "the prompt loader's position (`PromptLoader.state_dict`)"),
        Field("step", Int(minimum=0), "train steps completed (the trainer's weight version)"),
        Field("next_batch_step", Int(minimum=0), "the step the next drawn batch is for"),
        Field("draws", Int(minimum=0), "prompts drawn so far (the next prompt's `draw_seq`)"),
        Field("pending", MapOf(PENDING_DRAW), "groups reserved but not committed, by group id: what they draw"),
    ),
    LoaderStateError,
    constant="LOADER_STATE_FORMAT",
    stored_in="`train_dataloader.pt`: `torch.save` of plain values",
    writer="`rlckpt.controller.loop_state.LoopState.to_state`",
    doc=(
        "Where the run's prompt stream stands, captured in the same instant as the replay index: the "
        "loader's position and the prompts drawn whose groups are reserved but not committed (a resumed "
        "run generates them again rather than drawing new ones). Restore checks it before anything is "
        "loaded; `LoopState.from_state` then holds it to the loader it resumes (seed, batch size, task)."
    ),
    written_by="rlckpt 0.1.0, from 154794b (every run-bundle format)",
    changes="the first",
)
LOADER_STATE_FORMATS = (LOADER_STATE,)  # every format this rlckpt reads, oldest first


@dataclass
class LoopState:
    """The controller's own position: what the dataloader file of a bundle holds."""

    step: int = 0  # completed train steps == trainer weight version
    next_batch_step: int = 0  # the step the next drawn batch is for
    draws: int = 0  # prompts drawn so far (a prompt's draw_seq)
    pending: dict[str, dict[str, int]] = field(default_factory=dict)  # reserved, not committed groups

    def to_state(self, loader: PromptLoader) -> dict[str, Any]:
        return {
            "format": LOADER_STATE_FORMAT,
            "loader": loader.state_dict(),
            "step": self.step,
            "next_batch_step": self.next_batch_step,
            "draws": self.draws,
            "pending": {gid: dict(v) for gid, v in self.pending.items()},
        }

    @classmethod
    def from_state(cls, state: Any, loader: PromptLoader) -> LoopState:
        """The position a saved loader state holds, with `loader` moved to it.

        Raises:
            LoaderStateError: a field missing, of another type or unknown (named), a format this rlckpt
                does not read, or a position for another loader.
        """
        read_format(LOADER_STATE_FORMATS, state, "train_dataloader.pt")
        loader.load_state_dict(state["loader"])
        pending = {gid: dict(draw) for gid, draw in state["pending"].items()}
        return cls(state["step"], state["next_batch_step"], state["draws"], pending)
