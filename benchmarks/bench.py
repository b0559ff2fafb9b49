"""Benchmark: tracedx against HolisticTraceAnalysis (HTA) on large traces, same machine, one run.

What it does:

1. Makes large traces from a real one by repeating its ProfilerSteps: every event that belongs
   to a step (by its time, or for GPU work and flows by the correlation id of its launch) is
   written again with timestamps, correlation ids, External ids, flow ids, sequence numbers and
   step numbers shifted, so the result is a valid trace with more steps. The original text of
   each event is kept (Kineto's own formatting), only the numbers change. Sizes: 10 MB, 100 MB
   and 1 GB of JSON by default, each written plain and gzipped under ``benchmarks/out/``
   (git-ignored) and reused while the source does not change.
2. Creates a separate virtual environment with HTA (``traceinsight`` on PyPI from 0.6,
   ``HolisticTraceAnalysis`` before), unless ``--no-hta``.
3. For each file, runs rounds; each round runs, in turn, ``tracedx diagnose --format json
   --no-cache`` end to end (a subprocess: interpreter start, imports, parse, full diagnosis,
   report), the in-process case (``tracedx.diagnose(tracedx.load(p))`` in a process whose
   imports are done and which ran it once; ``tracedx.load`` is timed too) and HTA: its trace
   load plus temporal, idle time and kernel breakdowns, end to end and in-process (its
   imports excluded), with ``HTA_DISABLE_NS_ROUNDING=1`` (each trace alone in a folder, as HTA
   reads a folder of rank traces; failures are recorded, not hidden). Interleaved, a drift of
   the machine's speed hits both tools. Then ``import tracedx``, ``tracedx --help`` and the
   cached second run (``diagnose`` over a cache filled by a first run, in a temporary folder).
   Each time is reported as median (min-max). Peak memory is the largest total resident set of
   the child's process tree (sampled every 20 ms; tracedx's second reader process counts while
   it runs), or the child's own ``wait4`` maximum when that is larger.
4. Prints a table (and writes ``benchmarks/out/results.json`` and ``results.md``).

Usage::

    python benchmarks/bench.py                  # 10 MB, 100 MB, 1 GB; tracedx and HTA
    python benchmarks/bench.py --quick          # 10 MB and 100 MB only, fewer runs
    python benchmarks/bench.py --no-hta --sizes 100
    python benchmarks/bench.py --source sample_traces/foo.json.gz
    taskset -c 0,1 python benchmarks/bench.py --no-hta   # pinned to two cores

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
GENERATOR_VERSION = 4
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
    written = sum(
        1
        for k in range(n_steps)
        if len(templates[k % len(templates)][2]) or templates[k % len(templates)][0][0]
    )
    # tracedx capture's record of its complete steps, if the source has one, counts the
    # generated steps: each is a whole copy of a complete step (else all but the source's
    # count would read as steps the script ended inside, left out of the diagnosis)
    head = re.sub(
        rb'("active_steps_recorded"\s*:\s*)\d+', rb"\g<1>%d" % written, plan["head"], count=1
    )
    tmp = out.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(head)
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


def _run_wait4(cmd: list[str], timeout: float, env: dict | None = None) -> dict:
    """Run ``cmd``; wall seconds, exit status, output and peak memory.

    Peak memory is the larger of the child's own maximum resident set (``wait4``, exact for one
    process) and the largest sum over the process tree sampled every 20 ms (tracedx may start a
    second process to decode chunks; HTA runs in one).
    """
    import tempfile

    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, cwd=ROOT, env=env)
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


_TRACEDX_E2E = ("-m", "tracedx.cli", "diagnose", "--format", "json", "--no-cache")

_INPROCESS_SNIPPET = (
    "import sys, time, tracedx\n"
    "tracedx.diagnose  # imports done before timing, as in a notebook\n"
    "import tracedx.analysis.diagnosis, tracedx.trace\n"
    "p = sys.argv[1]\n"
    "t = time.perf_counter()\n"
    "tracedx.diagnose(tracedx.load(p))  # the first call: polars' first-use costs, fresh memory\n"
    "first = time.perf_counter() - t\n"
    "t = time.perf_counter()\n"
    "tr = tracedx.load(p)\n"
    "t1 = time.perf_counter()\n"
    "tracedx.diagnose(tr)\n"
    "print('INPROC_S', time.perf_counter() - t, 'LOAD_S', t1 - t, 'FIRST_S', first)\n"
)


def _ok(r: dict) -> dict:
    if r["rc"] != 0:
        raise RuntimeError(r["stderr"].decode(errors="replace")[-500:])
    return r


def _rng(v: list[float]) -> dict:
    """Median, min and max of repeated measurements (seconds or bytes)."""
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v} if v else {}


def bench_file(
    path: Path, runs: int, hta_py: Path | None, hta_runs: int, timeout: float, hta_warm: bool
) -> dict:
    """Every measurement of one file, interleaved: each round runs tracedx end to end, tracedx
    in-process (``tracedx.diagnose(tracedx.load(p))``, imports excluded: its first call in the
    process, ``first``, and a second, warm call, ``inproc``) and, in its first ``hta_runs``
    rounds, HTA (end to end, and in-process: its load and three breakdowns with its imports
    excluded, first call and, with ``hta_warm``, a second warm one), so a drift of the machine's speed hits both tools
    alike. Then start-up (``import tracedx``, ``tracedx --help``) and the cached second run
    (``diagnose`` again over a cache filled by a first run, in its own temporary folder)."""
    import tempfile

    t: dict = {"e2e": [], "peak": [], "inproc": [], "first": [], "load": [], "inproc_peak": []}
    h: dict = {"e2e": [], "inproc": [], "first": [], "load": [], "peak": [], "error": None}
    for i in range(runs):
        r = _ok(_run_wait4([sys.executable, *_TRACEDX_E2E, str(path)], timeout))
        json.loads(r["stdout"])  # the report must be complete, valid JSON
        t["e2e"].append(r["wall_s"])
        t["peak"].append(r["peak_bytes"])
        r = _ok(_run_wait4([sys.executable, "-c", _INPROCESS_SNIPPET, str(path)], timeout))
        m = re.search(
            rb"INPROC_S ([0-9.eE+-]+) LOAD_S ([0-9.eE+-]+) FIRST_S ([0-9.eE+-]+)", r["stdout"]
        )
        t["inproc"].append(float(m.group(1)))
        t["load"].append(float(m.group(2)))
        t["first"].append(float(m.group(3)))
        t["inproc_peak"].append(r["peak_bytes"])
        if hta_py is not None and i < hta_runs and h["error"] is None:
            one = bench_hta(hta_py, path, timeout, warm=hta_warm)
            if one.get("ok"):
                h["e2e"].append(one["wall_s"])
                h["first"].append(one["first_s"])
                if "warm_s" in one:
                    h["inproc"].append(one["warm_s"])
                h["load"].append(one["load_s"])
                h["peak"].append(one["peak_bytes"])
            else:
                h["error"] = one["error"]
                print(f"  HTA failed: {one['error']}", flush=True)
    x: dict = {"import": [], "help": [], "cached": []}
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "TRACEDX_CACHE_DIR": d}
        cmd = [sys.executable, "-m", "tracedx.cli", "diagnose", "--format", "json", str(path)]
        _ok(_run_wait4(cmd, timeout, env))  # fills the cache
        for _ in range(runs):
            x["import"].append(
                _ok(_run_wait4([sys.executable, "-c", "import tracedx"], 60))["wall_s"]
            )
            x["help"].append(
                _ok(_run_wait4([sys.executable, "-m", "tracedx.cli", "--help"], 60))["wall_s"]
            )
            r = _ok(_run_wait4(cmd, timeout, env))
            if b"reused the cached diagnosis" not in r["stderr"]:
                raise RuntimeError("the second run did not use the cache")
            x["cached"].append(r["wall_s"])
    out = {"ok": True, **{k: _rng(v) for k, v in t.items()}, **{k: _rng(v) for k, v in x.items()}}
    if hta_py is not None:
        out["hta"] = {k: _rng(v) for k, v in h.items() if k != "error"}
        out["hta"]["ok"] = bool(h["e2e"]) and h["error"] is None
        out["hta"]["error"] = h["error"]
    return out


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


# HTA's temporal breakdown fails an assertion on traces with sub-microsecond kernels unless its
# nanosecond rounding is off (the rounding makes such a kernel last -1 us): set for every run.
HTA_ENV = {"HTA_DISABLE_NS_ROUNDING": "1"}


HTA_WARM_MAX_BYTES = 50 * MB
"""HTA runs its workflow a second time in the same process (the warm in-process case) on
files of at most this size; past it a second pass would double runs of tens of seconds."""


def bench_hta(py: Path, path: Path, timeout: float, warm: bool = False) -> dict:
    """One HTA run on ``path`` (alone in a folder, as HTA reads a folder of rank traces); with
    ``warm``, also a second pass in the same process (``warm_s``), which ``wall_s`` (end to
    end: the process less that pass) leaves out."""
    folder = OUT / "hta-dirs" / path.name.replace(".", "_")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / path.name
    if not target.exists():
        try:
            os.link(path, target)
        except OSError:
            target.symlink_to(path)
    env = {**os.environ, **HTA_ENV}
    again = ["--warm"] if warm else []
    r = _run_wait4([str(py), str(HERE / "hta_run.py"), str(folder), *again], timeout, env)
    m = re.search(rb"HTA_RESULT (\{.*\})", r["stdout"])
    info = json.loads(m.group(1)) if m else {"ok": False}
    if not info.get("ok"):
        why = info.get("error") or (
            "timed out" if r.get("timed_out") else r["stderr"].decode(errors="replace")[-300:]
        )
        return {"ok": False, "error": why}
    return {**info, "wall_s": r["wall_s"] - info.get("warm_s", 0.0), "peak_bytes": r["peak_bytes"]}


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def _s(r: dict, digits: int = 2) -> str:
    """``median (min-max)`` of a range, in seconds."""
    if not r:
        return "-"
    f = f"{{:.{digits}f}}"
    return f"{f.format(r['median'])} ({f.format(r['min'])}-{f.format(r['max'])})"


def _fmt_row(f: dict) -> list[str]:
    js = f["json_bytes"]
    t, h = f["tracedx"], f.get("hta") or {}
    row = [f["label"], f"{js / MB:.0f}", str(f["steps"])]
    if not t.get("ok"):
        return row + ["failed"] + [""] * (len(HEADERS) - 4)
    hok = h.get("ok")
    ratio = (
        f"{h['e2e']['median'] / t['e2e']['median']:.1f}x"
        if hok
        else ("failed" if h.get("error") else "-")
    )

    def ratio_of(key: str) -> str:
        return f"{h[key]['median'] / t[key]['median']:.1f}x" if hok and h.get(key) else "-"

    peak = t["peak"]["median"]
    row += [
        _s(t["e2e"]),
        _s(h.get("e2e") if hok else {}, 1),
        ratio,
        _s(t["first"]),
        _s(h.get("first") if hok else {}, 2),
        ratio_of("first"),
        _s(t["inproc"]),
        _s(h.get("inproc") if hok else {}, 2),
        ratio_of("inproc"),
        _s(t["cached"]),
        f"{peak / MB:.0f} ({peak / js:.2f}x)",
        f"{h['peak']['median'] / MB:.0f} ({h['peak']['median'] / js:.2f}x)" if hok else "-",
    ]
    return row


HEADERS = [
    "trace",
    "JSON MB",
    "steps",
    "tracedx s",
    "HTA s",
    "HTA / tracedx",
    "in-process 1st call s",
    "HTA in-process 1st call s",
    "HTA / tracedx 1st call",
    "in-process warm s",
    "HTA in-process warm s",
    "HTA / tracedx warm",
    "cached 2nd run s",
    "tracedx peak MB (x JSON)",
    "HTA peak MB (x JSON)",
]


def render_table(files: list[dict]) -> str:
    rows = [HEADERS] + [_fmt_row(f) for f in files]
    w = [max(len(r[i]) for r in rows) for i in range(len(HEADERS))]
    lines = ["| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (x + 2) for x in w) + "|")
    return "\n".join(lines)


def _compile_tracedx() -> None:
    """Write tracedx's bytecode once, as ``pip install`` does for an installed package: a
    source checkout run with ``PYTHONDONTWRITEBYTECODE=1`` (set on this project's machines)
    would otherwise compile every module in every run, while HTA's installed packages read
    theirs (``import tracedx.trace`` measured here: 0.67-0.80 s without bytecode, 0.42-0.47 s
    with it)."""
    import compileall

    compileall.compile_dir(str(ROOT / "tracedx"), quiet=1)


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
    _compile_tracedx()
    files = ensure_traces(source, sizes, gz=not args.no_gzip)

    hta_py, hta_version = (None, "not run (--no-hta)")
    if not args.no_hta:
        hta_py, hta_version = ensure_hta()
        if hta_py is None:
            print(f"HTA could not be installed: {hta_version}", flush=True)
            hta_version = f"not installed: {hta_version}"
    for f in files:
        large = f["json_bytes"] >= 1000 * MB
        py = hta_py
        if py is not None and args.hta_max_mb and f["json_bytes"] > args.hta_max_mb * MB:
            f["hta_note"], py = f"not run (--hta-max-mb {args.hta_max_mb:g})", None
        elif py is not None and large and f["path"].suffix == ".gz" and not args.hta_large_gzip:
            f["hta_note"], py = "not run (--hta-large-gzip)", None
        print(f"{f['path'].name}: tracedx{' and HTA, interleaved' if py else ''} ...", flush=True)
        hta_runs = args.hta_large_runs if large else args.hta_runs
        warm = f["json_bytes"] <= HTA_WARM_MAX_BYTES
        f["tracedx"] = bench_file(f["path"], args.runs, py, hta_runs, args.hta_timeout, warm)
        if py is not None:
            f["hta"] = f["tracedx"].pop("hta")

    table = render_table(files)
    machine = (
        f"{_cpu_model()}, {len(os.sched_getaffinity(0))} of {os.cpu_count()} cores usable, "
        f"{_mem_gib():.0f} GiB, Python {platform.python_version()}"
    )
    notes = [
        f"source: {source.name} ({plan_bytes(files)})",
        f"machine: {machine}",
        f"HTA: {hta_version}",
        f"tracedx: commit {os.environ.get('BENCH_COMMIT') or _commit()}",
        f"runs: tracedx {args.runs}, HTA {args.hta_runs} per file (median); "
        f"HTA {args.hta_large_runs} on files of 1 GB and more",
    ]
    if hta_py is not None:
        notes.append(
            "HTA runs with HTA_DISABLE_NS_ROUNDING=1 (its temporal breakdown fails an "
            "assertion on sub-microsecond kernels otherwise)"
        )
    notes.append("times: median (min-max) of the runs; each round runs tracedx and HTA in turn")
    for f in files:
        x, h = f["tracedx"], f.get("hta")
        if x.get("ok"):
            notes.append(
                f"{f['label']}: import tracedx {_s(x['import'], 3)} s, --help {_s(x['help'], 3)} s, "
                f"tracedx.load alone {_s(x['load'])} s"
            )
        if f.get("hta_note"):
            notes.append(f"HTA on {f['label']}: {f['hta_note']}")
        if h is not None and h.get("error"):
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


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def plan_bytes(files: list[dict]) -> str:
    return ", ".join(f"{f['label']}: {f['steps']} steps" for f in files if "gz" not in f["label"])


def _commit() -> str:
    r = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    )
    return r.stdout.strip() or "unknown"


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
