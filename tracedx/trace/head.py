"""A trace file's head: the top-level keys written before ``traceEvents``, without reading on.

Kineto's chrome trace writer (``ChromeTraceLogger::handleTraceStart`` in pytorch/kineto,
``libkineto/src/output_json.cpp``) opens the document with ``schemaVersion``,
``deviceProperties``, the profiler's metadata (``distributedInfo``: rank, world size, process
groups), ``displayTimeUnit`` and ``baseTimeNanoseconds``, then ``"traceEvents": [``;
``tracedx capture`` puts its own ``tracedx`` key first. So the first few KiB tell which job and
rank a file is of, before its events are read (a trace that writes them after its events, as
on-demand tracing may, tells nothing early):
:func:`tracedx.job.load.load_job` uses that to refuse a folder of two whole rank sets at once
instead of after summarising every rank.
"""

from __future__ import annotations

import gzip
import os
import stat
import zlib

import msgspec

from tracedx.trace.source import _GZIP_MAGIC, _KEY

__all__ = ["HEAD_BYTES", "head_metadata"]

HEAD_BYTES = 64 * 1024
"""Text read at most (after gunzip). Of the 79 sample and public traces that have a head, the
largest is 17 KiB (HolisticTraceAnalysis' ``cpu_only__rank-34``)."""


def head_metadata(path: str | os.PathLike, limit: int = HEAD_BYTES) -> dict | None:
    """The top-level keys of the trace file ``path`` that come before ``"traceEvents"``, as
    decoded JSON (``{}`` when that key is first). None when they cannot be told from the first
    ``limit`` bytes of text: the key is not there (written last, or a larger head), the file is
    not a local readable file, not gzip or JSON text, or the head does not parse. Never
    raises: a None only means the caller learns nothing early."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or device would block or never end
            return None
        with open(path, "rb") as f:
            raw = f.read(2)
            f.seek(0)
            if raw == _GZIP_MAGIC:
                with gzip.GzipFile(fileobj=f) as g:
                    text = g.read(limit)
            else:
                text = f.read(limit)
    except (OSError, EOFError, zlib.error):
        return None
    i = text.find(_KEY)
    start = text.find(b"{")
    if i < 0 or start < 0 or start > i:
        return None
    body = text[start + 1 : i].rstrip()
    if body.endswith(b","):
        body = body[:-1]
    try:
        doc = msgspec.json.decode(b"{" + body + b"}")
    except msgspec.DecodeError:
        return None
    return doc if isinstance(doc, dict) else None
