"""The `rlckpt` command line: one module per subcommand, registered in `rlckpt.cli.main`."""
