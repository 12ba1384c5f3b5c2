"""Real multi-rank DCP runs for the tests and the policy benchmark: N processes (torch.multiprocessing,
spawn) in a gloo group on 127.0.0.1, each holding an FSDP2-sharded MLP + AdamW on a CPU device mesh.

Nothing here is mocked: the ranks really shard, plan, gather and scatter through DCP and gloo.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlckpt.s3local import free_port

# How long a gloo collective may wait for a peer. A rank that dies surfaces on the others as a gloo
# error at once (its sockets close); this bounds only a rank that hangs.
GROUP_TIMEOUT = timedelta(seconds=60)


def _rank_main(
    fn: Callable[..., None], rank: int, world_size: int, port: int, args: tuple[Any, ...], errors: Any
) -> None:
    """Run one rank and end its process without interpreter teardown: what the rank had to say is
    written by then, and torch's C++ statics (gloo, c10d) sometimes abort in their destructors at exit
    ("terminate called without an active exception", exit -6) after a rank that did everything right."""
    code = 0
    try:
        fn(rank, world_size, port, *args)
    except BaseException:
        errors.put((rank, traceback.format_exc()))
        code = 1  # what multiprocessing gives a process whose target raised
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_ranks(
    fn: Callable[..., None],
    world_size: int,
    *args: Any,
    timeout: float = 300.0,
    expected_exits: dict[int, int] | None = None,
) -> dict[int, int]:
    """Run `fn(rank, world_size, port, *args)` in `world_size` spawned processes and wait for every one
    of them (unlike mp.spawn, a rank that dies does not get the others terminated while they still record
    what they saw).

    Returns:
        Each rank's exit code.
    Raises:
        RuntimeError: a rank exited otherwise than `expected_exits` says (default: all 0); the message
            holds the tracebacks of the ranks that raised.
        TimeoutError: not all ranks ended within `timeout` seconds (the rest are terminated).
    """
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(fn, rank, world_size, port, args, errors), name=f"rank{rank}")
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        if any(proc.is_alive() for proc in procs):
            raise TimeoutError(f"{world_size} ranks of {fn.__name__} did not end within {timeout:.0f}s")
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(10)
    codes = {rank: proc.exitcode for rank, proc in enumerate(procs)}
    expected = {rank: 0 for rank in range(world_size)} | dict(expected_exits or {})
    if codes != expected:
        tracebacks = []
        while not errors.empty():
            rank, text = errors.get()
            tracebacks.append(f"--- rank {rank} ---\n{text}")
        raise RuntimeError(f"ranks of {fn.__name__} exited with {codes}, expected {expected}\n" + "\n".join(tracebacks))
    return codes  # type: ignore[return-value]


@contextlib.contextmanager
def process_group(rank: int, world_size: int, port: int) -> Iterator[Any]:
    """A gloo group over tcp://127.0.0.1:`port` and a 1-D CPU device mesh over it, destroyed on exit."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)  # N ranks share 2 cores
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, timeout=GROUP_TIMEOUT
    )
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def mlp(width: int, depth: int, seed: int) -> torch.nn.Sequential:
    """`depth` Linear(width, width) layers with ReLUs between, initialised from `seed`."""
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for i in range(depth):
        layers.append(torch.nn.Linear(width, width))
        if i < depth - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def sharded_policy(mesh: Any, width: int, depth: int, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """An MLP sharded with FSDP2 (`fully_shard` per layer, then the root) on `mesh`, and its AdamW."""
    from torch.distributed.fsdp import fully_shard

    model = mlp(width, depth, seed)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def plain_policy(width: int, depth: int, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The same MLP unsharded (world size 1, no process group) and its AdamW: the resharding target."""
    model = mlp(width, depth, seed)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: torch.nn.Module, optim: torch.optim.Optimizer, width: int, seed: int) -> None:
    """One AdamW step on a batch drawn from `seed` (the same batch on every rank)."""
    generator = torch.Generator().manual_seed(seed)
    batch = torch.randn(8, width, generator=generator)
    optim.zero_grad()
    model(batch).pow(2).mean().backward()
    optim.step()


def policy_state(model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    """{"model": ..., "optim": ...} as DCP saves it (DTensor shards under FSDP2)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optim)
    return {"model": model_sd, "optim": optim_sd}


def apply_policy_state(model: torch.nn.Module, optim: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Put a loaded {"model", "optim"} state back into the model and optimizer."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])


def full_state(model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    """The unsharded state on every rank (a collective under FSDP2), as plain CPU tensors."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_sd, optim_sd = get_state_dict(model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": model_sd, "optim": optim_sd}


def flat_tensors(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a nested state (DTensors as their local shard), by dotted path, cloned."""
    from torch.distributed.tensor import DTensor

    out: dict[str, torch.Tensor] = {}
    if isinstance(state, DTensor):
        out[prefix] = state.to_local().detach().clone()
    elif isinstance(state, torch.Tensor):
        out[prefix] = state.detach().clone()
    elif isinstance(state, dict):
        for key, value in state.items():
            out.update(flat_tensors(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            out.update(flat_tensors(value, f"{prefix}.{i}" if prefix else str(i)))
    return out


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Paths whose tensors differ in shape, dtype or any bit (or exist on one side only); [] if identical."""
    differ = sorted(set(a) ^ set(b))
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        if (
            x.shape != y.shape
            or x.dtype != y.dtype
            or not torch.equal(x.view(-1).view(torch.uint8), y.view(-1).view(torch.uint8))
        ):
            differ.append(key)
    return differ


def quiet_dcp_warnings() -> None:
    """DCP warns on every no-dist save and FileSystemWriter overwrite; the tests look at errors, not those."""
    import warnings

    warnings.filterwarnings("ignore", module=r"torch\.distributed\.checkpoint.*")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
