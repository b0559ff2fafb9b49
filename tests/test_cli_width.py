"""The CLI at a 100-column terminal and piped (issue 17): stderr messages and --help fit the
width, larger-batch reads per sample, and a command given the wrong kind of input says what to
run instead."""

from __future__ import annotations

import io
import json
import re

import pytest
from click.testing import CliRunner

from tests.tracebuilder import T0, TraceBuilder
from tests.tracebuilder import steps_trace as _trace
from tracedx.cli import main

COMMANDS = ["diagnose", "capture", "diff", "annotate", "report", "calibrate"]


def _messages(stderr: str) -> list[str]:
    """stderr's messages: a message's continuation lines are indented; joined back here."""
    out: list[str] = []
    for line in stderr.splitlines():
        if line.startswith(" ") and out:
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out


def _fits(text: str, width: int = 100) -> None:
    long = [ln for ln in text.splitlines() if len(ln) > width]
    assert not long, long


# --- stderr ----------------------------------------------------------------------------------


def test_cache_notice_fits_100_columns_as_one_indented_message(tmp_path):
    p = _trace(tmp_path / "t.json")
    run = CliRunner().invoke
    assert run(main, ["diagnose", str(p)]).exit_code == 0
    r = run(main, ["diagnose", str(p)])
    assert r.exit_code == 0
    _fits(r.stderr)
    assert len(r.stderr.splitlines()) > 1  # the notice is longer than 100 columns: wrapped
    [msg] = _messages(r.stderr)
    assert msg.startswith(f"tracedx: reused the cached diagnosis of {p} (in ")
    assert msg.endswith("; --no-cache reads the file)")


def test_diff_gate_fail_line_is_one_line_off_a_terminal_and_fits_on_one(tmp_path, monkeypatch):
    fast, slow = _trace(tmp_path / "fast.json", 100.0), _trace(tmp_path / "slow.json", 150.0)
    args = ["diff", str(fast), str(slow), "--fail-if-slower", "40", "--no-cache"]
    line = (
        "tracedx: FAIL: AFTER is 50.0% slower (1.50x the time; traced median step 0.100 -> "
        "0.150 ms), over --fail-if-slower 40%"
    )
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and r.stderr.splitlines() == [line]  # a CI log: grep gets it whole
    import tracedx.cli as cli

    monkeypatch.setattr(cli, "_isatty", lambda stream: True)
    monkeypatch.setattr(cli, "columns", lambda stream=None: 80)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1
    _fits(r.stderr, 80)
    assert _messages(r.stderr) == [line]


def test_errors_stay_one_line_off_a_terminal_and_fit_on_one(tmp_path, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    r = CliRunner().invoke(main, ["diagnose", str(bad)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and len(r.stderr) > 100
    import tracedx.cli as cli

    monkeypatch.setattr(cli, "_isatty", lambda stream: True)
    monkeypatch.setattr(cli, "columns", lambda stream=None: 80)
    r = CliRunner().invoke(main, ["diagnose", str(bad)])
    assert r.exit_code == 2
    _fits(r.stderr, 80)
    [msg] = _messages(r.stderr)
    assert msg.startswith(f"tracedx: error: {bad}: not valid JSON")


def test_capture_notices_fit_stderr(capsys):
    from tracedx.capture import _print_err

    _print_err("tracedx: wrote " + "/x" * 30 + " (431 events, 0 kernels, 5 ProfilerStep ranges)")
    err = capsys.readouterr().err
    _fits(err)
    assert len(err.splitlines()) == 2 and err.splitlines()[1] == "    5 ProfilerStep ranges)"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_columns_follow_the_terminal_else_100(monkeypatch):
    from tracedx import console

    assert console.columns(io.StringIO()) == 100
    monkeypatch.setenv("COLUMNS", "132")
    assert console.columns(_Tty()) == 132
    assert console.columns(io.StringIO()) == 100  # piped: $COLUMNS does not widen it
    monkeypatch.setenv("COLUMNS", "20")
    assert console.columns(_Tty()) == console.MIN_WIDTH


def test_fit_keeps_a_short_command_whole():
    from tracedx import console

    line = "tracedx: error: traces is a directory; " + "x " * 20 + "(`tracedx diagnose traces`)"
    out = console.fit(line, 60).splitlines()
    assert any("`tracedx diagnose traces`" in ln for ln in out), out


# --- --help ----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_uses_100_columns_when_not_a_terminal_and_reads_well(command):
    r = CliRunner().invoke(main, [command, "--help"] if command else ["--help"])
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    _fits(r.stdout)
    # click's default wraps at 78: at 100 columns some line uses the room past it
    assert max(map(len, lines)) > 80, r.stdout
    for ln in lines:
        assert not re.search(r"\w-$", ln), ln  # no word broken at a hyphen (cuda-|graphs)
        # every option names what it takes, not click's type names
        assert not re.search(r"--\S+ (TEXT|INTEGER|FLOAT)\b", ln), ln
    if command is None:  # every command's one-line summary is whole, not cut with "..."
        assert not [ln for ln in lines[1:] if ln.endswith("...")], r.stdout


def test_help_follows_a_wider_terminal_up_to_a_limit(monkeypatch):
    import tracedx.cli as cli

    monkeypatch.setattr(cli, "columns", lambda stream=None: 200)
    r = CliRunner().invoke(main, ["diagnose", "--help"])
    widest = max(map(len, r.stdout.splitlines()))
    assert 100 < widest <= cli.HELP_MAX_WIDTH


# --- larger-batch reads per sample -----------------------------------------------------------


def test_larger_batch_is_per_sample_in_every_format(tmp_path):
    """host 100 us per step stays, GPU 40 us grows 1.98x (elementwise above the launch floor)
    -> 79.2 us: the 2x step is max(100, 79.2) = 100 us, i.e. 0.050 ms per today's batch."""
    import tracedx
    from tracedx.report import render
    from tracedx.report.html import render_html

    d = tracedx.diagnose(tracedx.load(_trace(tmp_path / "t.json")))
    text = render(d, "text")
    assert (
        "  1. larger-batch: 2.00x per sample -> 0.050 ms per today's batch; the 2x step 0.100 ms"
        in text.splitlines()
    )
    md = render(d, "md")
    assert "| 2.00x per sample | 0.050 ms per today's batch; the 2x step 0.100 ms |" in md
    [f] = json.loads(render(d, "json"))["findings"]
    assert f["fix"] == "larger-batch" and f["batch_factor"] == 2.0
    assert f["estimated_ms_per_batch"] == f["estimated_step_ms"] == 0.05  # the old name kept
    page = render_html(d)
    assert "2.00x per sample" in page and "0.050 ms per today&#x27;s batch" in page
    assert "2.00x per sample" in d._repr_html_()


def test_diff_of_a_grown_batch_says_per_sample(tmp_path):
    """BEFORE: 4 steps of 100 us, kernel of input [64, 64]; AFTER: 4 steps of 150 us with the
    kernel's input [128, 64] (2x the batch): per sample 2 x 100 / 150 = 1.33x faster."""

    def batch(path, step_us, rows):
        b = TraceBuilder()
        t = T0
        for i in range(1, 5):
            b.step(i, t, step_us)
            ext = b.op("aten::add", t + 1, 10, input_dims=[[rows, 64], [rows, 64]])
            corr = b.launch(t + 2, 5, ext=ext)
            b.kernel(t + 10, 40, corr, name="elementwise_kernel")
            t += step_us
        return b.write(path)

    before, after = batch(tmp_path / "b.json", 100.0, 64), batch(tmp_path / "a.json", 150.0, 128)
    r = CliRunner().invoke(main, ["diff", str(before), str(after), "--fix", "larger-batch"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert any(
        ln.startswith("STEP: AFTER is 1.33x faster per sample (25.0% less time per sample;")
        for ln in lines
    ), r.stdout
    assert any(ln.startswith("  achieved     1.33x per sample traced") for ln in lines), r.stdout


# --- the wrong kind of input -----------------------------------------------------------------


def test_report_of_a_directory_says_what_to_run(tmp_path):
    d = tmp_path / "traces"
    d.mkdir()
    r = CliRunner().invoke(main, ["report", str(d)])
    assert r.exit_code == 2 and r.stdout == "" and r.stderr.count("\n") == 1
    assert "tracedx report takes one trace file" in r.stderr
    assert f"`tracedx diagnose {d} --html report.html`" in r.stderr
    r = CliRunner().invoke(main, ["diff", str(d), str(d)])
    assert r.exit_code == 2 and "tracedx diff compares two trace files" in r.stderr


def test_a_python_script_given_as_a_trace_points_to_capture(tmp_path):
    s = tmp_path / "train.py"
    s.write_text("print('hi')\n")
    r = CliRunner().invoke(main, ["diagnose", str(s)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert f"`tracedx capture {s}` runs it under torch.profiler" in r.stderr


# --- what a new user trips on ----------------------------------------------------------------


def test_a_cpu_only_trace_shows_host_time_without_empty_device_columns(tmp_path):
    b = TraceBuilder()
    for i in range(1, 4):
        t = T0 + 100 * i
        b.step(i, t, 100)
        b.op("aten::linear", t + 5, 60)
    p = b.write(tmp_path / "cpu.json")
    out = CliRunner().invoke(main, ["diagnose", str(p)]).stdout
    assert "CPU VS DEVICE TIME" not in out
    i = out.index("HOST TIME BY TOP-LEVEL OP (mean per step; the trace has no GPU activity)")
    rows = out[i:].splitlines()[1:3]
    assert rows[0].split() == ["op", "host", "ms"] and rows[1].split() == ["aten::linear", "0.060"]


def test_top_level_op_names_use_the_width(tmp_path):
    name = "autograd::engine::evaluate_function: AddmmBackward0"  # 51 characters
    b = TraceBuilder()
    for i in range(1, 4):
        t = T0 + 100 * i
        b.step(i, t, 100)
        b.launched_kernel(name, t + 5, 20, t + 30, 10)
    out = CliRunner().invoke(main, ["diagnose", str(b.write(tmp_path / "t.json"))]).stdout
    [row] = [ln for ln in out.splitlines() if ln.startswith(f"  {name} ")]
    assert len(row) <= 100


def test_diff_says_why_op_times_vanish_under_a_cuda_graph(tmp_path):
    """BEFORE launches its kernel from aten::mm; AFTER replays it in a CUDA graph, whose kernel
    no op launched: aten::mm's device time falls 10 us -> 0, and the report says why."""
    eager, graph = TraceBuilder(), TraceBuilder()
    for i in range(1, 4):
        t = T0 + 100 * i
        eager.step(i, t, 100)
        eager.launched_kernel("aten::mm", t + 5, 20, t + 30, 10)
        graph.step(i, t, 40)
        graph.graph_launch(t + 5, 5, [(t + 12, 10)])
    before, after = eager.write(tmp_path / "e.json"), graph.write(tmp_path / "g.json")
    out = CliRunner().invoke(main, ["diff", str(before), str(after)]).stdout
    i = out.index("OPS WHOSE DEVICE TIME CHANGED MOST (per step)")
    assert " ".join(out[i:].split()).startswith(
        "OPS WHOSE DEVICE TIME CHANGED MOST (per step) (AFTER replays CUDA graphs: a graph's "
        "kernels have no launching op there, so op times count only kernels outside graphs) "
        "aten::mm 0.010 ms -> 0.000 ms (-0.010 ms)"
    ), out[i:]


def test_fit_keeps_a_number_with_its_unit():
    from tracedx.console import fit

    out = fit("a" * 45 + " 0.25 s then 2 GiB", 50).split("\n")  # "0.25" would end at column 50
    assert out == ["a" * 45, "    0.25 s then 2 GiB"], out


# --- narrow terminals --------------------------------------------------------------------------


@pytest.mark.parametrize("width", [80, 90])
def test_report_tables_fit_a_narrow_terminal_without_wrapped_rows(width):
    """At 80 columns every table row of the report stays one line: the op column gives up
    width, not the numbers (a wrapped row would be indented under its first)."""
    from conftest import SAMPLES

    import tracedx
    from tracedx.report import render

    d = tracedx.diagnose(tracedx.load(SAMPLES / "mlp_train-eager.json.gz"))
    text = render(d, "text", width=width)
    _fits(text, width)
    lines = text.splitlines()
    for title in ("CPU VS DEVICE TIME", "TOP OPS BY DEVICE TIME"):
        at = next(i for i, ln in enumerate(lines) if ln.startswith(title))
        end = lines.index("", at)
        # the table's rows, up to a note under it (which may wrap)
        rows = lines[at + 1 : end]
        rows = rows[: next((i for i, r in enumerate(rows) if r.startswith("  (")), len(rows))]
        assert all(not r.startswith("    ") for r in rows), rows  # no continuation lines


def test_a_shortened_op_name_keeps_what_tells_it_apart():
    from tracedx.report.text import short_name

    name = "autograd::engine::evaluate_function: AddmmBackward0"
    assert short_name(name, 32) == "autograd::engin…: AddmmBackward0"
    assert short_name(name, 14) == "autograd::eng…"  # the tail alone would not fit
    assert short_name(name, 60) == name
    assert short_name("void at::native::kernel<float>(int)", 12) == "void at::na…"


def test_a_terminal_of_unknown_size_is_not_taken_as_narrow(monkeypatch):
    import os

    from tracedx import console

    class Tty(io.StringIO):
        def isatty(self):
            return True

        def fileno(self):
            return 1

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((0, 0)))
    assert console.columns(Tty()) == console.WIDTH
    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((72, 20)))
    assert console.columns(Tty()) == 72
