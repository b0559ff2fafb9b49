"""GPU ceilings: dense peak FLOP/s per dtype and memory bandwidth, matched from the trace.

Every figure is **dense** (no 2:4 structured sparsity). Vendor datasheets print the sparse
figure for tensor-core math with an asterisk; the dense figure is half of it, and that half
is what is stored here (PyTorch inductor's device table lists H100 bf16 at the sparse
figure). Units: ``peak_tflops`` in TFLOP/s (1e12 FLOP/s), ``bandwidth_gbs`` in GB/s
(1e9 bytes/s, bytes read plus bytes written, as a device-to-device copy counts them).

Peak keys (present only where the part has that math):

- ``fp64``: FP64 on the vector (CUDA-core / SIMD) units.
- ``fp64_tc``: FP64 on matrix units (A100, H100, H200, B200, MI200/MI300).
- ``fp32``: FP32 on the vector units (elementwise math and fp32 GEMMs with TF32 off).
- ``fp32_tc``: FP32 on matrix units (AMD CDNA only).
- ``tf32``: TF32 tensor cores (fp32 GEMMs with ``allow_tf32``; NVIDIA Ampere and later).
- ``bf16``, ``fp16``: tensor cores with FP32 accumulate (what PyTorch uses).
- ``fp8``: FP8 tensor cores with FP32 accumulate.

Datasheets are leads, not measurements (``tracedx calibrate`` on an H200, recorded in
``sample_traces/calibration-h200.json``: copies at 4.21 TB/s against 4.8 on paper, bf16 matmuls
at 775 TFLOP/s against 989.5): a calibration file
written by ``tracedx calibrate`` replaces them with measured figures.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from tracedx.errors import DeviceSpecError
from tracedx.files import CALIBRATION_MAX_BYTES, read_capped

PEAK_KEYS = ("fp64", "fp64_tc", "fp32", "fp32_tc", "tf32", "bf16", "fp16", "fp8")
"""The peak keys a :class:`DeviceSpec` may carry (see the module docstring)."""

CALIBRATION_SCHEMA = "tracedx.calibration/1"


@dataclass(frozen=True)
class DeviceSpec:
    """The ceilings of one GPU model.

    Attributes:
        name: display name, e.g. ``"NVIDIA H100 SXM5 80GB"``.
        peak_tflops: dense peak TFLOP/s per math type (keys from :data:`PEAK_KEYS`).
        bandwidth_gbs: memory bandwidth in GB/s (1e9 bytes/s).
        num_sms: streaming multiprocessors (NVIDIA) or compute units (AMD); None if unknown.
        source: where the figures come from as a whole: a datasheet document/URL,
            ``"calibration FILE"`` or ``"command-line override"`` (several joined by ``"; "``).
        sources: the source of each figure, keyed by peak key or ``"bandwidth_gbs"``.
        key: the table key (``"h100-sxm"``); empty for specs built from overrides only.
        notes: caveats about the figures (derived values, clocks, variants).
        gpu_link: the GPU-to-GPU link (``"NVLink 4"``, ...) or None where the part has none.
        gpu_link_gbs: its bandwidth per direction in GB/s (half the datasheet's bidirectional
            total), the reference for a collective's bus bandwidth inside one host.
        pcie_gbs: the host link (PCIe) bandwidth per direction in GB/s.
        Link sources are in ``sources["gpu_link_gbs"]`` and ``sources["pcie_gbs"]``.
    """

    name: str
    peak_tflops: dict[str, float]
    bandwidth_gbs: float
    num_sms: int | None
    source: str
    sources: dict[str, str] = field(default_factory=dict)
    key: str = ""
    notes: str = ""
    gpu_link: str | None = None
    gpu_link_gbs: float | None = None
    pcie_gbs: float | None = None

    def link_gbs(self, intra_host: bool = True) -> tuple[float | None, str | None]:
        """The link a collective of this GPU runs on and its bandwidth per direction (GB/s).

        Inside one host: the GPU link (NVLink, Infinity Fabric) where the part has one, else
        PCIe; across hosts: the network, which the device table does not know (None, None).
        """
        if not intra_host:
            return None, None
        if self.gpu_link_gbs:
            return self.gpu_link_gbs, self.gpu_link
        if self.pcie_gbs:
            return self.pcie_gbs, "PCIe"
        return None, None

    def ridge_point(self, dtype: str) -> float | None:
        """Ridge point in FLOP/byte for a peak key: peak / bandwidth (Williams et al. 2009).

        ``peak_tflops[dtype] * 1e12 / (bandwidth_gbs * 1e9)``; None when the part has no
        figure for ``dtype`` or the bandwidth is not positive.
        """
        peak = self.peak_tflops.get(dtype)
        if peak is None or not self.bandwidth_gbs or self.bandwidth_gbs <= 0:
            return None
        return peak * 1e3 / self.bandwidth_gbs


# --------------------------------------------------------------------------------------
# The table. Each entry: key, display name, peaks, bandwidth, SMs, and the source of each
# figure. "sparse/2" means the datasheet prints the 2:4-sparse figure and the dense one is
# half of it.
# --------------------------------------------------------------------------------------

_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/h100/)"
_H200_DS = "NVIDIA H200 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/h200/)"
_A100_DS = (
    "NVIDIA A100 Tensor Core GPU datasheet (https://www.nvidia.com/content/dam/en-zz/Solutions/"
    "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)"
)
_L4_DS = "NVIDIA L4 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/l4/)"
_L40S_DS = "NVIDIA L40S GPU datasheet (https://www.nvidia.com/en-us/data-center/l40s/)"
_A10_DS = "NVIDIA A10 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/products/a10-gpu/)"
_A10G_SRC = (
    "Baseten, 'NVIDIA A10 vs A10G for ML model inference' spec table "
    "(https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/); "
    "AWS publishes no A10G datasheet"
)
_T4_DS = "NVIDIA T4 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/tesla-t4/)"
_GA102_WP = (
    "NVIDIA Ampere GA102 GPU Architecture whitepaper, Appendix A, GeForce RTX 3090 column "
    "(https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf)"
)
_ADA_WP = (
    "NVIDIA Ada GPU Architecture whitepaper, Appendix A, GeForce RTX 4090 column "
    "(https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf)"
)
_RTX4060L = (
    "derived from NVIDIA's GeForce RTX 4060 Laptop GPU specifications (3072 CUDA cores, boost "
    "clock up to 2370 MHz, 128-bit GDDR6 at 16 Gbps; "
    "https://www.nvidia.com/en-us/geforce/laptops/40-series/)"
)
_V100_DS = (
    "NVIDIA Tesla V100 GPU datasheet (https://images.nvidia.com/content/technologies/volta/pdf/"
    "volta-v100-datasheet-update-us-1165301-r5.pdf)"
)
_B200_DS = (
    "NVIDIA HGX B200 specifications, 8-GPU totals / 8 "
    "(https://www.nvidia.com/en-us/data-center/hgx/; the DGX B200 datasheet agrees)"
)
_MI300X_DS = (
    "AMD Instinct MI300X data sheet (https://www.amd.com/content/dam/amd/en/documents/"
    "instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf)"
)
_MI210_DS = (
    "AMD Instinct MI210 data sheet (https://www.amd.com/content/dam/amd/en/documents/"
    "instinct-business-docs/product-briefs/instinct-mi210-brochure.pdf)"
)
_SPARK_DS = (
    "NVIDIA DGX Spark product page (https://www.nvidia.com/en-us/products/workstations/dgx-spark/)"
)
_CUDA_TPUT = (
    "derived: fp32 x FP64:FP32 ratio from the CUDA C++ Programming Guide arithmetic-instruction "
    "throughput table"
)


def _spec(
    key: str,
    name: str,
    peaks: dict[str, tuple[float, str]],
    bandwidth: tuple[float, str],
    num_sms: int | None,
    source: str,
    notes: str = "",
) -> DeviceSpec:
    sources = {k: s for k, (_, s) in peaks.items()}
    sources["bandwidth_gbs"] = bandwidth[1]
    return DeviceSpec(
        name=name,
        peak_tflops={k: v for k, (v, _) in peaks.items()},
        bandwidth_gbs=bandwidth[0],
        num_sms=num_sms,
        source=source,
        sources=sources,
        key=key,
        notes=notes,
    )


def _build_table() -> dict[str, DeviceSpec]:
    s = "sparse/2"
    t: list[DeviceSpec] = [
        # ---- Hopper ------------------------------------------------------------------
        _spec(
            "h100-sxm",
            "NVIDIA H100 SXM5 80GB",
            {
                "fp64": (34.0, _H100_DS),
                "fp64_tc": (67.0, _H100_DS),
                "fp32": (67.0, _H100_DS),
                "tf32": (494.5, f"{_H100_DS}, 989 {s}"),
                "bf16": (989.5, f"{_H100_DS}, 1979 {s}"),
                "fp16": (989.5, f"{_H100_DS}, 1979 {s}"),
                "fp8": (1979.0, f"{_H100_DS}, 3958 {s}"),
            },
            (3350.0, _H100_DS),
            132,
            _H100_DS,
        ),
        _spec(
            "h100-pcie",
            "NVIDIA H100 PCIe 80GB",
            {
                "fp64": (26.0, _H100_DS),
                "fp64_tc": (51.0, _H100_DS),
                "fp32": (51.0, _H100_DS),
                "tf32": (378.0, f"{_H100_DS}, 756 {s}"),
                "bf16": (756.5, f"{_H100_DS}, 1513 {s}"),
                "fp16": (756.5, f"{_H100_DS}, 1513 {s}"),
                "fp8": (1513.0, f"{_H100_DS}, 3026 {s}"),
            },
            (2000.0, _H100_DS),
            114,
            _H100_DS,
        ),
        _spec(
            "h100-nvl",
            "NVIDIA H100 NVL 94GB",
            {
                "fp64": (30.0, _H100_DS),
                "fp64_tc": (60.0, _H100_DS),
                "fp32": (60.0, _H100_DS),
                "tf32": (417.5, f"{_H100_DS}, 835 {s}"),
                "bf16": (835.5, f"{_H100_DS}, 1671 {s}"),
                "fp16": (835.5, f"{_H100_DS}, 1671 {s}"),
                "fp8": (1670.5, f"{_H100_DS}, 3341 {s}"),
            },
            (3900.0, _H100_DS),
            132,
            _H100_DS,
        ),
        _spec(
            "h200-sxm",
            "NVIDIA H200 SXM 141GB",
            {
                "fp64": (34.0, _H200_DS),
                "fp64_tc": (67.0, _H200_DS),
                "fp32": (67.0, _H200_DS),
                "tf32": (494.5, f"{_H200_DS}, 989 {s}"),
                "bf16": (989.5, f"{_H200_DS}, 1979 {s}"),
                "fp16": (989.5, f"{_H200_DS}, 1979 {s}"),
                "fp8": (1979.0, f"{_H200_DS}, 3958 {s}"),
            },
            (4800.0, _H200_DS),
            132,
            _H200_DS,
            "tracedx calibrate measured 4.21 TB/s copy, 775 bf16, 354 tf32, 50.4 fp32 TFLOP/s on an H200 "
            "(tracedx's sample_traces/calibration-h200.json): calibrate yours",
        ),
        _spec(
            "h200-nvl",
            "NVIDIA H200 NVL 141GB",
            {
                "fp64": (30.0, _H200_DS),
                "fp64_tc": (60.0, _H200_DS),
                "fp32": (60.0, _H200_DS),
                "tf32": (417.5, f"{_H200_DS}, 835 {s}"),
                "bf16": (835.5, f"{_H200_DS}, 1671 {s}"),
                "fp16": (835.5, f"{_H200_DS}, 1671 {s}"),
                "fp8": (1670.5, f"{_H200_DS}, 3341 {s}"),
            },
            (4800.0, _H200_DS),
            132,
            _H200_DS,
        ),
        # ---- Ampere datacenter ------------------------------------------------------
        *[
            _spec(
                key,
                name,
                {
                    "fp64": (9.7, _A100_DS),
                    "fp64_tc": (19.5, _A100_DS),
                    "fp32": (19.5, _A100_DS),
                    "tf32": (156.0, f"{_A100_DS}, 312 {s}"),
                    "bf16": (312.0, f"{_A100_DS}, 624 {s}"),
                    "fp16": (312.0, f"{_A100_DS}, 624 {s}"),
                },
                (bw, _A100_DS),
                108,
                _A100_DS,
                note,
            )
            for key, name, bw, note in (
                ("a100-sxm-40gb", "NVIDIA A100 SXM4 40GB", 1555.0, ""),
                ("a100-sxm-80gb", "NVIDIA A100 SXM4 80GB", 2039.0, ""),
                (
                    "a100-pcie-40gb",
                    "NVIDIA A100 PCIe 40GB",
                    1555.0,
                    "PCIe parts list the SXM peaks but run at 250-300 W: sustained clocks are lower",
                ),
                (
                    "a100-pcie-80gb",
                    "NVIDIA A100 PCIe 80GB",
                    1935.0,
                    "PCIe parts list the SXM peaks but run at 300 W: sustained clocks are lower",
                ),
            )
        ],
        _spec(
            "a10",
            "NVIDIA A10",
            {
                "fp64": (0.49, _CUDA_TPUT + " (1/64, CC 8.6)"),
                "fp32": (31.2, _A10_DS),
                "tf32": (62.5, f"{_A10_DS}, 125 {s}"),
                "bf16": (125.0, f"{_A10_DS}, 250 {s}"),
                "fp16": (125.0, f"{_A10_DS}, 250 {s}"),
            },
            (600.0, _A10_DS),
            72,
            _A10_DS,
        ),
        _spec(
            "a10g",
            "NVIDIA A10G",
            {
                "fp64": (0.55, _CUDA_TPUT + " (1/64, CC 8.6)"),
                "fp32": (35.0, _A10G_SRC),
                "tf32": (35.0, _A10G_SRC),
                "bf16": (70.0, _A10G_SRC),
                "fp16": (70.0, _A10G_SRC),
            },
            (600.0, _A10G_SRC),
            80,
            _A10G_SRC,
            "no vendor datasheet: tensor figures are a third-party table; calibrate to be sure",
        ),
        # ---- Ada ---------------------------------------------------------------------
        _spec(
            "l4",
            "NVIDIA L4",
            {
                "fp64": (0.47, _CUDA_TPUT + " (1/64, CC 8.9)"),
                "fp32": (30.3, _L4_DS),
                "tf32": (60.0, f"{_L4_DS}, 120 {s}"),
                "bf16": (121.0, f"{_L4_DS}, 242 {s}"),
                "fp16": (121.0, f"{_L4_DS}, 242 {s}"),
                "fp8": (242.5, f"{_L4_DS}, 485 {s}"),
            },
            (300.0, _L4_DS),
            58,
            _L4_DS,
        ),
        _spec(
            "l40s",
            "NVIDIA L40S",
            {
                "fp64": (1.43, _CUDA_TPUT + " (1/64, CC 8.9)"),
                "fp32": (91.6, _L40S_DS),
                "tf32": (183.0, f"{_L40S_DS}, 366 {s}"),
                "bf16": (362.05, f"{_L40S_DS}, 733 {s}"),
                "fp16": (362.05, f"{_L40S_DS}, 733 {s}"),
                "fp8": (733.0, f"{_L40S_DS}, 1466 {s}"),
            },
            (864.0, _L40S_DS),
            142,
            _L40S_DS,
        ),
        _spec(
            "rtx-4090",
            "NVIDIA GeForce RTX 4090",
            {
                "fp64": (1.29, _CUDA_TPUT + " (1/64, CC 8.9)"),
                "fp32": (82.6, _ADA_WP),
                "tf32": (82.6, f"{_ADA_WP}, 165.2 {s}"),
                "bf16": (165.2, f"{_ADA_WP}, FP32 accumulate, 330.4 {s}"),
                "fp16": (165.2, f"{_ADA_WP}, FP32 accumulate, 330.4 {s}"),
                "fp8": (330.3, f"{_ADA_WP}, FP32 accumulate, 660.6 {s}"),
            },
            (1008.0, _ADA_WP),
            128,
            _ADA_WP,
        ),
        _spec(
            "rtx-4060-laptop",
            "NVIDIA GeForce RTX 4060 Laptop GPU",
            {
                "fp64": (0.23, _CUDA_TPUT + " (1/64, CC 8.9)"),
                "fp32": (14.6, f"{_RTX4060L}: 3072 x 2 FLOP x 2.37 GHz"),
                "tf32": (14.6, "derived: = fp32, the Ada GeForce ratio of the RTX 4090 column"),
                "bf16": (
                    29.1,
                    f"{_RTX4060L}: 2 x fp32, the Ada GeForce ratio of the RTX 4090 column",
                ),
                "fp16": (29.1, "derived: = bf16, as in the Ada whitepaper"),
                "fp8": (58.2, "derived: 2 x bf16, the Ada GeForce ratio"),
            },
            (256.0, f"{_RTX4060L}: 128 bit x 16 Gbps / 8"),
            24,
            f"{_RTX4060L}: 24 SMs of 128 CUDA cores",
            "laptop clocks depend on the power limit the OEM set: calibrate",
        ),
        # ---- Ampere GeForce -----------------------------------------------------------
        _spec(
            "rtx-3090",
            "NVIDIA GeForce RTX 3090",
            {
                "fp64": (0.56, _CUDA_TPUT + " (1/64, CC 8.6)"),
                "fp32": (35.6, _GA102_WP),
                "tf32": (35.6, f"{_GA102_WP}, 71 {s}"),
                "bf16": (71.0, f"{_GA102_WP}, FP32 accumulate, 142 {s}"),
                "fp16": (71.0, f"{_GA102_WP}, FP32 accumulate, 142 {s}"),
            },
            (936.0, _GA102_WP),
            82,
            _GA102_WP,
        ),
        # ---- Turing / Volta -----------------------------------------------------------
        _spec(
            "t4",
            "NVIDIA Tesla T4",
            {
                "fp64": (0.25, _CUDA_TPUT + " (1/32, CC 7.5)"),
                "fp32": (8.1, _T4_DS),
                "fp16": (65.0, f"{_T4_DS} (mixed precision)"),
            },
            (320.0, _T4_DS),
            40,
            _T4_DS,
            "no bf16 or tf32 tensor cores; copies reach less than the datasheet's 320 GB/s: calibrate",
        ),
        _spec(
            "v100-sxm2",
            "NVIDIA Tesla V100 SXM2",
            {
                "fp64": (7.8, _V100_DS),
                "fp32": (15.7, _V100_DS),
                "fp16": (125.0, f"{_V100_DS} (tensor performance)"),
            },
            (900.0, _V100_DS),
            80,
            _V100_DS,
            "no bf16 or tf32 tensor cores",
        ),
        _spec(
            "v100-pcie",
            "NVIDIA Tesla V100 PCIe",
            {
                "fp64": (7.0, _V100_DS),
                "fp32": (14.0, _V100_DS),
                "fp16": (112.0, f"{_V100_DS} (tensor performance)"),
            },
            (900.0, _V100_DS),
            80,
            _V100_DS,
            "no bf16 or tf32 tensor cores",
        ),
        _spec(
            "v100s-pcie",
            "NVIDIA Tesla V100S PCIe",
            {
                "fp64": (8.2, _V100_DS),
                "fp32": (16.4, _V100_DS),
                "fp16": (130.0, f"{_V100_DS} (tensor performance)"),
            },
            (1134.0, _V100_DS),
            80,
            _V100_DS,
            "no bf16 or tf32 tensor cores",
        ),
        # ---- Blackwell ----------------------------------------------------------------
        _spec(
            "b200",
            "NVIDIA B200",
            {
                "fp64": (37.0, _B200_DS),
                "fp64_tc": (37.0, _B200_DS),
                "fp32": (75.0, _B200_DS),
                "tf32": (1125.0, f"{_B200_DS}, 2250 {s}"),
                "bf16": (2250.0, f"{_B200_DS}, 4500 {s}"),
                "fp16": (2250.0, f"{_B200_DS}, 4500 {s}"),
                "fp8": (4500.0, f"{_B200_DS}, 9000 {s}"),
            },
            (8000.0, _B200_DS),
            148,
            _B200_DS,
            "HGX/DGX B200 at 1000 W; GB200 parts clock higher",
        ),
        _spec(
            "dgx-spark",
            "NVIDIA DGX Spark (GB10)",
            {
                "fp32": (31.0, "derived: 6144 CUDA cores x 2 FLOP x ~2.5 GHz; not published"),
                "tf32": (62.5, "derived: bf16 / 2; not published"),
                "bf16": (
                    125.0,
                    f"derived from {_SPARK_DS}: 1 PFLOP FP4 sparse -> 500 dense FP4 -> 250 FP8 "
                    "-> 125 BF16 (the 2:1 Blackwell ladder); not published",
                ),
                "fp16": (125.0, "derived: = bf16; not published"),
                "fp8": (250.0, "derived: FP4 dense / 2; not published"),
            },
            (273.0, f"{_SPARK_DS}: 273 GB/s LPDDR5x, shared by CPU and GPU"),
            48,
            _SPARK_DS,
            "NVIDIA publishes only the FP4 sparse headline and 273 GB/s: the compute peaks are "
            "derived upper bounds; run `tracedx calibrate`",
        ),
        # ---- AMD ----------------------------------------------------------------------
        _spec(
            "mi300x",
            "AMD Instinct MI300X",
            {
                "fp64": (81.7, f"{_MI300X_DS} (vector)"),
                "fp64_tc": (163.4, f"{_MI300X_DS} (matrix)"),
                "fp32": (163.4, f"{_MI300X_DS} (vector)"),
                "fp32_tc": (163.4, f"{_MI300X_DS} (matrix)"),
                "tf32": (653.7, f"{_MI300X_DS}, 1307.4 {s}"),
                "bf16": (1307.4, f"{_MI300X_DS}, 2614.9 {s}"),
                "fp16": (1307.4, f"{_MI300X_DS}, 2614.9 {s}"),
                "fp8": (2614.9, f"{_MI300X_DS}, 5229.8 {s}"),
            },
            (5300.0, _MI300X_DS),
            304,
            _MI300X_DS,
            "num_sms counts compute units (CUs)",
        ),
        _spec(
            "mi210",
            "AMD Instinct MI210",
            {
                "fp64": (22.6, f"{_MI210_DS} (vector)"),
                "fp64_tc": (45.3, f"{_MI210_DS} (matrix)"),
                "fp32": (22.6, f"{_MI210_DS} (vector)"),
                "fp32_tc": (45.3, f"{_MI210_DS} (matrix)"),
                "bf16": (181.0, _MI210_DS),
                "fp16": (181.0, _MI210_DS),
            },
            (1638.4, _MI210_DS),
            104,
            _MI210_DS,
            "num_sms counts compute units (CUs); no tf32",
        ),
    ]
    return {d.key: _with_links(d) for d in t}


# Link bandwidths as the datasheets print them: bidirectional totals per GPU. Stored per
# direction (half), because a collective's bus bandwidth (nccl-tests doc/PERFORMANCE.md) is
# compared with what one GPU can send (or receive) at once. PCIe per generation, x16:
# Gen3 32, Gen4 64, Gen5 128 GB/s bidirectional (PCI-SIG; the datasheets below print them).
_PCIE = {3: 16.0, 4: 32.0, 5: 64.0}
_LINKS: dict[str, tuple[str | None, float | None, int, str]] = {
    # key: (GPU link, bidirectional GB/s, PCIe generation, source)
    "h100-sxm": ("NVLink 4", 900.0, 5, f"{_H100_DS}: NVLink 900 GB/s, PCIe Gen5 128 GB/s"),
    "h100-pcie": ("NVLink bridge", 600.0, 5, f"{_H100_DS}: NVLink 600 GB/s, PCIe Gen5 128 GB/s"),
    "h100-nvl": ("NVLink bridge", 600.0, 5, f"{_H100_DS}: NVLink 600 GB/s, PCIe Gen5 128 GB/s"),
    "h200-sxm": ("NVLink 4", 900.0, 5, f"{_H200_DS}: NVLink 900 GB/s, PCIe Gen5 128 GB/s"),
    "h200-nvl": (
        "NVLink bridge",
        900.0,
        5,
        f"{_H200_DS}: 2- or 4-way NVLink bridge 900 GB/s, PCIe Gen5 128 GB/s",
    ),
    "a100-sxm-40gb": ("NVLink 3", 600.0, 4, f"{_A100_DS}: NVLink 600 GB/s, PCIe Gen4 64 GB/s"),
    "a100-sxm-80gb": ("NVLink 3", 600.0, 4, f"{_A100_DS}: NVLink 600 GB/s, PCIe Gen4 64 GB/s"),
    "a100-pcie-40gb": (
        "NVLink bridge",
        600.0,
        4,
        f"{_A100_DS}: NVLink bridge for 2 GPUs 600 GB/s, PCIe Gen4 64 GB/s",
    ),
    "a100-pcie-80gb": (
        "NVLink bridge",
        600.0,
        4,
        f"{_A100_DS}: NVLink bridge for 2 GPUs 600 GB/s, PCIe Gen4 64 GB/s",
    ),
    "a10": (None, None, 4, f"{_A10_DS}: PCIe Gen4 64 GB/s"),
    "l4": (None, None, 4, f"{_L4_DS}: PCIe Gen4 x16 64 GB/s"),
    "l40s": (None, None, 4, f"{_L40S_DS}: PCIe Gen4 x16 64 GB/s"),
    "t4": (None, None, 3, f"{_T4_DS}: PCIe Gen3 x16 32 GB/s"),
    "v100-sxm2": ("NVLink 2", 300.0, 3, f"{_V100_DS}: NVLink 300 GB/s, PCIe 32 GB/s"),
    "v100-pcie": (None, None, 3, f"{_V100_DS}: PCIe 32 GB/s"),
    "v100s-pcie": (None, None, 3, f"{_V100_DS}: PCIe 32 GB/s"),
    "b200": ("NVLink 5", 1800.0, 5, f"{_B200_DS}: NVLink 1.8 TB/s per GPU"),
    "mi300x": (
        "Infinity Fabric",
        896.0,
        5,
        f"{_MI300X_DS}: 7 Infinity Fabric links, 896 GB/s aggregate; PCIe Gen5 x16 128 GB/s",
    ),
}


def _with_links(d: DeviceSpec) -> DeviceSpec:
    link = _LINKS.get(d.key)
    if link is None:
        return d
    name, bidir, gen, src = link
    sources = dict(d.sources)
    if bidir:
        sources["gpu_link_gbs"] = f"{src} (stored per direction: half)"
    sources["pcie_gbs"] = f"{src} (stored per direction: half)"
    return replace(
        d,
        gpu_link=name,
        gpu_link_gbs=bidir / 2 if bidir else None,
        pcie_gbs=_PCIE[gen],
        sources=sources,
    )


DEVICES: dict[str, DeviceSpec] = _build_table()
"""The datasheet table, keyed by :attr:`DeviceSpec.key`."""


# --------------------------------------------------------------------------------------
# Name matching
# --------------------------------------------------------------------------------------

_VENDOR_WORDS = re.compile(r"\b(nvidia|amd|geforce|tesla|instinct|graphics|corporation)\b")


def normalize_device_name(name: str) -> str:
    """Lowercase, drop vendor words, turn punctuation into single spaces.

    ``"NVIDIA A100-SXM4-80GB"`` -> ``"a100 sxm4 80gb"``.
    """
    s = name.lower()
    s = re.sub(r"[^a-z0-9]+", " ", s)
    s = _VENDOR_WORDS.sub(" ", s)
    return re.sub(r"\s+", " ", s).strip()


def _w(token: str) -> str:
    """A token not glued to other letters/digits (``l4`` must not match ``l40s``)."""
    return rf"(?<![a-z0-9]){token}(?![a-z0-9])"


# (pattern on the normalized name, key, note). First match wins, so specific before generic.
_PATTERNS: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(p), k, n)
    for p, k, n in [
        (rf"{_w('gh200')}", "", ""),  # Grace Hopper: not in the table (different bandwidth)
        (rf"{_w('h100')}.*{_w('nvl')}", "h100-nvl", ""),
        (rf"{_w('h100')}.*{_w('pcie')}", "h100-pcie", ""),
        (rf"{_w('h100')}", "h100-sxm", ""),
        (rf"{_w('h200')}.*{_w('nvl')}", "h200-nvl", ""),
        (rf"{_w('h200')}", "h200-sxm", ""),
        (rf"{_w('a100')}.*{_w('pcie')}.*{_w('80gb')}", "a100-pcie-80gb", ""),
        (rf"{_w('a100')}.*{_w('80gb')}.*{_w('pcie')}", "a100-pcie-80gb", ""),
        (rf"{_w('a100')}.*{_w('pcie')}", "a100-pcie-40gb", ""),
        (rf"{_w('a100')}.*{_w('80gb')}", "a100-sxm-80gb", ""),
        (rf"{_w('a100')}.*{_w('40gb')}", "a100-sxm-40gb", ""),
        (
            rf"{_w('a100')}",
            "a100-sxm-80gb",
            "the name does not say which A100: assuming A100 SXM4 80GB (2039 GB/s); "
            "pass --device a100-sxm-40gb / a100-pcie-80gb / ... (device= in Python) if that is wrong",
        ),
        (rf"{_w('a10g')}", "a10g", ""),
        (rf"{_w('a10')}", "a10", ""),
        (rf"{_w('l40s')}", "l40s", ""),
        (rf"{_w('l4')}", "l4", ""),
        (rf"{_w('t4')}", "t4", ""),
        (rf"{_w('3090')}(?! ti)", "rtx-3090", ""),
        (rf"{_w('4090')}(?!.*laptop)(?! d)", "rtx-4090", ""),
        (rf"{_w('4060')}.*laptop", "rtx-4060-laptop", ""),
        (rf"{_w('v100s')}", "v100s-pcie", ""),
        (rf"{_w('v100')}.*{_w('pcie')}", "v100-pcie", ""),
        (rf"{_w('v100')}", "v100-sxm2", ""),
        (rf"{_w('b200')}", "b200", ""),
        (rf"{_w('mi300x')}", "mi300x", ""),
        (rf"{_w('mi210')}", "mi210", ""),
        (rf"{_w('gb10')}|dgx spark", "dgx-spark", ""),
    ]
]


def _match(name: str) -> tuple[DeviceSpec | None, str]:
    norm = normalize_device_name(name)
    compact = norm.replace(" ", "")
    # exact table keys and display names first ("h100-pcie", "rtx 4090", "RTX4090")
    for spec in DEVICES.values():
        if compact in (
            spec.key.replace("-", ""),
            normalize_device_name(spec.name).replace(" ", ""),
        ):
            return spec, ""
    # glued forms such as "rtx4090" or "h100pcie": retry with letters and digits split apart
    candidates = [norm, re.sub(r"(?<=[a-z])(?=\d{4})|(?<=\d)(?=[a-z]{3,})", " ", norm)]
    for cand in candidates:
        for pat, key, note in _PATTERNS:
            if pat.search(cand):
                return (DEVICES[key], note) if key else (None, "")
    return None, ""


def match_device(trace_device_name: str) -> tuple[DeviceSpec | None, str]:
    """Find the table entry for a ``deviceProperties[i].name`` string.

    Matching ignores case, punctuation and vendor words (NVIDIA, GeForce, Tesla, AMD,
    Instinct), reads PCIe/SXM/NVL and the memory size (A100 40 vs 80 GB) from the name, and
    never matches a laptop part to its desktop namesake. Returns ``(spec, note)``; ``spec`` is
    None when the name is not in the table; ``note`` is non-empty when a variant was assumed.
    """
    if not trace_device_name or not trace_device_name.strip():
        return None, ""
    return _match(trace_device_name)


def get_device(name: str) -> DeviceSpec:
    """The table entry for a user-given ``--device NAME`` (a key such as ``h100-pcie`` or any
    name :func:`match_device` understands).

    Raises:
        DeviceSpecError: unknown name; the one-line message lists the closest known keys.
    """
    spec, _ = _match(name) if name and name.strip() else (None, "")
    if spec is not None:
        return spec
    keys = list(DEVICES)
    close = difflib.get_close_matches(
        normalize_device_name(name or "").replace(" ", "-"), keys, n=4, cutoff=0.4
    )
    listed = ", ".join(close) if close else ", ".join(keys)
    label = "closest" if close else "known"
    raise DeviceSpecError(
        f"unknown device {name!r} for --device (device= in Python); {label}: {listed}"
    )


# --------------------------------------------------------------------------------------
# Calibration file and overrides
# --------------------------------------------------------------------------------------

_CAL_DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")


# A calibration file is a few hundred bytes; anything this large is not one.
# No device comes near these (an H200 is about 2,000 dense bf16 TFLOP/s and 4,800 GB/s): a
# larger figure is a corrupt file, and would make every achieved fraction 0.
_MAX_FIGURE = 1e7


def _positive(v: object) -> bool:
    """A positive finite figure below ``_MAX_FIGURE`` (TFLOP/s or GB/s)."""
    return (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(float(v))
        and 0 < float(v) < _MAX_FIGURE
    )


def load_calibration(path: str | Path) -> dict:
    """Read and check a ``tracedx.calibration/1`` JSON file written by ``tracedx calibrate``.

    Expected keys: ``schema`` (``"tracedx.calibration/1"``), ``device_name`` (str),
    ``copy_bandwidth_gbs`` (GB/s, bytes read + written), ``matmul_tflops`` (TFLOP/s per
    dtype among fp64/fp32/tf32/bf16/fp16/fp8); other keys (``launch_overhead_us``, ...) are
    kept as they are.

    Raises:
        DeviceSpecError: unreadable file, not JSON, wrong schema, or a figure that is not a
            positive finite number (one line naming the file and the key).
    """
    p = Path(path)
    raw = read_capped(p, "calibration file", DeviceSpecError, CALIBRATION_MAX_BYTES)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        utf16 = "; it looks like UTF-16" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise DeviceSpecError(
            f"calibration file {str(p)!r} is not UTF-8 text (byte 0x{raw[e.start]:02X} at "
            f"offset {e.start}{utf16})"
        ) from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise DeviceSpecError(f"calibration file {str(p)!r} is not valid JSON: {e}") from None
    except RecursionError:
        raise DeviceSpecError(
            f"calibration file {str(p)!r}: JSON nested too deeply to be a calibration file"
        ) from None
    if not isinstance(data, dict):
        raise DeviceSpecError(f"calibration file {str(p)!r}: expected a JSON object")
    schema = data.get("schema")
    if schema != CALIBRATION_SCHEMA:
        if "traceEvents" in data:
            what = "a chrome trace"
        elif schema is None:
            what = 'a JSON object with no "schema" key'
        else:
            what = f"a JSON object with schema {schema!r}"
        raise DeviceSpecError(
            f"calibration file {str(p)!r} is {what}, not a calibration file (expected schema "
            f"{CALIBRATION_SCHEMA!r}, as `tracedx calibrate` writes)"
        )
    bw = data.get("copy_bandwidth_gbs")
    if bw is not None and not _positive(bw):
        raise DeviceSpecError(
            f"calibration file {str(p)!r}: copy_bandwidth_gbs must be a positive number below {_MAX_FIGURE:g}, got {bw!r}"
        )
    mm = data.get("matmul_tflops", {})
    if mm is None:
        mm = {}
    if not isinstance(mm, dict):
        raise DeviceSpecError(f"calibration file {str(p)!r}: matmul_tflops must be an object")
    for k, v in mm.items():
        if k not in _CAL_DTYPES:
            raise DeviceSpecError(
                f"calibration file {str(p)!r}: unknown dtype {k!r} in matmul_tflops "
                f"(expected {', '.join(_CAL_DTYPES)})"
            )
        if v is not None and not _positive(v):
            raise DeviceSpecError(
                f"calibration file {str(p)!r}: matmul_tflops.{k} must be a positive number "
                f"below {_MAX_FIGURE:g}, "
                f"got {v!r}"
            )
    if bw is None and not any(v is not None for v in mm.values()):
        raise DeviceSpecError(
            f"calibration file {str(p)!r} holds no figure (copy_bandwidth_gbs or matmul_tflops)"
        )
    name = data.get("device_name")
    if name is not None and not isinstance(name, str):
        raise DeviceSpecError(f"calibration file {str(p)!r}: device_name must be a string")
    return data


def _apply_calibration(
    base: DeviceSpec | None, cal: dict, path: str | Path, notes: list[str]
) -> DeviceSpec | None:
    label = f"calibration {Path(path).name}"
    peaks = dict(base.peak_tflops) if base else {}
    sources = dict(base.sources) if base else {}
    measured: list[str] = []
    for k, v in (cal.get("matmul_tflops") or {}).items():
        if v is None:
            continue
        peaks[k] = float(v)
        sources[k] = label
        measured.append(k)
    bw = base.bandwidth_gbs if base else None
    if cal.get("copy_bandwidth_gbs") is not None:
        bw = float(cal["copy_bandwidth_gbs"])
        sources["bandwidth_gbs"] = label
        measured.append("bandwidth")
    if bw is None:
        notes.append(
            f"{label} has no copy_bandwidth_gbs and the device is not in the table: "
            "analysis that needs bandwidth is skipped"
        )
        return None
    if base is not None and measured:
        kept = [k for k in peaks if sources.get(k) != label]
        if kept:
            notes.append(
                f"{label} measured {', '.join(measured)}; datasheet figures kept for "
                f"{', '.join(kept)}"
            )
    source = f"{label}; {base.source}" if base else label
    return DeviceSpec(
        name=base.name if base else str(cal.get("device_name") or "calibrated device"),
        peak_tflops=peaks,
        bandwidth_gbs=bw,
        num_sms=base.num_sms if base else None,
        source=source,
        sources=sources,
        key=base.key if base else "",
        notes=base.notes if base else "",
    )


def resolve_device(
    trace_device_name: str | None,
    *,
    device: str | None = None,
    peak_tflops: float | None = None,
    bandwidth_gbs: float | None = None,
    calibration: str | Path | None = None,
) -> tuple[DeviceSpec | None, list[str]]:
    """Pick the ceilings for the analysis; returns ``(spec, notes)``.

    Precedence, highest first: explicit overrides (``peak_tflops`` TFLOP/s, ``bandwidth_gbs``
    GB/s) > calibration file > ``device`` (``--device NAME``) > the trace's
    ``deviceProperties`` name. A calibration file replaces the datasheet figures it measured
    (``matmul_tflops`` per dtype, ``copy_bandwidth_gbs``) and keeps the others;
    ``spec.sources`` says which figure came from where. ``peak_tflops`` sets one compute
    roof for every dtype (a single number cannot say how the dtypes relate).

    ``spec`` is None when no ceilings are known (unknown device and no overrides): a note then
    says that analysis needing peaks is skipped and how to supply them.

    Raises:
        DeviceSpecError: unknown ``device`` name, unusable calibration file, or an override
            that is not a positive finite number.
    """
    notes: list[str] = []
    for label, v in (
        ("--peak-tflops (peak_tflops= in Python)", peak_tflops),
        ("--bandwidth-gbs (bandwidth_gbs= in Python)", bandwidth_gbs),
    ):
        if v is not None and not _positive(v):
            raise DeviceSpecError(f"{label} must be a positive number, got {v!r}")

    base: DeviceSpec | None = None
    if device is not None:
        base = get_device(device)
        if trace_device_name:
            traced, _ = match_device(trace_device_name)
            if traced is None or traced.key != base.key:
                notes.append(
                    f"using --device {base.name} instead of the trace's device "
                    f"{trace_device_name!r}"
                )
    elif trace_device_name:
        base, note = match_device(trace_device_name)
        if note:
            notes.append(note)

    cal: dict | None = None
    if calibration is not None:
        cal = load_calibration(calibration)
        cal_name = cal.get("device_name")
        if cal_name:
            cal_spec, _ = match_device(cal_name)
            if base is None and cal_spec is not None:
                base = cal_spec
            elif base is not None and (cal_spec is None or cal_spec.key != base.key):
                notes.append(
                    f"calibration {Path(calibration).name} was measured on {cal_name!r}, "
                    f"but the analysis is for {base.name}"
                )
        spec = _apply_calibration(base, cal, calibration, notes)
    else:
        spec = base

    if peak_tflops is not None or bandwidth_gbs is not None:
        label = "command-line override"
        if spec is None and (peak_tflops is None or bandwidth_gbs is None):
            missing = "--bandwidth-gbs" if bandwidth_gbs is None else "--peak-tflops"
            unknown = trace_device_name or "unknown"
            notes.append(
                f"device {unknown!r} is not in the table and {missing} was not given: "
                "analysis that needs peaks is skipped; pass both --peak-tflops and "
                "--bandwidth-gbs, or --device NAME (peak_tflops=, bandwidth_gbs=, device= in "
                "Python)"
            )
            return None, notes
        peaks = dict(spec.peak_tflops) if spec else {}
        sources = dict(spec.sources) if spec else {}
        if peak_tflops is not None:
            keys = list(peaks) or ["fp64", "fp32", "tf32", "bf16", "fp16", "fp8"]
            peaks = {k: float(peak_tflops) for k in keys}
            sources.update({k: label for k in keys})
            notes.append(f"--peak-tflops {peak_tflops:g} is used as the roof for every dtype")
        bw = spec.bandwidth_gbs if spec else 0.0
        if bandwidth_gbs is not None:
            bw = float(bandwidth_gbs)
            sources["bandwidth_gbs"] = label
        base_name = spec.name if spec else (trace_device_name or "custom device")
        spec = replace(
            spec
            if spec
            else DeviceSpec(
                name=base_name, peak_tflops={}, bandwidth_gbs=0.0, num_sms=None, source=""
            ),
            peak_tflops=peaks,
            bandwidth_gbs=bw,
            sources=sources,
            source=f"{label}; {spec.source}" if spec and spec.source else label,
        )

    if spec is None:
        what = repr(trace_device_name) if trace_device_name else "(the trace names no device)"
        notes.append(
            f"unknown device {what}: analysis that needs peaks is skipped; "
            "pass --device NAME or --peak-tflops/--bandwidth-gbs (device=, peak_tflops=, "
            "bandwidth_gbs= in Python)"
        )
    return spec, notes
