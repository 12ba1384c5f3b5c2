"""The benchmark behind `rlckpt bench barrier` (`barrier`: the barrier window's stall, with the rollout pump,
rows and timed barrier it drives), and the harness every benchmark shares with `python -m benchmarks.NAME`:
destinations and servers (`harness`, `destinations`), reports (`report`) and arguments (`args`).
Internal to rlckpt and its benchmarks: nothing here is a user API, so the package names nothing."""

__all__: list[str] = []
