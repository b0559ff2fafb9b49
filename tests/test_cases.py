"""The publicly reported trace problems in ../shared/cases, with the values CASES.md gives."""

from __future__ import annotations

import polars as pl
import pytest

import tracedx
from tests.conftest import case
from tracedx.analysis.timeline import idle_by_cause, idle_gaps, step_windows


def totals(path, **kw):
    t = tracedx.load(path, **kw)
    w = step_windows(t)
    return t, w, float(w["gpu_busy_us"].sum()), float(w["step_time_us"].sum())


# file, kernels, busy_us, span_us  (CASES.md, "trace span" column)
SPAN_CASES = [
    ("C04a_legacy_category_names.json", 3, 139, 200),
    ("C04b_modern_category_names.json", 3, 139, 200),
    ("C18a_valid_gzip_same_as_C04b.json.gz", 3, 139, 200),
    ("C06_negative_durations.json", 2, 40, 100),
    ("C07_zero_timestamps_second_half.json", 2, 50, 100),
    ("C10_cpu_ranges_not_nested.json", 2, 62, 200),
    ("C11_partial_or_missing_flow_links.json", 5, 83, 200),
    ("C12a_cuda_graph_replay_shared_correlation.json", 5, 120, 300),
    ("C13c_long_template_names_differ_at_end.json", 3, 60, 100),
    ("C16a_rank0_nccl_overlap.json", 3, 100, 130),
    ("C16b_rank1_nccl_overlap.json", 3, 110, 130),
    ("C16c_no_rank_old_nccl_name.json", 3, 100, 130),
    ("C15_legacy_autograd_array_format.json", 2, 7, 50),
]


@pytest.mark.parametrize("name,kernels,busy,span", SPAN_CASES)
def test_busy_and_span_match_hand_values(name, kernels, busy, span):
    t, w, b, s = totals(case(name))
    assert t.kernels.height == kernels
    assert b == pytest.approx(busy)
    assert s == pytest.approx(span)
    assert 1 - b / s == pytest.approx(1 - busy / span)


@pytest.mark.parametrize(
    "name,kernels,busy,span",
    [
        ("C02a_inf_literal_zero_dur_memcpy.txt", 1, 10, 60),
        ("C02b_nan_infinity_tokens.json", 2, 52, 100),
        ("C03_windows_unescaped_backslashes.txt", 2, 35, 80),
        ("C13a_raw_control_char_in_name.txt", 2, 40, 100),
        ("C13b_invalid_utf8_in_name.txt", 2, 40, 100),
        ("C01b_truncated_mid_event.txt", 1, 40, 100),
    ],
)
def test_repair_mode_recovers_hand_values(name, kernels, busy, span):
    t, w, b, s = totals(case(name), repair=True)
    assert t.kernels.height == kernels
    assert b == pytest.approx(busy)
    assert s == pytest.approx(span)
    assert any(x.kind == "repaired" for x in t.warnings)


def test_c04_counts_and_bandwidths():
    for name in ("C04a_legacy_category_names.json", "C04b_modern_category_names.json"):
        t = tracedx.load(case(name))
        assert (t.memcpys.height, t.memsets.height) == (1, 1)
        m = t.memcpys.row(0, named=True)
        assert m["bytes"] == 1_048_576 and m["duration_us"] == 20
        assert m["bytes"] / m["duration_us"] / 1e3 == pytest.approx(52.43, abs=0.01)  # GB/s
        assert t.launches.height == 5
        assert t.steps.height == 1 and not t.steps_synthetic


def test_c06_negative_durations_dropped_and_counted():
    t = tracedx.load(case("C06_negative_durations.json"))
    w = {x.kind: x for x in t.warnings}
    assert w["invalid_duration"].count == 2  # one cpu_op, one kernel


def test_c07_zero_timestamps_left_out():
    t = tracedx.load(case("C07_zero_timestamps_second_half.json"))
    w = {x.kind: x for x in t.warnings}
    assert w["outlier_timestamp"].count == 7
    assert t.steps.height == 1  # ProfilerStep#2 had ts 0


def test_c10_kernels_land_in_the_step_of_their_launch():
    t = tracedx.load(case("C10_cpu_ranges_not_nested.json"))
    assert t.steps["step"].to_list() == [1, 2]
    assert t.kernels.sort("start_us")["step"].to_list() == [1, 2]
    assert t.memcpys["step"].to_list() == [1]
    assert t.memcpys["bytes"].to_list() == [4]


def test_c11_attribution_by_correlation_not_flows():
    t = tracedx.load(case("C11_partial_or_missing_flow_links.json"))
    k = t.kernels
    assert k.filter(k["launch_name"].is_not_null()).height == 4
    un = k.filter(k["launch_name"].is_null())
    assert (
        un.height == 1
        and un["correlation"].to_list() == [1999]
        and un["duration_us"].to_list() == [15]
    )
    assert "cuLaunchKernelEx" in k["launch_name"].to_list()
    assert {x.kind for x in t.warnings} >= {"unattributed_gpu"}


def test_c12_graph_replay_one_launch_many_kernels():
    t = tracedx.load(case("C12a_cuda_graph_replay_shared_correlation.json"))
    assert t.kernels.height == 5 and t.launches.height == 2
    assert t.kernels.filter(t.kernels["launch_name"] == "cudaGraphLaunch").height == 4
    assert t.kernels["launch_name"].null_count() == 0


def test_c13c_long_names_grouped_by_full_name():
    t = tracedx.load(case("C13c_long_template_names_differ_at_end.json"))
    by = dict(t.kernels.group_by("name").agg(pl.col("duration_us").sum()).rows())
    assert sorted(by.values()) == [20, 40]  # name A: 2 calls 40 us; name B: 1 call 20 us
    counts = sorted(dict(t.kernels.group_by("name").len().rows()).values())
    assert counts == [1, 2]


def test_c13b_non_ascii_kept_exactly_in_repair_mode():
    t = tracedx.load(case("C13b_invalid_utf8_in_name.txt"), repair=True)
    names = t.annotations["name"].to_list() + t.ops["name"].to_list()
    assert any("Vorwärts_前向_forward" in n for n in names)


def test_c08_cpu_only_has_no_gpu_numbers():
    t = tracedx.load(case("C08a_no_gpu_events_cpu_only.json"))
    w = step_windows(t)
    assert not t.has_gpu_activity
    assert w["gpu_busy_us"].to_list() == [None] and w["idle_fraction"].to_list() == [None]
    top = t.ops.filter(t.ops["parent_id"].is_null())
    assert top["duration_us"].sum() == 330


def test_c08b_launches_without_kernels_warns():
    t = tracedx.load(case("C08b_runtime_calls_but_no_gpu_activity.json"))
    w = {x.kind: x for x in t.warnings}
    assert w["no_gpu_activity"].count == 3


def test_c15_legacy_array_format():
    t = tracedx.load(case("C15_legacy_autograd_array_format.json"))
    assert t.ops.height == 3 and t.steps_synthetic
    assert sorted(t.kernels["duration_us"].to_list()) == [3, 4]


def test_idle_causes_add_up_to_idle():
    t = tracedx.load(case("C10_cpu_ranges_not_nested.json"))
    w = step_windows(t)
    g = idle_gaps(t, w)
    by = idle_by_cause(g)
    assert by["idle_us"].sum() == pytest.approx(w["idle_us"].sum())
    # step 2 starts with the GPU drained by the .item() copy that blocked the host
    assert "host sync" in by.filter(by["step"] == 2)["cause"].to_list()
