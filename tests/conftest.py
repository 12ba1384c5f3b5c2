"""The suite's plugins and groups. Its helpers live in tests/support (imported as `support`: pytest's
`pythonpath` setting); the processes the tests start get it, and the repo root, on PYTHONPATH here."""

import logging
import os
from pathlib import Path

import pytest

_PATHS = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
os.environ["PYTHONPATH"] = os.pathsep.join([*_PATHS, *filter(None, [os.environ.get("PYTHONPATH")])])

pytest_plugins = [
    "support.s3",
    "support.tq",
]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Against an external S3 endpoint (the Ceph RGW lane, `make test-rgw`), only the tests that reach it.
    Groups for `make test` (pytest-xdist, ``--dist loadgroup``), each run whole by one worker: the
    tests on the session's TransferQueue (one TQ per worker would cost another ≈20 s and 2 GiB), and
    each end-to-end module (its runs start their own Ray clusters and share module fixtures).
    Everything else is spread over the workers beside them."""
    from support.s3 import ENDPOINT_ENV  # a plugin of this suite: imported once pytest registered it

    if os.environ.get(ENDPOINT_ENV):
        elsewhere = [item for item in items if not _reaches_s3(item)]
        if elsewhere:
            config.hook.pytest_deselected(items=elsewhere)
            items[:] = [item for item in items if _reaches_s3(item)]
    for item in items:
        if "tq_session" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("tq"))
        elif "e2e" in item.path.parts:
            item.add_marker(pytest.mark.xdist_group(f"e2e-{item.path.stem}"))


def _reaches_s3(item: pytest.Item) -> bool:
    """Whether a test uses the session's S3 endpoint: through its fixtures, or as the S3 case of a test
    parametrized over locations (ids such as ``s3``, ``local-to-s3``, ``s3-dies-at-k``)."""
    if "s3_endpoint" in getattr(item, "fixturenames", ()):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and "s3" in callspec.id


@pytest.fixture(autouse=True)
def _root_logging_as_before():
    """A CLI test runs ``main()`` in-process, which points root logging at that test's captured stderr:
    take that handler away after it, else a later test logs into a closed file ("--- Logging error ---")."""
    root, ours = logging.getLogger(), logging.getLogger("rlckpt")
    before, levels = list(root.handlers), (root.level, ours.level)
    yield
    for handler in [h for h in root.handlers if type(h) is logging.StreamHandler and h not in before]:
        root.removeHandler(handler)
    root.setLevel(levels[0])
    ours.setLevel(levels[1])
