"""`conch`: the command line client of Conch's REST API, for CI pipelines and shells (no Django inside)."""

__version__ = "0.1.0"
