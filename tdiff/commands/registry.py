"""Which subcommands `tdiff` offers. A command is listed here only once it really works."""

from tdiff.commands.clean import clean
from tdiff.commands.distill import distill
from tdiff.commands.eval import eval_cmd
from tdiff.commands.export import export
from tdiff.commands.info import info
from tdiff.commands.plot import plot
from tdiff.commands.sample import sample
from tdiff.commands.tokenize import tokenize
from tdiff.commands.train import train
from tdiff.commands.train_ar import train_ar
from tdiff.commands.train_vae import train_vae

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
