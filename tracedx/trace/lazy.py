"""A Trace read back from the cache (:mod:`tracedx.cache`) whose tables are read when
first used."""

from __future__ import annotations

from pathlib import Path

from tracedx.trace import Trace


class LazyTrace(Trace):
    """A :class:`~tracedx.trace.Trace` of a cache entry whose tables are read from the entry's
    IPC files when first used: a cached Diagnosis renders its text without any, its HTML
    timeline with the few it draws. A table that cannot be read then (the entry was removed or
    damaged since) is a miss: the trace file is read again for the tables not read yet (the same
    tables: the entry's key is the file's), unless the file has changed since (its key is no
    longer the entry's): then a one-line TraceFormatError. Made by
    :func:`tracedx.cache.read` (``lazy=True``)."""

    @classmethod
    def of_entry(cls, entry: Path, tables: list[str], *, path: str, repair: bool, **fields):
        self = cls.__new__(cls)  # not the dataclass __init__: the tables are not read yet
        self.__dict__.update(_entry=Path(entry), _unread=set(tables), _repair=repair)
        self.path = path
        for k, v in fields.items():
            setattr(self, k, v)
        self._memo = {}
        return self

    def __getattr__(self, name: str):  # only for attributes not set yet: an unread table
        unread = self.__dict__.get("_unread")
        if not unread or name not in unread:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        try:
            self._read_table(name)
        except Exception:
            self._read_file()
        return self.__dict__[name]

    def _read_table(self, name: str) -> None:
        import polars as pl

        self.__dict__[name] = pl.read_ipc(self.__dict__["_entry"] / f"{name}.arrow")
        self.__dict__["_unread"].discard(name)

    def read_all(self) -> None:
        """Read every table not read yet from the entry; raises what polars raises for a
        missing or damaged IPC file (no fall-back to the trace file here)."""
        for name in sorted(self.__dict__["_unread"]):
            self._read_table(name)

    def _read_file(self) -> None:
        from tracedx.cache import entry_path
        from tracedx.errors import TraceFormatError
        from tracedx.trace import load as load_file

        repair = self.__dict__["_repair"]
        try:
            same = entry_path(self.path, repair=repair) == self.__dict__["_entry"]
        except OSError:
            same = False
        if not same:  # its tables would not be the ones the cached diagnosis was made from
            raise TraceFormatError(
                f"{self.path}: changed or gone since its diagnosis was cached, and the cached "
                "tables cannot be read: run the command again"
            )
        fresh = load_file(self.path, repair=repair)
        unread = self.__dict__["_unread"]
        for name in sorted(unread):
            self.__dict__[name] = getattr(fresh, name)
        unread.clear()
