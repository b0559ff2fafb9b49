"""The job diagnosis end to end on generated N-rank jobs (tests/jobgen.py): trace files ->
load_job -> diagnose_job, checked against the generator's own truth.

- a straggler is named only above the threshold, with its rank and cause;
- a host clock offset is recovered within its stated uncertainty;
- ``balance-ranks`` predicts the step of the same job without the straggler (predict, then
  generate that job and measure it).
"""

from __future__ import annotations

import pytest

pytest.importorskip("tracedx.job.summary", reason="needs the per-rank summary (job-summary)")

from jobgen import JobSpec, generate  # noqa: E402

from tracedx.job.diagnosis import diagnose_job  # noqa: E402
from tracedx.job.load import load_job  # noqa: E402

MESH = {"world": 4, "tp": 2, "steps": 6}


def _diagnose(spec, path):
    job = generate(spec, path)
    return job, diagnose_job(load_job(job.files, progress=False))


@pytest.mark.parametrize("pct, named", [(1.0, False), (8.0, True)])
def test_compute_straggler_only_above_threshold(tmp_path, pct, named):
    spec = JobSpec(**MESH, straggler=2, straggler_kind="compute", straggler_pct=pct)
    job, jd = _diagnose(spec, tmp_path)
    # the generator's own figures: the straggler's TP partner waits pct % of its compute
    truth = job.rank_steps.filter(job.rank_steps["rank"] == 3)["wait_us"].median()
    assert jd.straggler_test.effect is not None
    if named:
        assert jd.straggler is not None and jd.straggler.rank == 2
        assert jd.straggler.cause == "GPU compute"
        assert jd.bottleneck == "load imbalance"
    else:
        assert jd.straggler is None
        assert truth / jd.typical["step_us"] < 0.02


def test_host_straggler_named_with_cause(tmp_path):
    # only its first TP all-reduce and the DP one find it late (then the group is in step): 2
    # collectives per step, so 12 steps for C >= 20
    spec = JobSpec(**{**MESH, "steps": 12}, straggler=1, straggler_kind="host", straggler_pct=300)
    _, jd = _diagnose(spec, tmp_path)
    assert jd.straggler is not None and jd.straggler.rank == 1
    assert jd.straggler.host_side and jd.straggler.cause == "host work"
    assert jd.straggler.excess_us == pytest.approx(300.0)  # 300 % of 100 us host work
    assert jd.regime == "overhead-bound"


def test_clock_offset_recovered_within_uncertainty(tmp_path):
    spec = JobSpec(**MESH, ranks_per_host=2, theta_us=(0.0, 700.0), names="tensorboard")
    job, jd = _diagnose(spec, tmp_path)
    hosts = {r["host"]: r for r in jd.clock.hosts.iter_rows(named=True)}
    other = job.hosts[2]
    h = hosts[other]
    # the trace writes microseconds with 3 decimals: allow that rounding on top of u
    assert abs(h["theta_us"] - 700.0) <= h["uncertainty_us"] + 0.002
    assert h["applied"] and jd.clock.mode == "corrected"


@pytest.mark.parametrize("kind, pct", [("compute", 20.0), ("host", 300.0)])
def test_balance_ranks_predicts_the_balanced_job(tmp_path, kind, pct):
    spec = JobSpec(**{**MESH, "steps": 12}, straggler=2, straggler_kind=kind, straggler_pct=pct)
    _, jd = _diagnose(spec, tmp_path / "with")
    f = {x.fix: x for x in jd.findings}["balance-ranks"]
    _, balanced = _diagnose(spec.without_straggler(), tmp_path / "without")
    measured_ms = balanced.typical["step_us"] / 1e3
    # the generator's balanced job is the prediction to the trace's microsecond rounding
    assert f.estimated_step_ms == pytest.approx(measured_ms, rel=1e-3)
    assert jd.typical["step_us"] / 1e3 > measured_ms * 1.1  # and the straggler cost > 10 %
