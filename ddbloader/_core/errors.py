"""Error context: notes that say which subquery, thread, argument or step an error came from."""

from __future__ import annotations

import os
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["PACKAGE_DIR", "add_note", "step_name", "warn_caller"]

#: The ddbloader package's directory: frames inside it are ddbloader's, the first one outside is the user's.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def add_note(error: BaseException, note: str) -> None:
    """Attach ``note`` to ``error`` once (PEP 678); on Python 3.10 store it where 3.11 would."""
    notes: list[str] = list(getattr(error, "__notes__", None) or [])
    if note in notes:
        return
    error.__notes__ = [*notes, note]  # type: ignore[attr-defined]


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn, attributing the warning to the first frame outside the ddbloader package.

    A fixed ``stacklevel`` breaks whenever the call depth inside the package changes; this points
    at the user's line (their script or notebook cell) however deep the warning was raised.
    """
    frame = sys._getframe(1)
    level = 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(PACKAGE_DIR + os.sep):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, category, stacklevel=level)


def step_name(step: Callable[..., Any]) -> str:
    """How messages name a transform step: a function by its qualified name, a helper by its repr."""
    if isinstance(step, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return step.__qualname__
    return repr(step)
