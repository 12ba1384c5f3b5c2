"""Fixtures of the end-to-end runs."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest


@pytest.fixture
def ray_dir() -> Iterator[str]:
    """A run's private Ray temp dir, for runs a test may have to kill: short (Ray's socket paths must
    stay short), removed after."""
    path = tempfile.mkdtemp(prefix="rlckpt-e2e-ray-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)
