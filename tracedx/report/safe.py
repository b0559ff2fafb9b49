"""Output-time escaping of every string that comes from a trace or a path.

A trace is untrusted input: its device name, torch version, op and kernel names, file paths and
category names reach the terminal, markdown and stderr. :func:`term` is the one function that
makes such a string safe to print: control characters (C0, DEL, C1), Unicode format characters
(bidi overrides and isolates, zero-width marks), line and paragraph separators and lone
surrogates are written as visible ``\\xNN``/``\\uNNNN`` escapes, so no escape sequence reaches
the terminal (an ``ESC ] 0 ;`` retitling the window, a CR that overwrites a line with a fake
verdict). It also caps the length. :func:`safe_strings` applies it to every string of a report
document; the text, markdown and diff renderers render only what it returns (the header's
names, cut shorter, are :func:`term` of the document's own strings), and the CLI passes every
stderr line through :func:`term`. Each string goes through :func:`term` once: a second pass
would cut the first one's output and state its length, not the original's.

Markdown needs more, on strings :func:`term` already made safe: :func:`md_code` is an inline
code span that survives any content (its fence is longer than any backtick run inside,
CommonMark 6.1), and :func:`md_text` backslash-escapes the ASCII punctuation that could start a
link, image, emphasis, HTML or a heading (CommonMark 2.4: any ASCII punctuation may be
backslash-escaped), so ``<`` reads ``<`` rather than ``&lt;`` and a C++ template name renders
as written. :func:`md_prose` is :func:`md_text`
for tracedx's own sentences (notes, evidence, explanations), which mark a command to run as a
short `code span` (the terminal keeps one on a line): such a span becomes a markdown code span
(:func:`md_code`), everything around it is :func:`md_text`. A code span renders its content
literally, so a trace's text inside one stays inert.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

# The longest string a report prints in full: longer ones are cut, saying how long they were.
MAX_CHARS = 2000
# Names in a report's header lines (device, torch version, the trace's path).
HEADER_CHARS = 160

_UNSAFE = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs"))


def _escape_char(c: str) -> str:
    o = ord(c)
    if o < 0x100:
        return f"\\x{o:02x}"
    if o < 0x10000:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def term(s: Any, cap: int | None = MAX_CHARS) -> str:
    """``s`` as a string safe to print anywhere: no raw control, format or separator character
    (each is written as a visible escape), at most ``cap`` characters of the original kept
    (then ``…`` and the full length). Linear in ``min(len(s), cap)``."""
    s = s if isinstance(s, str) else str(s)
    cut = ""
    if cap is not None and len(s) > cap:
        cut = f"…({len(s):,} characters)"
        s = s[: max(cap - 1, 0)]
    if not s.isprintable():  # fast path: almost every string is printable
        s = "".join(
            _escape_char(c)
            if not c.isprintable() and c != " " and unicodedata.category(c) in _UNSAFE
            else c
            for c in s
        )
    return s + cut


def safe_strings(x: Any, cap: int | None = MAX_CHARS) -> Any:
    """A copy of a report document (dicts, lists, scalars) with :func:`term` applied to every
    string, keys included. Numbers, booleans and None are kept as they are."""
    if isinstance(x, str):
        return term(x, cap)
    if isinstance(x, dict):
        return {
            (term(k, cap) if isinstance(k, str) else k): safe_strings(v, cap) for k, v in x.items()
        }
    if isinstance(x, (list, tuple)):
        return [safe_strings(v, cap) for v in x]
    return x


_BACKTICKS = re.compile(r"`+")
_MD_PUNCT = re.compile(r"([\\`*_\[\]<>#!|&~])")


def md_code(s: Any, table: bool = True) -> str:
    """An inline markdown code span holding ``s`` literally, whatever it contains: the fence is
    one backtick longer than the longest run inside, with a space inside each end when the
    content starts or ends with a backtick (CommonMark 6.1). In a table cell (``table``),
    ``|`` is escaped, which GFM undoes inside code spans. ``s`` is already safe (:func:`term`):
    no line break can end the span."""
    s = _safe(s)
    longest = max((len(m) for m in _BACKTICKS.findall(s)), default=0)
    fence = "`" * (longest + 1)
    if table:
        s = s.replace("|", "\\|")
    pad = " " if s.startswith(("`", " ")) or s.endswith(("`", " ")) else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def _safe(s: Any) -> str:
    """``s`` as a string, escaped by :func:`term` (uncut) only if it holds a character that is
    not printable: a guard for a caller that passes a string not made safe first, which
    leaves an already safe one (the reports' every string) as it is."""
    s = str(s)
    return s if s.isprintable() else term(s, None)


def md_text(s: Any) -> str:
    """Markdown prose holding ``s`` as plain text: the punctuation that could make a link, an
    image, emphasis, inline HTML, an entity, a heading or a table cell is backslash-escaped.
    ``s`` is already safe (:func:`term`)."""
    return _MD_PUNCT.sub(r"\\\1", _safe(s))


# a `code span` of tracedx's prose: 1-60 characters, no backtick or line break, not starting or
# ending with a space (the terminal's rule for a command kept on one line, tracedx.console),
# its backticks single ones (two spans back to back would make a double one)
_PROSE_CODE = re.compile(r"(?<!`)`([^`\s](?:[^`\n]{0,58}[^`\s])?)`(?!`)")


def md_prose(s: Any, table: bool = False) -> str:
    """Markdown holding one of tracedx's sentences (``s``): each short `code span` in it
    (1-60 characters, no backtick inside, no space at either end) as a markdown code span
    (:func:`md_code`; ``table``: in a table cell), the rest as :func:`md_text`. A backtick that
    opens no such span is escaped, as :func:`md_text` escapes it. ``s`` is already safe
    (:func:`term`)."""
    s = _safe(s)
    out, pos = [], 0
    for m in _PROSE_CODE.finditer(s):
        out += [md_text(s[pos : m.start()]), md_code(m[1], table=table)]
        pos = m.end()
    out.append(md_text(s[pos:]))
    return "".join(out)
