"""pytest plugin: an S3 endpoint for the store suite (moto_server subprocess, or an external one such as
Ceph RGW via RLCKPT_TEST_S3_ENDPOINT), a fresh bucket per test, and `store_location` over local and S3."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from rlckpt.s3local import make_s3fs, moto_server, s3_env, s3_options_for, wait_http

ENDPOINT_ENV = "RLCKPT_TEST_S3_ENDPOINT"
KEY_ENV = "RLCKPT_TEST_S3_KEY"
SECRET_ENV = "RLCKPT_TEST_S3_SECRET"


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """URL of an S3 endpoint for the session; sets AWS_* so s3fs/boto find it and nothing else."""
    external = os.environ.get(ENDPOINT_ENV)
    with contextlib.ExitStack() as stack:
        if external:
            endpoint = external.rstrip("/")
            key, secret = os.environ.get(KEY_ENV, "testing"), os.environ.get(SECRET_ENV, "testing")
            wait_http(endpoint)
        else:
            endpoint = stack.enter_context(moto_server())
            key, secret = "testing", "testing"
        stack.enter_context(s3_env(endpoint, key, secret))
        yield endpoint


@pytest.fixture(scope="session")
def s3_storage_options(s3_endpoint: str) -> dict[str, Any]:
    """storage_options for BundleStore / s3fs pointing at the session endpoint."""
    return s3_options_for(s3_endpoint)


@pytest.fixture(scope="session")
def _s3_admin_fs(s3_storage_options: dict[str, Any]) -> Any:
    return make_s3fs(s3_storage_options)


@pytest.fixture
def s3_run_url(_s3_admin_fs: Any) -> Iterator[str]:
    """`s3://<fresh bucket>/run`: a bucket per test (works on RGW, no moto reset needed); emptied afterwards."""
    bucket = f"rlckpt-{uuid.uuid4().hex[:16]}"
    _s3_admin_fs.mkdir(bucket)
    yield f"s3://{bucket}/run"
    try:
        _s3_admin_fs.rm(bucket, recursive=True)
    except Exception:
        pass


@pytest.fixture(params=["local", "s3"])
def store_location(request: pytest.FixtureRequest, tmp_path: Any) -> tuple[str, dict[str, Any] | None]:
    """(url, storage_options) of an empty run location, once on local disk and once on S3."""
    if request.param == "local":
        return str(tmp_path / "run"), None
    url = request.getfixturevalue("s3_run_url")
    return url, dict(request.getfixturevalue("s3_storage_options"))
