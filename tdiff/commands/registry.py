"""Which subcommands `tdiff` offers. A command is listed here only once it really works."""

from tdiff.commands.clean import clean
from tdiff.commands.tokenize import tokenize

COMMANDS = [
    ("clean", clean),
    ("tokenize", tokenize),
]
