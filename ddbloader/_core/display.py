"""What a loader shows a person: tables as text and HTML, progress bars, and readable errors.

It knows no loader type (a plan's rows come from :mod:`ddbloader._diagnostics.summary`), so every module may
use it. Rendering a plan reads only the cached plan (counts, layout, config): it never queries the
engine, so ``repr(loader)`` is instant and free whatever the table size. Errors raised out of the
loader's background threads get a compact rendering in IPython/Jupyter (the message, the notes
naming the subquery and the thread, the two frames that matter), because the default rendering
is a wall of thread frames with the cause at the very end; plain Python's traceback is unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import html
import importlib.util
import os
import sys
import traceback
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .errors import PACKAGE_DIR

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = [
    "CELL_STYLE",
    "LABEL_STYLE",
    "PROGRESS_DELAY_SECONDS",
    "compact_traceback",
    "html_rows",
    "html_table",
    "human_bytes",
    "plan_html",
    "plan_text",
    "progress_bar",
    "readable_in_notebooks",
]

#: A phase shorter than this shows no bar at all, so quick loaders stay silent.
PROGRESS_DELAY_SECONDS = 1.0


_TABLE_STYLE = "border-collapse:collapse;font-size:0.9em;text-align:left"
#: Style of every table cell (stats.py draws its starvation bar in a cell of the same style).
CELL_STYLE = "padding:2px 12px 2px 0;text-align:left;vertical-align:top"
#: Labels never wrap; values (a verdict, a column list) may.
LABEL_STYLE = CELL_STYLE + ";white-space:nowrap"


def human_bytes(n: float) -> str:
    """``n`` bytes with a decimal unit and three significant digits: ``'512 B'``, ``'12.3 kB'``."""
    units = ("B", "kB", "MB", "GB", "TB")
    value, index = float(n), 0
    while value >= 1000 and index < len(units) - 1:
        value /= 1000
        index += 1
    if index == 0:
        return f"{value:.0f} B"
    digits = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{digits}f} {units[index]}"


def plan_text(rows: list[tuple[str, str]]) -> str:
    return "DDBDataLoader(" + ", ".join(f"{label}: {value}" for label, value in rows) + ")"


def html_rows(rows: Iterable[tuple[str, str]]) -> str:
    """Table rows of (label, value), both escaped."""
    return "".join(
        f"<tr><th style='{LABEL_STYLE}'>{html.escape(label)}</th>"
        f"<td style='{CELL_STYLE}'>{html.escape(value)}</td></tr>"
        for label, value in rows
    )


def html_table(caption: str, body: str) -> str:
    """A two-column table around ``body`` (trusted HTML rows, see :func:`html_rows`)."""
    return (
        f"<table style='{_TABLE_STYLE}'>"
        f"<caption style='text-align:left;font-weight:bold;padding-bottom:4px'>{html.escape(caption)}"
        f"</caption>{body}</table>"
    )


def plan_html(rows: list[tuple[str, str]], columns: dict[str, Any]) -> str:
    """An HTML table of the plan, then the x and y column names (long lists shortened)."""
    names = []
    for key, given in columns.items():
        values = [str(v) for v in given]
        shown = ", ".join(values[:12]) + (f", … ({len(values)} columns)" if len(values) > 12 else "")
        names.append((f"{key} columns", shown))
    return html_table("DDBDataLoader", html_rows([*rows, *names]))


def progress_bar(desc: str, unit: str, enabled: bool) -> tqdm:
    """A bar that appears only once its phase has lasted :data:`PROGRESS_DELAY_SECONDS`.

    A notebook widget when ipywidgets is installed, text on stderr otherwise (``tqdm.auto``
    would warn in a notebook without ipywidgets). Disabled bars cost nothing and print nothing.
    """
    from tqdm.std import tqdm as text_bar

    bar_class: type[tqdm] = text_bar
    if enabled and _in_notebook() and importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.notebook import tqdm as widget_bar

        bar_class = widget_bar
    return bar_class(desc=desc, unit=unit, delay=PROGRESS_DELAY_SECONDS, disable=not enabled, leave=False)


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (IPython is imported there already; never import it here)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and "IPKernelApp" in shell.config


def compact_traceback(error: BaseException) -> list[str]:
    """The lines IPython shows for ``error`` instead of its full traceback.

    Order: the exception type, the PEP 678 notes (which name the subquery, its parameters and
    the thread), then the cause (the message, and a chained exception), then two frames: where
    the error was raised and the user's line that received it, and how to print the full
    traceback. Without notes the first line is the usual ``Type: message``.
    """
    red, bold, reset = "\x1b[1;31m", "\x1b[1m", "\x1b[0m"
    notes = getattr(error, "__notes__", None) or []
    if notes:
        lines = [f"{red}{type(error).__name__}{reset} in ddbloader:"]
        lines += [f"{bold}↳ {note}{reset}" for note in notes]
        lines.append(f"cause: {error}")
    else:
        lines = [f"{red}{type(error).__name__}{reset}: {error}"]
    cause = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    if cause is not None:
        lines.append(f"caused by {type(cause).__name__}: {cause}")
    frames = traceback.extract_tb(error.__traceback__)
    if frames:
        raised = frames[-1]
        lines.append(f"raised at {_place(raised.filename)}:{raised.lineno} in {raised.name}")
        caller = _caller(frames)
        if caller is not None:
            lines.append(
                f"reached your code at {_place(caller.filename)}, line {caller.lineno}: {caller.line or ''}"
            )
        lines.append(
            f"({len(frames)} frames hidden by ddbloader; the full traceback: "
            "import sys, traceback; traceback.print_exception(sys.last_value))"
        )
    return lines


def _place(filename: str) -> str:
    """``Cell In[7]`` for a notebook cell, a path relative to its import root for a module."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    name = getattr(getattr(shell, "compile", None), "format_code_name", lambda _: None)(filename)
    if name:
        return f"{name[0]} {name[1]}"
    roots = sorted((p for p in sys.path if p and filename.startswith(p + os.sep)), key=len, reverse=True)
    return os.path.relpath(filename, roots[0]) if roots else filename


def _caller(frames: traceback.StackSummary) -> traceback.FrameSummary | None:
    """The last frame before the first one inside ddbloader: the user's call."""
    caller = None
    for frame in frames:
        if os.path.abspath(frame.filename).startswith(PACKAGE_DIR + os.sep):
            return caller
        caller = frame
    return None


def readable_in_notebooks(error: BaseException) -> None:
    """Make IPython render ``error`` with :func:`compact_traceback` (its ``_render_traceback_``
    hook); elsewhere the error and its traceback are unchanged. ``KeyboardInterrupt`` and other
    non-``Exception`` errors keep IPython's rendering."""
    if not isinstance(error, Exception):
        return
    # An exception type with __slots__ refuses the attribute and keeps IPython's rendering.
    with contextlib.suppress(AttributeError):
        error._render_traceback_ = functools.partial(compact_traceback, error)  # type: ignore[attr-defined]
