"""The version of oxbench (the package's ``__version__``; pyproject.toml says the same)."""

__version__ = "0.1.0"
