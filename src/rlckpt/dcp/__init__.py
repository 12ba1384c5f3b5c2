"""torch.distributed.checkpoint (DCP) on rlckpt bundles: every rank writes its shards through the store's
participants, the coordinator commits once, readers load digest-checked bytes only. The files are DCP's
own format, so a local bundle's `policy/` still loads with plain `FileSystemReader`.

    dcp.save(state, storage_writer=BundleStorageWriter(handle, participant=f"rank{rank}"))   # joined
    dcp.save(state, storage_writer=BundleStorageWriter("s3://bucket/run", step=100))         # standalone
    dcp.load(state, storage_reader=BundleStorageReader("s3://bucket/run", step=None))        # newest

With `BundleStorageWriter(..., compression="auto" | "on")` shard files are stored in byte planes + zstd
where that pays: lossless, but then only rlckpt's reader loads them. See docs/sharded-policy.md. Imports
torch; the store (rlckpt.store) does not.
"""

from .reader import BundleStorageReader
from .writer import POLICY_COMPRESSIONS, BundleStorageWriter, check_policy_compression

__all__ = ["POLICY_COMPRESSIONS", "BundleStorageReader", "BundleStorageWriter", "check_policy_compression"]
