"""`tracedx capture` under torchrun (CPU, gloo): one trace per rank, named by rank, kept when a
rank crashes; then `tracedx diagnose DIR` diagnoses them as one job.

The job is capture/ddp_mlp.py (DDP, 6 x Linear(128, 128), buckets of 0.05 MB: ~6 all-reduces
per step) with rank 1 doing 30 ms of extra host work (a busy Python loop) per step. Runs two
2-process torchrun jobs (--standalone: a free port, never another job's rendezvous).
Skipped without torch.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracedx.cli import main

ROOT = Path(__file__).resolve().parents[1]

try:
    import torch.distributed as _dist  # noqa: F401

    HAVE_TORCH = _dist.is_available()
except Exception:  # pragma: no cover - depends on the machine
    HAVE_TORCH = False

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch with torch.distributed")


def _torchrun(out: Path, script: str, *script_args: str, steps: int = 6):
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "tracedx", "capture", "--out", str(out), "--wait", "1", "--warmup", "1",
        "--steps", str(steps), script, "--", *script_args,
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers: no orphan left
        out, err = proc.communicate()
        pytest.fail(f"torchrun did not finish in 150 s: {err[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture(scope="module")
def straggler_job(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp") / "traces"
    # 12 active steps: with 2 ranks the per-step straggler test needs 2^-S < 0.01 / 2, S >= 8;
    # with 12, one step a loaded machine makes noisy still passes (11 of 12: p = 0.003; 8 of 8 was flaky)
    proc = _torchrun(
        out,
        "capture/ddp_mlp.py",
        *("--steps", "15", "--width", "128", "--layers", "6", "--batch", "16"),
        *("--bucket-cap-mb", "0.05", "--straggler-rank", "1", "--host-ms", "30"),
        steps=12,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_each_rank_writes_its_own_trace_named_by_rank(straggler_job):
    out, proc = straggler_job
    files = sorted(out.glob("*.json.gz"))
    assert [f.name.rsplit("-", 1)[1] for f in files] == ["rank0.json.gz", "rank1.json.gz"]
    # one time in both names: the launcher's start, not each rank's
    assert len({f.name.rsplit("-", 1)[0] for f in files}) == 1
    assert all(f.name.startswith("ddp_mlp-") for f in files)
    assert "tracedx (rank 1): wrote" in proc.stderr
    for r, f in enumerate(files):
        with gzip.open(f, "rt") as fh:
            doc = json.load(fh)
        assert doc["tracedx"]["distributed"]["rank"] == r
        assert doc["tracedx"]["distributed"]["world_size"] == 2
        assert doc["distributedInfo"]["backend"] == "gloo"
        assert doc["tracedx"]["active_steps_recorded"] == 12


def test_the_directory_is_diagnosed_as_a_job_naming_the_straggler(straggler_job):
    out, _ = straggler_job
    r = CliRunner().invoke(main, ["diagnose", str(out), "--format", "json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "tracedx.job/1"
    assert [x["rank"] for x in doc["ranks"]] == [0, 1]
    assert doc["straggler"] is not None and doc["straggler"]["rank"] == 1


def test_the_straggler_cause_is_host_work(straggler_job):
    out, _ = straggler_job
    doc = json.loads(CliRunner().invoke(main, ["diagnose", str(out), "--format", "json"]).stdout)
    assert "host" in str(doc["straggler"]["cause"]).lower()


def test_one_rank_alone_gets_the_single_rank_diagnosis_and_a_note(straggler_job):
    out, _ = straggler_job
    f = sorted(out.glob("*rank0.json.gz"))[0]
    r = CliRunner().invoke(main, ["diagnose", str(f)])
    assert r.exit_code == 0, r.stderr
    assert "job of" not in r.stdout
    assert "this trace is one rank of a 2-rank job" in r.stdout


CRASH = """
import sys, torch, torch.distributed as dist
from torch import nn
dist.init_process_group("gloo")
rank = dist.get_rank()
model = nn.parallel.DistributedDataParallel(nn.Linear(32, 32))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(8, 32)
for i in range(10):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    if rank == 1 and i == 3:
        raise RuntimeError("rank 1 fails at step 3")
"""


def test_a_crash_on_one_rank_keeps_every_trace(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent(CRASH))
    proc = _torchrun(tmp_path / "out", str(script), steps=5)
    assert proc.returncode != 0
    assert "rank 1 fails at step 3" in proc.stderr
    files = sorted((tmp_path / "out").glob("crash-*-rank*.json.gz"))
    assert [f.name[-13:] for f in files] == ["rank0.json.gz", "rank1.json.gz"], proc.stderr[-2000:]
    for f in files:
        with gzip.open(f, "rt") as fh:
            doc = json.load(fh)
        # both stopped inside the active window (steps 2..6): what was recorded is kept
        assert 0 < doc["tracedx"]["active_steps_recorded"] < 5
