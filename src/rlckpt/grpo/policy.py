"""A small autoregressive GRU policy over digit tokens, and reproducible group sampling.

Action ids equal digit token ids (0..9), so a sampled action is directly a completion token.
Sampling is seeded per (seed, prompt_id, sample_index, weight_version) through a stable hash:
a sample's tokens do not depend on which process generates it or in which order.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from torch import nn

from rlckpt.grpo.task import NUM_DIGITS, DigitSumTask, Prompt


@dataclass(frozen=True)
class PolicyConfig:
    """Shape of the policy; the defaults fit ``DigitSumTask()`` with its default settings."""

    vocab_size: int = 48
    completion_length: int = 4
    num_actions: int = NUM_DIGITS
    embed_dim: int = 32
    hidden_dim: int = 64

    @classmethod
    def for_task(cls, task: DigitSumTask, **overrides: int) -> PolicyConfig:
        """A config whose vocabulary and completion length match ``task``."""
        return cls(vocab_size=task.vocab_size, completion_length=task.completion_length, **overrides)


class DigitPolicy(nn.Module):
    """Embedding -> one-layer GRU -> linear head over the digit actions."""

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.embed_dim)
        self.gru = nn.GRU(config.embed_dim, config.hidden_dim, batch_first=True)
        self.head = nn.Linear(config.hidden_dim, config.num_actions)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Action logits [N, T, A] for every position of ``tokens`` [N, T], and the final hidden state."""
        out, hidden = self.gru(self.embed(tokens), hidden)
        return self.head(out), hidden

    def completion_logits(self, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
        """Logits [N, L, A] that predicted each completion token, teacher-forced in one pass."""
        inputs = torch.cat([prompts, completions[:, :-1]], dim=1)
        logits, _ = self(inputs)
        return logits[:, prompts.shape[1] - 1 :, :]


def build_policy(config: PolicyConfig, seed: int) -> DigitPolicy:
    """A freshly initialised policy whose weights depend only on ``config`` and ``seed``.

    The global RNG is forked, so building a policy never disturbs anyone else's random stream.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return DigitPolicy(config)


def num_parameters(model: nn.Module) -> int:
    """Total number of scalar parameters."""
    return sum(p.numel() for p in model.parameters())


def sample_seed(seed: int, prompt_id: int, sample_index: int, weight_version: int) -> int:
    """A stable 63-bit generator seed for one sample (same on every machine and Python run)."""
    key = f"grpo-sample:{seed}:{prompt_id}:{sample_index}:{weight_version}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & (2**63 - 1)


def _sample_uniforms(length: int, prompt_id: int, group_size: int, seed: int, weight_version: int) -> torch.Tensor:
    rows = []
    for index in range(group_size):
        generator = torch.Generator().manual_seed(sample_seed(seed, prompt_id, index, weight_version))
        rows.append(torch.rand(length, generator=generator, dtype=torch.float64))
    return torch.stack(rows)


@torch.no_grad()
def sample_group(
    model: DigitPolicy, prompt: Prompt, group_size: int, *, seed: int, weight_version: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``group_size`` completions for one prompt.

    Returns ``(completions int64 [G, L], logprobs float32 [G, L])``; logprobs are those of the
    sampled tokens under ``model``. Each sample draws its own uniforms from its own seeded
    generator and picks a token by inverse CDF, so sample i is the same whatever G is.
    """
    length = model.config.completion_length
    uniforms = _sample_uniforms(length, prompt.prompt_id, group_size, seed, weight_version)
    tokens = torch.tensor([prompt.tokens] * group_size, dtype=torch.int64)
    logits, hidden = model(tokens)
    last = logits[:, -1, :]
    completions = torch.empty(group_size, length, dtype=torch.int64)
    logprobs = torch.empty(group_size, length, dtype=torch.float32)
    for t in range(length):
        log_dist = torch.log_softmax(last.double(), dim=-1)
        cdf = log_dist.exp().cumsum(dim=-1)
        action = torch.searchsorted(cdf, uniforms[:, t : t + 1].contiguous(), right=True)
        action = action.clamp(max=model.config.num_actions - 1)
        completions[:, t] = action[:, 0]
        logprobs[:, t] = log_dist.gather(1, action)[:, 0].float()
        logits, hidden = model(action, hidden)
        last = logits[:, -1, :]
    return completions, logprobs
