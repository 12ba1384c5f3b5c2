"""The single controller: driver-side setup and the controller actor (one asyncio loop)."""
