"""`from rlckpt import Checkpointer` is the entry point, and `import rlckpt` stays light: torch is imported only
when the Checkpointer is first used (the CLI's `--help` must not pay for it)."""

from __future__ import annotations

import subprocess
import sys

import rlckpt
from rlckpt.checkpointer import Checkpointer, CheckpointerConfig, SaveAndStop


def test_the_checkpointer_is_importable_from_the_package():
    assert (rlckpt.Checkpointer, rlckpt.CheckpointerConfig, rlckpt.SaveAndStop) == (
        Checkpointer,
        CheckpointerConfig,
        SaveAndStop,
    )


def test_importing_rlckpt_does_not_import_torch():
    code = "import sys, rlckpt; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
