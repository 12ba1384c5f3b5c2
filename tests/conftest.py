"""Shared fixtures live in rlckpt.testing so benchmarks and scripts can reuse them."""

import pytest

pytest_plugins = [
    "rlckpt.testing.s3",
    "rlckpt.testing.tq",
]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups for `make test` (pytest-xdist, ``--dist loadgroup``), each run whole by one worker: the
    tests on the session's TransferQueue (one TQ per worker would cost another ≈20 s and 2 GiB), and
    each end-to-end module (its runs start their own Ray clusters and share module fixtures).
    Everything else is spread over the workers beside them."""
    for item in items:
        if "tq_session" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("tq"))
        elif "e2e" in item.path.parts:
            item.add_marker(pytest.mark.xdist_group(f"e2e-{item.path.stem}"))
