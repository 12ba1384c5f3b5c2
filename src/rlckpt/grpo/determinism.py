"""CPU determinism: run torch work with a fixed thread count, restoring the caller's afterwards.

Float reductions in matmul/GRU kernels can split work differently with a different number of
threads, so bit-exact results need the same count in every process. We pin it per call instead
of process-wide, so importing or using rlckpt.grpo never changes the rest of the process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(num_threads: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(num_threads)``, then restore the previous count."""
    previous = torch.get_num_threads()
    if previous != num_threads:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)
