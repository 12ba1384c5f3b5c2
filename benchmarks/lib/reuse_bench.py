"""The ranks of `python -m benchmarks.reuse`: a sharded bf16 policy whose first three quarters of layers are frozen
(so, with AdamW's moments of the trained quarter, half the state's bytes do not change between saves), saved again
and again by rlckpt with reuse off (a full save) and on, one system after the other in the same processes; each
saved state is loaded back and checked bitwise after the last save."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

MiB = 1 << 20
DEPTH = 8
FROZEN_LAYERS = 6  # of DEPTH: frozen 6/8 P, trained 2/8 P + moments 4/8 P: half the state is frozen
FULL, REUSE = "rlckpt", "rlckpt-reuse"
SYSTEMS = (FULL, REUSE)


@dataclass(frozen=True)
class ReuseDestination:
    name: str
    kind: str  # "local" or "s3"
    run_urls: dict[str, str]  # system -> a fresh run
    storage_options: dict[str, Any] | None
    reclaim_command: str | None = None  # run (untimed) after each removal: RGW frees deleted objects then


@dataclass(frozen=True)
class ReuseJob:
    destinations: list[ReuseDestination]
    size_mib: float
    saves: int  # timed saves per system after the first (untimed: the run's first save writes everything)
    out_path: str
    thread_count: int = 1


@dataclass
class SaveRecord:
    destination: str
    kind: str
    ranks: int
    system: str
    save: int
    seconds: float  # the slowest rank's dcp.save
    state_bytes: int
    stored_bytes: int  # the bundle's files
    taken_bytes: int  # of those, in files equal to the previous bundle's (taken from it with reuse on)
    cpu_s: float  # every rank's process, user + system
    verified: bool | None = None  # the last save of each system, loaded back bitwise
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def written_bytes(self) -> int:
        return self.stored_bytes - self.taken_bytes if self.system == REUSE else self.stored_bytes


def width_for(size_mib: float) -> int:
    """MLP width whose bf16 state (all weights; moments of the trained layers) comes to about `size_mib`."""
    per_weight = size_mib * MiB / (DEPTH + 2 * (DEPTH - FROZEN_LAYERS)) / 2
    return max(64, int(round(per_weight**0.5 / 64)) * 64)


def half_frozen_policy(mesh: Any, width: int) -> tuple[Any, Any]:
    """An MLP of DEPTH bf16 layers drawn like trained weights (normal, std 0.02), sharded with FSDP2; its first
    FROZEN_LAYERS layers frozen, AdamW over the rest."""
    import torch
    from torch.distributed.fsdp import fully_shard

    from support.dcp_ranks import mlp

    model = mlp(width, DEPTH, 0)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02, generator=generator)
    model = model.to(torch.bfloat16)
    linears = [layer for layer in model if isinstance(layer, torch.nn.Linear)]
    for layer in linears[:FROZEN_LAYERS]:
        for param in layer.parameters():
            param.requires_grad_(False)
    for layer in linears:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    return model, optim


def train(model: Any, optim: Any, width: int, seed: int) -> None:
    """One real AdamW step on gradients drawn from `seed` for the trained layers (the frozen ones have none): every
    trained weight and moment changes at every save, as in a run, which a toy loss would not guarantee (its
    ReLUs die, its gradients go to zero and bf16 rounds the shrinking updates away)."""
    import torch
    from torch.distributed.tensor import DTensor

    generator = torch.Generator().manual_seed(seed)
    for param in (p for p in model.parameters() if p.requires_grad):
        local = param.to_local() if isinstance(param, DTensor) else param
        grad = (torch.randn(local.shape, generator=generator) * 0.01).to(local.dtype)
        param.grad = (
            DTensor.from_local(grad, param.device_mesh, param.placements) if isinstance(param, DTensor) else grad
        )
    optim.step()
    optim.zero_grad()


def _taken(store: Any, step: int) -> int:
    """Bytes of bundle `step` in files whose entries are those of the committed bundle before it."""
    entry = next(e for e in store.entries() if e.step == step)
    return int(entry.unchanged or 0)


def reuse_rank(rank: int, world_size: int, port: int, job: ReuseJob) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from benchmarks.lib.policy import _reclaim, _zero  # the policy benchmark's: a reclaim is logged, never raised
    from rlckpt.dcp import BundleStorageReader
    from rlckpt.store import BundleStore
    from support.dcp_ranks import bitwise_equal, flat_tensors, policy_state, process_group, quiet_dcp_warnings

    quiet_dcp_warnings()
    records: list[dict[str, Any]] = []
    width = width_for(job.size_mib)
    with process_group(rank, world_size, port) as mesh:
        model, optim = half_frozen_policy(mesh, width)
        train(model, optim, width, seed=0)
        state_bytes = torch.tensor(
            [sum(t.numel() * t.element_size() for t in flat_tensors(policy_state(model, optim)).values())]
        )
        dist.all_reduce(state_bytes)
        for dest in job.destinations:
            stores = {s: BundleStore(dest.run_urls[s], dest.storage_options) for s in SYSTEMS}
            step = 0

            def save(system: str, step: int, stores: dict[str, Any] = stores) -> tuple[float, float]:
                return _timed_save(stores[system], step, system == REUSE, model, optim, job.thread_count)

            step += 1
            for system in SYSTEMS:  # untimed: imports, clients, and the reusing run's first (full) bundle
                save(system, step)
            expected: dict[str, Any] = {}
            for n in range(1, job.saves + 1):
                step += 1
                train(model, optim, width, seed=step)  # the trained quarter and its moments change
                order = SYSTEMS if n % 2 else SYSTEMS[::-1]
                for system in order:
                    seconds, cpu_s = save(system, step)
                    if rank == 0:
                        store = stores[system]
                        record = SaveRecord(
                            dest.name,
                            dest.kind,
                            world_size,
                            system,
                            n,
                            seconds,
                            int(state_bytes.item()),
                            store.open(step).manifest.total_size,
                            _taken(store, step),
                            cpu_s,
                        )
                        records.append(asdict(record))
                        print(
                            f"  {dest.name:<10} {world_size} ranks {system:<13} save {n}: {seconds:6.2f} s, "
                            f"{record.written_bytes / MiB:8.1f} MiB written of {record.stored_bytes / MiB:8.1f}",
                            flush=True,
                        )
                        store.gc(keep_last=1)  # the reusing run keeps its base: the bundle just saved
                        if dest.reclaim_command:
                            _reclaim(dest.reclaim_command)
                    dist.barrier()
                expected = {k: v.clone() for k, v in flat_tensors(policy_state(model, optim)).items()}
            for system in SYSTEMS:  # the last save of each system, loaded into a zeroed state, bit for bit
                into = policy_state(model, optim)  # the live tensors: zeroed, then loaded into
                _zero(into)
                dcp.load(into, storage_reader=BundleStorageReader(stores[system], step=step))
                bad = torch.tensor([0 if bitwise_equal(flat_tensors(into), expected) == [] else 1])
                dist.all_reduce(bad)
                for done in records:
                    if (done["destination"], done["system"], done["save"]) == (dest.name, system, job.saves):
                        done["verified"] = bad.item() == 0
    if rank == 0:
        with open(job.out_path, "w") as out:
            json.dump(records, out)


def _timed_save(store: Any, step: int, reuse: bool, model: Any, optim: Any, thread_count: int) -> tuple[float, float]:
    """One `dcp.save` of the policy as bundle `step`: (the slowest rank's seconds, every rank's CPU seconds)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from rlckpt.dcp import BundleStorageWriter
    from support.dcp_ranks import policy_state

    writer = BundleStorageWriter(store, step=step, reuse=reuse, thread_count=thread_count)
    dist.barrier()
    cpu, started = time.process_time(), time.perf_counter()
    dcp.save(policy_state(model, optim), storage_writer=writer)
    seconds = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
    cpu_s = torch.tensor([time.process_time() - cpu], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    dist.all_reduce(cpu_s)
    return float(seconds.item()), float(cpu_s.item())
