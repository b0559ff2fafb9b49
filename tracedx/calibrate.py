"""``tracedx calibrate``: measure this GPU's real ceilings and save them for ``diagnose``.

Paper bandwidth is not real bandwidth (on an H200 this command measured copies at 4.21 of
4.8 TB/s and bf16 matmuls at 775 of 989.5 TFLOP/s: ``sample_traces/calibration-h200.json``).
What is measured, each after a warm-up, with CUDA synchronization or CUDA events, as the median
of repeats (see :mod:`tracedx.measure`):

- ``copy_bandwidth_gbs``: ``dst.copy_(src)`` of a device buffer of max(1 GiB, 16 x L2),
  counting bytes read plus bytes written (2 x size per copy), timed with CUDA events.
- ``matmul_tflops``: ``torch.matmul(a, b, out=c)`` of two 8192 x 8192 matrices of random
  normal data (not zeros: some kernels run faster on zeros), 2 * n^3 FLOPs each, timed with CUDA
  events, for bf16, fp16, tf32 (fp32 tensors with ``torch.set_float32_matmul_precision("high")``)
  and fp32 (``"highest"``: TF32 off).
- ``launch_overhead_us``: the host's cost per tiny eager op from Python: 1000 back-to-back
  ``x.add_(1)`` on a one-element tensor between two synchronizations, divided by 1000 (the GPU
  runs each in ~2 us, so the host's launch path is what is timed); ``details`` adds the launch
  rate and the synchronized latency of one op alone.

The file (schema ``tracedx.calibration/1``) is read by ``tracedx diagnose --calibration FILE``
(:func:`tracedx.devices.load_calibration`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import sys
import tempfile
from pathlib import Path

from tracedx.errors import TraceError

__all__ = ["CalibrationError", "calibrate", "run_calibration", "write_calibration"]

SCHEMA = "tracedx.calibration/1"


class CalibrationError(TraceError):
    """Calibration cannot run here (no torch, no CUDA GPU): one line, exit 2."""


def _torch():
    try:
        import torch
    except ImportError as e:
        raise CalibrationError(f"calibrate needs PyTorch ({e})") from None
    if not torch.cuda.is_available():
        raise CalibrationError("calibrate needs a CUDA GPU: none is visible to PyTorch here")
    return torch


def _events_ms(torch, fn, samples: int, warmup: int, repeats: int) -> list[float]:
    """Per-call milliseconds from CUDA events around ``repeats`` calls, ``samples`` times."""
    from tracedx.measure import event_times_ms

    return event_times_ms(fn, samples=samples, warmup=warmup, repeats=repeats)


def _stats(values: list[float]) -> dict:
    import statistics

    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def _copy_bandwidth(torch, quick: bool) -> tuple[float, dict]:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    size = max(1 << 30, 16 * l2)
    src = torch.empty(size, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    times = _events_ms(
        torch, lambda: dst.copy_(src), samples=5 if quick else 20, warmup=3, repeats=5
    )
    moved = 2 * size  # bytes read + bytes written
    gbs = [moved / (t * 1e-3) / 1e9 for t in times]
    s = _stats(gbs)
    return s["median"], {
        "buffer_bytes": size,
        "l2_bytes": l2,
        "bytes_per_copy": moved,
        "gbs": s,
        "ms_per_copy": _stats(times),
    }


_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "tf32": "float32", "fp32": "float32"}


def _matmul(torch, key: str, n: int, quick: bool) -> tuple[float, dict]:
    dtype = getattr(torch, _DTYPES[key])
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if key == "tf32" else "highest")
    try:
        gen = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(n, n, device="cuda", dtype=dtype, generator=gen)
        b = torch.randn(n, n, device="cuda", dtype=dtype, generator=gen)
        c = torch.empty(n, n, device="cuda", dtype=dtype)
        repeats = 1 if key == "fp32" else 5
        samples = 3 if quick else 10
        times = _events_ms(
            torch, lambda: torch.matmul(a, b, out=c), samples=samples, warmup=3, repeats=repeats
        )
    finally:
        torch.set_float32_matmul_precision(old)
    flops = 2.0 * n**3
    tflops = [flops / (t * 1e-3) / 1e12 for t in times]
    s = _stats(tflops)
    return s["median"], {
        "n": n,
        "flops": flops,
        "tflops": s,
        "ms": _stats(times),
        "data": "torch.randn",
    }


def _launch_overhead(torch, quick: bool) -> tuple[float, dict]:
    import time

    from tracedx.measure import wall

    x = torch.zeros(1, device="cuda")
    ops = 1000
    for _ in range(200):
        x.add_(1)
    per_op = []
    for _ in range(5 if quick else 20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(ops):
            x.add_(1)
        torch.cuda.synchronize()
        per_op.append((time.perf_counter() - t0) / ops * 1e6)
    s = _stats(per_op)
    single = wall(lambda: x.add_(1), samples=50 if quick else 200, warmup=20, cuda=True)
    return s["median"], {
        "op": "x.add_(1) on a 1-element float32 CUDA tensor",
        "ops_per_sample": ops,
        "us_per_op": s,
        "launch_rate_per_s": 1e6 / s["median"],
        "single_op_synchronized_us": {
            "median": single.median_ms * 1e3,
            "min": single.min_ms * 1e3,
            "max": single.max_ms * 1e3,
            "n": single.samples,
        },
    }


def calibrate(quick: bool = False, n: int = 8192) -> dict:
    """Measure the current CUDA device's ceilings; return the ``tracedx.calibration/1`` dict.

    Keys: ``copy_bandwidth_gbs`` (GB/s, bytes read + written), ``matmul_tflops`` (TFLOP/s for
    bf16, fp16, tf32, fp32 at ``n``^3), ``launch_overhead_us`` (microseconds per tiny eager op),
    ``device_name``, ``torch_version``, ``measured_at`` (UTC ISO 8601), ``method`` and
    ``details`` (every distribution: median/min/max/n). Takes about 10 s on an H200
    (``quick``: fewer repeats).

    Raises :class:`CalibrationError` when torch is missing or no CUDA GPU is visible.
    """
    torch = _torch()
    name = torch.cuda.get_device_name(torch.cuda.current_device())
    # Warm the clocks up (they idle low) before anything is timed.
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(50 if quick else 300):
        torch.matmul(a, a)
    torch.cuda.synchronize()
    del a
    bw, bw_detail = _copy_bandwidth(torch, quick)
    tflops, mm_detail = {}, {}
    for key in ("bf16", "fp16", "tf32", "fp32"):
        tflops[key], mm_detail[key] = _matmul(torch, key, n, quick)
    launch, launch_detail = _launch_overhead(torch, quick)
    torch.cuda.empty_cache()
    return {
        "schema": SCHEMA,
        "device_name": name,
        "copy_bandwidth_gbs": round(bw, 1),
        "matmul_tflops": {k: round(v, 1) for k, v in tflops.items()},
        "launch_overhead_us": round(launch, 2),
        "torch_version": str(torch.__version__),
        "cuda_version": getattr(torch.version, "cuda", None),
        "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "method": (
            "tracedx calibrate: copy = dst.copy_(src) of a max(1 GiB, 16 x L2) uint8 buffer, "
            "bytes read + written, CUDA events, median of 20 samples x 5 copies; matmul = "
            f"torch.matmul(out=) of random-normal {n}x{n} matrices, 2n^3 FLOPs, CUDA events, "
            "median of 10 samples (x5 calls; fp32 x1), tf32 = float32 with "
            "set_float32_matmul_precision('high'), fp32 = 'highest'; launch = 1000 "
            "back-to-back x.add_(1) on a 1-element tensor between synchronizations, per op, "
            "median of 20; after 3+ warm-up calls each and a clock warm-up"
            + (" (quick: fewer samples)" if quick else "")
        ),
        "details": {
            "copy": bw_detail,
            "matmul": mm_detail,
            "launch": launch_detail,
            "launch_rate_per_s": round(launch_detail["launch_rate_per_s"]),
        },
    }


def write_calibration(result: dict, path: str | os.PathLike) -> Path:
    """Write ``result`` as JSON to ``path`` atomically (temp file then rename); return the path.

    Raises ``OSError`` when the folder cannot be written.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tracedx-cal-", suffix=".json", dir=final.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return final


def run_calibration(path: str | os.PathLike, quick: bool = False) -> dict:
    """Measure (:func:`calibrate`), write the file, print a summary on stderr; return the dict.

    Raises :class:`CalibrationError` (no torch or GPU) and ``OSError`` (cannot write).
    """
    from tracedx.console import fit_to

    print(
        fit_to(
            "tracedx: calibrating (copy bandwidth, matmul per dtype, launch cost) ...", sys.stderr
        ),
        file=sys.stderr,
        flush=True,
    )
    result = calibrate(quick=quick)
    write_calibration(result, path)
    mm = result["matmul_tflops"]
    line = (
        f"tracedx: {result['device_name']}: copy {result['copy_bandwidth_gbs'] / 1e3:.2f} TB/s; "
        f"matmul TFLOP/s bf16 {mm['bf16']:.0f}, fp16 {mm['fp16']:.0f}, tf32 {mm['tf32']:.0f}, "
        f"fp32 {mm['fp32']:.1f}; launch {result['launch_overhead_us']:.1f} us/op"
    )
    print(
        fit_to(line, sys.stderr),
        file=sys.stderr,
        flush=True,
    )
    return result
