"""``python -m ddbloader demo``: the command-line entry point."""

from __future__ import annotations

import sys

from .demo import main


def _run(argv: list[str]) -> None:
    if not argv or argv[0] != "demo":
        sys.exit(
            "usage: python -m ddbloader demo [--steps N] [--symbols S] [--days D] [--rows R] [--factors F]"
        )
    main(argv[1:])


if __name__ == "__main__":
    _run(sys.argv[1:])
