"""Run HolisticTraceAnalysis on one trace folder and print timings as one JSON line.

Runs inside the separate HTA virtual environment that ``bench.py`` creates (HTA pins its own
pandas/numpy). Usage: ``python hta_run.py TRACE_DIR [--warm]``. Does what a user does in HTA's
notebooks: load the traces, then temporal breakdown, idle time breakdown and kernel breakdown.
With ``--warm`` it then does all of it again in the same process and records that second pass
as ``warm_s`` (the notebook's second call: imports and first-use costs paid); ``first_s`` is
the first pass, imports excluded. Prints ``{"ok": true, "import_s": ..., "first_s": ..., ...}``
or ``{"ok": false, "error": ...}``.
"""

from __future__ import annotations

import json
import sys
import time
import traceback


def _workflow(folder: str, out: dict) -> None:
    """HTA's load and three breakdowns, recording each one's seconds in ``out``."""
    from hta.trace_analysis import TraceAnalysis

    t1 = time.perf_counter()
    a = TraceAnalysis(trace_dir=folder)
    t2 = time.perf_counter()
    out["load_s"] = t2 - t1
    ranks = sorted(a.t.traces)
    a.get_temporal_breakdown(visualize=False)
    t3 = time.perf_counter()
    out["temporal_s"] = t3 - t2
    a.get_idle_time_breakdown(ranks=ranks, visualize=False)
    t4 = time.perf_counter()
    out["idle_s"] = t4 - t3
    a.get_gpu_kernel_breakdown(visualize=False)
    out["kernel_s"] = time.perf_counter() - t4


def main() -> int:
    t0 = time.perf_counter()
    out: dict = {"ok": False}
    try:
        import hta.trace_analysis  # noqa: F401  (the import, timed on its own)

        t1 = time.perf_counter()
        out["import_s"] = t1 - t0
        _workflow(sys.argv[1], out)
        first_end = time.perf_counter()
        out["first_s"] = first_end - t1  # the first call, imports excluded
        if "--warm" in sys.argv[2:]:
            _workflow(sys.argv[1], {})
            out["warm_s"] = time.perf_counter() - first_end
        out["ok"] = True
    except BaseException as e:  # record the failure honestly, whatever it is
        tb = traceback.extract_tb(e.__traceback__)
        where = f"{tb[-1].filename.split('site-packages/')[-1]}:{tb[-1].lineno}" if tb else "?"
        out["error"] = f"{type(e).__name__}: {str(e)[:200]} (at {where})"
    out["total_s"] = time.perf_counter() - t0
    sys.stdout.flush()
    print("HTA_RESULT " + json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
