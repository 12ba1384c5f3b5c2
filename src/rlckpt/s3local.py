"""A local S3 for testing an integration with rlckpt: a moto server on loopback (a subprocess: `moto_server`
from the `moto[server]` extra, which this module runs but never imports) and the settings that point s3fs at
it and at nothing else — no user profile, no AWS config, no listings cache.

    from rlckpt.s3local import make_s3fs, moto_server, s3_env, s3_options_for

    with moto_server() as endpoint, s3_env(endpoint):
        options = s3_options_for(endpoint)
        make_s3fs(options).mkdir("my-bucket")
        ckpt = Checkpointer("s3://my-bucket/run1", storage_options=options)

rlckpt's own tests and benchmarks use it the same way (docs/testing.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)

# s3fs/botocore must see only the endpoint and credentials we give them, never a user's profile or config.
AWS_ISOLATION_ENV = {
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
AWS_ENV_KEYS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_ENDPOINT_URL_S3",
    "AWS_PROFILE",
)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 30.0) -> None:
    """Block until `url` answers a GET; fail early if `proc` (the server) exits, or after `timeout` seconds."""
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


def moto_server_command(host: str, port: int) -> list[str]:
    """argv for `moto_server` from this interpreter's bin dir (else PATH, else `python -m moto.server`)."""
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which("moto_server")
    base = [exe] if exe else [sys.executable, "-m", "moto.server"]
    return [*base, "-H", host, "-p", str(port)]


def _stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def moto_server(host: str = "127.0.0.1") -> Iterator[str]:
    """A moto S3 server subprocess on `host` for the duration of the block; yields its endpoint URL.
    A subprocess (not moto's threaded server) so its work does not compete for our GIL."""
    port = free_port(host)
    endpoint = f"http://{host}:{port}"
    proc = subprocess.Popen(
        moto_server_command(host, port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a terminal's Ctrl-C reaches us, and we stop it in order
    )
    try:
        wait_http(endpoint, proc)
        logger.info("moto server on %s (pid %d)", endpoint, proc.pid)
        yield endpoint
    finally:
        _stop(proc)


def s3_env_vars(endpoint: str | None = None, key: str = "testing", secret: str = "testing") -> dict[str, str]:
    """AWS_* variables that give botocore these credentials, a region, no user config and (if given) `endpoint`."""
    env = {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, **AWS_ISOLATION_ENV}
    if endpoint is not None:
        env["AWS_ENDPOINT_URL_S3"] = endpoint
    return env


@contextlib.contextmanager
def s3_env(endpoint: str, key: str = "testing", secret: str = "testing") -> Iterator[None]:
    """Set `s3_env_vars(...)` and drop AWS_PROFILE for the block; restore the previous AWS_* values after."""
    saved = {name: os.environ.get(name) for name in AWS_ENV_KEYS}
    os.environ.update(s3_env_vars(endpoint, key, secret))
    os.environ.pop("AWS_PROFILE", None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def s3_options_for(endpoint: str, key: str | None = None, secret: str | None = None) -> dict[str, Any]:
    """s3fs storage options for `endpoint` (credentials default to AWS_* env, else "testing"); no listings
    cache and no instance cache, because other clients' writes must show."""
    return {
        "endpoint_url": endpoint,
        "key": key if key is not None else os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
        "secret": secret if secret is not None else os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
        "skip_instance_cache": True,
        "use_listings_cache": False,
    }


def make_s3fs(storage_options: dict[str, Any]) -> Any:
    """An s3fs filesystem for these options (imported lazily: s3fs is slow to import)."""
    import s3fs

    return s3fs.S3FileSystem(**storage_options)
