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


def test_everything_the_checkpointers_settings_and_results_name_is_importable_from_rlckpt_and_the_checkpointer():
    import rlckpt.checkpointer as checkpointer
    from rlckpt.checkpointer import Restored, SaveResult
    from rlckpt.store import Retention, SigningKey, VerifyKey
    from rlckpt.tiers import ReplicationConfig

    names = {
        "Retention": Retention,
        "ReplicationConfig": ReplicationConfig,
        "SigningKey": SigningKey,
        "VerifyKey": VerifyKey,
        "SaveResult": SaveResult,
        "Restored": Restored,
    }
    for name, value in names.items():
        assert getattr(rlckpt, name) is value and getattr(checkpointer, name) is value, name
        assert name in rlckpt.__all__ and name in checkpointer.__all__, name


def test_the_light_names_of_rlckpt_import_without_torch():
    code = (
        "import sys; from rlckpt import Retention, SigningKey, VerifyKey, ReplicationConfig; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
