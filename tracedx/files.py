"""Files named by the user (a trace, a calibration file): regular and readable, or one line.

:func:`regular_file` is the gate every reader passes first. It refuses what is not a regular
file without opening it (a FIFO would block the open or the read forever; ``/dev/zero`` and
other devices never end), and turns every ``OSError`` of the check (no such file, no
permission, a name too long, an I/O error) into the caller's one-line error, so the CLI exits 2
instead of reporting an internal error.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tracedx.errors import TraceError

CALIBRATION_MAX_BYTES = 1 << 20
"""The largest calibration file read (``tracedx calibrate`` writes a few KB)."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def regular_file(path: str | Path, what: str, error: type[TraceError]) -> os.stat_result:
    """Check that ``path`` is a regular file this process can read; returns its ``stat``.

    Args:
        path: the file (symlinks are followed).
        what: what the file is for the message ("trace", "calibration file").
        error: the TraceError subclass to raise.

    Raises:
        error: missing, not a regular file (directory, FIFO, device, socket), not readable
            (permissions), a name the system refuses (too long), or an I/O error; one line
            naming the file and the reason.
    """
    p = str(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise error(f"{p}: no such file" + ("" if what == "trace" else f" (the {what})")) from None
    except OSError as e:
        raise error(f"{p}: cannot read the {what}: {e.strerror or e}") from None
    noun = what if what.endswith("file") else f"{what} file"  # "calibration file", "trace file"
    if not stat.S_ISREG(st.st_mode):
        k = _kind(st.st_mode)
        sep = ", not" if k.startswith("a ") else ":"
        raise error(f"{p}: is {k}{sep} a {noun}" if sep != ":" else f"{p}: {k}")
    # open without blocking (the file could have been swapped for a FIFO since the stat)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise error(f"{p}: cannot read the {what}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"{p}: is not a regular file, not a {noun}")
        os.read(fd, 0)
    except OSError as e:
        raise error(f"{p}: cannot read the {what}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    return st


def read_capped(path: str | Path, what: str, error: type[TraceError], limit: int) -> bytes:
    """The bytes of a small file (a calibration file), at most ``limit`` of them.

    Raises ``error`` as :func:`regular_file` does, and when the file is larger than ``limit``.
    """
    regular_file(path, what, error)
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"{path}: cannot read the {what}: {e.strerror or e}") from None
    if len(data) > limit:
        raise error(f"{path}: the {what} is larger than {limit:,} bytes: not a {what}")
    return data


GZIP_MAGIC = b"\x1f\x8b"
"""The first two bytes of every gzip member (RFC 1952, section 2.3.1)."""


def json_start(head: bytes) -> bool:
    """Whether ``head`` (a file's first bytes) starts like a JSON document: ``{`` or ``[``
    after a UTF-8 byte-order mark, then whitespace (the order the reader takes them in)."""
    head = head[3:4096] if head[:3] == b"\xef\xbb\xbf" else head[:4096]
    return head.lstrip(b" \t\r\n")[:1] in (b"{", b"[")


def misnamed_gzip(path: str | Path) -> bool:
    """Whether ``path`` is named ``.gz`` but holds plain JSON (no gzip magic bytes): such a
    file is read as the JSON it is. False when it cannot be read (its reader says why)."""
    p = Path(path)
    if not p.name.lower().endswith(".gz"):
        return False
    try:
        with open(p, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head[:2] != GZIP_MAGIC and json_start(head)
