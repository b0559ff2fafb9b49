"""A real Dask cluster for tests: ``dask scheduler`` and ``dask worker`` processes on localhost.

The worker processes get this checkout on PYTHONPATH (so tests' stand-in tasks import) and
POLARS_MAX_THREADS=1. Yields the scheduler's address (``tcp://127.0.0.1:PORT``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _dask_cli() -> list[str]:
    exe = Path(sys.executable).with_name("dask")
    return [str(exe)] if exe.exists() else [shutil.which("dask") or "dask"]


@contextlib.contextmanager
def dask_cluster(tmp: Path, n_workers: int = 2, timeout: float = 60):
    sched_file = tmp / "scheduler.json"
    env = dict(
        os.environ,
        POLARS_MAX_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION="1.0",
    )
    stack = contextlib.ExitStack()
    logs = [stack.enter_context((tmp / n).open("wb")) for n in ("scheduler.log", "workers.log")]
    procs = [
        subprocess.Popen(
            [
                *_dask_cli(),
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(sched_file),
            ],
            env=env,
            stdout=logs[0],
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    ]
    try:
        deadline = time.monotonic() + timeout
        while not sched_file.exists() or not sched_file.read_text().strip():
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError(
                    "dask scheduler did not start: " + (tmp / "scheduler.log").read_text()[-2000:]
                )
            time.sleep(0.2)
        time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        procs.append(
            subprocess.Popen(
                [
                    *_dask_cli(),
                    "worker",
                    address,
                    "--nworkers",
                    str(n_workers),
                    "--nthreads",
                    "1",
                    "--no-dashboard",
                    "--memory-limit",
                    "0",
                ],
                env=env,
                stdout=logs[1],
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        from distributed import Client

        with Client(address, timeout=timeout) as c:
            c.wait_for_workers(n_workers, timeout=timeout)
        yield address
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        stack.close()
