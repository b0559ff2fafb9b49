"""`tracedx capture` on small scripts (CPU): traces written whatever the script does.

Each test runs the real command in a subprocess, as a user would. Skipped without torch.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tracedx import capture as cap

ROOT = Path(__file__).resolve().parents[1]

try:  # torch is optional for tracedx; these tests need it
    import torch  # noqa: F401

    HAVE_TORCH = True
except Exception:  # pragma: no cover - depends on the machine
    HAVE_TORCH = False

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed (capture needs it)")

TRAIN = """
import sys
import torch

print("argv", sys.argv, __name__)
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 32)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 8
fail_at = int(sys.argv[2]) if len(sys.argv) > 2 else -1
for i in range(steps):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    if i == fail_at:
        raise ValueError(f"boom at step {i}")
print("done")
"""


def _run(tmp_path: Path, script: str, *args: str, name: str = "s.py", env=None):
    path = tmp_path / name
    path.write_text(textwrap.dedent(script))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tracedx.cli", "capture", str(path), "--out", str(out), *args]
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=120)
    traces = sorted(out.glob("*.json.gz")) if out.exists() else []
    return proc, traces


def _load(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _names(doc: dict, cat: str) -> list[str]:
    return [e.get("name", "") for e in doc["traceEvents"] if e.get("cat") == cat]


@pytest.fixture(scope="module")
def train_run(tmp_path_factory):
    if not HAVE_TORCH:
        pytest.skip("torch is not installed (capture needs it)")
    tmp = tmp_path_factory.mktemp("train")
    return _run(tmp, TRAIN, "--steps", "3", "--time-unprofiled", "2", "--", "8")


@needs_torch
def test_training_loop_trace_has_steps_and_metadata(train_run):
    proc, traces = train_run
    assert proc.returncode == 0, proc.stderr
    assert len(traces) == 1
    path = traces[0]
    assert path.name.startswith("s-") and path.name.endswith(".json.gz")
    assert proc.stdout.strip().splitlines()[-1] == str(path)  # the path, printed on stdout
    assert "argv" in proc.stdout and "__main__" in proc.stdout
    doc = _load(path)
    steps = [n for n in _names(doc, "user_annotation") if n.startswith("ProfilerStep#")]
    assert steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert "aten::addmm" in _names(doc, "cpu_op")
    meta = doc["tracedx"]
    assert meta["schedule"] == {"wait": 1, "warmup": 1, "active": 3}
    assert meta["step_marker"] == "optimizer"
    assert meta["argv"][1:] == ["8"]
    assert meta["active_steps_recorded"] == 3
    assert set(meta) >= {"version", "torch_version", "cuda_version", "gpu_name", "script"}
    timing = meta["unprofiled_step_ms"]
    assert timing["n"] == 2 and 0 < timing["min"] <= timing["median"] <= timing["max"]
    assert timing["min"] <= timing["mean"] <= timing["max"]
    assert "CPU activity only" in proc.stderr  # said plainly when no GPU is present


@needs_torch
def test_training_trace_loads_and_diagnoses(train_run):
    import tracedx

    _, traces = train_run
    trace = tracedx.load(traces[0])
    assert trace.steps.height == 3
    assert trace.metadata["tracedx"]["step_marker"] == "optimizer"
    tracedx.diagnose(trace)


@needs_torch
def test_script_that_raises_mid_loop_keeps_trace_and_exit_code(tmp_path, capsys):
    res = _inprocess(tmp_path, TRAIN, "10", "3", schedule=cap.Schedule(active=5))
    err = capsys.readouterr().err
    assert res.exit_code == 1
    assert "ValueError: boom at step 3" in err
    assert 'File "' in err and "s.py" in err  # the script's own traceback
    assert "tracedx/capture.py" not in err  # ... without tracedx's frames
    assert "inside the active window" in err
    doc = _load(res.path)
    assert doc["tracedx"]["active_steps_recorded"] == 2
    assert any(n.startswith("ProfilerStep#") for n in _names(doc, "user_annotation"))


def _inprocess(tmp_path: Path, script: str, *args: str, **kw) -> cap.CaptureResult:
    """capture_script in this process (no interpreter start: fast)."""
    path = tmp_path / "s.py"
    path.write_text(textwrap.dedent(script))
    return cap.capture_script(path, list(args), out_dir=tmp_path / "out", **kw)


@needs_torch
def test_never_reaching_the_active_window_says_how_many_steps(tmp_path, capsys):
    res = _inprocess(tmp_path, TRAIN, "2", schedule=cap.Schedule(wait=3, warmup=2, active=5))
    err = capsys.readouterr().err
    assert res.exit_code == 0 and res.steps == 2 and res.active_steps == 0
    assert "after 2 steps" in err
    assert "before the active window" in err and "needs 10 steps" in err
    # What was collected (the setup and the steps before warm-up) is still written.
    assert res.path is not None and res.path.exists()
    doc = _load(res.path)
    assert "aten::addmm" in _names(doc, "cpu_op")
    assert doc["tracedx"]["active_steps_recorded"] == 0


@needs_torch
def test_arguments_sys_path_and_exit_code(tmp_path, capsys):
    (tmp_path / "helper_mod.py").write_text("VALUE = 42\n")
    script = """
    import sys
    import torch
    import helper_mod  # the script's folder is on sys.path

    assert __name__ == "__main__"
    with open(sys.argv[1], "w") as f:
        f.write(repr(sys.argv[1:]) + " " + str(helper_mod.VALUE))
    a = torch.randn(8, 8)
    for _ in range(2):
        a = a @ a
    sys.exit(3)
    """
    seen = tmp_path / "seen.txt"
    argv_before = list(sys.argv)
    res = _inprocess(tmp_path, script, str(seen), "--flag", "x y")
    assert sys.argv == argv_before  # restored
    assert res.exit_code == 3
    assert seen.read_text() == repr([str(seen), "--flag", "x y"]) + " 42"
    # No step marker at all: the whole run is written, with a plain note (C20).
    assert "no step marker was seen" in capsys.readouterr().err
    assert res.step_marker == "none"
    assert _names(_load(res.path), "cpu_op").count("aten::mm") == 2


@needs_torch
def test_keyboard_interrupt_writes_trace_and_exits_130(tmp_path):
    script = """
    import torch
    import tracedx

    for i in range(10):
        torch.randn(8, 8) @ torch.randn(8, 8)
        tracedx.step()
        if i == 4:
            raise KeyboardInterrupt
    """
    res = _inprocess(tmp_path, script, schedule=cap.Schedule(active=5), quiet=True)
    assert res.exit_code == 130
    doc = _load(res.path)
    assert doc["tracedx"]["step_marker"] == "tracedx.step"
    assert doc["tracedx"]["active_steps_recorded"] == 3


def test_missing_script_is_a_one_line_usage_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "tracedx.cli", "capture", str(tmp_path / "nope.py")],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "no such script" in proc.stderr and "Traceback" not in proc.stderr


def test_step_outside_capture_is_a_noop():
    assert cap._active_markers is None
    cap.step()  # nothing to mark, nothing raised, no torch needed


class _Opt:
    """Stands in for an optimizer: the hook only needs an object identity."""


def test_markers_explicit_calls_win_without_double_counting():
    seen = []
    m = cap._Markers(lambda: seen.append(1))
    opt = _Opt()
    m._optimizer_hook(opt, (), {})  # iteration 1 ends: optimizer marks it
    m.explicit()  # same iteration's explicit marker: the same boundary
    assert m.count == 1 and m.source == "tracedx.step"
    m._optimizer_hook(opt, (), {})  # optimizer no longer counts
    m.explicit()
    assert m.count == 2 and len(seen) == 2


def test_markers_count_only_the_first_optimizer():
    m = cap._Markers(lambda: None)
    d_opt, g_opt = _Opt(), _Opt()
    for _ in range(3):  # a GAN's two optimizers: one step per iteration
        m._optimizer_hook(d_opt, (), {})
        m._optimizer_hook(g_opt, (), {})
    assert m.count == 3 and m.source == "optimizer"


def test_marker_modes():
    m = cap._Markers(lambda: None, "optimizer")
    m.explicit()
    assert m.count == 0
    with pytest.raises(cap.CaptureError):
        cap._Markers(lambda: None, "sometimes")


def test_schedule_validation_and_window():
    s = cap.Schedule(wait=0, warmup=0, active=3)
    assert s.start_active == 1 and s.needed == 4  # the setup step is never recorded
    assert cap.Schedule(wait=2, warmup=1, active=5).needed == 8
    with pytest.raises(cap.CaptureError):
        cap.Schedule(active=0)
    with pytest.raises(cap.CaptureError):
        cap.Schedule(wait=-1)


def test_metadata_goes_first_and_events_are_copied_unchanged(tmp_path):
    src = tmp_path / "t.json"
    src.write_text('{\n  "schemaVersion": 1, "traceEvents": [{"ph": "X", "dur": NaN}]\n}')
    dst = tmp_path / "t.json.gz"
    cap._insert_metadata(src, dst, {"version": "x"})
    with gzip.open(dst, "rt") as f:
        text = f.read()
    assert text.startswith('{\n  "tracedx": {"version": "x"},')
    assert text.endswith('"schemaVersion": 1, "traceEvents": [{"ph": "X", "dur": NaN}]\n}')


@needs_torch
def test_profile_context_manager(tmp_path):
    import torch

    import tracedx

    with tracedx.profile(out=tmp_path, name="nb", steps=2, warmup=0, wait=1) as p:
        for _ in range(5):
            torch.randn(4, 4).sum()
            tracedx.step()
    assert p.path is not None and p.path.exists() and p.path.name.startswith("nb-")
    assert p.active_steps == 2
    doc = _load(p.path)
    steps = [n for n in _names(doc, "user_annotation") if n.startswith("ProfilerStep#")]
    assert steps == ["ProfilerStep#1", "ProfilerStep#2"]


@needs_torch
def test_calibrate_without_gpu_is_a_one_line_error(tmp_path):
    import torch
    from click.testing import CliRunner

    from tracedx.cli import main

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: calibration would run")
    result = CliRunner().invoke(main, ["calibrate", "--out", str(tmp_path / "c.json")])
    assert result.exit_code == 2
    assert "needs a CUDA GPU" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "c.json").exists()


def test_sample_calibration_file_is_read_by_the_device_table():
    from tracedx.calibrate import SCHEMA
    from tracedx.devices import load_calibration

    sample = ROOT / "sample_traces" / "calibration-h200.json"
    if not sample.exists():
        pytest.skip("no sample calibration file")
    data = load_calibration(sample)
    assert data["schema"] == SCHEMA and data["device_name"] == "NVIDIA H200"
    assert set(data["matmul_tflops"]) == {"bf16", "fp16", "tf32", "fp32"}
    assert data["launch_overhead_us"] > 0
    # GUIDE.md section 3 (H200): every GPU ceiling within 15%.
    guide = {"bf16": 762, "fp16": 742, "tf32": 394, "fp32": 50}
    for k, v in guide.items():
        assert abs(data["matmul_tflops"][k] / v - 1) < 0.15, k
    assert abs(data["copy_bandwidth_gbs"] / 4200 - 1) < 0.15


def test_write_calibration_is_atomic_json(tmp_path):
    from tracedx.calibrate import write_calibration

    out = write_calibration(
        {"schema": "tracedx.calibration/1", "x": 1.5}, tmp_path / "d" / "c.json"
    )
    assert json.loads(out.read_text()) == {"schema": "tracedx.calibration/1", "x": 1.5}
    assert [p.name for p in out.parent.iterdir()] == ["c.json"]


# --- issue 19: capture keeps the trace whatever the script does ---------------------------------

LOOP = """
import os, signal, sys
import torch
import tracedx

for i in range(12):
    torch.randn(8, 8) @ torch.randn(8, 8)
    tracedx.step()
    if i == 4:
        {action}
print("after the loop")
"""


def _loop(action: str) -> str:
    return LOOP.replace("{action}", action)


@needs_torch
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_keep_the_trace(tmp_path, capsys, sig):
    script = _loop(f"os.kill(os.getpid(), signal.{sig})")
    res = _inprocess(tmp_path, script, schedule=cap.Schedule(active=5))
    import signal

    assert res.exit_code == 128 + getattr(signal, sig)
    assert f"terminated ({sig})" in capsys.readouterr().err
    assert _load(res.path)["tracedx"]["active_steps_recorded"] == 3


@needs_torch
def test_a_second_ctrl_c_during_the_stop_keeps_the_trace(tmp_path, capsys, monkeypatch):
    import signal

    finish = cap._Session.finish

    def slow_finish(self):  # Ctrl-C again while torch stops and exports
        os.kill(os.getpid(), signal.SIGINT)
        return finish(self)

    monkeypatch.setattr(cap._Session, "finish", slow_finish)
    res = _inprocess(tmp_path, _loop("raise KeyboardInterrupt"), schedule=cap.Schedule(active=5))
    err = capsys.readouterr().err
    assert res.exit_code == 130
    assert "Ctrl-C is held until it is written" in err
    assert "could not write the trace" not in err
    assert _load(res.path)["tracedx"]["active_steps_recorded"] == 3


@needs_torch
def test_a_relative_out_survives_a_chdir(tmp_path, monkeypatch, capsys):
    script = _loop("import tempfile; os.chdir(tempfile.mkdtemp())")
    (tmp_path / "s.py").write_text(textwrap.dedent(script))
    monkeypatch.chdir(tmp_path)
    res = cap.capture_script("s.py", [], out_dir="rel-out", schedule=cap.Schedule(active=3))
    assert res.path == tmp_path / "rel-out" / res.path.name and res.path.exists()
    assert str(tmp_path / "rel-out") in capsys.readouterr().out  # an absolute path


@needs_torch
def test_a_script_with_its_own_profiler_keeps_both_traces(tmp_path, capsys):
    own = tmp_path / "own.json"
    script = _loop(
        f"""
        with torch.profiler.profile() as p:
            torch.randn(8, 8) @ torch.randn(8, 8)
        p.export_chrome_trace({str(own)!r})"""
    )
    res = _inprocess(tmp_path, script, schedule=cap.Schedule(active=5))
    err = capsys.readouterr().err
    assert res.exit_code == 0, err
    assert "starts its own torch.profiler" in err
    assert own.exists() and json.loads(own.read_text())["traceEvents"]
    assert _load(res.path)["tracedx"]["active_steps_recorded"] == 3


def test_the_summary_counts_are_counted_while_writing(tmp_path):
    c = cap._Counter()
    text = b'{"ph": "X", "cat": "kernel", "name": "ProfilerStep#1"}' * 3
    for i in range(0, len(text), 7):  # patterns split across pieces
        c.feed(text[i : i + 7])
    assert c.counts == {"events": 3, "kernels": 3, "steps": 3}


@needs_torch
@pytest.mark.parametrize(
    "action, code, said, recorded",
    [
        ("sys.stdout.flush(); os._exit(7)", 7, "called os._exit", 3),
        (
            "pid = os.fork()\n"
            "        if pid == 0:\n"
            "            torch.randn(4, 4).sum(); sys.exit(0)\n"
            "        os.waitpid(pid, 0)",
            0,
            None,
            5,  # the parent's whole active window; the child wrote nothing
        ),
    ],
    ids=["os._exit", "fork"],
)
def test_os_exit_and_fork_keep_one_trace(tmp_path, action, code, said, recorded):
    proc, traces = _run(tmp_path, _loop(action), "--steps", "5")
    assert proc.returncode == code, proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    assert len(traces) == 1, proc.stderr
    if said:
        assert said in proc.stderr
    assert _load(traces[0])["tracedx"]["active_steps_recorded"] == recorded


@needs_torch
def test_a_script_that_closes_stdout_keeps_its_trace(tmp_path, monkeypatch, capsys):
    import io

    monkeypatch.setattr(sys, "stdout", io.StringIO())
    res = _inprocess(tmp_path, _loop("sys.stdout.close(); sys.exit(0)"))
    assert res.exit_code == 0 and res.path.exists()  # the path line was lost, not the capture
    assert "internal error" not in capsys.readouterr().err


NO_MARKERS = """
import time, torch
x = torch.ones(64)
t0 = time.monotonic()
while time.monotonic() - t0 < 1.5:  # no step marker: the fallback profile would record it all
    y = (x * 2).sum()
    time.sleep(0.002)  # a small trace: quick to write
print("done")
"""


@needs_torch
@pytest.mark.parametrize("limit", ["time", "growth"])
def test_a_script_without_step_markers_is_recorded_for_a_bounded_time(
    tmp_path, capsys, monkeypatch, limit
):
    if limit == "growth":  # any growth at all stops it: the 64 MiB tensor is growth enough
        monkeypatch.setattr(cap, "FALLBACK_GROWTH_BYTES", 1 << 20)
        script = NO_MARKERS.replace("t0 = ", "big = torch.ones(16 << 20)\nt0 = ")
        res = _inprocess(tmp_path, script, fallback_seconds=0)
        why = "once the process had grown by"
    else:
        res = _inprocess(tmp_path, NO_MARKERS, fallback_seconds=0.25)
        why = "after 0.25 s"
    err = capsys.readouterr().err
    assert res.exit_code == 0 and res.steps == 0, err
    messages = re.sub(r"\n\s+", " ", err).splitlines()  # a message may wrap at the width
    said = [ln for ln in messages if why in ln and "--fallback-seconds" in ln]
    assert len(said) == 2, err  # when it triggers, and in the summary at the end
    ts = [e["ts"] for e in _load(res.path)["traceEvents"] if e.get("ph") == "X"]
    assert ts and (max(ts) - min(ts)) / 1e6 < 0.9  # not the 1.5 s the script ran
    if limit == "time":
        assert all("2 GiB of growth" in ln for ln in said)
        from click.testing import CliRunner

        from tracedx.cli import main

        assert "--fallback-seconds" in CliRunner().invoke(main, ["capture", "--help"]).output
