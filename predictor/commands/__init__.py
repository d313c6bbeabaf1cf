"""CLI subcommands: one module each, with `add_parser(subparsers)` and `run(args)`.
`predictor.cli` lists them in COMMANDS."""
