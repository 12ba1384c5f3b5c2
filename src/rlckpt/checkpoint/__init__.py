"""The save and restore procedures of a whole run bundle: the orderings of docs/architecture.md, in one place.
Public: `rlckpt.checkpoint.save.save_bundle` and `rlckpt.checkpoint.restore.restore_run` (a single controller
of your own, docs/trainer.md); the other modules are what `rlckpt train` and the Checkpointer share, internal.
The package imports nothing itself, so `rlckpt.checkpoint.stopping` stays free of torch for `rlckpt --help`."""

__all__: list[str] = []
