"""The store layer stays importable without torch, Ray or TransferQueue (and never pulls them in)."""

from __future__ import annotations

import subprocess
import sys


def test_store_imports_neither_torch_ray_nor_transfer_queue():
    code = (
        "import sys, rlckpt.store, rlckpt.store.upkeep.gc, support.faults\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray', 'transfer_queue'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
