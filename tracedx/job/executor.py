"""The per-rank map: one summary per trace file, on any ``concurrent.futures``-style executor.

Reading and summarising a rank is a pure function of its file (``summarize_path``), so the map
runs wherever there are cores: a local process pool by default, a Dask cluster with
``client=``, or any object with ``submit(fn, *args) -> concurrent.futures.Future``. Workers open
the files themselves (a local path or an fsspec URL); trace bytes never pass through the
driver. Each task returns its rank's summary as bytes (``RankSummary.to_bytes``: Arrow IPC), so
the driver holds only summaries, and those in their compact form (``HeldSummary``: ``meta`` and
``steps`` decoded, the other tables kept as the compressed IPC bytes, or with a summaries
directory as its Parquet files, and decoded when the reduce reads them).

- Local pool: ``ProcessPoolExecutor`` with the spawn start method (never fork from a threaded
  parent: CPython gh-90622; polars' docs ask for spawn), at most ``plan_workers`` processes
  (free memory against a per-task peak of 1.2x the JSON size + 0.3 GB, as measured for
  tracedx's reader, and the CPU count), ``POLARS_MAX_THREADS`` set to the worker's CPU share in
  each spawned process's environment (before it imports polars), and workers replaced after
  reading about ``RECYCLE_BYTES`` of JSON so a 1 GB trace's memory goes back to the system.
- A worker that dies (killed, out of memory, ``os._exit``) breaks a local pool: the ranks that
  were running are then re-run one at a time, so the one that kills its worker is found; it gets
  one more attempt, then becomes a note. On Dask the scheduler re-runs a task whose worker died
  until it has been on ``distributed.scheduler.allowed-failures`` + 1 dying workers (default 3
  + 1: Dask also counts the tasks merely queued on a dying worker, so 1 would fail innocent
  ranks), then it fails with ``KilledWorker``, which becomes a note; exceptions in a task get
  ``retries=1``.
- A rank that cannot be read (``TraceError``, or any other exception in its task) is a note;
  the other ranks are still analysed.
- With ``summaries_dir`` each task also writes its summary there (``RankSummary.write``: a
  temporary sibling directory renamed into place), under a name keyed by the trace's path,
  size, mtime and the tracedx version, and a later run reuses them without reading the traces.
  An interrupted run leaves at most hidden temporary directories, never read as summaries.
- Ctrl-C (KeyboardInterrupt in the driver) terminates the local workers (they ignore SIGINT
  themselves) or cancels the Dask futures, then re-raises.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import math
import os
import re
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

# Per-task peak memory of summarising one rank: tracedx's reader peaks at 1.04-1.1x the JSON
# size (README, Performance), plus the interpreter, polars and the diagnosis (~0.3 GB).
PEAK_PER_JSON_BYTE = 1.2
PEAK_FIXED_BYTES = 300_000_000
MEMORY_FRACTION = 0.8  # of the available memory the pool may plan to use
# A local worker process is replaced after reading about this much JSON (at least one trace):
# each 1 GB trace gets a fresh process, while small traces do not each pay a process start.
RECYCLE_BYTES = 256_000_000
SUMMARY_SUFFIX = ".rank-summary"


@dataclass(frozen=True)
class RankResult:
    """The map's answer for one input: a ``summary`` (by default a ``HeldSummary``) or a
    ``note`` (one line).

    ``reused`` is True when the summary was read back from the summaries directory.
    """

    path: str
    summary: object = None
    note: str | None = None
    reused: bool = False


# --------------------------------------------------------------------------------------------
# Sizes and memory
# --------------------------------------------------------------------------------------------


def is_url(path: str) -> bool:
    """Whether ``path`` is an fsspec URL (``s3://``, ``gs://``, ``file://``, ...)."""
    head, sep, _ = str(path).partition("://")
    return bool(sep) and head.isidentifier()


def _fs(path: str):
    try:
        import fsspec
    except ImportError:
        from tracedx.errors import TraceError

        raise TraceError(
            f"{path}: reading URLs needs fsspec (pip install fsspec, plus s3fs/gcsfs for s3/gs)"
        ) from None
    return fsspec.core.url_to_fs(path)


def file_identity(path: str) -> tuple[int, float]:
    """(size in bytes, mtime in seconds) of a local file or fsspec URL; metadata only.

    Raises OSError (FileNotFoundError) when the file is not there.
    """
    if not is_url(path):
        st = os.stat(path)
        return st.st_size, st.st_mtime
    fs, p = _fs(path)
    info = fs.info(p)
    mtime = info.get("mtime") or info.get("LastModified") or info.get("updated") or 0
    if hasattr(mtime, "timestamp"):
        mtime = mtime.timestamp()
    elif isinstance(mtime, str):
        mtime = float(hash(mtime) & 0xFFFFFFFF)  # an opaque stamp: only compared for equality
    return int(info.get("size") or 0), float(mtime)


def json_size(path: str) -> int:
    """The JSON size of a trace: the file's size, or for gzip its trailer's ISIZE (RFC 1952:
    the uncompressed size mod 2**32; never less than the compressed size). 0 when unreadable."""
    try:
        if is_url(path):
            fs, p = _fs(path)
            size = int(fs.info(p).get("size") or 0)
            with fs.open(p, "rb") as f:
                magic = f.read(2)
                if magic != b"\x1f\x8b" or size < 18:
                    return size
                f.seek(size - 4)
                return max(int.from_bytes(f.read(4), "little"), size)
        from tracedx.trace.source import _json_size

        return _json_size(Path(path))
    except Exception:
        return 0


def available_memory_bytes() -> int:
    """Memory this process may still use: ``MemAvailable`` of /proc/meminfo, lowered to the
    cgroup v2 limit's headroom (``memory.max - memory.current``) inside a container."""
    avail = None
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = 4 << 30
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            avail = min(avail, int(limit) - used)
    return max(int(avail), 0)


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def task_peak_bytes(json_bytes: int) -> int:
    """Planned peak memory of summarising one trace of ``json_bytes`` of JSON (see the constants)."""
    return int(PEAK_PER_JSON_BYTE * json_bytes + PEAK_FIXED_BYTES)


def plan_workers(
    json_sizes: Iterable[int], *, cpus: int | None = None, available_bytes: int | None = None
) -> int:
    """Local worker count: min(CPUs, tasks, floor(0.8 x available memory / the largest task's
    planned peak)), at least 1. Sizes in bytes of JSON (see ``json_size``)."""
    sizes = list(json_sizes)
    if not sizes:
        return 1
    cpus = cpu_count() if cpus is None else cpus
    avail = available_memory_bytes() if available_bytes is None else available_bytes
    by_memory = math.floor(MEMORY_FRACTION * avail / task_peak_bytes(max(sizes)))
    return max(1, min(cpus, len(sizes), by_memory))


# --------------------------------------------------------------------------------------------
# The task (runs in a worker)
# --------------------------------------------------------------------------------------------


def summary_name(path: str, size: int, mtime: float, options: dict | None = None) -> str:
    """The summaries-directory entry of a trace: its file name and a hash of its path, size,
    mtime, the tracedx version and the options it is summarised with (``steps``, device
    peaks, a calibration file by path, size and mtime, ``repair``), so a changed file, a new
    tracedx or other options never reuse a stale summary (``rank-3.json.gz.1f0c...e2.summary``)."""
    from tracedx import __version__

    opts = dict(options or {})
    cal = opts.get("calibration")
    if cal is not None:
        try:
            st = os.stat(cal)
            opts["calibration"] = (os.fspath(cal), st.st_size, st.st_mtime_ns)
        except OSError:  # the task reports it
            opts["calibration"] = os.fspath(cal)
    # an option at its default keys as if omitted, and a numpy number as the Python one
    listed = repr(
        sorted(
            (k, v.item() if hasattr(v, "item") else v)
            for k, v in opts.items()
            if v is not None and not (k == "repair" and v is False)
        )
    )
    key = f"{path}\0{size}\0{mtime!r}\0{__version__}\0{listed}".encode()
    base = re.sub(r"[^A-Za-z0-9._-]", "_", str(path).rstrip("/").rsplit("/", 1)[-1])[:80]
    return f"{base}.{hashlib.sha256(key).hexdigest()[:16]}{SUMMARY_SUFFIX}"


def summarize_task(
    path: str, options: dict, summaries_dir: str | None, name: str | None
) -> tuple[str, object]:
    """The default map task: ``("ok", RankSummary bytes)`` or ``("note", one line)``.

    Runs in a worker: ``tracedx.job.summary.summarize_path(path, **options)`` opens the file
    itself (local path or fsspec URL); with ``summaries_dir`` the summary is also written there
    as ``name`` (``RankSummary.write``: atomic by rename). A trace that cannot be read is a
    note, not an exception, so an engine's retries are left for workers that die.
    """
    from tracedx.errors import TraceError

    try:
        from tracedx.job.summary import summarize_path

        summary = summarize_path(path, **options)
        data = summary.to_bytes()
    except TraceError as e:
        return "note", str(e)
    except Exception as e:  # a bug or an odd file: this rank is a note, the job goes on
        return "note", f"{path}: cannot be summarised: {type(e).__name__}: {e}"
    if summaries_dir:
        summary.write(os.path.join(summaries_dir, name))
    return "ok", data


def _decode_summary(data: bytes, shared: dict | None = None):
    """The driver's form of a task's summary bytes (``HeldSummary``: tables kept serialized)."""
    from tracedx.job.summary import HeldSummary

    return HeldSummary.from_bytes(data, shared)


def _read_stored(entry: str, path: str, shared: dict | None = None):
    """A stored summary of ``path`` (``HeldSummary.read``: its tables read from the directory
    when the reduce needs them), or None when ``entry`` is missing or not its summary."""
    from tracedx.job.summary import HeldSummary

    if not os.path.isdir(entry):
        return None
    try:
        s = HeldSummary.read(entry, shared)
    except (ValueError, OSError):
        return None
    return s if s.meta.get("path") == path else None


_SPAWN_LOCK = threading.Lock()

try:  # the spawn start method without re-running the caller's __main__ (see _spawn_context)
    from multiprocessing import context as _mp_context
    from multiprocessing import popen_spawn_posix as _popen_spawn_posix
    from multiprocessing import spawn as _mp_spawn

    class _NoMainPopen(_popen_spawn_posix.Popen):
        def _launch(self, process_obj):
            with _SPAWN_LOCK:
                real = _mp_spawn.get_preparation_data

                def without_main(name):
                    d = real(name)
                    d.pop("init_main_from_path", None)
                    d.pop("init_main_from_name", None)
                    return d

                _mp_spawn.get_preparation_data = without_main
                try:
                    super()._launch(process_obj)
                finally:
                    _mp_spawn.get_preparation_data = real

    class _NoMainProcess(_mp_context.SpawnProcess):
        _start_method = "spawn"

        @staticmethod
        def _Popen(process_obj):
            return _NoMainPopen(process_obj)

    class _NoMainContext(_mp_context.SpawnContext):
        Process = _NoMainProcess

except ImportError:  # Windows: the plain spawn context
    _NoMainContext = None


def _spawn_context():
    """The spawn start method, without re-running the caller's ``__main__`` in each worker.

    multiprocessing's spawn normally imports the parent's main script in every child, so a
    script without an ``if __name__ == "__main__":`` guard, or code piped to ``python -``,
    kills every worker. The tasks live in importable modules and need nothing from it, so the
    preparation data sent to each worker leaves the main module out (on POSIX; elsewhere the
    plain spawn context).
    """
    import multiprocessing

    return _NoMainContext() if _NoMainContext is not None else multiprocessing.get_context("spawn")


def _init_local_worker() -> None:
    # Ctrl-C is the driver's to handle: it terminates the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# --------------------------------------------------------------------------------------------
# The map (runs in the driver)
# --------------------------------------------------------------------------------------------

Task = tuple[int, tuple]  # (index into the inputs, the task's arguments)


def map_ranks(
    paths: list[str],
    *,
    executor=None,
    client=None,
    summaries_dir: str | os.PathLike | None = None,
    options: dict | None = None,
    progress: bool | None = None,
    workers: int | None = None,
    fn: Callable | None = None,
    decode: Callable | None = None,
    read_stored: Callable | None = None,
) -> list[RankResult]:
    """Summarise every trace of ``paths``; one ``RankResult`` per path, in the same order.

    ``executor``: anything with ``submit(fn, *args) -> concurrent.futures.Future``; ``client``:
    a ``distributed.Client`` or a scheduler address (``tcp://host:8786``), used through
    ``Client.get_executor(retries=1)``; neither: a local spawn process pool of ``workers``
    processes (default ``plan_workers``; when it plans one, the tasks run in this process). ``summaries_dir``: where summaries are stored and
    reused (created if missing). ``options``: keyword arguments of ``summarize_path``.
    ``progress``: a rich progress bar on stderr (None: only when stderr is a terminal).
    ``progress`` may also be a callable ``progress(done, total, path)``.
    ``fn``: the task, ``fn(path, options, summaries_dir, name) -> ("ok", bytes) | ("note",
    str)`` (default ``summarize_task``), ``decode(bytes)`` turns its bytes into the result's
    ``summary`` in the driver (default ``HeldSummary.from_bytes``) and ``read_stored(entry,
    path)`` reads a stored one or returns None (default ``HeldSummary.read``); tests swap them.

    Raises KeyboardInterrupt after stopping the workers; TraceError when ``client`` needs
    Dask and it is not installed.
    """
    fn = fn or summarize_task
    shared: dict = {}  # process groups the ranks' meta repeat, held once (HeldSummary)
    decode = decode or (lambda data: _decode_summary(data, shared))
    read_stored = read_stored or (lambda entry, path: _read_stored(entry, path, shared))
    options = dict(options or {})
    paths = [str(p) for p in paths]
    results: list[RankResult | None] = [None] * len(paths)
    store = None
    if summaries_dir is not None:
        store = os.fspath(summaries_dir)
        os.makedirs(store, exist_ok=True)

    tasks: list[Task] = []
    reused = 0
    for i, path in enumerate(paths):
        name = None
        if store is not None:
            try:
                size, mtime = file_identity(path)
            except OSError:
                size, mtime = -1, 0.0  # the task reports the missing file as a note
            name = summary_name(path, size, mtime, options)
            stored = read_stored(os.path.join(store, name), path) if size >= 0 else None
            if stored is not None:
                results[i] = RankResult(path, summary=stored, reused=True)
                reused += 1
                continue
        tasks.append((i, (path, options, store, name)))
    if reused:
        from tracedx.console import fit_to

        msg = (
            f"tracedx: reused {reused} of {len(paths)} rank summaries from {store} "
            "(traces unchanged since; not read again)"
        )
        print(fit_to(msg, sys.stderr), file=sys.stderr)

    names = {i: args[3] for i, args in tasks}

    def done(i: int, outcome) -> None:
        kind, payload = outcome
        if kind == "ok":
            # with a summaries directory the driver holds the written summary's paths (its
            # tables are read from there when the reduce needs them), else the bytes' form
            held = read_stored(os.path.join(store, names[i]), paths[i]) if store else None
            results[i] = RankResult(paths[i], summary=held if held is not None else decode(payload))
        else:
            results[i] = RankResult(paths[i], note=str(payload))
        bar.advance(paths[i])

    with _Progress(len(paths), reused, progress) as bar:
        if tasks:
            if executor is None and client is None:
                n = workers or plan_workers([json_size(paths[i]) for i, _ in tasks])
                if n == 1 and workers is None:  # one at a time fits: no process to start
                    for i, args in tasks:
                        done(i, fn(*args))
                else:
                    _run_local(fn, tasks, n, done, _recycle_after(paths, tasks))
            else:
                own = None
                if executor is None:
                    executor, own = _dask_executor(client)
                try:
                    _run_executor(executor, fn, tasks, done)
                finally:
                    if own is not None:
                        own()
    return [r for r in results if r is not None]


def _recycle_after(paths: list[str], tasks: list[Task]) -> int:
    sizes = [json_size(paths[i]) for i, _ in tasks]
    biggest = max(sizes, default=0)
    return max(1, RECYCLE_BYTES // max(biggest, 1))


class _Progress:
    """A rich progress bar over ranks on stderr, or nothing (not a terminal, or quiet)."""

    def __init__(self, total: int, completed: int, show):
        self.total, self.completed = total, completed
        self.callback = show if callable(show) else None
        self.show = (sys.stderr.isatty() and total > 1) if show is None else show is True
        self._bar = None

    def __enter__(self):
        if self.show and self.total:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self._bar = Progress(
                "summarising ranks",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("ranks", total=self.total, completed=self.completed)
        return self

    def advance(self, path: str) -> None:
        self.completed += 1
        if self.callback is not None:
            self.callback(self.completed, self.total, path)
        if self._bar is not None:
            self._bar.advance(self._task)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()


@contextlib.contextmanager
def _polars_threads(n: int):
    """POLARS_MAX_THREADS=n in the environment spawned workers inherit (unless the user set it)."""
    if "POLARS_MAX_THREADS" in os.environ:
        yield
        return
    os.environ["POLARS_MAX_THREADS"] = str(n)
    try:
        yield
    finally:
        os.environ.pop("POLARS_MAX_THREADS", None)


def _run_local(fn, tasks: list[Task], workers: int, done, recycle: int) -> None:
    """Run ``tasks`` on spawn process pools of ``workers`` processes (see the module's doc)."""
    with _polars_threads(max(1, cpu_count() // workers)):
        queue: deque[Task] = deque(tasks)
        alone: deque[Task] = deque()  # ranks that were running when a worker died
        deaths: dict[int, int] = {}
        while queue or alone:
            if alone:
                task = alone.popleft()
                broken = _pool_round(fn, deque([task]), 1, done, recycle)
                if broken:
                    i = task[0]
                    deaths[i] = deaths.get(i, 0) + 1
                    if deaths[i] >= 2:
                        done(i, ("note", f"{task[1][0]}: {broken[0][1]}"))
                    else:
                        alone.appendleft(task)
                continue
            for task, _ in _pool_round(fn, queue, workers, done, recycle):
                deaths[task[0]] = deaths.get(task[0], 0) + 1
                alone.append(task)


def _pool_round(fn, queue: deque, workers: int, done, recycle: int) -> list[tuple[Task, str]]:
    """Run tasks from ``queue`` (consumed) with at most ``workers`` in flight. Returns [] when
    all finished, else the (task, reason) pairs in flight when the pool broke (a worker died);
    tasks not yet started stay in ``queue``."""
    from concurrent.futures.process import BrokenProcessPool

    pool = cf.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=_spawn_context(),
        initializer=_init_local_worker,
        max_tasks_per_child=recycle,
    )
    running: dict[cf.Future, Task] = {}
    seen: dict[int, object] = {}  # the worker processes (the pool forgets them when it breaks)
    try:
        while queue or running:
            while queue and len(running) < workers:
                task = queue.popleft()
                running[pool.submit(fn, *task[1])] = task
                seen.update(getattr(pool, "_processes", None) or {})
            # a timeout, so that the main thread returns to the interpreter twice a second: a
            # Ctrl-C the kernel hands to another thread of the driver is only seen there
            finished, _ = cf.wait(running, timeout=0.5, return_when=cf.FIRST_COMPLETED)
            seen.update(getattr(pool, "_processes", None) or {})  # also the ones it respawned
            broken = False
            for fut in finished:
                try:
                    outcome = fut.result()
                except BrokenProcessPool:
                    broken = True
                    continue
                except Exception as e:  # the task itself raised (a test's stand-in, say)
                    outcome = ("note", f"{running[fut][1][0]}: {type(e).__name__}: {e}")
                done(running.pop(fut)[0], outcome)
            if broken:
                reason = _death_reason(seen.values())
                lost = [(t, reason) for t in running.values()]
                running.clear()
                return lost
        return []
    except BaseException:  # KeyboardInterrupt above all: stop the workers now
        _terminate(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _death_reason(processes) -> str:
    for p in processes:
        with contextlib.suppress(Exception):
            p.join(timeout=1)
    # 0: recycled normally; -SIGTERM: stopped by the pool when another worker died
    codes = sorted({p.exitcode for p in processes} - {None, 0, -signal.SIGTERM})
    how = []
    for c in codes:
        if c < 0:
            try:
                how.append(signal.Signals(-c).name)
            except ValueError:
                how.append(f"signal {-c}")
        else:
            how.append(f"exit status {c}")
    why = f" ({', '.join(how)})" if how else ""
    return f"its worker process died twice{why} (killed, out of memory or crashed); rank left out"


def _terminate(pool) -> None:
    # ProcessPoolExecutor has no public way to stop running tasks before Python 3.14
    # (terminate_workers); its process table is the only handle on them.
    stop = getattr(pool, "terminate_workers", None)
    if stop is not None:
        stop()
        return
    for p in list(getattr(pool, "_processes", {}).values()):
        with contextlib.suppress(Exception):
            p.terminate()


def _run_executor(executor, fn, tasks: list[Task], done) -> None:
    """Submit every task to ``executor`` and collect them as they finish."""
    futures = {executor.submit(fn, *task[1]): task for task in tasks}
    pending = set(futures)
    try:
        while pending:
            # timed waits, so that a Ctrl-C another thread received is seen (see _pool_round)
            finished, pending = cf.wait(pending, timeout=0.5, return_when=cf.FIRST_COMPLETED)
            for fut in sorted(finished, key=lambda f: futures[f][0]):
                i, args = futures[fut]
                try:
                    outcome = fut.result()
                except Exception as e:
                    outcome = ("note", _failure_note(args[0], e))
                done(i, outcome)
    except BaseException:
        for fut in futures:
            fut.cancel()
        raise


def _failure_note(path: str, e: BaseException) -> str:
    if type(e).__name__ == "KilledWorker":
        return (
            f"{path}: the worker running it died every time it was tried (killed, out of "
            "memory or crashed); rank left out"
        )
    return f"{path}: cannot be summarised: {type(e).__name__}: {e}"


def _dask_executor(client):
    """(executor, close) for a ``distributed.Client`` or a scheduler address; ``close`` is
    None when the client is the caller's. Raises TraceError when Dask is not installed."""
    try:
        import distributed
    except ImportError:
        from tracedx.errors import TraceError

        raise TraceError(
            "a Dask scheduler needs Dask: pip install 'tracedx[dask]' (dask[distributed])"
        ) from None
    close = None
    if isinstance(client, str):
        try:
            client = distributed.Client(client, timeout=30)
        except OSError as e:
            from tracedx.errors import TraceError

            raise TraceError(f"cannot reach the Dask scheduler at {client}: {e}") from None
        close = client.close
    return client.get_executor(retries=1, pure=False), close


def local_cluster(n_workers: int = 2, **kwargs):
    """A Dask ``LocalCluster`` set up as tracedx expects: processes of one thread each, no
    dashboard, ``POLARS_MAX_THREADS`` set to each worker's CPU share, and one task at a time
    sent to each worker thread (``worker-saturation: 1.0``, for jobs of more ranks than twice
    the threads, Dask's root-ish tasks: a worker that dies then takes no queued rank down with
    it), and ranks failed after 120 s without any worker (``no-workers-timeout``) rather than
    a wait without end. Needs ``tracedx[dask]``."""
    import dask
    from distributed import LocalCluster

    threads = max(1, cpu_count() // n_workers)
    # a cluster whose workers are all gone for good (a nanny that could not restart one) fails
    # the ranks left as notes after two minutes instead of waiting for workers forever
    config = {
        "distributed.scheduler.worker-saturation": 1.0,
        "distributed.scheduler.no-workers-timeout": "120s",
    }
    with dask.config.set(config):
        return LocalCluster(
            n_workers=n_workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            env={"POLARS_MAX_THREADS": str(threads)},
            **kwargs,
        )
