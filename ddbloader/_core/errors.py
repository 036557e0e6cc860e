"""Error context: notes that say which subquery, thread or argument an engine error came from."""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["add_note", "warn_caller"]


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
    package = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(1)
    level = 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, category, stacklevel=level)
