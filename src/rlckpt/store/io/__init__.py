"""Bytes in and out of a store: writing and reading files through fsspec (`files`), pooled buffers
(`buffers`), the writer that digests as the bytes pass (`hashing_writer`, over the algorithms in
`digest`), zstd where it pays (`compression`), the read-back of a new bundle (`readback`) and the one
mapping of storage failures to rlckpt's errors (`storage_errors`)."""
