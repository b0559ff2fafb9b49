"""Ctrl-C during `tracedx diagnose DIR --summaries X`: the workers stop, no half-written
summary is ever read back as complete, and the next run reuses only the complete ones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def test_ctrl_c_stops_the_job_and_leaves_only_complete_summaries(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))  # jobgen imports tracebuilder by name
    from tests.jobgen import JobSpec, generate
    from tracedx.job.summary import RankSummary

    job = tmp_path / "job"
    generate(JobSpec(world=48, steps=20), job)
    store = tmp_path / "summaries"
    cmd = [sys.executable, "-m", "tracedx", "diagnose", str(job), "--summaries", str(store)]
    proc = subprocess.Popen(
        [*cmd, "--workers", "2", "--format", "json"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    workers: set[int] = set()
    deadline = time.monotonic() + 120
    while len([p for p in store.glob("*") if not p.name.startswith(".")]) < 2:
        assert proc.poll() is None and time.monotonic() < deadline
        workers.update(_children(proc.pid))
        time.sleep(0.05)
    workers.update(_children(proc.pid))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "tracedx: interrupted"
    time.sleep(0.5)
    assert workers and not any(_alive(p) for p in workers)
    complete = [p for p in store.iterdir() if not p.name.startswith(".")]
    assert 2 <= len(complete) < 48  # interrupted part-way
    for p in complete:
        RankSummary.read(p)  # each one whole
    # the next run reuses exactly those and gives the answer of a run without the store
    again = subprocess.run([*cmd, "--format", "json"], cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert f"reused {len(complete)} of 48 rank summaries" in again.stderr
    fresh = subprocess.run(
        [sys.executable, "-m", "tracedx", "diagnose", str(job), "--format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert again.stdout == fresh.stdout and '"schema": "tracedx.job/1"' in fresh.stdout
    assert os.path.isdir(store)
