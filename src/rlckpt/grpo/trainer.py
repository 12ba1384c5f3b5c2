"""The GRPO trainer: a clipped policy-gradient step with AdamW, versioned weights, exact save/load.

Everything is deterministic on CPU: the model and optimizer are built from the seed alone, the
batch order is fixed by ``TrainBatch.from_rows``, and torch runs with ``num_threads`` threads
inside every call (see ``determinism.py``).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import IO, Any

import torch

from rlckpt.errors import TrainerStateError
from rlckpt.grpo.batch import TrainBatch
from rlckpt.grpo.determinism import torch_threads
from rlckpt.grpo.policy import PolicyConfig, build_policy

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
    """Owns the policy and its AdamW optimizer; ``weight_version`` counts completed train steps."""

    def __init__(self, config: GRPOConfig) -> None:
        self.config = config
        self.model = build_policy(config.policy, config.seed)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay, foreach=False
        )
        self.weight_version = 0

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """``epochs_per_step`` full-batch updates of the clipped surrogate; bumps ``weight_version``."""
        cfg = self.config
        metrics: dict[str, float] = {}
        self.model.train()
        with torch_threads(cfg.num_threads):
            for epoch in range(cfg.epochs_per_step):
                log_dist = torch.log_softmax(self.model.completion_logits(batch.prompts, batch.completions), dim=-1)
                new_logprobs = log_dist.gather(-1, batch.completions.unsqueeze(-1)).squeeze(-1)
                ratio = torch.exp(new_logprobs - batch.old_logprobs)
                advantages = batch.advantages.unsqueeze(1)
                clipped = ratio.clamp(1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps)
                loss = -torch.minimum(ratio * advantages, clipped * advantages).mean()
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm, foreach=False)
                self.optimizer.step()
                if epoch == 0:
                    with torch.no_grad():
                        metrics["clip_fraction"] = float(((ratio - 1.0).abs() > cfg.clip_eps).float().mean())
                        metrics["approx_kl"] = float((batch.old_logprobs - new_logprobs).mean())
                        metrics["entropy"] = float(-(log_dist.exp() * log_dist).sum(-1).mean())
                metrics["loss"] = float(loss.detach())
                metrics["grad_norm"] = float(grad_norm)
        self.weight_version += 1
        metrics["mean_reward"] = float(batch.rewards.mean())
        metrics["num_samples"] = float(len(batch))
        metrics["weight_version"] = float(self.weight_version)
        return metrics

    def weights(self) -> dict[str, torch.Tensor]:
        """Detached CPU copies of the policy weights, safe to ship to generation workers."""
        return {name: t.detach().cpu().clone() for name, t in self.model.state_dict().items()}

    def policy_sha256(self) -> str:
        """Digest of the current weights (see ``weights_sha256``)."""
        return weights_sha256(self.model.state_dict())

    def state_dict(self) -> dict[str, Any]:
        """Weights + optimizer + version + config: only tensors and plain Python values."""
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
        """Restore weights, optimizer and version; refuses another format or policy shape."""
        if not isinstance(state, Mapping) or state.get("format") != TRAINER_STATE_FORMAT:
            found = _get(state, "format")
            raise TrainerStateError(f"trainer state {origin} has format {found!r}, expected {TRAINER_STATE_FORMAT}")
        mine = asdict(self.config)
        saved = state.get("config", {})
        if saved.get("policy") != mine["policy"]:
            raise TrainerStateError(
                f"trainer state {origin} is for policy {saved.get('policy')}, this trainer has {mine['policy']}"
            )
        if saved != mine:
            changed = sorted(k for k in mine if saved.get(k) != mine[k])
            log.warning("trainer state %s was saved with different settings %s; resume is not exact", origin, changed)
        try:
            self.model.load_state_dict(state["model"], strict=True)
            self.optimizer.load_state_dict(state["optimizer"])
        except (KeyError, RuntimeError, ValueError) as exc:
            raise TrainerStateError(f"trainer state {origin} does not fit this trainer: {exc}") from exc
        self.weight_version = int(state["weight_version"])


def _describe(source: object) -> str:
    return os.fspath(source) if isinstance(source, (str, os.PathLike)) else type(source).__name__


def _get(state: object, key: str) -> object:
    return state.get(key) if isinstance(state, Mapping) else type(state).__name__
