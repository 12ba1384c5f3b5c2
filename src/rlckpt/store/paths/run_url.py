"""The one reading of a run URL: which filesystem protocol, and which path on it is the run's root.

The library, the CLI and every participant build a run's root from here, so one URL cannot name two
places. fsspec reads more into a URL than a name: `::` chains filesystems (`/x/a::b` is `/x/a`),
`file:`/`local:`/`data:` before a plain path are protocols, `file://tmp/run` is the relative
`tmp/run`, and in a remote URL `?versionId=` selects S3 object versions and `*`, `?`, `[` are glob
patterns to the calls that expand paths (s3fs's `rm`). A URL that any of these could make mean
something else is refused as a StoreConfigError naming it and the reason, rather than read one way
here and another way there. A local run is read by rlckpt's own calls, name by name, so `?`, `*`, `[`
and `#` in a local path are just characters.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import fsspec

from rlckpt.errors import StoreConfigError

LOCAL_PROTOCOLS = ("file", "local")
# fsspec reads these before a plain path as a protocol (LocalFileSystem strips `file:`/`local:`;
# split_protocol takes `data:` for a data URL).
_PROTOCOL_PREFIXES = tuple(f"{p}:" for p in (*LOCAL_PROTOCOLS, "data"))
# What makes fsspec read a URL as more than a name, anywhere: a chain, a NUL.
_AMBIGUOUS = {
    "::": "'::' chains filesystems in an fsspec URL",
    "\x00": "a NUL byte ends a path early",
}
# And in a remote URL, where fsspec's calls take the path (a local run is read by rlckpt's own calls,
# name by name): a query (S3 object versions), a fragment, a glob pattern.
_AMBIGUOUS_REMOTE = {
    "?": "'?' starts a query ('?versionId=' picks an S3 object version) and is a glob wildcard",
    "#": "'#' starts a URL fragment",
    "*": "'*' is a glob wildcard to fsspec calls that expand paths",
    "[": "'[' opens a glob character class to fsspec calls that expand paths",
}
_PROTOCOL_RE = re.compile(r"[a-z][a-z0-9+.-]*")


@dataclass(frozen=True)
class RunUrl:
    """A run URL read once: `protocol` (`file` for a local path) and `root`, the run's path on that
    filesystem (no protocol, no trailing slash; a local root is absolute)."""

    url: str
    protocol: str
    root: str


def parse_run_url(url: str | os.PathLike[str]) -> RunUrl:
    """Read a run URL (a local path or `protocol://path`), or refuse it.

    Raises:
        StoreConfigError: empty, an unknown protocol, no path, or anything fsspec could read as another
            place than the name says (see the module docstring); the message names the URL and why.
    """
    text = os.fspath(url)
    if not isinstance(text, str):
        raise StoreConfigError(f"store URL must be a str, got {type(text).__name__}")
    if not text:
        raise StoreConfigError("store URL is empty: give a local path or an fsspec URL such as s3://bucket/prefix")
    _refuse_ambiguous(text, _AMBIGUOUS)
    protocol, path = _split(text)
    if protocol not in LOCAL_PROTOCOLS:
        _refuse_ambiguous(text, _AMBIGUOUS_REMOTE)
    if not path:
        raise StoreConfigError(f"store {text}: the URL names no path after {protocol}://")
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        raise StoreConfigError(
            f"store {text}: protocol {protocol} needs a package that is not installed: {exc}"
        ) from exc
    root = cls._strip_protocol(text)
    root = root.rstrip("/") or root
    return RunUrl(text, protocol, root)


def _refuse_ambiguous(text: str, table: dict[str, str]) -> None:
    for chars, why in table.items():
        if chars in text:
            raise StoreConfigError(
                f"store {text!r}: {why}; rlckpt takes no run URL it cannot read as one place: name the run without it"
            )


def _split(text: str) -> tuple[str, str]:
    """(protocol, path): `protocol://path`, or `file` and the text for a plain local path."""
    if "://" not in text:
        if text.startswith(_PROTOCOL_PREFIXES):
            raise StoreConfigError(
                f"store {text!r}: fsspec reads {text.split(':', 1)[0] + ':'!r} before a path as a protocol; "
                f"write ./{text} for a local path of that name, or file:///absolute/path"
            )
        return "file", text
    protocol, path = text.split("://", 1)
    if not _PROTOCOL_RE.fullmatch(protocol) or protocol not in fsspec.available_protocols():
        raise StoreConfigError(f"store {text}: unknown protocol {protocol!r} (e.g. file, memory, s3)")
    if protocol in LOCAL_PROTOCOLS and path and not path.startswith("/"):
        raise StoreConfigError(
            f"store {text}: a {protocol}:// URL names an absolute path ({protocol}:///abs/path); fsspec would read "
            f"{path!r} relative to the working directory, a file URL as host {path.split('/', 1)[0]!r}"
        )
    return protocol, path
