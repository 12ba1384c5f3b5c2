"""Names of the pieces inside a run bundle (``step_<N>/``), shared by save and restore."""

from __future__ import annotations

POLICY_DIR = "policy"  # the trainer ranks' DCP checkpoint: .metadata + per-rank shard files (participants rank<i>)
POLICY_METADATA = f"{POLICY_DIR}/.metadata"  # DCP's metadata of that checkpoint
POLICY_FILE = "policy/state.pt"  # a policy staged as one blob (StagedBytes: the benchmarks' stand-in trainer)
LOADER_FILE = "train_dataloader.pt"  # dataloader position + prompts drawn but not yet committed
REPLAY_FILE = "replay_buffer_metadata.pt"  # the replay index (no tensors)
DATA_PLANE_DIR = "data_plane"  # TransferQueue's own snapshot, staged locally then uploaded
DATA_PLANE_METADATA = f"{DATA_PLANE_DIR}/metadata.json"  # TQ writes it; JSON, safe to read first

# Keys of the manifest's user metadata that restore checks before loading anything.
META_INDEX_DIGEST = "index_digest"
META_GROUP_COUNT = "group_count"
META_ROLLOUT_ORDER = "rollout_order"  # the run's: "in_order" or "async" (`rlckpt train --mode`)
META_UPLOAD_TIMING = "upload_timing"  # the save's: "staged" or "inline" (recorded, never checked)
META_FORMAT = "rlckpt_run_format"
META_TRAINER_RANKS = "trainer_ranks"  # how many ranks saved policy/ (recorded; a resume may use another count)
# 3: policy/ is a DCP checkpoint written by the trainer ranks as participants (2 held one policy/state.pt);
# 2: the rollout order and the upload timing are recorded under the keys above (1 said "mode" and
# "save_mode"); restore refuses any other format.
RUN_BUNDLE_FORMAT = 3
# What a restore of RUN_BUNDLE_FORMAT reads, besides the policy's shard files and the data plane's rows.
RUN_BUNDLE_PIECES = (POLICY_METADATA, LOADER_FILE, REPLAY_FILE, DATA_PLANE_METADATA)
