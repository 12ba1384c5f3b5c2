"""Names of the pieces inside a run bundle (``step_<N>/``), shared by save and restore."""

from __future__ import annotations

POLICY_DIR = "policy"  # the trainer ranks' DCP checkpoint: .metadata + per-rank shard files (participants rank<i>)
POLICY_METADATA = f"{POLICY_DIR}/.metadata"  # DCP's metadata of that checkpoint
POLICY_FILE = "policy/state.pt"  # the whole policy in one torch.save file: run formats 1-2, and the benchmarks' blob
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
# The run-bundle format written today. 3: policy/ is a DCP checkpoint written by the trainer ranks as
# participants. Restore reads 1 and 2 too; what each held and how it is read: checkpoint/run_format.py.
RUN_BUNDLE_FORMAT = 3
# What a restore reads of every run bundle besides its policy (RunBundle.pieces adds the policy's) and the
# data plane's rows files.
RUN_BUNDLE_COMMON_PIECES = (LOADER_FILE, REPLAY_FILE, DATA_PLANE_METADATA)
