"""The integrity checksum an S3 upload's request carries, computed here instead of by botocore.

botocore (>= 1.36) adds a CRC32 of every PutObject/UploadPart body by default. It computes it with zlib on the
client's one event-loop thread, at about 2.6 GB/s: 0.36 s of CPU per GiB uploaded, on the thread that sends every
request of the process, on machines where the trainer's cores are shared with everything else. A CRC32C computed
by the writer's own thread with the CPU's CRC instruction (`crc32c`, about 10 GB/s, GIL released) and passed as
the request's `ChecksumCRC32C` gives the server the same check: botocore computes none when the request already
carries a checksum header.

A client configured to send checksums only where S3 requires them (`request_checksum_calculation="when_required"`,
in `config_kwargs` or AWS_REQUEST_CHECKSUM_CALCULATION; the usual fix for servers that refuse the headers) gets
none from rlckpt either. Integrity does not rest on this header: every file's BLAKE3 digest is in the manifest
and checked on every read.
"""

from __future__ import annotations

import base64
from typing import Any

import crc32c

CHECKSUM_PARAM = "ChecksumCRC32C"  # botocore's parameter for the x-amz-checksum-crc32c header


def crc32c_base64(data: Any) -> str:
    """The CRC32C of a bytes-like object, base64 of its 4 big-endian bytes (the header's form)."""
    return base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode("ascii")


def sends_checksums(fs: Any) -> bool:
    """Whether the filesystem's botocore client adds request checksums where S3 supports them (its resolved
    `request_checksum_calculation`: config_kwargs, then the environment and the shared config file)."""
    client = getattr(fs, "s3", None)
    config = getattr(getattr(client, "meta", None), "config", None)
    return getattr(config, "request_checksum_calculation", "when_supported") != "when_required"


def body_checksum(fs: Any, data: Any) -> dict[str, str]:
    """The checksum parameter for a request with body `data`, or none when the client sends checksums only
    where required."""
    return {CHECKSUM_PARAM: crc32c_base64(data)} if sends_checksums(fs) else {}
