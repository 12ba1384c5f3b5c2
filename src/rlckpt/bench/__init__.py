"""The benchmarks behind `rlckpt bench`: the barrier window's stall (`barrier`) and end-to-end save/restore
against a raw copy (`save_restore`, `save_downtime`, `two_tiers`), with their harness (`harness`: destinations,
servers, run metadata), reports (`report`) and arguments (`args`), which `python -m benchmarks.NAME` shares.
Internal to rlckpt and its benchmarks: nothing here is a user API, so the package names nothing."""

__all__: list[str] = []
