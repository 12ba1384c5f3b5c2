"""The Checkpointer sits between rlckpt.checkpoint and the trainers (docs/architecture.md, Layers): it imports no
layer above it (rlckpt.controller, rlckpt.cli, rlckpt.bench), nor Ray or TransferQueue, which a torchrun trainer
does not have."""

from __future__ import annotations

import subprocess
import sys


def test_the_checkpointer_imports_no_layer_above_it_nor_ray_nor_transfer_queue():
    code = (
        "import importlib, pkgutil, sys\n"
        "import rlckpt.checkpointer as package\n"
        "for module in pkgutil.walk_packages(package.__path__, 'rlckpt.checkpointer.'):\n"
        "    importlib.import_module(module.name)\n"
        "above = ('rlckpt.controller', 'rlckpt.cli', 'rlckpt.bench', 'ray', 'transfer_queue')\n"
        "bad = sorted(m for m in sys.modules if any(m == a or m.startswith(a + '.') for a in above))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
