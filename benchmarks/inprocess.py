"""In-process diagnosis against HolisticTraceAnalysis, interleaved, imports excluded for both.

Each repeat runs, in fresh processes one after the other: ``tracedx.diagnose(tracedx.load(p))``
(timed after ``import tracedx`` and of the modules it loads on first use, the notebook case:
the imports are done) and HTA's trace load plus temporal, idle time and kernel breakdowns
(``hta_run.py``, its own import time taken out), with ``HTA_DISABLE_NS_ROUNDING=1`` (HTA's
rounding makes sub-microsecond kernels last -1 and its temporal breakdown fails). HTA runs in
the virtual environment ``bench.py`` makes (``benchmarks/out/hta-venv``).

Usage: ``python benchmarks/inprocess.py TRACE [--repeats 3] [--no-hta]``. Prints each repeat
and the ranges; callable as :func:`measure` (returns the per-repeat seconds).
Not a test: numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

_TRACEDX = (
    "import sys, time, tracedx\n"
    # the modules diagnose imports on first use, so no import is timed
    "import tracedx.analysis.diagnosis, tracedx.analysis.intensity, tracedx.analysis.roofline\n"
    "import tracedx.analysis.batch, tracedx.devices, tracedx.trace\n"
    "p = sys.argv[1]\n"
    "t0 = time.perf_counter(); tr = tracedx.load(p); t1 = time.perf_counter()\n"
    "tracedx.diagnose(tr); t2 = time.perf_counter()\n"
    "print('TDX', t1 - t0, t2 - t1)\n"
)


def _tracedx_once(path: Path) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:  # never a cache hit
        env = {**os.environ, "TRACEDX_CACHE_DIR": d}
        r = subprocess.run(
            [sys.executable, "-c", _TRACEDX, str(path)],
            capture_output=True, text=True, env=env, check=True,
        )  # fmt: skip
    load_s, diag_s = (float(x) for x in re.search(r"TDX (\S+) (\S+)", r.stdout).groups())
    return load_s, diag_s


def _hta_once(py: Path, folder: Path) -> float | None:
    env = {**os.environ, "HTA_DISABLE_NS_ROUNDING": "1"}
    r = subprocess.run(
        [str(py), str(HERE / "hta_run.py"), str(folder)], capture_output=True, text=True, env=env
    )
    m = re.search(r"HTA_RESULT (\{.*\})", r.stdout)
    info = json.loads(m.group(1)) if m else {}
    return info["first_s"] if info.get("ok") else None


def measure(path: Path, repeats: int = 3, hta: bool = True) -> dict:
    """Per-repeat seconds: ``tracedx_load_s``, ``tracedx_diagnose_s``, ``tracedx_s`` (their
    sum) and ``hta_s`` (None entries where HTA failed), run interleaved."""
    py = HERE / "out" / "hta-venv" / "bin" / "python"
    folder = None
    if hta:
        if not py.exists():
            raise SystemExit(f"no HTA venv at {py}: run benchmarks/bench.py once (it makes it)")
        folder = HERE / "out" / "hta-dirs" / ("inproc-" + path.name.replace(".", "_"))
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / path.name
        if not target.exists():
            os.link(path.resolve(), target)
    res: dict = {"tracedx_load_s": [], "tracedx_diagnose_s": [], "tracedx_s": [], "hta_s": []}
    for _ in range(repeats):
        load_s, diag_s = _tracedx_once(path)
        res["tracedx_load_s"].append(load_s)
        res["tracedx_diagnose_s"].append(diag_s)
        res["tracedx_s"].append(load_s + diag_s)
        if hta:
            res["hta_s"].append(_hta_once(py, folder))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-hta", action="store_true")
    args = ap.parse_args(argv)
    res = measure(args.trace, args.repeats, hta=not args.no_hta)
    for i in range(args.repeats):
        h = res["hta_s"][i] if res["hta_s"] else None
        ratio = f"  ratio {h / res['tracedx_s'][i]:.1f}x" if h else ""
        print(
            f"repeat {i + 1}: tracedx load {res['tracedx_load_s'][i]:.3f} s + diagnose "
            f"{res['tracedx_diagnose_s'][i]:.3f} s = {res['tracedx_s'][i]:.3f} s"
            + (f"; HTA {h:.3f} s{ratio}" if h else "")
        )
    t = res["tracedx_s"]
    print(f"tracedx {min(t):.3f}-{max(t):.3f} s", end="")
    hs = [h for h in res["hta_s"] if h]
    if hs:
        rs = [h / x for h, x in zip(res["hta_s"], t, strict=True) if h]
        print(f"; HTA {min(hs):.3f}-{max(hs):.3f} s; ratio {min(rs):.1f}-{max(rs):.1f}x")
    else:
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
