"""Which subcommands `tdiff` offers. A command is listed here only once it really works."""

from tdiff.cli.commands.clean import clean
from tdiff.cli.commands.distill import distill
from tdiff.cli.commands.eval import eval_cmd
from tdiff.cli.commands.export import export
from tdiff.cli.commands.info import info
from tdiff.cli.commands.plot import plot
from tdiff.cli.commands.sample import sample
from tdiff.cli.commands.tokenize import tokenize
from tdiff.cli.commands.train import train
from tdiff.cli.commands.train_ar import train_ar
from tdiff.cli.commands.train_vae import train_vae

COMMANDS = [
    ("clean", clean),
    ("tokenize", tokenize),
    ("train-vae", train_vae),
    ("train", train),
    ("train-ar", train_ar),
    ("distill", distill),
    ("sample", sample),
    ("eval", eval_cmd),
    ("export", export),
    ("plot", plot),
    ("info", info),
]
