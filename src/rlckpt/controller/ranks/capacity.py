"""What each trainer rank asks Ray for, and whether the cluster can hold the ranks a run asks for.

Checked right after the driver starts or joins the cluster, before any actor exists: a rank count or a
resource the cluster cannot satisfy is refused in seconds, naming the flag, instead of Ray starting every
rank process of `--trainer-ranks 100000` at once (ranks asked for nothing) or leaving ranks pending on a
resource no node offers until the 180 s rank timeout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rlckpt.errors import ClusterConfigError

# Ray's memory resource (bytes) each trainer rank asks for: what one rank process of the tiny policy holds
# (Ray worker + torch + the sharded trainer: 366 MiB RSS measured with 2 ranks), rounded up. Ranks ask for
# no CPUs: on the private cluster Ray's CPU count is a scheduling label that TransferQueue's actors use
# (docs/dataplane.md), and a rank of the tiny policy is mostly idle.
RANK_MEMORY_BYTES = 512 << 20

# Resources Ray sets through their own options (num_cpus=, memory=, ...); Ray refuses them as custom resources.
_RAY_OWN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
# Ray counts resources in units of 1/10 000; a smaller non-zero amount cannot be asked for.
_RAY_RESOURCE_UNIT = 1e-4
# How many of the resources the cluster offers a refusal lists.
_LISTED_RESOURCES = 12


def check_rank_resources(resources: Mapping[Any, Any]) -> dict[str, float]:
    """The custom resources every rank asks for (``--trainer-resources``) as floats.

    Raises:
        ClusterConfigError: naming the first entry Ray could not take: a name that is Ray's own resource
            (CPU, GPU, memory), an amount that is not a finite number >= 0, or one finer than Ray counts.
    """
    checked: dict[str, float] = {}
    for name, amount in resources.items():
        if not isinstance(name, str) or not name:
            raise ClusterConfigError(f"resource name {name!r} is not a non-empty string")
        if name in _RAY_OWN_RESOURCES:
            raise ClusterConfigError(
                f"{name!r} is Ray's own resource, not a custom one (each rank asks for "
                f"{_amount('memory', RANK_MEMORY_BYTES)} of memory and no CPUs)"
            )
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) or amount < 0:
            raise ClusterConfigError(f"{name!r}: {amount!r} is not an amount (a finite number >= 0)")
        if 0 < amount < _RAY_RESOURCE_UNIT:
            raise ClusterConfigError(f"{name!r}: {amount!r} is finer than Ray counts ({_RAY_RESOURCE_UNIT:g})")
        checked[name] = float(amount)
    return checked


def rank_request(resources: Mapping[str, float] | None) -> dict[str, float]:
    """Everything one rank asks Ray for: its memory and the custom ``resources``."""
    return {"memory": float(RANK_MEMORY_BYTES), **(resources or {})}


def ranks_that_fit(nodes: Sequence[Mapping[str, float]], request: Mapping[str, float]) -> int:
    """How many ranks asking ``request`` each the ``nodes`` (each node's total resources) hold at once."""
    asked = {name: amount for name, amount in request.items() if amount > 0}
    if not asked:
        raise ClusterConfigError("a trainer rank must ask Ray for something, or nothing bounds how many start")
    # a rank does not span nodes: each node holds as many as its scarcest resource allows
    return sum(min(math.floor(node.get(name, 0.0) / amount + 1e-9) for name, amount in asked.items()) for node in nodes)


def check_capacity(nodes: Sequence[Mapping[str, float]], ranks: int, resources: Mapping[str, float] | None) -> None:
    """ClusterConfigError unless ``nodes`` (each node's total resources) hold ``ranks`` trainer ranks.

    A resource no node offers, or no node offers enough of for one rank, is named as such (it comes from
    ``--trainer-resources``); otherwise the message says how many ranks fit and what each asks for.
    """
    request = rank_request(resources)
    for name, amount in request.items():
        most = max((node.get(name, 0.0) for node in nodes), default=0.0)
        if amount > 0 and most <= 0:
            offered = sorted({r for node in nodes for r in node if ":" not in r})  # not Ray's node:<ip> labels
            listed = ", ".join(offered[:_LISTED_RESOURCES]) + (", …" if len(offered) > _LISTED_RESOURCES else "")
            raise ClusterConfigError(
                f"--trainer-resources asks for {name!r}, which no node of the Ray cluster offers (they offer: {listed})"
            )
        if amount > most:
            raise ClusterConfigError(
                f"each trainer rank asks for {_amount(name, amount)} {name!r}, and no node of the Ray cluster has "
                f"more than {_amount(name, most)}"
            )
    fit = ranks_that_fit(nodes, request)
    if fit < ranks:
        asked = ", ".join(f"{_amount(name, amount)} {name}" for name, amount in request.items() if amount > 0)
        raise ClusterConfigError(
            f"--trainer-ranks {ranks}: the Ray cluster ({len(nodes)} node{'s' if len(nodes) != 1 else ''}) holds at "
            f"most {fit} trainer ranks, each asking for {asked}"
        )


def check_cluster(ranks: int, resources: Mapping[str, float] | None) -> None:
    """``check_capacity`` on the alive nodes of the Ray cluster this process is connected to."""
    import ray

    nodes = [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]
    check_capacity(nodes, ranks, resources)


def _amount(name: str, amount: float) -> str:
    if name in ("memory", "object_store_memory"):
        return f"{amount / (1 << 30):.1f} GiB" if amount >= 1 << 30 else f"{amount / (1 << 20):.0f} MiB"
    return f"{amount:g}"
