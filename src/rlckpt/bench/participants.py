"""What every benchmark saves with: its own policy source and replay buffer, no dataloader (a marker
instead), the ``async`` rollout order, and only the newest bundle kept so the destination stays small."""

from __future__ import annotations

from rlckpt.checkpoint.row_copy import RowCopier
from rlckpt.checkpoint.save import PolicyStateSource, SaveParticipants
from rlckpt.replay import ReplayBuffer
from rlckpt.store import BundleStore, Retention


def bench_participants(
    store: BundleStore,
    policy: PolicyStateSource,
    replay: ReplayBuffer,
    *,
    staging_root: str | None,
    compress: bool | None,
    row_copier: RowCopier | None = None,
) -> SaveParticipants:
    """The save participants of one benchmark point (the real save path, nothing stubbed)."""
    return SaveParticipants(
        store=store,
        policy=policy,
        replay=replay,
        capture_loader_state=lambda: {"bench": True},
        rollout_order="async",
        staging_root=staging_root,
        compress_data_plane=compress,
        retention=Retention(keep_last=1),
        row_copier=row_copier,
    )
