"""Create-exclusive probing: refuse a server that ignores If-None-Match (unless opted in, loudly);
recognize Ceph RGW's 412 that s3fs surfaces as OSError(EINVAL)."""

from __future__ import annotations

import errno

import pytest

from rlckpt.errors import UnsafeStoreError
from rlckpt.store import BundleStore
from rlckpt.store.io.storage_errors import is_precondition_failed, is_unavailable
from support.faults import FaultyFileSystem


class IgnoresCreateExclusive(FaultyFileSystem):
    """A real filesystem behind a proxy that drops mode="create", like a server ignoring If-None-Match."""

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        return self.inner.pipe_file(path, value, **kwargs)


def test_store_that_ignores_create_exclusive_is_refused(s3_run_url, s3_storage_options):
    real = BundleStore(s3_run_url, s3_storage_options).fs
    store = BundleStore(s3_run_url, s3_storage_options, fs=IgnoresCreateExclusive(real))
    with pytest.raises(UnsafeStoreError, match="create-exclusive"):
        store.begin(1)
    assert real.find(s3_run_url[5:]) == []


def test_allow_unsafe_writes_with_a_loud_warning(s3_run_url, s3_storage_options, caplog):
    real = BundleStore(s3_run_url, s3_storage_options).fs
    store = BundleStore(s3_run_url, s3_storage_options, fs=IgnoresCreateExclusive(real), allow_unsafe=True)
    with pytest.warns(RuntimeWarning, match="UNSAFE"), store.begin(1) as txn:
        txn.write_bytes("a", b"1")
        txn.commit()
    assert "UNSAFE" in caplog.text
    assert store.steps() == [1]


def test_real_s3_endpoint_enforces_create_exclusive(s3_run_url, s3_storage_options):
    store = BundleStore(s3_run_url, s3_storage_options)
    store.begin(1).abort()  # the probe passed


def _ceph_style_412() -> OSError:
    from botocore.exceptions import ClientError

    cause = ClientError({"Error": {}, "ResponseMetadata": {"HTTPStatusCode": 412}}, "PutObject")
    err = OSError(errno.EINVAL, "Invalid argument")
    err.__cause__ = cause
    return err


def test_ceph_412_as_einval_counts_as_precondition_failed():
    err = _ceph_style_412()
    assert is_precondition_failed(err)
    assert not is_unavailable(err)


def test_plain_einval_is_not_a_precondition_failure():
    assert not is_precondition_failed(OSError(errno.EINVAL, "Invalid argument"))
    assert is_unavailable(OSError(errno.EINVAL, "Invalid argument"))


def test_create_exclusive_is_probed_once_per_store(s3_run_url, s3_storage_options, monkeypatch):
    from rlckpt.store.backends import ObjectBackend

    probes = []
    real_probe = ObjectBackend.create_exclusive_enforced
    monkeypatch.setattr(
        ObjectBackend, "create_exclusive_enforced", lambda backend: probes.append(1) or real_probe(backend)
    )
    store = BundleStore(s3_run_url, s3_storage_options)
    for step in (1, 2):
        with store.begin(step) as txn:
            txn.write_bytes("a", b"x")
            txn.commit()
    assert len(probes) == 1
    BundleStore(s3_run_url, s3_storage_options).begin(3).abort()
    assert len(probes) == 2  # a new store (maybe another server behind the same URL) probes again
