"""A small transformer trained with FSDP2 under torchrun, checkpointed by rlckpt's Checkpointer.

    torchrun --standalone --nproc-per-node 2 examples/fsdp2_torchrun.py --run-dir /tmp/run1 --steps 4 --save-every 2
    torchrun --standalone --nproc-per-node 2 examples/fsdp2_torchrun.py --run-dir /tmp/run1 --steps 6   # resumes at 4

The run to 6 in two parts ends with the same weights, bit for bit, as one run straight to 6 (`--json` prints
their digest): every save holds the sharded model and AdamW state (DCP, one participant per rank), the data
loader's position (a piece saved once) and each rank's RNG state (its own piece), as one bundle that commits
only when every rank's part is in place. SIGTERM to the torchrun job (torchrun forwards it to every worker)
saves the step the ranks reached — all of them the same step — and exits. `--steps` is the total across
resumes. Storage, tier and key flags are `rlckpt train`'s (`--storage-options`, `--keep-last`,
`--replicate-to`, `--signing-key`, ...): see `--help` and docs/trainer.md.

CPU only (gloo), a model built in code (random init, no download), a synthetic next-token task.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import logging
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from rlckpt import Checkpointer, Restored, SaveAndStop
from rlckpt.cli.checkpointer_args import add_checkpointer_arguments, config_from_args, stop_settings

VOCAB, WIDTH, HEADS, LAYERS, SEQ = 32, 32, 4, 2, 16
log = logging.getLogger("fsdp2_torchrun")


class TinyTransformer(nn.Module):
    """Token embedding, a learned position embedding, LAYERS causal encoder layers (with dropout: the RNG
    state matters for exact resume) and a head over the vocabulary."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.zeros(SEQ, WIDTH))
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(WIDTH, HEADS, 2 * WIDTH, dropout=0.1, batch_first=True) for _ in range(LAYERS)
        )
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        hidden = self.embed(tokens) + self.position[: tokens.shape[1]]
        for layer in self.layers:
            hidden = layer(hidden, src_mask=mask, is_causal=True)
        return self.head(hidden)


class SyntheticLoader:
    """Sequences of an arithmetic pattern (start + stride·i mod VOCAB), drawn in a shuffled order per epoch.
    The whole job draws one global batch per step; each rank trains on its slice. Its position is its state."""

    def __init__(self, size: int, batch: int, seed: int) -> None:
        self.size, self.batch, self.seed = size, batch, seed
        self.epoch, self.position = 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def next_batch(self) -> torch.Tensor:
        if self.position + self.batch > self.size:
            self.epoch, self.position = self.epoch + 1, 0
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        indexes = order[self.position : self.position + self.batch]
        self.position += self.batch
        return torch.stack([self._sample(int(i)) for i in indexes])

    def _sample(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        start, stride = torch.randint(0, VOCAB, (2,), generator=g).tolist()
        return (start + (stride + 1) * torch.arange(SEQ + 1)) % VOCAB


class TrainState(Stateful):
    """The model and its optimizer as DCP saves them: each rank's shards (FSDP2 DTensors)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optimizer}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def weights_digest(model: nn.Module) -> str:
    """sha256 of the full (unsharded) weights, the same on every rank and at any world size (a collective)."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    digest = hashlib.sha256()
    for name in sorted(full):
        tensor = full[name].detach().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, metavar="URL", help="a local path or s3://bucket/prefix")
    parser.add_argument("--steps", type=int, default=6, help="train until this many steps are done (default 6)")
    parser.add_argument("--save-every", type=int, default=2, help="save every K steps and at the last (default 2)")
    parser.add_argument("--global-batch", type=int, default=8, help="sequences per step, over all ranks (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="rank 0 prints one JSON line: step, digest, ...")
    add_checkpointer_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train, then tear the process group down on every path: exit 0 when training finished or stopped as asked,
    1 after an exception (logged with its traceback) — the save it had staged finished first (`with Checkpointer`)."""
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    torch.set_num_threads(1)  # bit-exact on CPU needs the same thread count every run; 2 ranks share 2 cores
    dist.init_process_group("gloo")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    summary, code = None, 0
    try:
        summary = train(args)
    except Exception:
        log.exception("rank %d: training failed", dist.get_rank())
        code = 1
    finally:
        dist.destroy_process_group()
        # Free what still holds a process group (FSDP's modules keep theirs in reference cycles, and so does a
        # traceback) now, while the interpreter is alive: a gloo group first freed at its exit aborts the
        # process now and then, its worker thread dropping a tensor after Python has stopped ("terminate called
        # without an active exception", pytorch/pytorch#190489).
        gc.collect()
    if summary is not None:
        print(json.dumps(summary, sort_keys=True) if args.json else f"done: {summary}", flush=True)
    return code


def train(args: argparse.Namespace) -> dict[str, Any] | None:
    """Train to `args.steps` from the newest bundle, saving as asked; rank 0's summary (None on the others).

    The Checkpointer is closed by its `with` block on every path, before `main` destroys the process group:
    on an exception the save already staged is finished first (bounded by the group timeout), so a step
    saved before a crash is there to resume from."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))

    torch.manual_seed(args.seed)  # the same initial weights on every rank, before sharding
    model = TinyTransformer()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    loader = SyntheticLoader(size=64, batch=args.global_batch, seed=args.seed)
    train_state = TrainState(model, optimizer)
    torch.manual_seed(args.seed + 1 + rank)  # each rank's dropout stream

    with Checkpointer(config_from_args(args, args.run_dir)) as ckpt:
        stop = SaveAndStop(ckpt, **stop_settings(args))
        stop.install()
        try:
            restored = ckpt.restore({"train": train_state})
            start = resume(restored, loader, args.seed, rank)
            step = train_steps(args, ckpt, stop, model, optimizer, loader, train_state, start)
        finally:
            stop.uninstall()
    digest = weights_digest(model)
    if rank != 0:
        return None
    return {
        "step": step,
        "weights_sha256": digest,
        "restored_from": restored.step if restored else None,
        "stop_reason": stop.reason or "completed",
        "last_committed_step": ckpt.committed_step,
        "world_size": world,
        "replicated": ckpt.replicated,
    }


def resume(restored: Restored | None, loader: SyntheticLoader, seed: int, rank: int) -> int:
    """Put the loader and this rank's RNG where the restored bundle left them; the step to go on from."""
    if restored is None:
        return 0
    loader.load_state_dict(restored.extra["loader"])
    if restored.rank_extra is not None:  # saved at this world size: this rank's own dropout stream
        torch.set_rng_state(restored.rank_extra["rng"])
    else:
        torch.manual_seed(seed + 1 + rank + 1000 * restored.step)
    log.info("rank %d: resumed at step %d from %s", rank, restored.step, restored.url)
    return restored.step


def train_steps(
    args: argparse.Namespace,
    ckpt: Checkpointer,
    stop: SaveAndStop,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: SyntheticLoader,
    train_state: TrainState,
    step: int,
) -> int:
    """Train from `step` until `args.steps` or a stop, saving every `args.save_every` steps; the step reached."""
    rank, world = dist.get_rank(), dist.get_world_size()
    while step < args.steps:
        batch = loader.next_batch()
        mine = batch[rank * len(batch) // world : (rank + 1) * len(batch) // world]
        logits = model(mine[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), mine[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", file=sys.stderr, flush=True)
        stopping = stop.should_stop()  # the same answer on every rank
        if stopping or step % args.save_every == 0 or step == args.steps:
            ckpt.save(
                step,
                {"train": train_state},
                extra={"loader": loader.state_dict()},
                rank_extra={"rng": torch.get_rng_state()},
                metrics={"loss": float(loss.item())},
                last=stopping or step == args.steps,
            )
        if stopping:
            ckpt.wait(timeout=stop.grace_left())  # SaveTimeoutError when the grace period runs out first
            break
    return step


if __name__ == "__main__":
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    sys.exit(main())
