"""``python -m oxbench`` is the ``oxbench`` command."""

from oxbench.cli import main

if __name__ == "__main__":
    main()
