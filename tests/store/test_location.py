"""Building a store's filesystem (`store/paths/location.py`): every input that cannot describe a store is
refused when the store is built, as one StoreConfigError naming the URL and the cause."""

from __future__ import annotations

import importlib.util

import pytest

from rlckpt.errors import StoreConfigError, StoreUnavailableError
from rlckpt.s3local import free_port
from rlckpt.store import BundleStore
from rlckpt.store.paths.location import (
    FAIL_FAST_S3_CONFIG,
    FAIL_FAST_S3FS_RETRIES,
    S3_CLIENT_DEFAULTS,
    S3_DEADLINES,
    S3FS_RETRIES,
    open_location,
)

CREDENTIALS = {"key": "testing", "secret": "testing"}  # so building a client never asks the network for any


def test_empty_url_is_refused():
    with pytest.raises(StoreConfigError, match="store URL is empty"):
        BundleStore("")


def test_unknown_protocol_is_refused_naming_url_and_protocol():
    with pytest.raises(StoreConfigError, match=r"foo://bucket/run: unknown protocol 'foo'"):
        BundleStore("foo://bucket/run")


@pytest.mark.parametrize("url", ["file://", "memory://", "s3://"])
def test_url_without_a_path_is_refused_rather_than_meaning_the_current_directory(url):
    with pytest.raises(StoreConfigError, match="names no path"):
        BundleStore(url)


def test_s3_url_without_a_bucket_is_refused():
    with pytest.raises(StoreConfigError, match="needs a bucket"):
        BundleStore("s3:///run")


@pytest.mark.parametrize("endpoint", ["not-a-url", "ftp://127.0.0.1:9000", "http://", "127.0.0.1:9000", 9000])
def test_endpoint_that_is_not_an_http_url_is_refused_naming_it(endpoint):
    with pytest.raises(StoreConfigError, match=r"s3://bucket/run: endpoint_url .* is not an http\(s\) URL"):
        BundleStore("s3://bucket/run", {"endpoint_url": endpoint})


def test_endpoint_from_the_environment_is_checked_and_named(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "localhost-9000")
    with pytest.raises(StoreConfigError, match="AWS_ENDPOINT_URL_S3 'localhost-9000'"):
        BundleStore("s3://bucket/run", {"key": "k", "secret": "s"})


def test_unknown_s3_option_is_refused_when_the_store_is_built_not_at_the_first_request(s3_storage_options):
    with pytest.raises(StoreConfigError, match="s3://bucket/run: unknown storage option 'endpoint'"):
        BundleStore("s3://bucket/run", dict(s3_storage_options, endpoint="http://127.0.0.1:9000"))


@pytest.mark.parametrize("option", [{"client_kwargs": "us-east-1"}, {"config_kwargs": 3}, {"max_concurrency": "ten"}])
def test_ill_typed_s3_option_is_refused_when_the_store_is_built(s3_storage_options, option):
    with pytest.raises(StoreConfigError, match="s3://bucket/run: "):
        BundleStore("s3://bucket/run", dict(s3_storage_options, **option))


def test_storage_options_that_are_not_a_mapping_are_refused():
    with pytest.raises(StoreConfigError, match="must be a mapping"):
        open_location("memory://run", ["endpoint_url"])  # type: ignore[arg-type]


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs is installed here")
def test_missing_filesystem_package_is_a_config_error_naming_it():
    with pytest.raises(StoreConfigError, match="gs://bucket/run: protocol gs needs a package .*gcsfs"):
        BundleStore("gs://bucket/run")


def test_config_error_is_a_value_error_for_callers_that_caught_fsspecs():
    with pytest.raises(ValueError):
        BundleStore("foo://bucket/run")


def test_building_an_s3_store_sends_no_request(s3_storage_options):
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens: any request would fail
    one_attempt = {"retries": {"total_max_attempts": 1}}
    store = BundleStore("s3://bucket/run", dict(s3_storage_options, endpoint_url=endpoint, config_kwargs=one_attempt))
    with pytest.raises(StoreUnavailableError, match=endpoint):
        store._check_reachable()


def test_open_location_gives_the_root_without_protocol_or_trailing_slash(tmp_path):
    fs, root = open_location(f"file://{tmp_path}/run/")
    assert root == f"{tmp_path}/run" and "file" in fs.protocol


def test_fail_fast_gives_s3_a_small_retry_budget(monkeypatch):
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    fs, _root = open_location(
        "s3://bucket/run", {**CREDENTIALS, "endpoint_url": "http://127.0.0.1:9000"}, fail_fast=True
    )
    assert fs.config_kwargs == {**S3_CLIENT_DEFAULTS, **FAIL_FAST_S3_CONFIG} and fs.retries == FAIL_FAST_S3FS_RETRIES


def test_fail_fast_keeps_what_the_user_set(monkeypatch):
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    given = {"connect_timeout": 30, "retries": {"max_attempts": 10}}
    fs, _root = open_location("s3://bucket/run", {**CREDENTIALS, "config_kwargs": given}, fail_fast=True)
    assert fs.config_kwargs == {**S3_CLIENT_DEFAULTS, **given}


def test_fail_fast_leaves_retries_to_aws_max_attempts_when_it_is_set(monkeypatch):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "8")
    fs, _root = open_location("s3://bucket/run", CREDENTIALS, fail_fast=True)
    assert fs.config_kwargs == {**S3_CLIENT_DEFAULTS, "connect_timeout": FAIL_FAST_S3_CONFIG["connect_timeout"]}


def test_every_s3_call_has_a_deadline_without_fail_fast_too(monkeypatch):
    """A training run's calls: bounded tries within s3fs's timeouts, not 25 tries of 15 s on a silent server;
    payloads unsigned (S3_CLIENT_DEFAULTS)."""
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    fs, _root = open_location("s3://bucket/run", {**CREDENTIALS, "skip_instance_cache": True})
    assert fs.config_kwargs == {**S3_CLIENT_DEFAULTS, **S3_DEADLINES} and fs.retries == S3FS_RETRIES < type(fs).retries
    assert (fs.connect_timeout, fs.read_timeout) == (5, 15)  # s3fs's own, applied to every request


def test_the_deadline_keeps_the_retries_the_user_set(monkeypatch):
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    given = {"read_timeout": 60, "retries": {"max_attempts": 10}}
    fs, _root = open_location("s3://bucket/run", {**CREDENTIALS, "config_kwargs": given, "skip_instance_cache": True})
    assert fs.config_kwargs == {**S3_CLIENT_DEFAULTS, **given}


def test_a_caller_may_sign_payloads_again(monkeypatch):
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    given = {"s3": {"payload_signing_enabled": True, "addressing_style": "path"}, "retries": {"max_attempts": 10}}
    fs, _root = open_location("s3://bucket/run", {**CREDENTIALS, "config_kwargs": given})
    assert fs.config_kwargs == given
