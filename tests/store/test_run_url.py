"""One reading of a run URL (`store/paths/run_url.py`) for the library, the CLI and every participant: a URL
that fsspec could read as another place than its name says is refused, and a filesystem built
elsewhere (the CLI's, a test's wrapper) gets the very root the library would use."""

from __future__ import annotations

import fsspec
import pytest

from rlckpt.errors import StoreConfigError
from rlckpt.store import BundleStore
from rlckpt.store.paths.location import open_location
from rlckpt.store.paths.run_url import parse_run_url
from support.store_checks import save_sample


def test_a_local_path_with_double_colon_never_resolves_to_the_run_before_it(tmp_path):
    """fsspec chains `/x/a::b` to `/x/a`: a resume of `/x/a::b` would load another run's bundles."""
    save_sample(BundleStore(str(tmp_path / "a")), 1)
    with pytest.raises(StoreConfigError, match=r"a::b'?: '::' chains filesystems"):
        BundleStore(f"{tmp_path}/a::b")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("simplecache::s3://bucket/run", "'::' chains"),
        ("memory://a::b", "'::' chains"),
        ("file:run", "'file:' before a path as a protocol"),
        ("local:run", "'local:' before a path as a protocol"),
        ("data:run", "'data:' before a path as a protocol"),
        ("file://tmp/run", "names an absolute path"),
        ("s3://bucket/run?versionId=3", "'\\?' starts a query"),
        ("s3://bucket/run#2", "'#' starts a URL fragment"),
        ("s3://bucket/run*", "'\\*' is a glob wildcard"),
        ("memory://run[1]", "'\\[' opens a glob character class"),
        ("/data/r\x00un", "NUL byte"),
    ],
)
def test_a_run_url_fsspec_reads_as_another_place_is_refused_naming_why(url, why):
    with pytest.raises(StoreConfigError, match=why):
        parse_run_url(url)
    with pytest.raises(StoreConfigError, match=why):
        BundleStore(url)


def test_glob_and_query_characters_in_a_local_path_are_just_characters(tmp_path):
    """Local runs are read by rlckpt's own calls, name by name: nothing expands a pattern there."""
    store = BundleStore(str(tmp_path / "run[1]?*#"))
    save_sample(store, 1)
    assert store.root == f"{tmp_path}/run[1]?*#" and store.steps() == [1]
    assert (tmp_path / "run[1]?*#" / "step_1" / "COMMIT").exists()


def test_a_local_name_that_starts_like_a_protocol_is_read_literally_after_dot_slash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_run_url("./file:run").root == f"{tmp_path}/file:run"


@pytest.mark.parametrize("url", ["run", "./run/", "file://{tmp}/run", "{tmp}/run"])
def test_a_given_filesystem_gets_the_root_the_library_reads(tmp_path, monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    url = url.format(tmp=tmp_path)
    built = BundleStore(url)
    given = BundleStore(url, fs=fsspec.filesystem("file"))
    assert given.root == built.root == open_location(url)[1] == f"{tmp_path}/run"


def test_a_given_filesystem_of_another_protocol_is_refused():
    with pytest.raises(StoreConfigError, match="filesystem given is for memory, not s3"):
        BundleStore("s3://bucket/run", fs=fsspec.filesystem("memory"))


@pytest.mark.parametrize("protocol", ["local", "memory"])
def test_an_unknown_storage_option_is_refused_off_s3_too_naming_it(tmp_path, protocol):
    url = str(tmp_path / "run") if protocol == "local" else "memory://run"
    with pytest.raises(StoreConfigError, match=f"{url}: unknown storage option 'endpoint_url' for"):
        BundleStore(url, {"endpoint_url": "http://127.0.0.1:9000"})


def test_fsspecs_own_options_are_accepted_on_local_disk(tmp_path):
    store = BundleStore(str(tmp_path / "run"), {"auto_mkdir": True, "skip_instance_cache": True})
    save_sample(store, 1)
    assert store.steps() == [1]
