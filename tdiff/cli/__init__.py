"""The command line: the Typer application (main.py) and one module per subcommand (commands/),
each parsing options and calling the library. Only this layer knows flags.
"""
