"""The store's records, each declared field by field and read with bounds: the manifest (`manifest`, and its
format history in `manifest_formats`), a save's write-ahead intent (`intent`), who joined and sealed it
(`roster`), the run's identity (`run_record`) and the listing of a run dir by kind (`inventory`).
Import from the modules; `rlckpt.store` re-exports what callers use."""
