"""The library as a notebook uses it: argument forms, errors, reprs, figures, the cache."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import tracedx
from tests.conftest import SAMPLES
from tracedx.errors import TraceError

JOB = SAMPLES / "ddp_mlp-gloo-host-straggler"


@pytest.fixture(scope="module")
def resnet():
    return tracedx.diagnose(tracedx.load(SAMPLES / "resnet_train-bf16-cl.json.gz"))


@pytest.mark.parametrize(
    "spec, want",
    [(5, [5]), (range(4, 6), [4, 5]), ([5, 4, 5], [4, 5]), ((4,), [4]), ("4..5", [4, 5])],
)
def test_steps_take_a_number_a_range_or_a_list(resnet, spec, want):
    assert tracedx.diagnose(resnet.trace, steps=spec).steps == want


def test_steps_take_numpy_integers_and_arrays(resnet):
    """What a notebook computes steps with: numpy scalars and arrays, a polars column."""
    import numpy as np

    t = resnet.trace
    assert tracedx.diagnose(t, steps=np.int64(5)).steps == [5]
    assert tracedx.diagnose(t, steps=np.arange(4, 6)).steps == [4, 5]
    assert tracedx.diagnose(t, steps=t.steps["step"].head(2)).steps == [4, 5]
    from tracedx.analysis.diagnosis import check_steps

    got = check_steps([np.int32(6), 4])
    assert got == (4, 6) and all(type(v) is int for v in got)  # pickled to workers as ints
    with pytest.raises(TypeError, match="not float64"):
        check_steps(np.float64(4))
    with pytest.raises(TypeError, match="not dict"):
        check_steps({4: 1})


@pytest.mark.parametrize(
    "spec, error, fragment",
    [
        (5.0, TypeError, "not float"),
        (True, TypeError, "not bool"),
        ([4, "5"], TypeError, "not str '5'"),
        ([], TraceError, "empty"),
        ([4, 99], TraceError, "no step 99; the trace has steps 4..7"),
        ("9..2", TraceError, "reversed"),
    ],
)
def test_bad_steps_say_what_is_wrong(resnet, spec, error, fragment):
    with pytest.raises(error, match=re.escape(fragment)):
        tracedx.diagnose(resnet.trace, steps=spec)


@pytest.mark.parametrize(
    "kw, error, fragment",
    [({"stepz": "5"}, TypeError, "unknown option"), ({"steps": 5.5}, TypeError, "not float")],
)
def test_load_job_refuses_bad_options_before_reading(kw, error, fragment, monkeypatch):
    # refused before any rank is read: no map runs
    monkeypatch.setattr("tracedx.job.executor.map_ranks", lambda *a, **k: pytest.fail("read"))
    with pytest.raises(error, match=fragment):
        tracedx.load_job(JOB, **kw)


def test_stored_summaries_are_keyed_by_the_options(tmp_path):
    store = tmp_path / "sums"
    few = tracedx.load_job(JOB, summaries_dir=store, steps="5..6", progress=False)
    stored = {e.name: e.stat().st_mtime_ns for e in store.iterdir()}
    again = tracedx.load_job(JOB, summaries_dir=store, steps="5..6", progress=False)
    assert {
        e.name: e.stat().st_mtime_ns for e in store.iterdir()
    } == stored  # reused, not rewritten
    every = tracedx.load_job(JOB, summaries_dir=store, progress=False, repair=False)
    assert len(list(store.iterdir())) == 2 * len(stored)  # entries of their own
    steps = [s.meta["steps"] for s in few.summaries]
    assert all(list(x) == [5, 6] for x in steps)
    assert [s.meta["steps"] for s in again.summaries] == steps
    assert all(len(s.meta["steps"]) > 2 for s in every.summaries)  # not the stored 5..6


def test_summary_keys_read_defaults_and_numpy_numbers_as_plain_options():
    import numpy as np

    from tracedx.job.executor import summary_name

    assert summary_name("t", 1, 0.0, {"repair": False}) == summary_name("t", 1, 0.0, {})
    assert summary_name("t", 1, 0.0, {"peak_tflops": np.float64(1.5)}) == summary_name(
        "t", 1, 0.0, {"peak_tflops": 1.5}
    )
    assert summary_name("t", 1, 0.0, {"repair": True}) != summary_name("t", 1, 0.0, {})


def test_repr_names_the_step_the_estimates_are_against(resnet):
    r = repr(resnet)
    assert "step 29.010 ms (median per step)" in r
    assert "top fixes (against the unprofiled 9.896 ms step): cuda-graphs 3.05x" in r
    f = resnet.findings[0]
    assert repr(f) == (
        "<Finding cuda-graphs: 3.05x -> 3.244 ms per step, f = 100%; .derivation, .evidence>"
    )
    assert f.estimated_ms_per_batch == pytest.approx(3.2442840625)
    assert f.to_dict()["estimated_ms_per_batch"] == 3.244284


def test_results_compare_by_identity(resnet):
    assert resnet == resnet and resnet != tracedx.diagnose(resnet.trace)
    assert resnet.trace == resnet.trace


def test_timeline_of_a_step_not_analysed_is_an_error(resnet):
    assert resnet.figures(step=5)["timeline"].layout.title.text.startswith("Step timeline: step 5")
    with pytest.raises(ValueError, match="step 99 was not analysed: the diagnosis has steps 4..7"):
        resnet.figures(step=99)
    with pytest.raises(TypeError, match="not str '5'"):
        resnet.figures(step="5")
    import numpy as np

    title = resnet.figures(step=np.int64(6))["timeline"].layout.title.text
    assert title.startswith("Step timeline: step 6")
    gappy = tracedx.diagnose(resnet.trace, steps=[4, 6])
    with pytest.raises(ValueError, match="step 5 was not analysed: the diagnosis has steps 4, 6$"):
        gappy.figures(step=5)


def test_figures_print_one_line_each(resnet):
    figs = resnet.figures()
    assert list(figs) == ["roofline", "timeline", "breakdown", "fixes"]
    lines = repr(figs).split("\n")
    assert len(lines) == 4 and all(len(x) < 160 for x in lines)
    assert lines[1].startswith(" 'timeline': <plotly Figure 'Step timeline: step")
    bundle = figs["fixes"]._repr_mimebundle_()
    assert bundle["text/plain"] == repr(figs["fixes"]) and "text/html" in bundle


def test_every_result_has_json_and_figures(resnet):
    a = tracedx.diagnose(tracedx.load(SAMPLES / "mlp_train-eager.json.gz"))
    b = tracedx.diagnose(tracedx.load(SAMPLES / "mlp_train-cudagraph.json.gz"))
    td = tracedx.diff(a, b)
    jd = tracedx.diagnose(tracedx.load_job(JOB, progress=False))
    for res, schema, names in (
        (resnet, "tracedx.diagnosis/1", ["roofline", "timeline", "breakdown", "fixes"]),
        (td, "tracedx.diff/2", ["estimate", "sides"]),
        (jd, "tracedx.job/1", ["wait_heatmap", "ranks"]),
    ):
        assert json.loads(res.to_json())["schema"] == schema
        assert list(res.figures()) == names


def test_job_text_is_wrapped_like_a_trace_report():
    jd = tracedx.diagnose(tracedx.load_job(JOB, progress=False))
    assert max(map(len, jd.to_text().split("\n"))) <= 100
    from tracedx.report.job import render_text

    assert max(map(len, render_text(jd, 80).split("\n"))) <= 80


def test_diff_of_paths_says_to_load_them():
    with pytest.raises(TypeError, match=r"tracedx.diff\(tracedx.load\('a.json'\), \.\.\.\)"):
        tracedx.diff("a.json", "b.json")


def test_load_with_cache_reads_back_the_tables(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEDX_CACHE_DIR", str(tmp_path / "cache"))
    p = SAMPLES / "mlp_train-eager.json.gz"
    first = tracedx.load(p, cache=True)
    from tracedx.cache import load as cached_load

    second, hit = cached_load(p)
    assert hit and second.kernels.equals(first.kernels) and second.ops.equals(first.ops)
    # a hit reads no JSON: the reader is never called
    monkeypatch.setattr("tracedx.trace._load", lambda *a: pytest.fail("the JSON was read"))
    assert tracedx.load(p, cache=True).launches.equals(first.launches)


def test_a_python_script_is_refused_by_load_and_the_command_alike():
    from click.testing import CliRunner

    from tests.conftest import ROOT
    from tracedx.cli import main
    from tracedx.errors import TraceFormatError

    script = ROOT / "capture" / "add_loop.py"
    with pytest.raises(TraceFormatError, match="is a Python script, not a trace: `tracedx capture"):
        tracedx.load(script)
    r = CliRunner().invoke(main, ["diagnose", str(script)])
    assert r.exit_code == 2 and "is a Python script, not a trace" in r.stderr


def test_errors_name_the_python_argument_as_well_as_the_flag():
    """A notebook user has no --device or --repair: the message names both."""
    tiny = tracedx.load(Path(__file__).parent / "data" / "tiny.json")
    with pytest.raises(TraceError) as e:
        tracedx.diagnose(tiny, peak_tflops=-1)
    assert (
        str(e.value) == "--peak-tflops (peak_tflops= in Python) must be a positive number, got -1"
    )
    with pytest.raises(TraceError) as e:
        tracedx.diagnose(tiny, device="h20")
    assert str(e.value).startswith(
        "unknown device 'h20' for --device (device= in Python); closest: "
    )
    cut = Path(__file__).parent / "data" / "bad" / "cut.json.gz"
    with pytest.raises(TraceError) as e:
        tracedx.load(cut)
    assert str(e.value).endswith("; `--repair` (repair=True in Python) loads what can be salvaged")
