"""Lines for the terminal: how wide they may be, and wrapping them to that width.

Every line tracedx writes to a terminal (the text reports on stdout, the notes, errors and gate
lines on stderr, ``--help``) is fitted to the width of the stream it goes to: the terminal's
when the stream is one, else :data:`WIDTH` columns (a CI log, a file, a pipe). Light on
purpose (no polars): ``tracedx capture`` prints through it from inside the user's script.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap

WIDTH = 100
"""Columns of a line where the stream is not a terminal (its width is unknown)."""

MIN_WIDTH = 60
"""The narrowest width lines are fitted to, however narrow the terminal says it is."""

_ITEM = re.compile(r"^(\s*)(- |\d+\. |[A-Za-z][A-Za-z ]{2,13}(?=  ))")
# a short `code span` (a command to run) is kept on one line
_CODE = re.compile(r"`[^`\n]{1,60}`")
# a number is kept on one line with its unit ("0.25 s", "2 GiB")
_UNIT = re.compile(r"(?<=\d) (?=(?:ns|us|µs|ms|s|B|KB|MB|GB|KiB|MiB|GiB|bytes|GB/s|TB/s|TFLOPS)\b)")
_GLUE = "\x00"  # never in a line: every string printed went through safe.term, which escapes it


def columns(stream=None) -> int:
    """The width to fit lines written to ``stream`` (``sys.stdout`` by default) to: the
    terminal's when ``stream`` is one (``$COLUMNS`` when set, as :func:`shutil.get_terminal_size`
    reads it; at least :data:`MIN_WIDTH`), else :data:`WIDTH`."""
    stream = sys.stdout if stream is None else stream
    try:
        if not stream.isatty():
            return WIDTH
    except (AttributeError, ValueError, OSError):  # closed, detached or not a file
        return WIDTH
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        cols = int(env)
    else:
        try:
            # a pseudo-terminal whose size was never set says 0 columns: not a narrow one
            cols = os.get_terminal_size(stream.fileno()).columns or WIDTH
        except (AttributeError, ValueError, OSError):
            cols = WIDTH
    return max(cols, MIN_WIDTH)


def fit(text: str, width: int = WIDTH) -> str:
    """Wrap every line longer than ``width`` at spaces; continuation lines are indented under
    the line's text (after a ``- `` or ``1. `` bullet, or a row label), else by 4 columns. A
    word longer than the width (a kernel name, a path) is left whole on its own line, and so is a
    short `code span` (a command to copy); a number keeps its unit on its line."""
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        m = _ITEM.match(line)
        lead = len(line) - len(line.lstrip())
        if m and m.group(2).strip() and not m.group(2)[0].isalpha():
            hang = len(m.group(1)) + len(m.group(2))
        elif m:  # a row label: "  step time      12.3 ms ..."
            hang = len(line) - len(line[m.end() :].lstrip())
        else:
            hang = lead + 4
        hang = min(hang, width // 2)
        glued = _CODE.sub(lambda c: c.group().replace(" ", _GLUE), line)
        glued = _UNIT.sub(_GLUE, glued)
        wrapped = textwrap.wrap(
            glued, width, subsequent_indent=" " * hang, break_long_words=False,
            break_on_hyphens=False,
        ) or [glued]  # fmt: skip
        out += [w.replace(_GLUE, " ") for w in wrapped]
    return "\n".join(out)


def fit_to(text: str, stream=None) -> str:
    """``text`` fitted (:func:`fit`) to the width of ``stream`` (:func:`columns`): a message
    stays one message, its continuation lines indented by 4 columns."""
    return fit(text, columns(stream))


__all__ = ["MIN_WIDTH", "WIDTH", "columns", "fit", "fit_to", "plural"]


def plural(n: int, word: str) -> str:
    """``1 rank``, ``2 ranks``: ``n`` and ``word``, with an ``s`` unless ``n`` is 1."""
    return f"{n} {word}" + ("" if n == 1 else "s")
