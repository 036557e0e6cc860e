"""``python -m ddbloader``: the command line a first-time user types."""

from __future__ import annotations

import subprocess
import sys

from ddbloader.__main__ import parser


def test_help_exits_zero_and_lists_every_option() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ddbloader", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    options = [o for action in parser()._actions for o in action.option_strings]
    assert len(options) > 5
    for option in [*options, "demo"]:
        assert option in done.stdout


def test_an_unknown_command_exits_with_usage() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ddbloader", "train"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert "invalid choice: 'train'" in done.stderr
