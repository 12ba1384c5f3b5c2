"""pytest plugin: an S3 endpoint for the store suite (moto_server subprocess, or an external one such as
Ceph RGW via RLCKPT_TEST_S3_ENDPOINT), a fresh bucket per test, and `store_location` over local and S3."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

ENDPOINT_ENV = "RLCKPT_TEST_S3_ENDPOINT"
KEY_ENV = "RLCKPT_TEST_S3_KEY"
SECRET_ENV = "RLCKPT_TEST_S3_SECRET"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes] | None, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"moto_server exited early with code {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"S3 endpoint {url} did not come up within {timeout}s")


def _moto_server_command(port: int) -> list[str]:
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which("moto_server")
    if exe:
        return [exe, "-H", "127.0.0.1", "-p", str(port)]
    return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """URL of an S3 endpoint for the session; sets AWS_* so s3fs/boto find it and nothing else."""
    saved = {k: os.environ.get(k) for k in _AWS_ENV_KEYS}
    external = os.environ.get(ENDPOINT_ENV)
    key = os.environ.get(KEY_ENV, "testing") if external else "testing"
    secret = os.environ.get(SECRET_ENV, "testing") if external else "testing"
    proc: subprocess.Popen[bytes] | None = None
    if external:
        endpoint = external.rstrip("/")
    else:
        port = _free_port()
        endpoint = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen(
            _moto_server_command(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
    os.environ.update(
        AWS_ACCESS_KEY_ID=key,
        AWS_SECRET_ACCESS_KEY=secret,
        AWS_DEFAULT_REGION="us-east-1",
        AWS_CONFIG_FILE="/dev/null",
        AWS_SHARED_CREDENTIALS_FILE="/dev/null",
        AWS_ENDPOINT_URL_S3=endpoint,
    )
    os.environ.pop("AWS_PROFILE", None)
    try:
        _wait_http(endpoint, proc)
        yield endpoint
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_AWS_ENV_KEYS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_ENDPOINT_URL_S3",
    "AWS_PROFILE",
)


def s3_options_for(endpoint: str) -> dict[str, Any]:
    """s3fs storage options for a test endpoint (no listings cache: other clients' writes must show)."""
    return {
        "endpoint_url": endpoint,
        "key": os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
        "secret": os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
        "skip_instance_cache": True,
        "use_listings_cache": False,
    }


def make_s3fs(storage_options: dict[str, Any]) -> Any:
    """An s3fs filesystem for tests (e.g. to corrupt objects behind the store's back)."""
    import s3fs

    return s3fs.S3FileSystem(**storage_options)


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
    except Exception:  # noqa: BLE001 - best-effort cleanup of a throwaway bucket
        pass


@pytest.fixture(params=["local", "s3"])
def store_location(request: pytest.FixtureRequest, tmp_path: Any) -> tuple[str, dict[str, Any] | None]:
    """(url, storage_options) of an empty run location, once on local disk and once on S3."""
    if request.param == "local":
        return str(tmp_path / "run"), None
    url = request.getfixturevalue("s3_run_url")
    return url, dict(request.getfixturevalue("s3_storage_options"))
