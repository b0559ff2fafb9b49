"""A cache of loaded traces and of their diagnoses: diagnosing the same file again reads neither.

An entry is a folder holding each table of a :class:`~tracedx.trace.Trace` as an Arrow IPC file
(polars ``write_ipc``, LZ4-compressed) and ``trace.json`` with the Trace's metadata, warnings and
``steps_synthetic``. It is named by :func:`file_key`: the file's size, mtime, a SHA-256 of its
first and last 64 KiB, the tracedx version, the size and mtime of tracedx's own source files (an
edited checkout keeps its version) and the ``repair`` flag, so a changed file or another tracedx
never reuses an entry. Entries are written into a temporary sibling folder and renamed into
place (a reader never sees half an entry); an entry that cannot be read back is ignored and
rewritten.

An entry also keeps the diagnoses made from it, one per set of analysis options
(:func:`result_key`: ``--device``, ``--peak-tflops``, ``--bandwidth-gbs``, ``--calibration``
by path and content, ``--steps`` and the trace's path as given), as two files:

- ``result-KEY.json``: the ``tracedx.diagnosis/1`` document (:meth:`Diagnosis.to_dict`), what
  the text, JSON and markdown reports render from, read without polars or numpy;
- ``result-KEY.pickle``: the :class:`~tracedx.analysis.diagnosis.Diagnosis` itself (for HTML,
  figures and gates), pickled (the standard library's ``pickle``) without its Trace: on reading
  it back, its ``trace`` is a :class:`~tracedx.trace.lazy.LazyTrace` whose tables are read from the entry's IPC files
  only when first used. A pickle runs code when read, so one is read only from a cache folder
  and entry that this user owns and nobody else can write (the folder is created with mode
  0o700); a pickle of another tracedx or polars, or one that fails to read, is a miss.

Each file is written to a temporary name and renamed into place. A result that cannot be read
back is a miss: the diagnosis runs again and replaces it; it never changes an answer.

The folder is ``$TRACEDX_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/tracedx`` (by default
``~/.cache/tracedx``, the XDG Base Directory specification's user cache folder); never next to
the trace. The folder is kept under a size cap (:func:`max_bytes`: 5 GiB unless
``$TRACEDX_CACHE_MAX_MB`` says otherwise): after each entry is stored, the least recently used
entries are removed until the rest fit (:func:`prune`; an entry is used when it is stored or
read). An entry removed while another command reads it is a miss there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tracedx.files import CALIBRATION_MAX_BYTES  # a larger calibration is not keyed

ENV_VAR = "TRACEDX_CACHE_DIR"
EDGE_BYTES = 64 * 1024
"""Bytes hashed at each end of the file (a gzip file's last 8 bytes are its CRC-32 and size)."""
FORMAT = 2
"""The entry layout's version: a new layout never reads an old entry."""
META_NAME = "trace.json"
RESULT_PREFIX = "result-"
DIR_MODE = 0o700
MAX_ENV = "TRACEDX_CACHE_MAX_MB"
DEFAULT_MAX_BYTES = 5 * 1024**3
"""The cache's size cap unless ``$TRACEDX_CACHE_MAX_MB`` is set (ccache's default ``max_size``
is the same 5 GB: ccache manual, "Configuration options"). A 1 GB trace's entry is about
100 MB."""
_STALE_TMP_S = 3600  # a temporary folder this old was left by a command that did not finish


def cache_dir() -> Path:
    """The cache folder: ``$TRACEDX_CACHE_DIR``, else ``$XDG_CACHE_HOME/tracedx``, else
    ``~/.cache/tracedx``. Not created here."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "tracedx"


_CODE: list[str] = []


def code_fingerprint() -> str:
    """A SHA-256 (hex) over the installed polars, msgspec and numpy (their ``__init__`` files'
    path, size and mtime), Python's version, and the relative path, size and mtime (ns) of
    every ``.py`` file of the tracedx package being run: an upgraded library, or an edited
    install (``pip install -e``) that keeps its version number, must not reuse what other code
    computed. Stats about a hundred files (about a millisecond); computed once per process."""
    if not _CODE:
        root = Path(__file__).resolve().parent
        h = hashlib.sha256()
        # the libraries the tables and the analysis are computed with (their installed files,
        # found without importing them: an upgrade rewrites them), and the interpreter
        from importlib.util import find_spec

        for name in ("polars", "msgspec", "numpy"):
            spec = find_spec(name)
            origin = spec.origin if spec is not None else None
            st = os.stat(origin) if origin and os.path.exists(origin) else None
            h.update(f"{name}\0{origin}\0{st and (st.st_size, st.st_mtime_ns)}\0".encode())
        h.update(f"{sys.version_info[:3]}\0".encode())
        for folder, dirs, files in sorted(os.walk(root)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    st = os.stat(os.path.join(folder, name))
                    rel = os.path.relpath(os.path.join(folder, name), root)
                    h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        _CODE.append(h.hexdigest())
    return _CODE[0]


def file_key(path: str | os.PathLike, *, extra: str = "") -> str:
    """A 32-hex-digit key for a local file's content as it is now: its size, mtime (ns), a
    SHA-256 of its first and last :data:`EDGE_BYTES`, the tracedx version and source files
    (:func:`code_fingerprint`) and ``extra``.

    Reads at most 128 KiB. Raises ``OSError`` when the file cannot be opened.
    """
    from tracedx import __version__

    st = os.stat(path)
    h = hashlib.sha256()
    h.update(
        f"{FORMAT}\0{__version__}\0{code_fingerprint()}\0{st.st_size}\0{st.st_mtime_ns}\0"
        f"{extra}\0".encode()
    )
    with open(path, "rb") as f:
        h.update(f.read(EDGE_BYTES))
        if st.st_size > EDGE_BYTES:
            f.seek(max(EDGE_BYTES, st.st_size - EDGE_BYTES))
            h.update(f.read(EDGE_BYTES))
    return h.hexdigest()[:32]


def entry_path(path: str | os.PathLike, *, repair: bool = False) -> Path:
    """Where the entry of ``path`` read with ``repair`` lives (it may not exist)."""
    return cache_dir() / file_key(path, extra=f"repair={bool(repair)}")


def max_bytes() -> int:
    """The cache's size cap in bytes: ``$TRACEDX_CACHE_MAX_MB`` (MiB, a number >= 0; 0 stores
    nothing) when set, else :data:`DEFAULT_MAX_BYTES`. Raises ``ValueError`` (one line) for a
    value that is not such a number."""
    v = os.environ.get(MAX_ENV, "").strip()
    if not v:
        return DEFAULT_MAX_BYTES
    try:
        mib = float(v)
    except ValueError:
        mib = -1.0
    if not (mib >= 0 and mib != float("inf")):
        raise ValueError(f"{MAX_ENV}={v!r} is not a size in MiB (a number >= 0)")
    return int(mib * 1024**2)


def _cap() -> int:
    """:func:`max_bytes`, or the default for a value it refuses (:func:`load` says so)."""
    try:
        return max_bytes()
    except ValueError:
        return DEFAULT_MAX_BYTES


def _size(folder: Path) -> int:
    total = 0
    for f in os.scandir(folder):
        with contextlib.suppress(OSError):
            total += f.stat(follow_symlinks=False).st_size
    return total


def _touch(entry: Path) -> None:
    """Mark ``entry`` used now (its folder's mtime: what :func:`prune` orders by)."""
    with contextlib.suppress(OSError):
        os.utime(entry)


def prune(keep: Path | None = None, limit: int | None = None) -> int:
    """Remove the least recently used entries of the cache folder until the others add up to
    ``limit`` bytes (default :func:`max_bytes`); ``keep`` (the entry just stored) goes last,
    only when it alone is over the limit (then it alone is removed). Also removes temporary folders over an hour old (a
    write that was killed). Returns the bytes removed. Errors (a folder another command
    removes meanwhile) are skipped."""
    limit = _cap() if limit is None else limit
    root = cache_dir()
    entries: list[tuple[bool, float, int, Path]] = []
    freed = 0
    try:
        listing = list(os.scandir(root))
    except OSError:
        return 0
    now = time.time()
    for d in listing:
        try:
            if not d.is_dir(follow_symlinks=False):
                continue
            mtime = d.stat(follow_symlinks=False).st_mtime
            if d.name.startswith("."):
                if now - mtime > _STALE_TMP_S:
                    shutil.rmtree(d.path, ignore_errors=True)
                continue
            path = Path(d.path)
            entries.append((path == keep, mtime, _size(path), path))
        except OSError:
            continue
    kept = [e for e in entries if e[0]]
    if kept and kept[0][2] > limit:  # over the cap alone: it goes, and the others stay
        shutil.rmtree(kept[0][3], ignore_errors=True)
        return kept[0][2]
    total = sum(e[2] for e in entries)
    for _, _, size, folder in sorted(entries, key=lambda e: e[:2]):
        if total <= limit:
            break
        shutil.rmtree(folder, ignore_errors=True)
        total -= size
        freed += size
    return freed


def _tables(trace) -> list[str]:
    import polars as pl

    return [
        f.name
        for f in dataclasses.fields(trace)
        if f.init and isinstance(getattr(trace, f.name), pl.DataFrame)
    ]


def _lazy_trace(entry: Path, path: str | os.PathLike, repair: bool):
    """The entry's :class:`~tracedx.trace.lazy.LazyTrace`, no table read yet (raises when
    ``trace.json`` is unusable)."""
    from tracedx.trace.lazy import LazyTrace
    from tracedx.trace.tables import DataWarning

    with open(entry / META_NAME, encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("format") != FORMAT:
        raise ValueError("another entry layout")
    meta = doc["metadata"]
    meta["path"] = str(Path(path))
    return LazyTrace.of_entry(
        entry,
        [str(n) for n in doc["tables"]],
        path=str(Path(path)),
        repair=repair,
        steps_synthetic=bool(doc["steps_synthetic"]),
        metadata=meta,
        warnings=[DataWarning(w["kind"], int(w["count"]), w["message"]) for w in doc["warnings"]],
    )


def read(path: str | os.PathLike, *, repair: bool = False, lazy: bool = False):
    """The cached Trace of ``path``, or None when there is no usable entry (missing, written by
    another layout, or unreadable: the caller reads the file and :func:`write` replaces it).
    With ``lazy``, a :class:`~tracedx.trace.lazy.LazyTrace` that reads each table when first
    used."""
    try:
        entry = entry_path(path, repair=repair)
        trace = _lazy_trace(entry, path, repair)
        if not lazy:
            trace.read_all()
        _touch(entry)
        return trace
    except Exception:  # a missing, partial or corrupt entry: read the file instead
        return None


def _private(folder: Path) -> bool:
    """Whether ``folder`` is this user's and nobody else may write to it (no check where the
    platform has no user ids)."""
    if not hasattr(os, "getuid"):
        return True
    st = os.stat(folder)
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def write(
    trace,
    path: str | os.PathLike,
    *,
    repair: bool = False,
    entry: Path | None = None,
    on_note=None,
) -> Path | None:
    """Store ``trace`` (loaded from ``path`` with ``repair``) as the entry of ``path``.

    ``entry``: :func:`entry_path` of ``path`` taken before it was read; when the file's key
    is no longer that (the file changed while it was read), nothing is stored.

    Returns the entry's folder, or None when the file changed, the Trace's metadata does not
    survive JSON unchanged (nothing is stored that would read back different), the cap
    (:func:`max_bytes`) is 0, or the entry alone is over it (then it is removed). Raises
    ``OSError`` when the cache folder cannot be written.
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
    now = entry_path(path, repair=repair)
    if (entry is not None and now != entry) or _cap() == 0:
        return None
    entry = now
    entry.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
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
    _touch(entry)  # another process's entry, kept: used now
    size = _size(entry)
    prune(keep=entry)
    if entry.is_dir():
        return entry
    if on_note:
        on_note(
            f"the cached tables of {path} ({size / 2**20:.1f} MiB) are over the cache's cap "
            f"({_cap() / 2**20:.1f} MiB, {MAX_ENV}): not kept"
        )
    return None


def load(path: str | os.PathLike, *, repair: bool = False, progress=None, on_note=None):
    """:func:`tracedx.load` through the cache: the stored Trace when there is one, else the file
    read and stored. ``on_note(message)`` hears one line when the cache cannot be written.
    Returns ``(trace, hit)`` (``hit``: the tables came from the cache); raises what
    :func:`tracedx.load` raises."""
    from tracedx.trace import load as load_file

    if not Path(path).is_file():
        return load_file(path, repair=repair, progress=progress), False
    try:
        max_bytes()
    except ValueError as e:
        if on_note:
            on_note(f"{e}: the cache is kept under {DEFAULT_MAX_BYTES // 1024**3} GiB")
    cached = read(path, repair=repair)
    if cached is not None:
        return cached, True
    try:
        before = entry_path(path, repair=repair)  # the key of what is about to be read
    except OSError:
        before = None
    trace = load_file(path, repair=repair, progress=progress)
    try:
        stored = before is not None and write(
            trace, path, repair=repair, entry=before, on_note=on_note
        )
        if (
            not stored
            and on_note
            and before is not None
            and entry_path(path, repair=repair) != before
        ):
            on_note(f"{path} changed while it was read: its tables were not cached")
    except OSError as e:
        if on_note:
            on_note(f"cannot write the cache in {cache_dir()}: {e.strerror or e}")
    return trace, False


def result_key(path: str | os.PathLike, options: Mapping[str, Any]) -> str | None:
    """A 32-hex-digit key for one diagnosis of ``path`` within its entry: the analysis
    ``options`` as :func:`tracedx.analysis.diagnosis.diagnose` takes them (``device``,
    ``peak_tflops``, ``bandwidth_gbs``, ``calibration``, ``steps``), the content of the
    calibration file when one is named (a re-run ``tracedx calibrate`` misses), and ``path`` as
    given (the report prints it). None when the calibration is not a regular file that can be
    read, or is over :data:`CALIBRATION_MAX_BYTES`: nothing is cached, and the diagnosis says
    what is wrong."""
    opts = dict(sorted(options.items()))
    cal = opts.get("calibration")
    if cal is not None:
        try:
            if not os.path.isfile(cal):  # a pipe read here would be empty for the diagnosis
                return None
            with open(cal, "rb") as f:
                data = f.read(CALIBRATION_MAX_BYTES + 1)
        except (OSError, TypeError, ValueError):
            return None
        if len(data) > CALIBRATION_MAX_BYTES:
            return None
        opts["calibration"] = [str(cal), hashlib.sha256(data).hexdigest()]
    text = json.dumps([str(Path(path)), opts], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _result_paths(entry: Path, key: str) -> tuple[Path, Path]:
    return entry / f"{RESULT_PREFIX}{key}.json", entry / f"{RESULT_PREFIX}{key}.pickle"


def read_result_doc(path: str | os.PathLike, key: str, *, repair: bool = False):
    """The cached diagnosis document (``tracedx.diagnosis/1``, a dict) of ``path`` under
    ``key``, or None when there is none or it cannot be read back. Imports neither polars nor
    numpy."""
    try:
        doc_path, _ = _result_paths(entry_path(path, repair=repair), key)
        with open(doc_path, encoding="utf-8") as f:
            rec = json.load(f)
        if rec.get("format") != FORMAT or rec.get("key") != key:
            return None
        doc = rec["doc"]
        if not (isinstance(doc, dict) and doc.get("schema")):
            return None
        _touch(doc_path.parent)
        return doc
    except Exception:  # missing or damaged: a miss
        return None


class _Pickler(pickle.Pickler):
    """Pickles a Diagnosis with every reference to a Trace left out (read back lazily)."""

    def persistent_id(self, obj):
        from tracedx.trace import Trace

        return "trace" if isinstance(obj, Trace) else None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, trace):
        super().__init__(file)
        self._trace = trace

    def persistent_load(self, pid):
        if pid != "trace":
            raise pickle.UnpicklingError(f"unknown reference {pid!r}")
        return self._trace


def read_result(path: str | os.PathLike, key: str, *, repair: bool = False, on_note=None):
    """The cached :class:`~tracedx.analysis.diagnosis.Diagnosis` of ``path`` under ``key``,
    its ``trace`` a :class:`~tracedx.trace.lazy.LazyTrace`; None when there is none, when it cannot be read back,
    or when the cache folder or entry is not this user's alone (a pickle runs code: then
    ``on_note(message)`` hears why, and what to run)."""
    try:
        entry = entry_path(path, repair=repair)
        if not _result_paths(entry, key)[1].is_file():
            return None
        for folder in (entry.parent, entry):
            if not _private(folder):
                if on_note:
                    on_note(
                        f"{folder} is not this user's alone (others can write to it): cached "
                        f"diagnoses are not read from it (chmod 700 {folder} to reuse them)"
                    )
                return None
        _, pickle_path = _result_paths(entry, key)
        trace = _lazy_trace(entry, path, repair)
        with open(pickle_path, "rb") as f:
            rec = _Unpickler(f, trace).load()
        if not (isinstance(rec, dict) and rec.get("format") == FORMAT and rec.get("key") == key):
            return None
        diag = rec["diagnosis"]
        if getattr(diag, "trace", None) is not trace:
            return None
        _touch(entry)
        return diag
    except Exception:  # missing, damaged, or written by another polars: a miss
        return None


def _replace_file(target: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_result(
    path: str | os.PathLike,
    key: str,
    doc: dict,
    diagnosis,
    *,
    repair: bool = False,
    entry: Path | None = None,
) -> bool:
    """Store a diagnosis of ``path`` under ``key`` in its entry: ``doc`` (its
    :meth:`~tracedx.analysis.diagnosis.Diagnosis.to_dict`) and the Diagnosis, its Trace left
    out. Stores nothing and returns False when there is no entry (its tables were not cached),
    when ``doc`` does not survive JSON unchanged (it would render differently) or when the
    Diagnosis does not pickle, and when ``entry`` (:func:`entry_path` taken before the trace
    was read) is no longer the file's (it changed since). Raises ``OSError`` when the entry
    cannot be written."""
    now = entry_path(path, repair=repair)
    if (entry is not None and now != entry) or not (now / META_NAME).is_file():
        return False
    entry = now
    try:
        text = json.dumps({"format": FORMAT, "key": key, "doc": doc}, allow_nan=False)
    except (TypeError, ValueError):
        return False
    if json.loads(text)["doc"] != doc:
        return False
    buf = io.BytesIO()
    try:
        _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(
            {"format": FORMAT, "key": key, "diagnosis": diagnosis}
        )
    except Exception:  # an object that does not pickle: nothing is stored, nothing fails
        return False
    doc_path, pickle_path = _result_paths(entry, key)
    _replace_file(pickle_path, buf.getvalue())  # first: a document never lacks its object
    _replace_file(doc_path, text.encode())
    prune(keep=entry)  # the result counts against the cap too
    return True


__all__ = [
    "ENV_VAR",
    "cache_dir",
    "code_fingerprint",
    "entry_path",
    "file_key",
    "load",
    "max_bytes",
    "prune",
    "read",
    "read_result",
    "read_result_doc",
    "result_key",
    "write",
    "write_result",
]
