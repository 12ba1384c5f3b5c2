"""Validation and naming of steps and bundle-relative paths (strict, so a manifest cannot escape its bundle)."""

from __future__ import annotations

import re

from rlckpt.errors import InvalidPathError, InvalidStepError
from rlckpt.formats.json_text import quoted

STEP_PREFIX = "step_"
MANIFEST_NAME = "manifest.json"
COMMIT_NAME = "COMMIT"
RESERVED_NAMES = frozenset({MANIFEST_NAME, COMMIT_NAME})
TXN_DIR = "_txn"
TMP_DIR = "_tmp"
PROBE_DIR = "_probe"
QUARANTINE_DIR = "_quarantine"  # corrupt bundles moved aside so their step can be saved again

_STEP_RE = re.compile(r"step_(0|[1-9][0-9]*)")
TXID_PATTERN = "[A-Za-z0-9_-]{1,64}"
_TXID_RE = re.compile(TXID_PATTERN)


def is_txid(value: object) -> bool:
    """Whether `value` can be a transaction id: 1-64 of [A-Za-z0-9_-]. Txids name directories and keys
    (a staging dir, a bundle's data prefix), so one read from a record must never be a path."""
    return isinstance(value, str) and _TXID_RE.fullmatch(value) is not None


def validate_step(step: object) -> int:
    """Return `step` if it is a non-negative int (bool excluded); raise InvalidStepError otherwise."""
    if isinstance(step, bool) or not isinstance(step, int):
        raise InvalidStepError(f"step must be a non-negative int, got {quoted(step)} ({type(step).__name__})")
    if step < 0:
        raise InvalidStepError(f"step must be a non-negative int, got {step}")
    return step


def step_dirname(step: int) -> str:
    """The directory/prefix name of a step: `step_<N>` without padding."""
    return f"{STEP_PREFIX}{validate_step(step)}"


def intent_name(step: int) -> str:
    """The file name of a step's intent under `_txn/`."""
    return f"{step_dirname(step)}.json"


def parse_intent_name(name: str) -> int | None:
    """The step an intent file name `step_<N>.json` is for, or None."""
    return parse_step_dirname(name[: -len(".json")]) if name.endswith(".json") else None


def parse_step_dirname(name: str) -> int | None:
    """The step of a `step_<N>` name, or None when the name is not exactly that form."""
    match = _STEP_RE.fullmatch(name)
    return int(match.group(1)) if match else None


def validate_relpath(relpath: object, *, allow_reserved: bool = False) -> str:
    """Return `relpath` if it is a safe POSIX relative path inside a bundle; raise InvalidPathError otherwise.

    Refused: non-strings, empty, absolute, backslashes, NUL, `.`/`..`/empty segments, trailing slash,
    and (unless allow_reserved) the reserved top-level names manifest.json and COMMIT and anything under
    them: on local disk those names must stay free in the staging dir for the bundle's own metadata,
    and every backend refuses the same paths.
    """
    if not isinstance(relpath, str):
        raise InvalidPathError(f"relative path must be a str, got {quoted(relpath)}")
    if relpath == "":
        raise InvalidPathError("relative path is empty")
    if "\\" in relpath:
        raise InvalidPathError(f"relative path {quoted(relpath)} contains a backslash")
    if "\x00" in relpath:
        raise InvalidPathError(f"relative path {quoted(relpath)} contains a NUL byte")
    if relpath.startswith("/") or re.match(r"^[A-Za-z]:", relpath):
        raise InvalidPathError(f"relative path {quoted(relpath)} is absolute")
    for part in relpath.split("/"):
        if part in ("", ".", ".."):
            raise InvalidPathError(f"relative path {quoted(relpath)} has an empty, '.' or '..' segment")
    head = relpath.split("/", 1)[0]
    if not allow_reserved and head in RESERVED_NAMES:
        what = "is" if head == relpath else f"lies under {head!r}, which is"
        raise InvalidPathError(f"relative path {quoted(relpath)} {what} reserved for the bundle's own metadata")
    return relpath


def join_relpath(prefix: str, name: str) -> str:
    """Join two bundle-relative parts (prefix may be empty) and validate the result."""
    return validate_relpath(f"{prefix.rstrip('/')}/{name}" if prefix else name)
