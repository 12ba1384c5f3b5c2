"""TrainConfig refuses what no run could use before anything starts, naming its own field."""

from __future__ import annotations

import pytest

from rlckpt.controller.config import TrainConfig


def test_an_unknown_compress_policy_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"compress_policy must be one of off, auto, on \(or None\), got 'zip'"):
        TrainConfig(run_dir="/tmp/unused", compress_policy="zip")
