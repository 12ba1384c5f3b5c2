"""Shared fixtures live in rlckpt.testing so benchmarks and scripts can reuse them."""

pytest_plugins = [
    "rlckpt.testing.s3",
    "rlckpt.testing.tq",
]
