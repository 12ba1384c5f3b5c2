"""The single controller: driver-side setup and the controller actor (one asyncio loop). Internal to
`rlckpt train`: its entry point is `rlckpt.controller.setup.setup_single_controller`."""

__all__: list[str] = []
