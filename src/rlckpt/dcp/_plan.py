"""What rides DCP's own plan machinery between the ranks of one save, so rlckpt needs no collective of its
own: the coordinator's transaction goes out with the global plan (SavePlan.storage_data), each rank's
receipt comes back with its write results (an extra WriteResult, stripped before `.metadata` is written),
and on load each rank's bundle comes in with its local plan (LoadPlan.storage_data)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.storage import WriteResult

from rlckpt.store import Receipt

# The fqn of a WriteResult that carries a receipt. No state dict key starts with it; finish() strips
# every such result before the storage records become `.metadata`.
RECEIPT_FQN = "__rlckpt_receipt__"


@dataclass(frozen=True)
class RankPlan:
    """SavePlan.storage_data of one rank: DCP's file prefix (`__{rank}_`), the participant name it writes
    as, and — standalone — the transaction the coordinator began (step, txid; no storage options, so no
    credentials go over the process group) and the bundle it may take unchanged files from (its base)."""

    prefix: str
    participant: str
    step: int | None = None
    txid: str | None = None
    base_step: int | None = None
    base_txid: str | None = None


@dataclass(frozen=True)
class BundleRef:
    """LoadPlan.storage_data of one rank: the bundle its reader opened."""

    url: str
    step: int
    txid: str


def receipt_result(receipt: Receipt) -> WriteResult:
    """A WriteResult that carries `receipt` (as plain JSON data) to the coordinator's finish()."""
    return WriteResult(
        index=MetadataIndex(f"{RECEIPT_FQN}/{receipt.participant}"), size_in_bytes=0, storage_data=receipt.to_json()
    )


def split_receipts(results: Sequence[Sequence[WriteResult]]) -> tuple[list[WriteResult], list[Receipt]]:
    """Every rank's results as DCP's storage records, and the receipts that rode along."""
    records: list[WriteResult] = []
    receipts: list[Receipt] = []
    for rank_results in results:
        for result in rank_results:
            if result.index.fqn.startswith(RECEIPT_FQN + "/"):
                receipts.append(Receipt.from_json(result.storage_data))
            else:
                records.append(result)
    return records, receipts
