"""A cache of loaded traces: diagnosing the same file again skips reading it.

An entry is a folder holding each table of a :class:`~tracedx.trace.Trace` as an Arrow IPC file
(polars ``write_ipc``, LZ4-compressed) and ``trace.json`` with the Trace's metadata, warnings and
``steps_synthetic``. It is named by :func:`file_key`: the file's size, mtime, a SHA-256 of its
first and last 64 KiB, the tracedx version and the ``repair`` flag, so a changed file or another
tracedx never reuses an entry. Entries are written into a temporary sibling folder and renamed
into place (a reader never sees half an entry); an entry that cannot be read back is ignored and
rewritten.

The folder is ``$TRACEDX_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/tracedx`` (by default
``~/.cache/tracedx``, the XDG Base Directory specification's user cache folder); never next to
the trace. Nothing evicts entries: remove the folder to reclaim the space.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

ENV_VAR = "TRACEDX_CACHE_DIR"
EDGE_BYTES = 64 * 1024
"""Bytes hashed at each end of the file (a gzip file's last 8 bytes are its CRC-32 and size)."""
FORMAT = 1
"""The entry layout's version: a new layout never reads an old entry."""
META_NAME = "trace.json"


def cache_dir() -> Path:
    """The cache folder: ``$TRACEDX_CACHE_DIR``, else ``$XDG_CACHE_HOME/tracedx``, else
    ``~/.cache/tracedx``. Not created here."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "tracedx"


def file_key(path: str | os.PathLike, *, extra: str = "") -> str:
    """A 32-hex-digit key for a local file's content as it is now: its size, mtime (ns), a
    SHA-256 of its first and last :data:`EDGE_BYTES`, the tracedx version and ``extra``.

    Reads at most 128 KiB. Raises ``OSError`` when the file cannot be opened.
    """
    from tracedx import __version__

    st = os.stat(path)
    h = hashlib.sha256()
    h.update(f"{FORMAT}\0{__version__}\0{st.st_size}\0{st.st_mtime_ns}\0{extra}\0".encode())
    with open(path, "rb") as f:
        h.update(f.read(EDGE_BYTES))
        if st.st_size > EDGE_BYTES:
            f.seek(max(EDGE_BYTES, st.st_size - EDGE_BYTES))
            h.update(f.read(EDGE_BYTES))
    return h.hexdigest()[:32]


def entry_path(path: str | os.PathLike, *, repair: bool = False) -> Path:
    """Where the entry of ``path`` read with ``repair`` lives (it may not exist)."""
    return cache_dir() / file_key(path, extra=f"repair={bool(repair)}")


def _tables(trace) -> list[str]:
    import polars as pl

    return [
        f.name
        for f in dataclasses.fields(trace)
        if f.init and isinstance(getattr(trace, f.name), pl.DataFrame)
    ]


def read(path: str | os.PathLike, *, repair: bool = False):
    """The cached Trace of ``path``, or None when there is no usable entry (missing, written by
    another layout, or unreadable: the caller reads the file and :func:`write` replaces it)."""
    import polars as pl

    from tracedx.trace import Trace
    from tracedx.trace.tables import DataWarning

    try:
        entry = entry_path(path, repair=repair)
        with open(entry / META_NAME, encoding="utf-8") as f:
            doc = json.load(f)
        if doc.get("format") != FORMAT:
            return None
        tables = {n: pl.read_ipc(entry / f"{n}.arrow") for n in doc["tables"]}
        meta = doc["metadata"]
        meta["path"] = str(Path(path))
        return Trace(
            path=str(Path(path)),
            **tables,
            steps_synthetic=bool(doc["steps_synthetic"]),
            metadata=meta,
            warnings=[
                DataWarning(w["kind"], int(w["count"]), w["message"]) for w in doc["warnings"]
            ],
        )
    except Exception:  # a missing, partial or corrupt entry: read the file instead
        return None


def write(trace, path: str | os.PathLike, *, repair: bool = False) -> Path | None:
    """Store ``trace`` (loaded from ``path`` with ``repair``) as the entry of ``path``.

    Returns the entry's folder, or None when the Trace's metadata does not survive JSON
    unchanged (nothing is stored that would read back different). Raises ``OSError`` when the
    cache folder cannot be written.
    """
    doc = {
        "format": FORMAT,
        "tables": _tables(trace),
        "steps_synthetic": trace.steps_synthetic,
        "metadata": trace.metadata,
        "warnings": [dataclasses.asdict(w) for w in trace.warnings],
    }
    text = json.dumps(doc)
    if json.loads(text)["metadata"] != trace.metadata:
        return None
    entry = entry_path(path, repair=repair)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        for name in doc["tables"]:
            getattr(trace, name).write_ipc(tmp / f"{name}.arrow", compression="lz4")
        (tmp / META_NAME).write_text(text, encoding="utf-8")
        if entry.exists():  # an entry that could not be read: replaced
            shutil.rmtree(entry, ignore_errors=True)
        try:
            os.rename(tmp, entry)
        except OSError:
            if not (entry / META_NAME).exists():
                raise
            # another process stored the same entry first: keep theirs
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return entry


def load(path: str | os.PathLike, *, repair: bool = False, progress=None, on_note=None):
    """:func:`tracedx.load` through the cache: the stored Trace when there is one, else the file
    read and stored. ``on_note(message)`` hears one line when the cache is used or cannot be
    written. Returns ``(trace, hit)``; raises what :func:`tracedx.load` raises."""
    from tracedx.trace import load as load_file

    if not Path(path).is_file():
        return load_file(path, repair=repair, progress=progress), False
    cached = read(path, repair=repair)
    if cached is not None:
        if on_note:
            on_note(
                f"using the cached tables of {path} (in {cache_dir()}; --no-cache reads the file)"
            )
        return cached, True
    trace = load_file(path, repair=repair, progress=progress)
    try:
        write(trace, path, repair=repair)
    except OSError as e:
        if on_note:
            on_note(f"cannot write the cache in {cache_dir()}: {e.strerror or e}")
    return trace, False


__all__ = ["ENV_VAR", "cache_dir", "entry_path", "file_key", "load", "read", "write"]
