"""Where things are: the one reading of a run URL (`run_url`), a store's filesystem and root (`location`),
the names inside a run dir and the checks on a bundle's relative paths (`paths`, `path_set`)."""
