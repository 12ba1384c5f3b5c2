"""The GRPO trainer: a clipped policy-gradient step with AdamW, versioned weights, exact save/load.

Everything is deterministic on CPU: the model and optimizer are built from the seed alone, the
batch order is fixed by ``TrainBatch.from_rows``, and torch runs with ``num_threads`` threads
inside every call (see ``determinism.py``). Data-parallel over a trainer group with FSDP2
(``sharding.py``): at a fixed world size the same batches give bit-identical weights; at another
world size only the order of float additions in the gradient and metric sums differs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import IO, Any

import torch

from rlckpt.errors import TrainerStateError
from rlckpt.formats import load_json
from rlckpt.grpo.batch import TrainBatch
from rlckpt.grpo.determinism import torch_threads
from rlckpt.grpo.policy import PolicyConfig, build_policy
from rlckpt.grpo.sharding import DataParallel, rank_rows, shard_policy, sum_over_ranks

log = logging.getLogger(__name__)

TRAINER_STATE_FORMAT = 1


@dataclass(frozen=True)
class GRPOConfig:
    """Hyper-parameters of the whole tiny GRPO (trainer and generation share it)."""

    seed: int = 0
    lr: float = 1e-2
    weight_decay: float = 0.0
    clip_eps: float = 0.2
    epochs_per_step: int = 2
    max_grad_norm: float = 1.0
    group_size: int = 8
    prompts_per_step: int = 8
    num_threads: int = 1
    policy: PolicyConfig = field(default_factory=PolicyConfig)


def weights_sha256(weights: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over sorted names, dtype, shape and raw bytes: equal iff the weights are bit-identical."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        tensor = weights[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class Trainer:
    """Owns the policy and its AdamW optimizer; ``weight_version`` counts completed train steps.

    Without ``parallel`` the policy is a plain module in this process (world size 1, no process
    group). With it, the policy is sharded with FSDP2 over the trainer group and every method below
    that touches the weights is a collective: all ranks must call it, in the same order.
    """

    def __init__(self, config: GRPOConfig, parallel: DataParallel | None = None) -> None:
        self.config = config
        self.parallel = parallel
        self.model = build_policy(config.policy, config.seed)  # the same full weights on every rank...
        if parallel is not None:
            shard_policy(self.model, parallel)  # ...of which each rank keeps its shard
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay, foreach=False
        )
        self.weight_version = 0

    @property
    def rank(self) -> int:
        return 0 if self.parallel is None else self.parallel.rank

    @property
    def world_size(self) -> int:
        return 1 if self.parallel is None else self.parallel.world_size

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """``epochs_per_step`` full-batch updates of the clipped surrogate; bumps ``weight_version``.

        Each rank computes the loss of its rows (``rank_rows``) as their sum over the element count
        of the *whole* batch; FSDP sums the gradients, so they are the whole batch's mean's. Metrics
        are summed over the ranks the same way and are those of the whole batch on every rank.
        """
        cfg = self.config
        rows = rank_rows(len(batch), self.rank, self.world_size)
        prompts, completions = batch.prompts[rows], batch.completions[rows]
        old_logprobs, advantages = batch.old_logprobs[rows], batch.advantages[rows].unsqueeze(1)
        count = float(batch.completions.numel())  # elements of the whole batch: the mean's denominator
        sums = torch.zeros(4, dtype=torch.float64)  # clip count, kl sum, entropy sum (epoch 0), last loss
        grad_norm = torch.zeros(())
        self.model.train()
        with torch_threads(cfg.num_threads):
            for epoch in range(cfg.epochs_per_step):
                log_dist = torch.log_softmax(self.model.completion_logits(prompts, completions), dim=-1)
                new_logprobs = log_dist.gather(-1, completions.unsqueeze(-1)).squeeze(-1)
                ratio = torch.exp(new_logprobs - old_logprobs)
                clipped = ratio.clamp(1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps)
                loss = -torch.minimum(ratio * advantages, clipped * advantages).sum() / count
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm, foreach=False)
                self.optimizer.step()
                with torch.no_grad():
                    if epoch == 0:
                        sums[0] = ((ratio - 1.0).abs() > cfg.clip_eps).double().sum()
                        sums[1] = (old_logprobs - new_logprobs).double().sum()
                        sums[2] = (-(log_dist.exp() * log_dist).sum(-1)).double().sum()
                    sums[3] = loss.detach().double()
            totals = sum_over_ranks(sums, self.parallel)
        self.weight_version += 1
        return {
            "clip_fraction": float(totals[0]) / count,
            "approx_kl": float(totals[1]) / count,
            "entropy": float(totals[2]) / count,
            "loss": float(totals[3]),
            "grad_norm": float(_full(grad_norm)),
            "mean_reward": float(batch.rewards.mean()),
            "num_samples": float(len(batch)),
            "weight_version": float(self.weight_version),
        }

    def weights(self) -> dict[str, torch.Tensor]:
        """Detached CPU copies of the full (unsharded) policy weights, safe to ship to generation workers.

        Sharded: an all-gather; every rank gets the full weights.
        """
        if self.parallel is None:
            state = self.model.state_dict()
        else:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        return {name: _full(t).detach().cpu().clone() for name, t in state.items()}

    def policy_sha256(self) -> str:
        """Digest of the full weights (see ``weights_sha256``): the same at any world size."""
        return weights_sha256(self.weights())

    # --- sharded checkpoints (torch.distributed.checkpoint) -------------------------------------

    def checkpoint_state(self) -> dict[str, Any]:
        """What a DCP save writes: model and AdamW state (this rank's shards) and the trainer record.

        The tensors are the live ones: stage a copy (``dcp.async_save`` does) before training on.
        """
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        record = {"format": TRAINER_STATE_FORMAT, "weight_version": self.weight_version, "config": asdict(self.config)}
        return {"model": model_state, "optim": optim_state, "trainer": json.dumps(record, sort_keys=True)}

    def load_checkpoint(self, storage_reader: Any, *, process_group: Any = None, origin: str = "<dcp>") -> None:
        """Load a DCP checkpoint written by any world size into this trainer (DCP reshards).

        Raises:
            TrainerStateError: the trainer record is of another format or policy, or the tensors do not fit.
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self.checkpoint_state()
        try:
            dcp.load(state, storage_reader=storage_reader, process_group=process_group)
            record = load_json(state["trainer"], "the trainer record")
        except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
            raise TrainerStateError(
                f"trainer state {origin} does not load into this trainer: {checkpoint_failure(exc)}"
            ) from exc
        self._check_record(record, origin)
        try:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        except (KeyError, RuntimeError, ValueError) as exc:
            raise TrainerStateError(f"trainer state {origin} does not fit this trainer: {exc}") from exc
        self.weight_version = int(record["weight_version"])

    def _check_record(self, record: Mapping[str, Any], origin: str) -> None:
        """Refuse another format or policy shape; warn (resume not exact) on other settings."""
        if not isinstance(record, Mapping) or record.get("format") != TRAINER_STATE_FORMAT:
            found = _get(record, "format")
            raise TrainerStateError(f"trainer state {origin} has format {found!r}, expected {TRAINER_STATE_FORMAT}")
        mine = asdict(self.config)
        saved = record.get("config", {})
        if saved.get("policy") != mine["policy"]:
            raise TrainerStateError(
                f"trainer state {origin} is for policy {saved.get('policy')}, this trainer has {mine['policy']}"
            )
        if saved != mine:
            changed = sorted(k for k in mine if saved.get(k) != mine[k])
            log.warning("trainer state %s was saved with different settings %s; resume is not exact", origin, changed)

    # --- one-file state: the whole (unsharded) trainer state ------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Weights + optimizer + version + config: only tensors and plain Python values (unsharded only)."""
        self._require_unsharded("state_dict")
        return {
            "format": TRAINER_STATE_FORMAT,
            "weight_version": self.weight_version,
            "config": asdict(self.config),
            "model": self.weights(),
            "optimizer": self.optimizer.state_dict(),
        }

    def save_state(self, target: str | os.PathLike[str] | IO[bytes]) -> None:
        """``torch.save`` the state to a path or a binary file object."""
        torch.save(self.state_dict(), target)

    def load_state(self, source: str | os.PathLike[str] | IO[bytes]) -> None:
        """Load a state written by ``save_state`` with ``torch.load(weights_only=True)``."""
        try:
            state = torch.load(source, map_location="cpu", weights_only=True)
        except Exception as exc:  # unpickling errors have many types; all mean "not loadable"
            raise TrainerStateError(f"trainer state {_describe(source)} cannot be read: {exc}") from exc
        self.load_state_dict(state, origin=_describe(source))

    def load_state_dict(self, state: Mapping[str, Any], origin: str = "<dict>") -> None:
        """Restore weights, optimizer and version from a whole state (``state_dict``'s), at any world size:
        sharded, every rank passes the whole state (a collective) and keeps its shard of each tensor.
        Refuses another format or policy shape."""
        self._check_record(state, origin)
        try:
            if self.parallel is None:
                self.model.load_state_dict(state["model"], strict=True)
                self.optimizer.load_state_dict(state["optimizer"])
            else:
                self._load_whole_into_shards(state["model"], state["optimizer"])
        except (KeyError, IndexError, RuntimeError, ValueError) as exc:
            raise TrainerStateError(f"trainer state {origin} does not fit this trainer: {exc}") from exc
        self.weight_version = int(state["weight_version"])

    def _load_whole_into_shards(self, model_state: Mapping[str, Any], optim_state: Mapping[str, Any]) -> None:
        """Full tensors in, this rank's shards kept (torch's ``set_state_dict`` with ``full_state_dict``).
        The optimizer's state names its parameters by their place in ``parameters()``; torch wants names."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        names = [name for name, _ in self.model.named_parameters()]
        groups = optim_state["param_groups"]
        if sorted(i for group in groups for i in group["params"]) != list(range(len(names))):
            raise ValueError(f"the optimizer state covers parameters {[g['params'] for g in groups]}, not {len(names)}")
        by_name: dict[str, Any] = {
            "state": {names[int(i)]: value for i, value in optim_state["state"].items()},
            "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in groups],
        }
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=dict(model_state),
            optim_state_dict=by_name,
            options=StateDictOptions(full_state_dict=True),
        )

    def _require_unsharded(self, what: str) -> None:
        if self.parallel is not None:
            raise TrainerStateError(
                f"Trainer.{what} holds the whole state in one file; a sharded trainer (rank {self.rank} of "
                f"{self.world_size}) saves with checkpoint_state() and dcp.save"
            )


def checkpoint_failure(exc: BaseException) -> str:
    """One line per rank for DCP's CheckpointException (its ``failures``: rank -> (exception, traceback))."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        causes = [(rank, f[0] if isinstance(f, tuple) else f) for rank, f in sorted(failures.items())]
        return "; ".join(f"rank {rank}: {type(cause).__name__}: {cause}" for rank, cause in causes)
    return f"{type(exc).__name__}: {exc}"


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective), any other tensor as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _describe(source: object) -> str:
    return os.fspath(source) if isinstance(source, (str, os.PathLike)) else type(source).__name__


def _get(state: object, key: str) -> object:
    return state.get(key) if isinstance(state, Mapping) else type(state).__name__
