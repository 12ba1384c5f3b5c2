"""The measurements behind `python -m benchmarks.policy` and `python -m benchmarks.store_scale`."""
