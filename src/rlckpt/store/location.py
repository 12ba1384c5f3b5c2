"""Where a store lives: turn a URL and storage options into (filesystem, root), or one clear error.

This is the one place a store's filesystem is built, so every way that can fail — empty or malformed
URL, unknown protocol, missing filesystem package (s3fs), an `endpoint_url` that is not an http(s)
URL, unknown or ill-typed storage options — becomes a `StoreConfigError` naming the URL and the cause,
instead of whatever fsspec, s3fs or botocore raise (often only at the first request).

`fail_fast=True` gives short-lived interactive tools (the `rlckpt` CLI) a small retry budget on S3;
the training path keeps botocore's and s3fs's defaults, which ride out longer blips.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import fsspec
import fsspec.core

from rlckpt.errors import StoreConfigError, StoreUnavailableError

from .storage_errors import as_store_error, describe_cause

log = logging.getLogger(__name__)

S3_PROTOCOLS = ("s3", "s3a")
S3_ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")

# fail_fast on S3, for what the user did not set. botocore's default (legacy mode, 5 attempts) spends
# 4-15 s backing off from a closed port; 3 attempts in standard mode sleep at most 1 + 2 s and still
# ride out one 503/SlowDown. s3fs retries timeouts and dropped connections 5 times on top of that, so a
# server that accepts and never answers held a command for 5-10 minutes (15 s read timeout each).
FAIL_FAST_S3_CONFIG: dict[str, Any] = {
    "connect_timeout": 3,
    "retries": {"total_max_attempts": 3, "mode": "standard"},
}
FAIL_FAST_S3FS_RETRIES = 2

_UNEXPECTED_KEYWORD = re.compile(r"unexpected keyword argument '([^']+)'")


def open_location(
    url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None, *, fail_fast: bool = False
) -> tuple[Any, str]:
    """The filesystem and the run's root path (no protocol, no trailing slash) for a store URL.

    Args:
        url: a local path or an fsspec URL (`s3://bucket/prefix`, `file://…`, `memory://…`).
        storage_options: keyword arguments for the filesystem (e.g. s3fs's `endpoint_url`, `key`).
        fail_fast: for an interactive command (the CLI). On S3, unless the user set them
            (`config_kwargs.connect_timeout` / `.retries`, or AWS_MAX_ATTEMPTS / AWS_RETRY_MODE): a 3 s
            connect timeout, 3 attempts in botocore's standard retry mode, and 2 tries (not 5) in s3fs,
            on a filesystem instance of its own. Without it the libraries' defaults apply.

    Returns:
        (fs, root). On S3 the client is set up here, so bad options fail now rather than at the first
        request; no request is sent.

    Raises:
        StoreConfigError: the URL or the options cannot describe a store (message names URL and cause).
        StoreUnavailableError: building the filesystem needed the network and could not reach it.
    """
    text = os.fspath(url)
    options = _checked_options(text, storage_options)
    protocol, _path = _checked_url(text)
    s3 = protocol in S3_PROTOCOLS
    if s3:
        _check_s3(text, options)
        if fail_fast:
            options = _fail_fast_s3_options(options)
            log.debug("fail-fast S3 client for %s: config_kwargs %s", text, options["config_kwargs"])
    fs, root = _build(text, protocol, options)
    if s3:
        if fail_fast:
            fs.retries = min(fs.retries, FAIL_FAST_S3FS_RETRIES)  # our own instance: skip_instance_cache
        _connect_s3(text, fs)
    return fs, root.rstrip("/") or root


# --- checks before anything is built -----------------------------------------------------------


def _checked_options(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    if storage_options is None:
        return {}
    if not isinstance(storage_options, Mapping):
        raise StoreConfigError(f"store {url}: storage options must be a mapping, got {type(storage_options).__name__}")
    bad = [k for k in storage_options if not isinstance(k, str)]
    if bad:
        raise StoreConfigError(f"store {url}: storage option names must be strings, got {bad[0]!r}")
    return dict(storage_options)


def _checked_url(url: str) -> tuple[str, str]:
    """(protocol, path) of a URL that names a place: not empty, a known protocol, a non-empty path."""
    if not url:
        raise StoreConfigError("store URL is empty: give a local path or an fsspec URL such as s3://bucket/prefix")
    protocol, path = fsspec.core.split_protocol(url)
    protocol = protocol or "file"
    known = set(fsspec.available_protocols())
    for part in protocol.split("::"):
        if part not in known:
            raise StoreConfigError(f"store {url}: unknown protocol {part!r} (e.g. file, memory, s3)")
    if not path:
        raise StoreConfigError(f"store {url}: the URL names no path after {protocol}://")
    return protocol, path


def _check_s3(url: str, options: dict[str, Any]) -> None:
    """A bucket in the URL, and an endpoint (if one is given) that is an http(s) URL."""
    if not urlsplit(url).netloc:
        raise StoreConfigError(f"store {url}: an S3 URL needs a bucket: s3://bucket/prefix")
    client_kwargs = options.get("client_kwargs")
    if client_kwargs is not None and not isinstance(client_kwargs, Mapping):
        raise StoreConfigError(
            f"store {url}: storage option client_kwargs must be a JSON object, got {client_kwargs!r}"
        )
    config_kwargs = options.get("config_kwargs")
    if config_kwargs is not None and not isinstance(config_kwargs, Mapping):
        raise StoreConfigError(
            f"store {url}: storage option config_kwargs must be a JSON object, got {config_kwargs!r}"
        )
    given = [
        ("endpoint_url", options.get("endpoint_url")),
        ("client_kwargs.endpoint_url", (client_kwargs or {}).get("endpoint_url")),
    ]
    given += [(name, os.environ.get(name)) for name in S3_ENDPOINT_ENV]
    for source, endpoint in given:
        if endpoint is not None:  # the first one set is the one s3fs/botocore use
            _check_endpoint(url, source, endpoint)
            return


def _fail_fast_s3_options(options: dict[str, Any]) -> dict[str, Any]:
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("connect_timeout", FAIL_FAST_S3_CONFIG["connect_timeout"])
    if "retries" not in config and not any(os.environ.get(v) for v in ("AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE")):
        config["retries"] = dict(FAIL_FAST_S3_CONFIG["retries"])
    return {**options, "config_kwargs": config, "skip_instance_cache": True}


def _check_endpoint(url: str, source: str, endpoint: Any) -> None:
    try:
        parts = urlsplit(endpoint) if isinstance(endpoint, str) else None
        host = parts.hostname if parts else None
    except ValueError:  # e.g. an unclosed IPv6 bracket
        parts, host = None, None
    if parts is None or parts.scheme not in ("http", "https") or not host:
        raise StoreConfigError(
            f"store {url}: {source} {endpoint!r} is not an http(s) URL such as http://127.0.0.1:9000"
        )


# --- building ------------------------------------------------------------------------------


def _build(url: str, protocol: str, options: dict[str, Any]) -> tuple[Any, str]:
    try:
        return fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        raise StoreConfigError(
            f"store {url}: protocol {protocol} needs a package that is not installed: {exc}"
        ) from exc
    except Exception as exc:
        translated = as_store_error(exc, url, "connecting")
        if isinstance(translated, StoreUnavailableError):  # a filesystem that talks to its server when built
            raise translated from exc
        raise StoreConfigError(f"store {url}: cannot build the {protocol} filesystem: {describe_cause(exc)}") from exc


def _connect_s3(url: str, fs: Any) -> None:
    """Create the s3fs client now (no request is sent): s3fs hands unknown options to aiobotocore's
    session and builds it lazily, so a typo would otherwise surface as a TypeError at the first request."""
    try:
        fs.connect()
    except Exception as exc:
        match = _UNEXPECTED_KEYWORD.search(str(exc)) if isinstance(exc, TypeError) else None
        if match:
            raise StoreConfigError(
                f"store {url}: unknown storage option {match.group(1)!r} for s3 ({describe_cause(exc)})"
            ) from exc
        raise StoreConfigError(f"store {url}: cannot set up the s3 client: {describe_cause(exc)}") from exc
