"""Benchmarks of the checkpoint path: the barrier window's stall (``barrier``) and end-to-end
save/restore against a raw copy (``save_restore``). Importable so the CLI and smoke tests share them."""
