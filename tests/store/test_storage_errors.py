"""How storage failures are classified (`store/io/storage_errors.py`): outages and refused permissions are
StoreUnavailableError naming the store, the action, the path and the cause; a store set up wrong is
StoreConfigError; a missing object or a create-exclusive refusal passes through untouched."""

from __future__ import annotations

import errno

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, ParamValidationError

from rlckpt.errors import StoreConfigError, StoreUnavailableError
from rlckpt.store.io.storage_errors import unavailable_as_store_error

URL = "s3://bucket/run"


def _raised_through(exc: BaseException) -> BaseException:
    with pytest.raises(Exception) as info, unavailable_as_store_error(URL, "beginning step 3"):
        raise exc
    return info.value


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"
    )


def test_local_permission_error_is_unavailable_naming_store_action_and_path():
    denied = PermissionError(errno.EACCES, "Permission denied", "/data/run/_txn")
    error = _raised_through(denied)
    assert isinstance(error, StoreUnavailableError) and error.__cause__ is denied
    assert (
        str(error) == f"store {URL} unavailable while beginning step 3: "
        "PermissionError: [Errno 13] Permission denied: '/data/run/_txn'"
    )


def test_s3_access_denied_translated_by_s3fs_is_unavailable():
    error = _raised_through(PermissionError("Access Denied"))
    assert isinstance(error, StoreUnavailableError)
    assert str(error).endswith("beginning step 3: PermissionError: Access Denied")


def test_raw_botocore_access_denied_is_unavailable():
    error = _raised_through(_client_error("AccessDenied", 403))
    assert isinstance(error, StoreUnavailableError) and "AccessDenied" in str(error)


def test_connection_failure_is_unavailable_naming_the_endpoint():
    error = _raised_through(EndpointConnectionError(endpoint_url="http://127.0.0.1:9/bucket"))
    assert isinstance(error, StoreUnavailableError) and "http://127.0.0.1:9/bucket" in str(error)


@pytest.mark.parametrize(
    "exc",
    [NoCredentialsError(), ParamValidationError(report='Invalid bucket name "Bad_Bucket!"')],
    ids=["no-credentials", "invalid-bucket-name"],
)
def test_store_set_up_wrong_is_a_config_error_not_an_outage(exc):
    error = _raised_through(exc)
    assert isinstance(error, StoreConfigError) and f"store {URL} is misconfigured (beginning step 3)" in str(error)


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError("step_3/COMMIT"),
        FileExistsError("_txn/step_3.json"),
        OSError(errno.EINVAL, "PreconditionFailed (412)"),
    ],
    ids=["missing", "exists", "ceph-412"],
)
def test_missing_object_and_create_exclusive_refusal_pass_through(exc):
    assert _raised_through(exc) is exc
