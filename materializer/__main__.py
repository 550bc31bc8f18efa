"""``python -m materializer``: the ``materializer`` command line."""

from materializer.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    main(prog_name="materializer")
