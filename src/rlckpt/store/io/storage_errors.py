"""Classify what fsspec backends raise: create-exclusive refusals (incl. Ceph's 412-as-EINVAL), unreachable
or forbidden stores (StoreUnavailableError) and stores set up wrong (StoreConfigError)."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

from rlckpt.errors import RlckptError, StoreConfigError, StoreError, StoreUnavailableError

_NETWORK_MODULES = ("botocore", "aiobotocore", "aiohttp", "urllib3", "requests")

# botocore errors raised before any request reaches the network: the client or the request is set up
# wrong (bad bucket name, no credentials, unknown profile, unresolvable endpoint). Matched by class
# name along the MRO so this module does not import botocore.
_BOTOCORE_CONFIG_ERRORS = frozenset(
    {
        "ParamValidationError",
        "ValidationError",
        "NoCredentialsError",
        "PartialCredentialsError",
        "UnknownCredentialError",
        "ProfileNotFound",
        "ConfigParseError",
        "ConfigNotFound",
        "BaseEndpointResolverError",
        "EndpointProviderError",
        "InvalidEndpointConfigurationError",
        "InvalidConfigError",
        "InvalidRetryConfigurationError",
        "InvalidProxiesConfigError",
        "InvalidDNSNameError",
        "InvalidS3AddressingStyleError",
        "UnsupportedS3ArnError",
        "UnknownSignatureVersionError",
        "UnsupportedSignatureVersionError",
    }
)


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


def is_misconfigured(exc: BaseException) -> bool:
    """True for botocore errors that mean the store is set up wrong rather than out of reach."""
    if type(exc).__module__.split(".")[0] not in ("botocore", "aiobotocore"):
        return False
    return any(cls.__name__ in _BOTOCORE_CONFIG_ERRORS for cls in type(exc).__mro__)


def is_unavailable(exc: BaseException) -> bool:
    """True for errors that mean "cannot reach/use the store" rather than "this object is missing":
    connection failures and timeouts, any other OSError — PermissionError included, local or an S3
    AccessDenied that s3fs translated — and botocore's own errors other than misconfiguration."""
    if isinstance(exc, RlckptError):
        return False
    if isinstance(exc, (FileNotFoundError, FileExistsError, IsADirectoryError)):
        return False
    if isinstance(exc, OSError):
        return not (exc.errno == errno.EINVAL and is_precondition_failed(exc))
    if is_misconfigured(exc):
        return False
    return type(exc).__module__.split(".")[0] in _NETWORK_MODULES


def service_error_code(exc: BaseException) -> str | None:
    """The S3 error code (`NoSuchUpload`, `InvalidRange`, ...) somewhere in `exc`'s chain, if any.

    s3fs translates botocore errors to OSError and keeps the message only when the server sent one;
    Ceph RGW often does not, which leaves `[Errno 22] None` — the code is what says what happened."""
    for item in _chain(exc):
        response = getattr(item, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            if code:
                return str(code)
    return None


def describe_cause(exc: BaseException) -> str:
    """`Type: message` (an OSError's message includes its path, e.g. `[Errno 13] Permission denied: '/x'`),
    plus the S3 error code when the message does not already name it."""
    text = f"{type(exc).__name__}: {exc}"
    code = service_error_code(exc)
    if code and code not in text:
        text += f" [{code}]"
    return text


def as_store_error(exc: BaseException, url: str, action: str) -> StoreError | None:
    """The StoreConfigError or StoreUnavailableError that `exc` amounts to (naming the URL, the action
    and the cause), or None when it is neither (a missing object, a refusal, a bug)."""
    if is_misconfigured(exc):
        return StoreConfigError(f"store {url} is misconfigured ({action}): {describe_cause(exc)}")
    if is_unavailable(exc):
        return StoreUnavailableError(f"store {url} unavailable while {action}: {describe_cause(exc)}")
    return None


@contextmanager
def unavailable_as_store_error(url: str, action: str) -> Iterator[None]:
    """Re-raise connection/permission/OS failures as StoreUnavailableError and misconfiguration as
    StoreConfigError, each naming the URL and the action; anything else passes through."""
    try:
        yield
    except Exception as exc:
        translated = as_store_error(exc, url, action)
        if translated is None:
            raise
        raise translated from exc
