"""Classify what fsspec backends raise: create-exclusive refusals (incl. Ceph's 412-as-EINVAL) and unreachable stores."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

from rlckpt.errors import RlckptError, StoreUnavailableError

_NETWORK_MODULES = ("botocore", "aiobotocore", "aiohttp", "urllib3", "requests")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_precondition_failed(exc: BaseException) -> bool:
    """True when a create-exclusive write was refused because the object exists.

    moto/AWS via s3fs raise FileExistsError; Ceph RGW's 412 lacks the fields s3fs expects and
    surfaces as OSError(EINVAL) whose cause carries HTTP 412 / PreconditionFailed.
    """
    for item in _chain(exc):
        if isinstance(item, FileExistsError):
            return True
        response = getattr(item, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = response.get("Error", {}).get("Code")
            if status == 412 or code in ("PreconditionFailed", "412"):
                return True
        text = str(item)
        if "PreconditionFailed" in text or "Precondition Failed" in text or "(412)" in text:
            return True
    return False


def is_unavailable(exc: BaseException) -> bool:
    """True for errors that mean "cannot reach/use the store" rather than "this object is missing"."""
    if isinstance(exc, RlckptError):
        return False
    if isinstance(exc, (FileNotFoundError, FileExistsError, IsADirectoryError)):
        return False
    if isinstance(exc, OSError):
        return not (exc.errno == errno.EINVAL and is_precondition_failed(exc))
    return type(exc).__module__.split(".")[0] in _NETWORK_MODULES


@contextmanager
def unavailable_as_store_error(url: str, action: str) -> Iterator[None]:
    """Re-raise connection/permission/OS failures as StoreUnavailableError naming the URL and the action."""
    try:
        yield
    except Exception as exc:
        if is_unavailable(exc):
            raise StoreUnavailableError(f"store {url} unavailable while {action}: {type(exc).__name__}: {exc}") from exc
        raise
