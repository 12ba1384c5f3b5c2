"""The tiers layer sits above the store and below the checkpoint procedures: no torch, Ray or TransferQueue."""

from __future__ import annotations

import subprocess
import sys


def test_tiers_import_neither_torch_ray_nor_transfer_queue():
    code = (
        "import sys, rlckpt.tiers\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray', 'transfer_queue'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
