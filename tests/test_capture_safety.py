"""Capture that cannot lose work (issue 17): --out checked first, a non-zero exit whenever no
trace was written, the incomplete last step left out, a CPU-only capture said plainly, and
Kineto's USDT notices kept off tracedx's output. Skipped without torch."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tracedx
from tracedx import capture as cap

ROOT = Path(__file__).resolve().parents[1]
needs_torch = pytest.mark.skipif(
    __import__("importlib").util.find_spec("torch") is None, reason="capture needs torch"
)

LOOP = """
import sys, pathlib
import torch, tracedx
pathlib.Path(sys.argv[1]).write_text("ran")
x = torch.ones(64)
for i in range(int(sys.argv[2])):
    y = (x * i).sum()
    if i == int(sys.argv[3]):
        raise SystemExit(0)  # ends inside a step, after its work
    tracedx.step()
"""


def _capture(tmp_path, out, *args, steps="4", stop_at="99"):
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(LOOP))
    ran = tmp_path / "ran.txt"
    cmd = [sys.executable, "-m", "tracedx.cli", "capture", str(script), "--out", str(out), *args,
           "--", str(ran), steps, stop_at]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    return proc, ran


@needs_torch
@pytest.mark.parametrize("kind", ["file", "under-a-file"])
def test_out_that_cannot_hold_the_trace_fails_before_the_script_runs(tmp_path, kind):
    f = tmp_path / "afile"
    f.write_text("x")
    out = f if kind == "file" else f / "sub"
    proc, ran = _capture(tmp_path, out)
    assert proc.returncode == 2
    assert not ran.exists()  # the script never ran
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("tracedx: error:")]
    assert str(out) in line


def test_no_trace_written_is_never_exit_0(tmp_path, monkeypatch):
    script = tmp_path / "s.py"
    script.write_text("import tracedx\nfor i in range(6):\n    tracedx.step()\n")
    monkeypatch.setattr(cap, "_import_torch", lambda: pytest.importorskip("torch"))

    def broken_export(*a, **k):
        raise OSError(17, "File exists")

    monkeypatch.setattr(cap, "_export", broken_export)
    r = cap.capture_script(script, [], out_dir=tmp_path / "o", quiet=True)
    assert r.path is None and r.exit_code == 1


@needs_torch
def test_cpu_capture_incomplete_last_step_and_no_usdt_noise(tmp_path):
    # wait 1, warm-up 1, 3 active: the script ends inside the 3rd active step (steps 2, 3
    # complete, step 4 cut)
    proc, _ = _capture(tmp_path, tmp_path / "o", "--steps", "3", steps="10", stop_at="4")
    assert proc.returncode == 0, proc.stderr
    assert "USDT" not in proc.stderr and "USDT" not in proc.stdout
    [path] = sorted((tmp_path / "o").glob("*.json.gz"))
    t = tracedx.load(path)
    assert t.steps["step"].to_list() == [2, 3, 4]
    assert t.metadata["tracedx"]["active_steps_recorded"] == 2
    d = tracedx.diagnose(t)
    assert d.steps == [2, 3]
    assert d.notes[0] == (
        "step 4 is incomplete (the script ended or was stopped inside it; tracedx capture "
        "recorded 2 complete steps): left out"
    )
    assert tracedx.diagnose(t, steps="3..4").steps == [3, 4]  # asked for: kept, and flagged
    assert any("step 4 is incomplete" in n for n in tracedx.diagnose(t, steps="3..4").notes)
    t.metadata["tracedx"]["active_steps_recorded"] = 1  # as if the script ended in step 3
    assert tracedx.diagnose(t).notes[0] == (
        "steps 3..4 (2) are incomplete (the script ended or was stopped inside it; tracedx "
        "capture recorded 1 complete step): left out"
    )
    # a machine with no GPU: said plainly, no CUPTI advice, no unknown-device note
    if not __import__("torch").cuda.is_available():
        text = " ".join(d.to_text().split())
        assert "had no CUDA GPU" in text
        assert "CUPTI" not in text and "unknown device" not in text


def test_kineto_notices_are_filtered_and_the_rest_passes(capfd):
    def noisy():
        os.write(
            2, b"USDT:2026-12-01 10:02:48 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
        )
        os.write(2, b"a real warning\n")
        return 7

    assert cap._without_kineto_noise(noisy) == 7
    err = capfd.readouterr().err
    assert err == "a real warning\n"


def _timed_trace(tmp_path, median, lo, hi):
    """Four 1000 us steps (one 40 us kernel each) with a capture-recorded unprofiled timing."""
    from tests.tracebuilder import T0, TraceBuilder, write_json

    b = TraceBuilder()
    for i in range(4):
        t = T0 + 1000 * i
        b.step(i + 1, t, 1000)
        ext = b.op("aten::add", t + 10, 20)
        b.kernel(t + 40, 40, b.launch(t + 15, 5, ext=ext), name="elementwise_kernel")
    doc = b.to_dict()
    doc["tracedx"] = {"unprofiled_step_ms": {"median": median, "min": lo, "max": hi, "n": 5}}
    return tracedx.load(write_json(tmp_path / "t.json", doc))


def test_an_unprofiled_timing_that_cannot_be_right_is_flagged_and_not_used(tmp_path):
    d = tracedx.diagnose(_timed_trace(tmp_path, 87.0, 1.0, 130.0))
    assert d.model.unprofiled_step_us is None  # estimates are against the traced step
    assert d.step_time == {"ms": 1.0, "basis": "traced"}
    assert d.notes[0] == (
        "the unprofiled timing cannot be right (its median is 87.0x the traced step; its steps "
        "spread 130x (1.000 to 130.000 ms): a profiler only slows a step); estimates and "
        "--max-step-ms use the traced step time instead"
    )
    assert "cannot be right, not used" in " ".join(d.to_text().split())
    ok = tracedx.diagnose(_timed_trace(tmp_path, 0.8, 0.7, 0.9))
    assert ok.model.unprofiled_step_us == 800.0 and ok.step_time["basis"] == "unprofiled"
    assert not any("cannot be right" in n for n in ok.notes)
