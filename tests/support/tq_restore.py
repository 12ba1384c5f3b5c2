"""Subprocess entry point: restore a TQ snapshot into a brand-new local Ray cluster and report.

``python -m support.tq_restore SNAPSHOT PARTITION OUT [--replay-state FILE]`` starts its
own Ray (``address="local"``) and a bootstrap TransferQueue, loads the snapshot, reads back every
row of PARTITION, optionally loads the replay index with the digest from the snapshot metadata
and checks the inventory, then writes a torch.save report to OUT and shuts everything down.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from rlckpt.dataplane.ray_cluster import start_local_ray, stop_local_ray


async def _restore(args: argparse.Namespace) -> dict[str, Any]:
    from rlckpt.dataplane.tq_client import TransferQueueClient
    from rlckpt.errors import RestoreRefusedError
    from rlckpt.replay import DataPlaneCheckpointBarrier, ReplayBuffer

    trainer_client = TransferQueueClient(bootstrap=True)
    try:
        metadata = await trainer_client.load_checkpoint(args.snapshot)
        report: dict[str, Any] = {"metadata_json": json.dumps(metadata)}
        try:
            await trainer_client.load_checkpoint(args.snapshot)
            report["second_load_refused"] = False
        except RestoreRefusedError:
            report["second_load_refused"] = True
        controller_client = TransferQueueClient(bootstrap=False)
        ids = await controller_client.list_sample_ids(args.partition)
        report["sample_ids"] = ids
        report["rows"] = await controller_client.get_samples(args.partition, ids) if ids else {}
        if args.replay_state:
            state = json.loads(Path(args.replay_state).read_text())
            buffer = ReplayBuffer(
                controller_client,
                DataPlaneCheckpointBarrier(),
                partition_id=args.partition,
                group_size=int(metadata["group_size"]),
            )
            buffer.load_state_dict(state, expected_digest=metadata["replay_digest"])
            buffer.validate_inventory(ids)
            report["replay_digest"] = buffer.metadata_state_dict()["digest"]
        await controller_client.close()
        return report
    finally:
        await trainer_client.close()


def main(argv: list[str] | None = None) -> int:
    """Run one restore in a fresh cluster; exit 0 and write the report on success."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("snapshot")
    parser.add_argument("partition")
    parser.add_argument("out")
    parser.add_argument("--replay-state", default=None)
    args = parser.parse_args(argv)
    temp_dir = Path(tempfile.mkdtemp(prefix="rlckpt-rs-", dir="/tmp"))
    start_local_ray(temp_dir, log_to_driver=False)
    try:
        report = asyncio.run(_restore(args))
    finally:
        stop_local_ray()
        shutil.rmtree(temp_dir, ignore_errors=True)
    torch.save(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
