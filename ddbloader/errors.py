"""Error context: notes that say which subquery, thread or argument an engine error came from."""

from __future__ import annotations

__all__ = ["add_note"]


def add_note(error: BaseException, note: str) -> None:
    """Attach ``note`` to ``error`` once (PEP 678); on Python 3.10 store it where 3.11 would."""
    notes: list[str] = list(getattr(error, "__notes__", None) or [])
    if note in notes:
        return
    error.__notes__ = [*notes, note]  # type: ignore[attr-defined]
