"""Stand-in map tasks for the executor tests (picklable: a module of their own).

Each "trace" is a small text file; the task returns its bytes as the rank's summary, so
results are easy to check. Its content steers the task: ``die`` makes the worker process
exit at once (as a SIGKILL or OOM would), ``die-once`` does so only the first time (a marker
file beside it records the first attempt); ``die S`` / ``die-once S`` first sleep S seconds
(a worker that dies while its nanny is still starting it may not be restarted: Dask's race,
not tracedx's); ``sleep N`` writes its pid beside the file and sleeps N seconds first, ``bad``
is an unreadable trace (a TraceError).
"""

from __future__ import annotations

import os
import time

from tracedx.errors import TraceFormatError

# map_ranks(..., **STANDIN): these tasks, their bytes kept as they are, stored as plain files
STANDIN: dict = {}


def _store(directory: str, name: str, data: bytes) -> None:
    """Write atomically: a temporary name, then os.replace."""
    final = os.path.join(directory, name)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, final)


def read_stored(entry: str, path: str):
    if not os.path.isfile(entry):
        return None
    with open(entry, "rb") as f:
        return f.read()


def fake_task(path, options, summaries_dir, name):
    with open(path, "rb") as f:
        data = f.read()
    words = data.split()
    if words[:1] == [b"die"]:
        time.sleep(float(words[1]) if len(words) > 1 else 0.0)
        os._exit(3)
    if words[:1] == [b"die-once"]:
        marker = path + ".tried"
        if not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(float(words[1]) if len(words) > 1 else 0.0)
            os._exit(3)
    if words[:1] == [b"sleep"]:
        with open(path + ".pid", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(float(words[1]))
    if words[:1] == [b"bad"]:
        try:
            raise TraceFormatError(f"{path}: not a trace")
        except TraceFormatError as e:
            return "note", str(e)
    out = b"summary of " + data
    if summaries_dir:
        _store(summaries_dir, name, out)
    return "ok", out


def write_ranks(tmp_path, contents: list[str]) -> list[str]:
    """One stand-in "trace" per rank, ``tmp_path/rank{i}.txt`` holding ``contents[i]``."""
    paths = []
    for i, text in enumerate(contents):
        p = tmp_path / f"rank{i}.txt"
        p.write_text(text)
        paths.append(str(p))
    return paths


STANDIN.update(fn=fake_task, decode=bytes, read_stored=read_stored)


def polars_threads_task(path, options, summaries_dir, name):
    import polars as pl

    return "ok", f"{os.environ.get('POLARS_MAX_THREADS')} {pl.thread_pool_size()}".encode()


if __name__ == "__main__":  # the Ctrl-C test's driver: python -m tests.rankmap STORE PATH...
    import signal
    import sys

    from tests import rankmap  # the tasks by their module's name, not __main__'s
    from tracedx.job.executor import map_ranks

    # a shell's background jobs start with SIGINT ignored; a terminal's foreground job does not
    signal.signal(signal.SIGINT, signal.default_int_handler)

    try:
        map_ranks(
            sys.argv[2:], workers=2, summaries_dir=sys.argv[1], progress=False, **rankmap.STANDIN
        )
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
