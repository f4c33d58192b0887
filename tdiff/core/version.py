"""The running version of tdiff, stored in every artifact it writes."""

__version__ = "0.1.0"
