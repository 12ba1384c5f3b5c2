"""Where a store lives: turn a URL and storage options into (filesystem, root), or one clear error.

This is the one place a store's filesystem is built, so every way that can fail — empty or malformed
URL, unknown protocol, missing filesystem package (s3fs), an `endpoint_url` that is not an http(s)
URL, unknown or ill-typed storage options — becomes a `StoreConfigError` naming the URL and the cause,
instead of whatever fsspec, s3fs or botocore raise (often only at the first request). The root comes
from `run_url.parse_run_url`, the reading every other user of the URL shares.

Every S3 call has a deadline: s3fs's timeouts (5 s to connect, 15 s per read) and a bounded number of
tries (S3_DEADLINES), unless the user set them — the libraries' defaults retry a server that accepts
connections and never answers for minutes (25 tries), and a run must not wait on a remote that long.
`fail_fast=True` (the `rlckpt` CLI: someone waits at a terminal) also connects within 3 s.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import fsspec
import fsspec.core

from rlckpt.errors import StoreConfigError, StoreUnavailableError
from rlckpt.store.io.storage_errors import as_store_error, describe_cause
from rlckpt.store.paths.run_url import LOCAL_PROTOCOLS, RunUrl, parse_run_url

log = logging.getLogger(__name__)

S3_PROTOCOLS = ("s3", "s3a")
S3_ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")

# The deadline of every S3 call, for what the user did not set. botocore's default (legacy mode, 5
# attempts) spends 4-15 s backing off from a closed port, and s3fs retries timeouts and dropped connections
# 5 times on top of that: a server that accepts and never answers held one call for 5-10 minutes (25 tries
# with s3fs's 15 s read timeout each; a save of a two-tier run waited 423 s on one). 3 attempts in
# standard mode sleep at most 1 + 2 s and still ride out one 503/SlowDown; with 2 tries in s3fs a call
# gives up within 6 tries: ≈ 94 s on a silent server, 1-4 s on a closed port.
S3_DEADLINES: dict[str, Any] = {"retries": {"total_max_attempts": 3, "mode": "standard"}}
S3FS_RETRIES = 2
# fail_fast (the CLI) also connects within 3 s (s3fs's default is 5 s).
FAIL_FAST_S3_CONFIG: dict[str, Any] = {"connect_timeout": 3, **S3_DEADLINES}
FAIL_FAST_S3FS_RETRIES = S3FS_RETRIES

# What rlckpt's S3 client does unless the caller's `config_kwargs` say otherwise: no SHA-256 of every payload
# byte for the request's signature. botocore signs payloads only over plain http; over https it relies on the
# checksum header, as here (CRC32C per upload request, s3_checksums.py; the BLAKE3 digest of every file checked on
# every read).
# Over http that hash ran on the client's one event-loop thread and halved upload throughput (80 -> 145 MiB/s
# to Ceph RGW on loopback, one stream).
S3_CLIENT_DEFAULTS: dict[str, Any] = {"s3": {"payload_signing_enabled": False}}

_UNEXPECTED_KEYWORD = re.compile(r"unexpected keyword argument '([^']+)'")

# Filesystems that read no option but their named parameters and fsspec's own (instance and listings
# cache): anything else is a typo they would swallow without a word. s3fs hands the rest to botocore,
# whose client refuses it (`_connect_s3`).
_STRICT_PROTOCOLS = (*LOCAL_PROTOCOLS, "memory")
_FSSPEC_OPTIONS = frozenset({"skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths"})


def open_location(
    url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None, *, fail_fast: bool = False
) -> tuple[Any, str]:
    """The filesystem and the run's root path (no protocol, no trailing slash) for a store URL.

    Args:
        url: a local path or an fsspec URL (`s3://bucket/prefix`, `file://…`, `memory://…`).
        storage_options: keyword arguments for the filesystem (e.g. s3fs's `endpoint_url`, `key`).
        fail_fast: for an interactive command (the CLI): on S3 a 3 s connect timeout (unless the user set
            `config_kwargs.connect_timeout`), on a filesystem instance of its own. With or without it,
            every S3 call has a deadline unless the user set its parts (`config_kwargs.retries`, or
            AWS_MAX_ATTEMPTS / AWS_RETRY_MODE): 3 attempts in botocore's standard retry mode, 2 tries
            (not 5) in s3fs, each within s3fs's timeouts (5 s to connect, 15 s per read).

    Returns:
        (fs, root). On S3 the client is set up here, so bad options fail now rather than at the first
        request; no request is sent.

    Raises:
        StoreConfigError: the URL or the options cannot describe a store (message names URL and cause).
        StoreUnavailableError: building the filesystem needed the network and could not reach it.
    """
    text = os.fspath(url)
    options = _checked_options(text, storage_options)
    run = parse_run_url(text)
    s3 = run.protocol in S3_PROTOCOLS
    if run.protocol in _STRICT_PROTOCOLS:
        _check_known_options(text, run.protocol, options)
    if s3:
        _check_s3(text, options)
        options = _s3_deadlines(_s3_client_defaults(options), fail_fast)
        log.debug("S3 client for %s (fail fast: %s): config_kwargs %s", text, fail_fast, options["config_kwargs"])
    fs = _build(run, options)
    if s3:
        # an instance shared through fsspec's cache was built with these very options: the same budget
        fs.retries = min(fs.retries, S3FS_RETRIES)
        _connect_s3(text, fs)
    return fs, run.root


def given_filesystem_root(url: str | os.PathLike[str], fs: Any) -> str:
    """The run's root for a filesystem built elsewhere (the CLI's fail-fast one, a test's wrapper): read
    from the URL as `open_location` reads it, so both name the same place; the filesystem must be of
    the URL's protocol."""
    run = parse_run_url(url)
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    if run.protocol not in protocols:
        raise StoreConfigError(
            f"store {run.url}: the filesystem given is for {'/'.join(protocols)}, not {run.protocol}"
        )
    return run.root


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


def _check_known_options(url: str, protocol: str, options: dict[str, Any]) -> None:
    """Every option is one the filesystem reads: a named parameter of its class or fsspec's own."""
    cls = fsspec.get_filesystem_class(protocol)
    known = set(_FSSPEC_OPTIONS)
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None and klass is not object:
            known.update(
                name
                for name, param in inspect.signature(init).parameters.items()
                if name != "self" and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
            )
    unknown = sorted(set(options) - known)
    if unknown:
        raise StoreConfigError(
            f"store {url}: unknown storage option {unknown[0]!r} for {protocol} (it takes {', '.join(sorted(known))})"
        )


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


def _s3_client_defaults(options: dict[str, Any]) -> dict[str, Any]:
    """S3_CLIENT_DEFAULTS under what the caller's `config_kwargs` set (theirs win, key by key)."""
    config = dict(options.get("config_kwargs") or {})
    s3_config = {**S3_CLIENT_DEFAULTS["s3"], **(config.get("s3") or {})}
    return {**options, "config_kwargs": {**config, "s3": s3_config}}


def _s3_deadlines(options: dict[str, Any], fail_fast: bool) -> dict[str, Any]:
    """`options` with S3_DEADLINES (FAIL_FAST_S3_CONFIG, on an instance of its own) where the user set nothing."""
    defaults = FAIL_FAST_S3_CONFIG if fail_fast else S3_DEADLINES
    config = dict(options.get("config_kwargs") or {})
    if "connect_timeout" in defaults:
        config.setdefault("connect_timeout", defaults["connect_timeout"])
    if "retries" not in config and not any(os.environ.get(v) for v in ("AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE")):
        config["retries"] = dict(defaults["retries"])
    built = {**options, "config_kwargs": config}
    return {**built, "skip_instance_cache": True} if fail_fast else built


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


def _build(run: RunUrl, options: dict[str, Any]) -> Any:
    """The filesystem of a parsed run URL; refused if fsspec would put the run anywhere but `run.root`."""
    url, protocol = run.url, run.protocol
    try:
        fs, root = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        raise StoreConfigError(
            f"store {url}: protocol {protocol} needs a package that is not installed: {exc}"
        ) from exc
    except Exception as exc:
        translated = as_store_error(exc, url, "connecting")
        if isinstance(translated, StoreUnavailableError):  # a filesystem that talks to its server when built
            raise translated from exc
        raise StoreConfigError(f"store {url}: cannot build the {protocol} filesystem: {describe_cause(exc)}") from exc
    if (root.rstrip("/") or root) != run.root:  # parse_run_url refuses what fsspec reads otherwise; keep it so
        raise StoreConfigError(f"store {url}: fsspec reads the run as {root!r}, rlckpt as {run.root!r}")
    return fs


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
