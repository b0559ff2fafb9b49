"""Stand-in map tasks for the executor tests (picklable: a module of their own).

Each "trace" is a small text file; the task returns its bytes as the rank's summary, so
results are easy to check. Its content steers the task: ``die`` makes the worker process
exit at once (as a SIGKILL or OOM would), ``die-once`` does so only the first time (a marker
file beside it records the first attempt), ``sleep N`` writes its pid beside the file and sleeps N seconds first, ``bad`` is
an unreadable trace (a TraceError).
"""

from __future__ import annotations

import os
import time

from tracedx.errors import TraceFormatError
from tracedx.job.executor import _store


def fake_task(path, options, summaries_dir, name):
    with open(path, "rb") as f:
        data = f.read()
    words = data.split()
    if words[:1] == [b"die"]:
        os._exit(3)
    if words[:1] == [b"die-once"]:
        marker = path + ".tried"
        if not os.path.exists(marker):
            open(marker, "w").close()
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


def polars_threads_task(path, options, summaries_dir, name):
    import polars as pl

    return "ok", f"{os.environ.get('POLARS_MAX_THREADS')} {pl.thread_pool_size()}".encode()


if __name__ == "__main__":  # the Ctrl-C test's driver: python -m tests.rankmap STORE PATH...
    import signal
    import sys

    from tracedx.job.executor import map_ranks

    # a shell's background jobs start with SIGINT ignored; a terminal's foreground job does not
    signal.signal(signal.SIGINT, signal.default_int_handler)

    try:
        map_ranks(sys.argv[2:], fn=fake_task, workers=2, summaries_dir=sys.argv[1], progress=False)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
