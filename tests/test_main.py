"""``python -m ddbloader``: the command line a first-time user types."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddbloader.__main__ import main, parser


def test_help_exits_zero_and_lists_every_option() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ddbloader", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    options = [o for action in parser()._actions for o in action.option_strings]
    assert len(options) > 5
    for option in [*options, "demo"]:
        assert option in done.stdout


def test_an_unknown_command_exits_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """In this process: the help test above runs ``python -m ddbloader`` itself."""
    with pytest.raises(SystemExit) as exited:
        main(["train"])
    assert exited.value.code == 2
    assert "invalid choice: 'train'" in capsys.readouterr().err
