"""Lowest layer: errors and exit codes, seeds, devices and dtypes, logging, worker pools, memory
estimates, the option choices, the version. Imports nothing else of tdiff.
"""
