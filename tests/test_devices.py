"""Device table: real trace names, dense figures with sources, overrides and calibration."""

from __future__ import annotations

import json

import pytest

from tracedx.devices import DEVICES, PEAK_KEYS, get_device, match_device, resolve_device
from tracedx.errors import DeviceSpecError


@pytest.mark.parametrize(
    "trace_name,key",
    [
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 3090", "rtx-3090"),
        ("NVIDIA GeForce RTX 4060 Laptop GPU", "rtx-4060-laptop"),
        ("Tesla T4", "t4"),
        ("Tesla V100-SXM2-16GB", "v100-sxm2"),
        ("Tesla V100-DGXS-32GB", "v100-sxm2"),
        ("Tesla V100-PCIE-32GB", "v100-pcie"),
        ("Tesla V100S-PCIE-32GB", "v100s-pcie"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB10", "dgx-spark"),
        ("AMD Instinct MI300X", "mi300x"),
        ("AMD Instinct MI300X VF", "mi300x"),
        ("AMD Instinct MI210", "mi210"),
        ("nvidia h200", "h200-sxm"),  # case does not matter
    ],
)
def test_trace_names_match(trace_name, key):
    spec, _ = match_device(trace_name)
    assert spec is not None and spec.key == key


@pytest.mark.parametrize(
    "trace_name",
    [
        "NVIDIA GeForce RTX 4090 Laptop GPU",  # not the desktop 4090
        "NVIDIA GeForce RTX 3090 Ti",
        "NVIDIA L40",  # not an L4
        "NVIDIA GH200 480GB",
        "Quadro GP100",
        "AMD Radeon Graphics",
        "",
    ],
)
def test_unlisted_names_do_not_match(trace_name):
    assert match_device(trace_name)[0] is None


def test_ambiguous_a100_is_assumed_with_a_note():
    spec, note = match_device("NVIDIA A100-PG509-200")
    assert spec.key == "a100-sxm-80gb"
    assert "assuming" in note


def test_guide_figures_dense_not_sparse():
    h100 = DEVICES["h100-sxm"]
    assert h100.peak_tflops["bf16"] == pytest.approx(990, abs=1)  # dense, not the 1979 sparse
    assert h100.bandwidth_gbs == 3350
    assert h100.ridge_point("bf16") == pytest.approx(295, abs=1)  # GUIDE.md: ~295 FLOP/byte
    r4090 = DEVICES["rtx-4090"]
    assert (r4090.peak_tflops["bf16"], r4090.peak_tflops["fp32"], r4090.peak_tflops["tf32"]) == (
        165.2,
        82.6,
        82.6,
    )
    assert r4090.bandwidth_gbs == 1008 and r4090.num_sms == 128
    assert r4090.ridge_point("bf16") == pytest.approx(165.2e12 / 1.008e12)  # seed 001: ~164
    laptop = DEVICES["rtx-4060-laptop"]
    assert (laptop.peak_tflops["bf16"], laptop.peak_tflops["fp32"], laptop.bandwidth_gbs) == (
        29.1,
        14.6,
        256,
    )
    assert DEVICES["t4"].bandwidth_gbs == 320 and DEVICES["t4"].num_sms == 40
    assert DEVICES["dgx-spark"].bandwidth_gbs == 273
    h200 = DEVICES["h200-sxm"]  # GUIDE.md section 3 datasheet leads
    assert (h200.peak_tflops["bf16"], h200.peak_tflops["tf32"], h200.peak_tflops["fp32"]) == (
        989.5,
        494.5,
        67.0,
    )
    assert h200.bandwidth_gbs == 4800 and h200.num_sms == 132
    assert "fp8" not in DEVICES["a100-sxm-80gb"].peak_tflops
    assert "bf16" not in DEVICES["t4"].peak_tflops  # Turing has no bf16 tensor cores


def test_every_figure_has_a_source():
    for spec in DEVICES.values():
        assert spec.peak_tflops, spec.key
        assert set(spec.peak_tflops) <= set(PEAK_KEYS), spec.key
        for k in [*spec.peak_tflops, "bandwidth_gbs"]:
            assert spec.sources.get(k), f"{spec.key}.{k} has no source"
        assert spec.source and spec.bandwidth_gbs > 0


def test_ridge_point_missing_dtype():
    assert DEVICES["t4"].ridge_point("bf16") is None
    assert DEVICES["t4"].ridge_point("fp16") == pytest.approx(65e12 / 320e9)


def test_get_device_by_key_or_name_and_unknown_lists_close_names():
    assert get_device("h100-pcie").key == "h100-pcie"
    assert get_device("rtx4090").key == "rtx-4090"
    assert get_device("H200").key == "h200-sxm"
    with pytest.raises(DeviceSpecError) as e:
        get_device("h300-sxm")
    msg = str(e.value)
    assert "\n" not in msg and "h300-sxm" in msg and "h100-sxm" in msg


def test_resolve_from_trace_name():
    spec, notes = resolve_device("NVIDIA H100 80GB HBM3")
    assert spec.key == "h100-sxm" and notes == []


def test_resolve_unknown_device_skips_peaks_with_a_note():
    spec, notes = resolve_device("Foo GPU")
    assert spec is None
    assert any("unknown device 'Foo GPU'" in n and "--peak-tflops" in n for n in notes)
    spec, _ = resolve_device(None)
    assert spec is None


def test_device_flag_beats_trace_name():
    spec, notes = resolve_device("NVIDIA H100 80GB HBM3", device="a100-sxm-40gb")
    assert spec.key == "a100-sxm-40gb"
    assert any("instead of" in n for n in notes)


def test_unknown_device_flag_raises():
    with pytest.raises(DeviceSpecError):
        resolve_device("NVIDIA H200", device="not-a-gpu")


def _write_cal(tmp_path, **over):
    data = {
        "schema": "tracedx.calibration/1",
        "device_name": "NVIDIA H200",
        "copy_bandwidth_gbs": 4200.0,
        "matmul_tflops": {"bf16": 762.0, "fp16": 742.0, "tf32": 394.0, "fp32": 50.0},
        "launch_overhead_us": 13.0,
    }
    data.update(over)
    p = tmp_path / "h200.calibration.json"
    p.write_text(json.dumps(data))
    return p


def test_calibration_replaces_measured_figures_only(tmp_path):
    p = _write_cal(tmp_path)
    spec, notes = resolve_device("NVIDIA H200", calibration=p)
    assert spec.bandwidth_gbs == 4200.0
    assert spec.peak_tflops["bf16"] == 762.0 and spec.peak_tflops["fp32"] == 50.0
    assert spec.peak_tflops["fp8"] == 1979.0  # not measured: the datasheet figure stays
    assert spec.sources["bf16"] == "calibration h200.calibration.json"
    assert spec.sources["bandwidth_gbs"] == "calibration h200.calibration.json"
    assert "datasheet" in spec.sources["fp8"] or "nvidia.com" in spec.sources["fp8"]
    assert spec.source.startswith("calibration h200.calibration.json")
    assert any("datasheet figures kept for" in n for n in notes)
    assert spec.num_sms == 132


def test_calibration_beats_device_flag_and_overrides_beat_calibration(tmp_path):
    p = _write_cal(tmp_path)
    spec, notes = resolve_device(None, device="h200-sxm", calibration=p, bandwidth_gbs=3000.0)
    assert spec.bandwidth_gbs == 3000.0  # override > calibration
    assert spec.sources["bandwidth_gbs"] == "command-line override"
    assert spec.peak_tflops["bf16"] == 762.0  # calibration > --device datasheet
    spec, notes = resolve_device("NVIDIA H200", calibration=p, peak_tflops=500.0)
    assert set(spec.peak_tflops.values()) == {500.0}  # one roof for every dtype
    assert spec.bandwidth_gbs == 4200.0
    assert any("every dtype" in n for n in notes)


def test_calibration_for_unknown_trace_device_uses_its_own_name(tmp_path):
    p = _write_cal(tmp_path, device_name="Mystery GPU", matmul_tflops={"bf16": 100.0})
    spec, _ = resolve_device("Mystery GPU", calibration=p)
    assert spec.name == "Mystery GPU"
    assert spec.peak_tflops == {"bf16": 100.0} and spec.bandwidth_gbs == 4200.0


def test_calibration_from_another_gpu_is_noted(tmp_path):
    p = _write_cal(tmp_path, device_name="NVIDIA A100-SXM4-80GB")
    _, notes = resolve_device("NVIDIA H200", calibration=p)
    assert any("measured on 'NVIDIA A100-SXM4-80GB'" in n for n in notes)


@pytest.mark.parametrize(
    "content,needle",
    [
        ("{not json", "not valid JSON"),
        ('{"schema": "other/1", "copy_bandwidth_gbs": 1}', "schema"),
        ('{"schema": "tracedx.calibration/1", "copy_bandwidth_gbs": -5}', "copy_bandwidth_gbs"),
        (
            '{"schema": "tracedx.calibration/1", "matmul_tflops": {"bf16": "fast"}}',
            "matmul_tflops.bf16",
        ),
        ('{"schema": "tracedx.calibration/1", "matmul_tflops": {"int4": 5}}', "int4"),
        ('{"schema": "tracedx.calibration/1"}', "no figure"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_bad_calibration_file_is_one_line_error(tmp_path, content, needle):
    p = tmp_path / "cal.json"
    p.write_text(content)
    with pytest.raises(DeviceSpecError) as e:
        resolve_device("NVIDIA H200", calibration=p)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_calibration_file(tmp_path):
    with pytest.raises(DeviceSpecError, match="no such file \\(the calibration file\\)"):
        resolve_device("NVIDIA H200", calibration=tmp_path / "absent.json")


def test_overrides_alone_for_an_unknown_device():
    spec, _ = resolve_device("Foo GPU", peak_tflops=100.0, bandwidth_gbs=500.0)
    assert spec.bandwidth_gbs == 500.0 and spec.peak_tflops["bf16"] == 100.0
    assert spec.source == "command-line override"
    assert spec.ridge_point("fp32") == pytest.approx(200.0)
    spec, notes = resolve_device("Foo GPU", peak_tflops=100.0)
    assert spec is None and any("--bandwidth-gbs" in n for n in notes)
    with pytest.raises(DeviceSpecError):
        resolve_device("NVIDIA H200", bandwidth_gbs=-1.0)
