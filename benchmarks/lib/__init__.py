"""The measurements behind `python -m benchmarks.policy`, `.store_scale` and `.save_restore`."""
