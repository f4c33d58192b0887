"""The Python API: `tdiff.load(path)` returns a DiffusionModel (model or student) or an ARModel
(train-ar directory), each with sample, generate, encode, decode and config. Above every library
layer, below the command line."""

from tdiff.api.loaded import ARModel, DiffusionModel, load

__all__ = ["ARModel", "DiffusionModel", "load"]
