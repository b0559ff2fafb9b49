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
    _PROMPT.append(True)  # and trim_heap fixes the C library's mmap threshold (see there)


M_MMAP_THRESHOLD = -3  # mallopt's parameter (glibc's malloc.h)
MMAP_THRESHOLD_BYTES = 256 << 10
FIXED_THRESHOLD_MAX_ROWS = 500_000
"""Above this many rows in a table, the mmap threshold is left to glibc (see :func:`trim_heap`)."""
_USER_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")


def _glibc():
    """(malloc_trim, mallopt) of glibc, or None elsewhere."""
    import ctypes  # here: the command line's start-up does not need it

    try:
        libc = ctypes.CDLL("libc.so.6")
        trim, opt = libc.malloc_trim, libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS, Windows)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    opt.argtypes = [ctypes.c_int, ctypes.c_int]
    opt.restype = ctypes.c_int
    return trim, opt


_TRIM: list = []
_THRESHOLD: list = [None]  # the mmap threshold this process set (None: glibc's dynamic one)
_DYNAMIC_MAX_BYTES = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit (mallopt(3))
_PROMPT: list = []  # release_promptly was called: this process is the command line's


def trim_heap(rows: int = 0) -> None:
    """Return the C library's free heap memory to the system (glibc's ``malloc_trim(0)``,
    which also releases free pages inside the heap); nothing where it is not glibc.

    Called once a trace's events are read: their decoded Python objects and attribute lists
    leave tens of MB free in the heap (19 MB for the 107 MB benchmark trace) that later,
    smaller allocations do not reuse. With :func:`release_promptly`, the 107 MB trace's
    diagnosis then peaked at 206 MB instead of 220 (3 runs each).

    In the command line (after :func:`release_promptly`, and unless the user set glibc's
    ``MALLOC_MMAP_THRESHOLD_`` or ``GLIBC_TUNABLES``), each call also fixes glibc's mmap
    threshold at :data:`MMAP_THRESHOLD_BYTES`: from then on, a block that large (a numpy array
    of 32,768 values: the linking's and the analysis' temporaries) gets pages of its own, which
    go back to the system when it is freed. Without it, glibc raises the threshold to the size
    of the largest block freed so far (``mallopt(3)``: the reader's 8 MB buffers), so those
    arrays come from the heap, and the pages they leave free there stay resident: the 107 MB
    trace's heap held 23 MB free at the end of its diagnosis. Only after the read: while
    reading, the dynamic threshold lets the 8 MB buffers reuse the heap's pages (fixed from the
    start, the read faulted in fresh pages for each, 5% slower at 100 MB).

    Not when the largest table has over :data:`FIXED_THRESHOLD_MAX_ROWS` rows (``rows``): then
    every temporary is megabytes, each would fault in fresh pages, and the tables, not the
    heap, make the peak (under 1x the JSON at 1 GB). On the project's device machine (gVisor,
    2 cores) the 1 GB trace's diagnosis took 10.7-13.4 s with the threshold fixed against
    9.9-10.6 s without (3 interleaved runs each; 3.4-4.8 s of system time against 1.9-2.1)."""
    if not _TRIM:
        _TRIM.append(_glibc())
    libc = _TRIM[0]
    if libc is not None and _PROMPT and not any(map(os.environ.get, _USER_MALLOC_ENV)):
        # decided per trace (diff and annotate read several): once set, glibc's dynamic
        # threshold is off for the process, so a large trace after a small one gets the
        # value the dynamic threshold would reach (its 64-bit maximum, mallopt(3))
        want = MMAP_THRESHOLD_BYTES if rows <= FIXED_THRESHOLD_MAX_ROWS else _DYNAMIC_MAX_BYTES
        if _THRESHOLD[0] != want and (_THRESHOLD[0] is not None or want == MMAP_THRESHOLD_BYTES):
            libc[1](M_MMAP_THRESHOLD, want)
            _THRESHOLD[0] = want
    if libc is not None:
        libc[0](0)
