"""The Typer layer: one module per subcommand, each parsing options and calling the library."""
