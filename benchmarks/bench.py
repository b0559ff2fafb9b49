"""Benchmark: tracedx against HolisticTraceAnalysis (HTA) on large traces, same machine, one run.

What it does:

1. Makes large traces from a real one by repeating its ProfilerSteps: every event that belongs
   to a step (by its time, or for GPU work and flows by the correlation id of its launch) is
   written again with timestamps, correlation ids, External ids, flow ids, sequence numbers and
   step numbers shifted, so the result is a valid trace with more steps. The original text of
   each event is kept (Kineto's own formatting), only the numbers change. Sizes: 10 MB, 100 MB
   and 1 GB of JSON by default, each written plain and gzipped under ``benchmarks/out/``
   (git-ignored) and reused while the source does not change.
2. Times ``tracedx diagnose --format json`` end to end (a subprocess: interpreter start, imports,
   parse, full diagnosis, report) and the parse stage alone (``tracedx.load``, timed inside the
   process), over several runs; the median is reported. Peak memory is the largest total
   resident set of the child's process tree (sampled every 20 ms; tracedx's second reader
   process counts while it runs), or the child's own ``wait4`` maximum when that is larger.
3. Creates a separate virtual environment with HTA (``traceinsight`` on PyPI from 0.6,
   ``HolisticTraceAnalysis`` before) and runs, end to end in a subprocess, its trace load plus
   temporal breakdown, idle time breakdown and kernel breakdown on the same files (each alone
   in a folder, as HTA reads a folder of rank traces). Failures are recorded, not hidden.
4. Prints a table (and writes ``benchmarks/out/results.json`` and ``results.md``).

Usage::

    python benchmarks/bench.py                  # 10 MB, 100 MB, 1 GB; tracedx and HTA
    python benchmarks/bench.py --quick          # 10 MB and 100 MB only, fewer runs
    python benchmarks/bench.py --no-hta --sizes 100
    python benchmarks/bench.py --source sample_traces/foo.json.gz

Not a test: numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out"
FALLBACK_SOURCE = ROOT.parent / "shared/public_traces/hta/trace_diff__control__control.json.gz"
GENERATOR_VERSION = 3
MB = 1_000_000

# --------------------------------------------------------------------------------------------
# Trace generation
# --------------------------------------------------------------------------------------------


class _RawDoc(msgspec.Struct):
    traceEvents: list[msgspec.Raw] = []


# The numbers to shift, by the key in front of them. ts: time; id: every id-like counter;
# step: the N of ProfilerStep#N.
_SHIFT_KEYS = {
    b'"ts": ': 0,
    b'"ts":': 0,
    b'"id": ': 1,
    b'"id":': 1,
    b'"External id": ': 1,
    b'"external id": ': 1,
    b'"correlation": ': 1,
    b'"Sequence number": ': 1,
    b'"Python id": ': 1,
    b'"Python parent id": ': 1,
    b'"Ev Idx": ': 1,
    b'"Record function id": ': 1,
    b'"Profiler Event Index": ': 1,
    b"ProfilerStep#": 2,
}
_SHIFT_RE = re.compile(b"(" + b"|".join(re.escape(k) for k in _SHIFT_KEYS) + rb")(\d+)")
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


def _load_source(path: Path) -> tuple[bytes, list[bytes]]:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    doc = msgspec.json.decode(data, type=_RawDoc)
    return data, [bytes(r) for r in doc.traceEvents]


def _steps_of(events: list[dict]) -> tuple[list[float], list[float], list[int]]:
    wins = []
    for e in events:
        m = _STEP_RE.match(str(e.get("name", "")))
        host = e.get("cat") != "gpu_user_annotation"  # the GPU-side copy of the step marker
        if m and host and e.get("ph") == "X" and e.get("dur") is not None:
            wins.append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), int(m.group(1))))
    wins.sort()
    return [w[0] for w in wins], [w[1] for w in wins], [w[2] for w in wins]


def _int_or_none(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def plan_source(path: Path) -> dict:
    """Split a real trace into head, per-step event blocks, metadata events and tail."""
    data, raws = _load_source(path)
    events = [msgspec.json.decode(r) for r in raws]
    if not events:
        raise SystemExit(f"{path}: no events")
    starts, ends, numbers = _steps_of(events)
    if not starts:
        raise SystemExit(f"{path}: no ProfilerStep#N annotations; choose a trace with steps")

    def step_at(t: float) -> int | None:
        i = bisect.bisect_right(starts, t) - 1
        return i if i >= 0 and t < ends[i] else None

    # correlation -> step of its earliest event (the launch comes before its GPU work)
    first_ts: dict[int, float] = {}
    for e in events:
        a = e.get("args")
        c = _int_or_none(a.get("correlation")) if isinstance(a, dict) else None
        if c is not None and isinstance(e.get("ts"), (int, float)):
            first_ts[c] = min(first_ts.get(c, float("inf")), float(e["ts"]))
    corr_step = {c: step_at(t) for c, t in first_ts.items()}

    blocks: list[list[bytes]] = [[] for _ in starts]
    meta: list[bytes] = []
    lo, hi, id_max = float("inf"), float("-inf"), 0
    for raw, e in zip(raws, events, strict=True):
        if e.get("ph") == "M":
            meta.append(raw)
            continue
        ts = e.get("ts")
        if not isinstance(ts, (int, float)):
            continue
        a = e.get("args") if isinstance(e.get("args"), dict) else {}
        c = _int_or_none(a.get("correlation"))
        if c is None and e.get("ph") in ("s", "f", "t"):
            c = _int_or_none(e.get("id"))
        s = corr_step.get(c) if c is not None and c in corr_step else step_at(float(ts))
        if s is None:
            continue
        blocks[s].append(raw)
        lo = min(lo, float(ts))
        hi = max(hi, float(ts) + float(e.get("dur") or 0))
    for _key, num in _SHIFT_RE.findall(b"".join(b for blk in blocks for b in blk)):
        id_max = max(id_max, int(num))
    # head / separator / tail: the document's own text around the events
    first, last = raws[0], raws[-1]
    p0 = data.find(first)
    p1 = data.find(raws[1], p0 + len(first)) if len(raws) > 1 else p0 + len(first)
    sep = data[p0 + len(first) : p1] if len(raws) > 1 else b",\n  "
    pl_ = data.rfind(last)
    return {
        "head": data[:p0],
        "sep": sep,
        "tail": data[pl_ + len(last) :],
        "blocks": [sep.join(b) for b in blocks],
        "meta": meta,
        "period_us": int(hi - lo) + 1000,
        "id_period": 10 ** (len(str(id_max)) + 1),
        "step_period": numbers[-1] - numbers[0] + 1,
        "source_bytes": len(data),
    }


def _template(block: bytes) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    parts = _SHIFT_RE.split(block)
    kinds = np.fromiter((_SHIFT_KEYS[k] for k in parts[1::3]), dtype=np.int64)
    nums = np.fromiter(map(int, parts[2::3]), dtype=np.int64)
    return parts, kinds, nums


def make_trace(plan: dict, target_bytes: int, out: Path) -> dict:
    """Write a trace of about ``target_bytes`` by cycling through the source's steps."""
    templates = [_template(b) for b in plan["blocks"]]
    sizes = [len(b) for b in plan["blocks"]]
    sep = plan["sep"]
    fixed = len(plan["head"]) + len(plan["tail"]) + sum(len(m) + len(sep) for m in plan["meta"])
    n_steps, total = 0, fixed
    while True:
        nxt = sizes[n_steps % len(sizes)] + len(sep)
        if n_steps > 0 and total + nxt / 2 > target_bytes:
            break
        total += nxt
        n_steps += 1
    tmp = out.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(plan["head"])
        first = True
        for k in range(n_steps):
            cyc, s = divmod(k, len(templates))
            parts, kinds, nums = templates[s]
            if not len(nums) and not parts[0]:
                continue
            shift = np.array(
                [cyc * plan["period_us"], cyc * plan["id_period"], cyc * plan["step_period"]],
                dtype=np.int64,
            )
            parts = list(parts)
            parts[2::3] = [b"%d" % x for x in (nums + shift[kinds]).tolist()]
            if not first:
                f.write(sep)
            f.write(b"".join(parts))
            first = False
        for m in plan["meta"]:
            f.write(sep)
            f.write(m)
        f.write(plan["tail"])
    tmp.replace(out)
    return {"steps": n_steps, "bytes": out.stat().st_size}


def ensure_traces(source: Path, sizes_mb: list[int], gz: bool) -> list[dict]:
    """Generated files (plain and gzipped), reused when the source and generator are unchanged."""
    OUT.mkdir(parents=True, exist_ok=True)
    st = source.stat()
    key = {"source": str(source), "size": st.st_size, "mtime": st.st_mtime, "v": GENERATOR_VERSION}
    plan = None
    files = []
    for mb in sizes_mb:
        label = f"{mb // 1000} GB" if mb >= 1000 else f"{mb} MB"
        base = OUT / f"{source.name.split('.')[0]}-{mb}MB.json"
        meta_path = base.with_suffix(".meta.json")
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        if meta.get("key") != key or not base.exists():
            if plan is None:
                print(f"reading {source} ...", flush=True)
                plan = plan_source(source)
            t = time.perf_counter()
            info = make_trace(plan, mb * MB, base)
            print(
                f"wrote {base.name}: {info['bytes'] / MB:.1f} MB, {info['steps']} steps "
                f"({time.perf_counter() - t:.1f} s)",
                flush=True,
            )
            meta = {"key": key, **info}
            base.with_suffix(".json.gz").unlink(missing_ok=True)
            meta_path.write_text(json.dumps(meta))
        gz_path = base.with_suffix(".json.gz")
        if gz and not gz_path.exists():
            t = time.perf_counter()
            with open(gz_path.with_suffix(".tmp"), "wb") as f:
                subprocess.run(["gzip", "-6", "-c", str(base)], stdout=f, check=True)
            gz_path.with_suffix(".tmp").replace(gz_path)
            print(f"wrote {gz_path.name} ({time.perf_counter() - t:.1f} s)", flush=True)
        files.append(
            {"label": label, "path": base, "json_bytes": meta["bytes"], "steps": meta["steps"]}
        )
        if gz:
            files.append(
                {
                    "label": label + " gz",
                    "path": gz_path,
                    "json_bytes": meta["bytes"],
                    "steps": meta["steps"],
                }
            )
    return files


# --------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------


def _tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants (a worker process counts too)."""
    total, todo, page = 0, [root], os.sysconf("SC_PAGE_SIZE")
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError, IndexError):
            continue
    return total


def _run_wait4(cmd: list[str], timeout: float) -> dict:
    """Run ``cmd``; wall seconds, exit status, output and peak memory.

    Peak memory is the larger of the child's own maximum resident set (``wait4``, exact for one
    process) and the largest sum over the process tree sampled every 20 ms (tracedx may start a
    second process to decode chunks; HTA runs in one).
    """
    import tempfile

    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, cwd=ROOT)
        deadline = t0 + timeout
        tree_peak = 0
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                break
            tree_peak = max(tree_peak, _tree_rss(p.pid))
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        return {
            "rc": p.returncode,
            "wall_s": wall,
            "peak_bytes": max(ru.ru_maxrss * 1024, tree_peak),
            "stdout": fo.read(),
            "stderr": fe.read(),
            "timed_out": time.perf_counter() > deadline,
        }


_LOAD_SNIPPET = (
    "import sys, time, tracedx\n"
    "t = time.perf_counter()\n"
    "tr = tracedx.load(sys.argv[1])\n"
    "print('LOAD_S', time.perf_counter() - t)\n"
)


def bench_tracedx(path: Path, runs: int) -> dict:
    e2e, parse = [], []
    for _ in range(runs):
        r = _run_wait4(
            [
                sys.executable,
                "-m",
                "tracedx.cli",
                "diagnose",
                "--format",
                "json",
                "--no-cache",
                str(path),
            ],
            600,
        )
        if r["rc"] != 0:
            return {"ok": False, "error": r["stderr"].decode(errors="replace")[-500:]}
        json.loads(r["stdout"])  # the report must be complete, valid JSON
        e2e.append(r)
    for _ in range(runs):
        r = _run_wait4([sys.executable, "-c", _LOAD_SNIPPET, str(path)], 600)
        if r["rc"] != 0:
            return {"ok": False, "error": r["stderr"].decode(errors="replace")[-500:]}
        m = re.search(rb"LOAD_S ([0-9.eE+-]+)", r["stdout"])
        parse.append({"load_s": float(m.group(1)), "peak_bytes": r["peak_bytes"]})
    return {
        "ok": True,
        "e2e_s": statistics.median(r["wall_s"] for r in e2e),
        "e2e_runs": [round(r["wall_s"], 3) for r in e2e],
        "peak_bytes": statistics.median(r["peak_bytes"] for r in e2e),
        "parse_s": statistics.median(r["load_s"] for r in parse),
        "parse_runs": [round(r["load_s"], 3) for r in parse],
        "parse_peak_bytes": statistics.median(r["peak_bytes"] for r in parse),
    }


_INPROCESS_SNIPPET = (
    "import sys, time, tracedx\n"
    "tracedx.diagnose  # imports done before timing, as in a notebook\n"
    "p, runs = sys.argv[1], int(sys.argv[2])\n"
    "tracedx.diagnose(tracedx.load(p))  # warm: polars' first-use costs\n"
    "for _ in range(runs):\n"
    "    t = time.perf_counter()\n"
    "    tracedx.diagnose(tracedx.load(p))\n"
    "    print('INPROC_S', time.perf_counter() - t)\n"
)


def bench_extras(path: Path, runs: int) -> dict:
    """Start-up (``import tracedx``, ``tracedx --help``), the in-process case
    (``tracedx.diagnose(tracedx.load(p))`` with imports excluded) and the cached second run
    (``diagnose`` again with the cache filled by a first run; its own temporary cache folder)."""
    import tempfile

    def walls(cmd, env=None):
        out = []
        for _ in range(runs):
            r = _run_wait4(cmd, 600) if env is None else _run_env(cmd, env)
            if r["rc"] != 0:
                raise RuntimeError(r["stderr"].decode(errors="replace")[-300:])
            out.append(r["wall_s"])
        return out

    res: dict = {}
    res["import_runs"] = walls([sys.executable, "-c", "import tracedx"])
    res["help_runs"] = walls([sys.executable, "-m", "tracedx.cli", "--help"])
    r = _run_wait4([sys.executable, "-c", _INPROCESS_SNIPPET, str(path), str(runs)], 600)
    res["inprocess_runs"] = [float(x) for x in re.findall(rb"INPROC_S ([0-9.eE+-]+)", r["stdout"])]
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "TRACEDX_CACHE_DIR": d}
        cmd = [sys.executable, "-m", "tracedx.cli", "diagnose", "--format", "json", str(path)]
        _run_env(cmd, env)  # fills the cache
        res["cached_runs"] = walls(cmd, env)
    for k in ("import", "help", "inprocess", "cached"):
        v = res[f"{k}_runs"]
        res[f"{k}_s"] = statistics.median(v) if v else None
    return res


def _run_env(cmd: list[str], env: dict) -> dict:
    old = dict(os.environ)
    os.environ.update(env)
    try:
        return _run_wait4(cmd, 600)
    finally:
        os.environ.clear()
        os.environ.update(old)


# --------------------------------------------------------------------------------------------
# HolisticTraceAnalysis in its own virtual environment
# --------------------------------------------------------------------------------------------

HTA_VENV = OUT / "hta-venv"
HTA_PACKAGES = ("traceinsight", "HolisticTraceAnalysis")  # the PyPI name from 0.6, and before
# The version the README's table was measured with; the older name is installed unpinned.
HTA_PINS = {"traceinsight": "==0.6.1"}


def ensure_hta() -> tuple[Path, str] | tuple[None, str]:
    """Create the HTA venv once; returns (python, "package version") or (None, why not)."""
    py = HTA_VENV / "bin" / "python"
    if not py.exists():
        print(f"creating {HTA_VENV} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(HTA_VENV)], check=True)
    errors = []
    for pkg in HTA_PACKAGES:
        ver = _installed_version(py, pkg)
        if ver:
            return py, f"{pkg} {ver}"
    for pkg in HTA_PACKAGES:
        print(f"pip install {pkg} (into {HTA_VENV}) ...", flush=True)
        r = subprocess.run(
            [str(py), "-m", "pip", "install", "-q", pkg + HTA_PINS.get(pkg, "")],
            capture_output=True,
            text=True,
        )
        ver = _installed_version(py, pkg)
        if r.returncode == 0 and ver:
            return py, f"{pkg} {ver}"
        errors.append(
            f"{pkg}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}"
        )
    return None, "; ".join(errors)


def _installed_version(py: Path, pkg: str) -> str | None:
    r = subprocess.run(
        [str(py), "-c", f"import importlib.metadata as m; print(m.version({pkg!r}))"],
        capture_output=True,
        text=True,
    )
    return r.stdout.strip() if r.returncode == 0 else None


def bench_hta(py: Path, path: Path, runs: int, timeout: float) -> dict:
    folder = OUT / "hta-dirs" / path.name.replace(".", "_")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / path.name
    if not target.exists():
        try:
            os.link(path, target)
        except OSError:
            target.symlink_to(path)
    results = []
    for _ in range(runs):
        r = _run_wait4([str(py), str(HERE / "hta_run.py"), str(folder)], timeout)
        m = re.search(rb"HTA_RESULT (\{.*\})", r["stdout"])
        info = json.loads(m.group(1)) if m else {"ok": False}
        if not info.get("ok"):
            why = info.get("error") or (
                "timed out" if r.get("timed_out") else r["stderr"].decode(errors="replace")[-300:]
            )
            return {"ok": False, "error": why, "wall_s": r["wall_s"], "peak_bytes": r["peak_bytes"]}
        info["wall_s"] = r["wall_s"]
        info["peak_bytes"] = r["peak_bytes"]
        results.append(info)
    return {
        "ok": True,
        "e2e_s": statistics.median(r["wall_s"] for r in results),
        "e2e_runs": [round(r["wall_s"], 3) for r in results],
        "load_s": statistics.median(r["load_s"] for r in results),
        # in-process: load and the three breakdowns, HTA's imports excluded
        "inprocess_s": statistics.median(r["total_s"] - r["import_s"] for r in results),
        "peak_bytes": statistics.median(r["peak_bytes"] for r in results),
    }


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def _fmt_row(f: dict) -> list[str]:
    js = f["json_bytes"]
    t, h = f["tracedx"], f.get("hta")
    row = [f["label"], f"{js / MB:.0f}", str(f["steps"])]
    if not t.get("ok"):
        return row + ["failed", "", "", "", "", ""]
    row += [f"{t['e2e_s']:.2f}", f"{t['parse_s']:.2f}"]
    if h is None:
        row += ["-", "-"]
    elif h.get("ok"):
        row += [f"{h['e2e_s']:.1f}", f"{h['e2e_s'] / t['e2e_s']:.1f}x"]
    else:
        row += ["failed", "-"]
    row += [
        f"{js / MB / t['e2e_s']:.0f}",
        f"{t['peak_bytes'] / MB:.0f} ({t['peak_bytes'] / js:.2f}x)",
    ]
    if h is None:
        row.append("-")
    elif h.get("peak_bytes"):
        row.append(f"{h['peak_bytes'] / MB:.0f} ({h['peak_bytes'] / js:.2f}x)")
    else:
        row.append("-")
    return row


HEADERS = [
    "trace",
    "JSON MB",
    "steps",
    "tracedx s",
    "parse s",
    "HTA s",
    "HTA / tracedx",
    "tracedx MB/s",
    "tracedx peak MB (x JSON)",
    "HTA peak MB (x JSON)",
]


def render_table(files: list[dict]) -> str:
    rows = [HEADERS] + [_fmt_row(f) for f in files]
    w = [max(len(r[i]) for r in rows) for i in range(len(HEADERS))]
    lines = ["| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (x + 2) for x in w) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--source",
        type=Path,
        default=None,
        help="real trace to repeat (default: sample_traces/resnet_train-bf16-cl.json.gz, "
        "else the first sample trace with ProfilerSteps, else HTA's control trace)",
    )
    ap.add_argument("--sizes", default="10,100,1000", help="JSON sizes in MB (default 10,100,1000)")
    ap.add_argument("--no-1gb", action="store_true", help="skip sizes of 1000 MB and more")
    ap.add_argument("--quick", action="store_true", help="10 and 100 MB, 2 runs, HTA once")
    ap.add_argument("--no-hta", action="store_true", help="do not run HolisticTraceAnalysis")
    ap.add_argument("--no-gzip", action="store_true", help="plain JSON files only")
    ap.add_argument("--runs", type=int, default=3, help="tracedx runs per file (median)")
    ap.add_argument("--hta-runs", type=int, default=3, help="HTA runs per file (median)")
    ap.add_argument("--hta-timeout", type=float, default=1800, help="seconds per HTA run")
    ap.add_argument(
        "--hta-large-runs",
        type=int,
        default=1,
        help="HTA runs per file of 1 GB or more (one run takes over ten minutes here)",
    )
    ap.add_argument(
        "--hta-max-mb",
        type=float,
        default=None,
        help="run HTA only on files of at most this many MB of JSON (HTA takes 25 minutes at 1 GB)",
    )
    ap.add_argument(
        "--hta-large-gzip",
        action="store_true",
        help="also run HTA on the gzipped files of 1 GB or more (by default only the plain one)",
    )
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if args.quick:
        sizes = [s for s in sizes if s < 1000]
        args.runs, args.hta_runs = min(args.runs, 2), 1
    if args.no_1gb:
        sizes = [s for s in sizes if s < 1000]
    source = args.source or _default_source()
    print(f"source: {source}", flush=True)
    files = ensure_traces(source, sizes, gz=not args.no_gzip)

    hta_py, hta_version = (None, "not run (--no-hta)")
    if not args.no_hta:
        hta_py, hta_version = ensure_hta()
        if hta_py is None:
            print(f"HTA could not be installed: {hta_version}", flush=True)
            hta_version = f"not installed: {hta_version}"
    for f in files:
        print(f"tracedx on {f['path'].name} ...", flush=True)
        f["tracedx"] = bench_tracedx(f["path"], args.runs)
        f["extras"] = bench_extras(f["path"], args.runs)
        large = f["json_bytes"] >= 1000 * MB
        if hta_py is not None and args.hta_max_mb and f["json_bytes"] > args.hta_max_mb * MB:
            f["hta_note"] = f"not run (--hta-max-mb {args.hta_max_mb:g})"
        elif hta_py is not None and large and f["path"].suffix == ".gz" and not args.hta_large_gzip:
            f["hta_note"] = "not run (--hta-large-gzip)"
        elif hta_py is not None:
            print(f"HTA on {f['path'].name} ...", flush=True)
            runs = args.hta_large_runs if large else args.hta_runs
            f["hta"] = bench_hta(hta_py, f["path"], runs, args.hta_timeout)
            f["hta"]["runs"] = runs
            if not f["hta"]["ok"]:
                print(f"  HTA failed: {f['hta']['error']}", flush=True)

    table = render_table(files)
    machine = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{_mem_gib():.0f} GiB, Python {platform.python_version()}"
    )
    notes = [
        f"source: {source.name} ({plan_bytes(files)})",
        f"machine: {machine}",
        f"HTA: {hta_version}",
        f"runs: tracedx {args.runs}, HTA {args.hta_runs} per file (median); "
        f"HTA {args.hta_large_runs} on files of 1 GB and more",
    ]
    for f in files:
        x, h = f.get("extras") or {}, f.get("hta")
        if x:
            hta_inproc = h.get("inprocess_s") if h and h.get("ok") else None
            ratio = f", {hta_inproc / x['inprocess_s']:.1f}x HTA's" if hta_inproc else ""
            notes.append(
                f"{f['label']}: import tracedx {x['import_s']:.3f} s, --help {x['help_s']:.3f} s, "
                f"in-process diagnose(load) {x['inprocess_s']:.3f} s{ratio} (imports excluded), "
                f"cached second diagnose {x['cached_s']:.3f} s (medians of {args.runs})"
            )
        if f.get("hta_note"):
            notes.append(f"HTA on {f['label']}: {f['hta_note']}")
        if h is not None and not h.get("ok"):
            notes.append(f"HTA failed on {f['label']}: {h['error']}")
    text = table + "\n\n" + "\n".join("- " + n for n in notes)
    print("\n" + text)
    (OUT / "results.md").write_text(text + "\n")
    (OUT / "results.json").write_text(
        json.dumps(
            {
                "notes": notes,
                "files": [
                    {k: (str(v) if isinstance(v, Path) else v) for k, v in f.items()} for f in files
                ],
            },
            indent=1,
        )
    )
    return 0


def plan_bytes(files: list[dict]) -> str:
    return ", ".join(f"{f['label']}: {f['steps']} steps" for f in files if "gz" not in f["label"])


def _mem_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 0.0


PREFERRED_SOURCE = ROOT / "sample_traces" / "resnet_train-bf16-cl.json.gz"


def _default_source() -> Path:
    """A real H200 training trace (forward, backward, optimizer; shapes recorded) when present."""
    if PREFERRED_SOURCE.exists():
        return PREFERRED_SOURCE
    for p in sorted((ROOT / "sample_traces").glob("*.json*")):
        try:
            with gzip.open(p) if p.suffix == ".gz" else open(p, "rb") as fh:
                head = fh.read()
        except OSError:
            continue
        if b"ProfilerStep#" in head:
            return p
    return FALLBACK_SOURCE


if __name__ == "__main__":
    sys.exit(main())
