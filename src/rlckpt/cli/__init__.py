"""The `rlckpt` command line: one module per subcommand, registered in `rlckpt.cli.main`. Internal but for
`rlckpt.cli.checkpointer_args` (the Checkpointer's flags, for a trainer's own argparse: examples/)."""

__all__: list[str] = []
