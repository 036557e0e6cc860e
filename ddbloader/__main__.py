"""``python -m ddbloader demo``: the command-line entry point (``--help`` lists every option)."""

from __future__ import annotations

import argparse
import sys

from . import demo


def parser() -> argparse.ArgumentParser:
    """The command line: one command, ``demo``, and its options."""
    command_line = argparse.ArgumentParser(
        prog="python -m ddbloader",
        description="ddbloader's command line. demo: build a factor table in embedded DuckDB and "
        "train a small forecaster on it through DDBDataLoader, printing windows/s and the loss.",
    )
    command_line.add_argument("command", choices=["demo"], help="what to run")
    demo.add_arguments(command_line)
    return command_line


def main(argv: list[str]) -> None:
    """Parse ``argv`` (``--help`` prints the options and exits 0) and run the command."""
    demo.run(parser().parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
