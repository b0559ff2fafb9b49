"""Giving freed memory back to the system, so a trace's diagnosis peaks lower.

Two allocators hold memory a diagnosis has freed: polars' jemalloc (its column buffers) and the
C library's malloc (Python's lists and large objects). Neither changes a result.
"""

from __future__ import annotations

import os

JEMALLOC_ENV = "_RJEM_MALLOC_CONF"
JEMALLOC_CONF = "dirty_decay_ms:0,muzzy_decay_ms:0"


def release_promptly() -> None:
    """Make polars' jemalloc give freed pages back at once, in this process and in the
    reader's worker process (which inherits the environment). For the command line only: it
    must run before polars is imported, and a value the user set is kept.

    polars on Linux allocates with jemalloc, and its ``__init__`` writes jemalloc's settings
    into ``_RJEM_MALLOC_CONF`` before it loads its Rust library: ``dirty_decay_ms:500,
    muzzy_decay_ms:1000``, followed by any value already there, which wins (polars issue
    18088, pull request 21829). So freed pages stay resident for 0.5 s, then up to 1 s more
    as lazily freed ones; with both at 0, jemalloc purges them when they are freed (jemalloc's
    manual: ``opt.dirty_decay_ms``, ``opt.muzzy_decay_ms``).

    Measured with ``tracedx diagnose --format json`` on benchmarks/bench.py's traces (2-core
    development machine, interleaved, 2 to 6 runs each): the 107 MB trace peaked at 205-220
    (with :func:`trim_heap`) instead of 266-275 MB, the 1,085 MB one at 957-998 instead of
    1,109-1,160 MB, for about 0.1 s (100 MB) and 0.5 s (1 GB) more system CPU and no change of
    user CPU or wall time beyond the noise."""
    os.environ.setdefault(JEMALLOC_ENV, JEMALLOC_CONF)  # once polars is loaded, it holds its own


def _malloc_trim():
    import ctypes  # here: the command line's start-up does not need it

    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS, Windows)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM: list = []


def trim_heap() -> None:
    """Return the C library's free heap memory to the system (glibc's ``malloc_trim(0)``,
    which also releases free pages inside the heap); nothing where it is not glibc.

    Called once a trace's events are read: their decoded Python objects and attribute lists
    leave tens of MB free in the heap (19 MB for the 107 MB benchmark trace) that later,
    smaller allocations do not reuse. With :func:`release_promptly`, the 107 MB trace's
    diagnosis then peaked at 206 MB instead of 220 (3 runs each)."""
    if not _TRIM:
        _TRIM.append(_malloc_trim())
    if _TRIM[0] is not None:
        _TRIM[0](0)
