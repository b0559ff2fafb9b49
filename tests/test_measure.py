"""tracedx.measure: the seeds' timing helpers (CPU parts; torch only where it is needed)."""

from __future__ import annotations

import time

import pytest

from tracedx import measure


def test_summarize_median_min_max():
    t = measure.summarize([3.0, 1.0, 2.0, 10.0])
    assert (t.median_ms, t.min_ms, t.max_ms, t.samples) == (2.5, 1.0, 10.0, 4)
    # the mean, 16 / 4 = 4.0, is the throughput of bursty steps (one slow step in four)
    assert t.mean_ms == 4.0
    assert t.as_dict() == {"median": 2.5, "mean": 4.0, "min": 1.0, "max": 10.0, "n": 4}
    with pytest.raises(ValueError):
        measure.summarize([])


def test_wall_times_the_function_after_warmup():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.002)

    t = measure.wall(fn, samples=5, warmup=2, cuda=False)
    assert len(calls) == 7 and t.samples == 5
    assert 1.5 <= t.min_ms <= t.median_ms <= t.max_ms < 200
    with pytest.raises(ValueError):
        measure.wall(fn, samples=0)


def test_step_timer_skips_warmup_intervals_and_stops_at_count():
    timer = measure.StepTimer(count=3, skip=2, cuda=False)
    for _ in range(10):
        timer.mark()
        time.sleep(0.001)
    # marks 1..3 open intervals 0 and 1 (skipped); intervals 2..4 are kept; then done.
    assert timer.done and len(timer.intervals_ms) == 3
    assert timer.marks == 6
    s = timer.summary()
    assert s is not None and s.samples == 3 and s.min_ms >= 0.9


def test_step_timer_without_enough_marks():
    timer = measure.StepTimer(count=5, skip=1, cuda=False)
    timer.mark()
    timer.mark()
    assert timer.summary() is None and not timer.done
    with pytest.raises(ValueError):
        measure.StepTimer(count=0)


def test_gpu_helpers_without_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert measure.warm_gpu_clocks(0.1) is False
    measure.synchronize()  # no CUDA context: nothing to wait for, nothing raised
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        measure.device_time(lambda: None)
