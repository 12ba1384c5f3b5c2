"""torch.distributed.checkpoint (DCP) on rlckpt bundles: every rank writes its shards through the store's
participants, the coordinator commits once, readers load digest-checked bytes only. The files are DCP's
own format, so a local bundle's `policy/` still loads with plain `FileSystemReader`.

    dcp.save(state, storage_writer=BundleStorageWriter(handle, participant=f"rank{rank}"))   # joined
    dcp.save(state, storage_writer=BundleStorageWriter("s3://bucket/run", step=100))         # standalone
    dcp.load(state, storage_reader=BundleStorageReader("s3://bucket/run", step=None))        # newest

See docs/sharded-policy.md. Imports torch; the store (rlckpt.store) does not.
"""

from .reader import BundleStorageReader
from .writer import BundleStorageWriter

__all__ = ["BundleStorageReader", "BundleStorageWriter"]
