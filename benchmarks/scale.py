"""Benchmark: a many-rank job through tracedx's per-rank map and cross-rank reduce.

What it does:

1. Makes a synthetic N-rank job from one real sample trace (``sample_traces/mlp_train-eager``:
   450 KB of JSON, 5 ProfilerSteps on an H200): every rank is the same trace with its times
   shifted (a per-rank clock offset), its correlation, External and flow ids shifted, a
   ``distributedInfo`` (rank, world size, one default process group of all ranks), and four
   NCCL all-reduces per step (gradient buckets: kernels on their own stream with Kineto's
   collective args, each with its ``cudaLaunchKernel`` and ``record_param_comms``). A rank
   arrives at a bucket's all-reduce when the kernel ending a quarter, half, three quarters or
   all of the step's kernels ends, plus a per-rank, per-bucket jitter (0-40 us); one
   straggler (rank N // 3) arrives 300 us late every time (a host delay: about 10% of the
   step). Everyone's all-reduce ends 150 us after the last arrival. Files are
   ``rank-R.json.gz`` under ``benchmarks/out/scale/N/`` (git-ignored), made once and reused.
2. For N in 8, 64, 256, 1024 runs ``tracedx.load_job`` + ``diagnose_job`` in a fresh process
   (``python benchmarks/scale.py _one ...``) with the local pool of 1 and of 2 workers and a
   Dask LocalCluster of 2 workers, and records wall time, map and reduce time, the driver's
   peak resident set (its own ``ru_maxrss``), the largest worker's (``RUSAGE_CHILDREN``
   ``ru_maxrss``: the largest reaped descendant) and the largest sum over the process tree
   (sampled every 20 ms, as ``bench.py`` does).
3. Runs HolisticTraceAnalysis (``traceinsight==0.6.1`` in ``benchmarks/out/hta-venv``, made by
   ``bench.py``'s ``ensure_hta``; ``HTA_DISABLE_NS_ROUNDING=1``) on the same folders for
   N <= 64: load, temporal, idle and kernel breakdowns (``hta_run.py``).
4. Prints a table, writes ``benchmarks/out/scale.json`` and ``scale.md``, with the growth of
   time against N and a paper projection for 4,096 ranks of 1 GB on 64 nodes.
5. ``--reduce-only``: the driver's side alone (``run_reduce``) on N summaries cloned from one
   real rank's (``synth_summaries``), each size in a fresh process: decode as they arrive,
   ``assemble_job``, ``diagnose_job``, the JSON; times, resident set per stage, peak, and the
   log-log slope of the time against N.

Usage::

    python benchmarks/scale.py                        # N = 8, 64, 256, 1024; HTA for N <= 64
    python benchmarks/scale.py --sizes 8 64 --no-hta
    python benchmarks/scale.py --make-only --sizes 64 # only write the job
    python benchmarks/scale.py --pin --no-hta --sizes 8 64 256   # 1 worker on 1 core, 2 on 2
    python benchmarks/scale.py --reduce-only --sizes 64 256 1024 2048

Not a test: numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.util
import json
import math
import os
import platform
import random
import re
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out"
JOBS = OUT / "scale"
SOURCE = ROOT / "sample_traces" / "mlp_train-eager.json.gz"
GENERATOR_VERSION = 3
MB = 1_000_000
ID_SHIFT = 10_000_000  # per rank, added to correlation, External and flow ids
CLOCK_OFFSET_US = 0.7  # per rank: rank r's clock reads r * 0.7 us ahead
JITTER_US = 40.0
STRAGGLER_DELAY_US = 300.0
TRANSFER_US = 150.0
COMM_STREAM = 99
BUCKETS = 4  # all-reduces per step: 5 steps x 4 = 20, enough for the straggler test

# --------------------------------------------------------------------------------------------
# The synthetic job
# --------------------------------------------------------------------------------------------


def _plan(doc: dict) -> dict:
    """Steps of the source: per step, its CPU window and the end of its last kernel (by the
    launching runtime event's time), plus the main thread's (pid, tid) and the largest ids."""
    events = doc["traceEvents"]
    steps = sorted(
        (
            e
            for e in events
            if e.get("ph") == "X"
            and e.get("cat") == "user_annotation"
            and str(e.get("name", "")).startswith("ProfilerStep#")
        ),
        key=lambda e: e["ts"],
    )
    launch_ts = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    plan = []
    for s in steps:
        t0, t1 = s["ts"], s["ts"] + s["dur"]
        kernels = sorted(
            (e["ts"] + e["dur"], launch_ts[c])
            for e in events
            if e.get("cat") == "kernel"
            and t0 <= launch_ts.get(c := e.get("args", {}).get("correlation"), -1) < t1
        )
        # BUCKETS gradient buckets per step: each all-reduce follows the kernel that ends a
        # quarter, half, ... of the step's kernels (launched after that kernel's launch)
        for b in range(1, BUCKETS + 1):
            if not kernels:
                break
            end, launched = kernels[math.ceil(len(kernels) * b / BUCKETS) - 1]
            plan.append(
                {
                    "step": int(s["name"].split("#")[1]),
                    "cpu_end": min(launched + 30.0, t1),
                    "last_kernel_end": end,
                    "pid": s["pid"],
                    "tid": s["tid"],
                }
            )
    return {"steps": plan}


def make_job(n: int, source: Path = SOURCE, out: Path | None = None) -> Path:
    """Write the N-rank job (see the module's doc) and return its folder; reused when made by
    this generator version from the same source."""
    folder = out or JOBS / str(n)
    stamp = folder / "MADE"
    key = f"{GENERATOR_VERSION} {source} {source.stat().st_size} {source.stat().st_mtime}"
    if stamp.exists() and stamp.read_text() == key:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("rank-*.json.gz"):
        old.unlink()
    raw = gzip.decompress(source.read_bytes())
    doc = json.loads(raw)
    plan = _plan(doc)["steps"]
    rng = random.Random(n)
    straggler = n // 3
    arrivals = [
        [
            p["last_kernel_end"]
            + rng.uniform(0, JITTER_US)
            + (STRAGGLER_DELAY_US if r == straggler else 0.0)
            for p in plan
        ]
        for r in range(n)
    ]
    ends = [max(arrivals[r][i] for r in range(n)) + TRANSFER_US for i in range(len(plan))]
    ranks_text = "[" + ", ".join(map(str, range(n))) + "]"
    for r in range(n):
        rank_doc = _rank_doc(doc, r, n, plan, arrivals[r], ends, ranks_text)
        # json's default separators (", ", ": ") as Kineto writes: HTA finds a file's rank
        # with the pattern '"rank":\s+(\d+)'
        text = json.dumps(rank_doc).encode()
        (folder / f"rank-{r}.json.gz").write_bytes(gzip.compress(text, 1))
    stamp.write_text(key)
    return folder


def _rank_doc(doc, r, n, plan, arrivals, ends, ranks_text) -> dict:
    shift_id = r * ID_SHIFT
    dt = r * CLOCK_OFFSET_US
    events = []
    for e in doc["traceEvents"]:
        e = dict(e)
        if "ts" in e:
            e["ts"] = e["ts"] + dt
        if e.get("ph") in ("s", "f", "t") and isinstance(e.get("id"), int):
            e["id"] += shift_id
        args = e.get("args")
        if args:
            args = dict(args)
            for k in ("correlation", "External id"):
                if isinstance(args.get(k), int):
                    args[k] += shift_id
            e["args"] = args
        events.append(e)
    base = shift_id + ID_SHIFT // 2  # ids of the added events: past the source's own
    coll = {
        "Collective name": "allreduce",
        "In msg nelems": 1 << 20,
        "Out msg nelems": 1 << 20,
        "Group size": n,
        "dtype": "Float",
        "In split size": "[]",
        "Out split size": "[]",
        "Process Group Name": "0",
        "Process Group Description": "default_pg",
        "Process Group Ranks": ranks_text,
    }
    for i, p in enumerate(plan):
        ext, corr = base + 2 * i, base + 2 * i + 1
        t_cpu = p["cpu_end"] - 20.0 + dt
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "record_param_comms",
                "pid": p["pid"],
                "tid": p["tid"],
                "ts": t_cpu,
                "dur": 8.0,
                "args": {
                    "External id": ext,
                    "Record function id": 0,
                    **coll,
                    "Seq": i,
                    "Global rank start": 0,
                    "Global rank stride": 1,
                },
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": p["pid"],
                "tid": p["tid"],
                "ts": t_cpu + 1.0,
                "dur": 5.0,
                "args": {"External id": ext, "cbid": 211, "correlation": corr},
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                "pid": 0,
                "tid": COMM_STREAM,
                "ts": arrivals[i] + dt,
                "dur": ends[i] - arrivals[i],
                "args": {
                    "External id": ext,
                    "queued": 0,
                    "device": 0,
                    "context": 1,
                    "stream": COMM_STREAM,
                    "correlation": corr,
                    **coll,
                },
            }
        )
    out = {k: v for k, v in doc.items() if k not in ("traceEvents", "deviceProperties")}
    out["deviceProperties"] = doc.get("deviceProperties", [])
    out["distributedInfo"] = {
        "backend": "nccl",
        "rank": r,
        "world_size": n,
        "pg_count": 1,
        "pg_config": [
            {
                "pg_name": "0",
                "pg_desc": "default_pg",
                "backend_config": "cuda:nccl",
                "pg_size": n,
                "ranks": list(range(n)),
            }
        ],
        "nccl_version": "2.21.5",
    }
    out.pop("tracedx", None)  # a capture stamp of one process, not of a job
    out["traceEvents"] = events
    return out


# --------------------------------------------------------------------------------------------
# One measured run (a fresh process)
# --------------------------------------------------------------------------------------------


def run_one(folder: Path, mode: str, workers: int) -> dict:
    """Load and diagnose the job in ``folder``; times and peaks of this process (the driver)
    and of its largest reaped descendant (a worker)."""
    import tracedx
    from tracedx.job import executor as ex

    paths = sorted(str(p) for p in folder.glob("rank-*.json.gz"))
    t0 = time.perf_counter()
    cluster = client = None
    kwargs: dict = {"progress": False}
    if mode == "dask-local":
        from distributed import Client

        cluster = ex.local_cluster(workers)
        client = Client(cluster)
        kwargs["client"] = client
    else:
        kwargs["workers"] = workers
    t_start = time.perf_counter()
    load_job = getattr(tracedx, "load_job", None)
    if load_job is None:  # the map alone (before tracedx.load_job existed)
        results = ex.map_ranks(paths, **kwargs)
        t_map = time.perf_counter()
        notes = [r.note for r in results if r.note]
        summary_bytes = sum(len(r.data or b"") for r in results)
        t_reduce = time.perf_counter()
        answer = {"ranks": len(results), "notes": notes}
    else:
        job = load_job(paths, **kwargs)
        t_map = time.perf_counter()
        text = tracedx.diagnose(job).to_json()
        t_reduce = time.perf_counter()
        summary_bytes = None
        doc = json.loads(text)
        answer = {
            "json_sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
            "straggler": (doc.get("straggler") or {}).get("rank"),
            "notes": len(doc.get("notes") or []),
        }
    if client is not None:
        client.close()
        cluster.close()
    t_end = time.perf_counter()
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {
        "ok": True,
        "ranks": len(paths),
        "mode": mode,
        "workers": workers,
        "startup_s": t_start - t0,
        "map_s": t_map - t_start,
        "reduce_s": t_reduce - t_map,
        "total_s": t_end - t0,
        "driver_peak_bytes": me,
        "worker_peak_bytes": kids,
        "summary_bytes": summary_bytes,
        "answer": answer,
    }


# --------------------------------------------------------------------------------------------
# The reduce alone, on summaries made without traces
# --------------------------------------------------------------------------------------------

TEMPLATE = OUT / "scale-template.rank-summary"


def template_summary() -> bytes:
    """The summary bytes of rank 1 of the 8-rank job (made and summarised once, then reused)."""
    cached = OUT / f"scale-template-{GENERATOR_VERSION}.bin"
    if cached.exists():
        return cached.read_bytes()
    from tracedx.job.summary import summarize_path

    folder = make_job(8)
    data = summarize_path(str(folder / "rank-1.json.gz")).to_bytes()
    cached.write_bytes(data)
    return data


def synth_summaries(n: int, template: bytes, copies: int = 1):
    """Yield the summary bytes of each rank of an ``n``-rank job cloned from ``template`` (one
    rank's real summary): its meta with the rank, world size and default group of ``n`` ranks,
    its collectives re-timed as in ``make_job`` (each all-reduce ends at the same time on every
    rank, 490 us after the template's start; a rank arrives 0-40 us after that start, rank
    n // 3 300 us later) and all of each kernel free (no compute under it). ``copies``: each
    collective repeated that many times (its ``Seq`` shifted, 1 ns later each), for ranks with
    more collectives than the template's 20."""
    import copy

    import polars as pl

    from tracedx.job.summary import RankSummary

    t = RankSummary.from_bytes(template)
    if copies > 1:
        m = t.colls.height
        t.colls = pl.concat(
            t.colls.with_columns(
                seq=pl.col("seq") + j * m,
                start_us=pl.col("start_us") + j * 1e-3,
                end_us=pl.col("end_us") + j * 1e-3,
            )
            for j in range(copies)
        ).sort("start_us", maintain_order=True)
    rng = random.Random(n)
    ranks_text = "[" + ", ".join(map(str, range(n))) + "]"
    start0 = t.colls["start_us"]
    end = start0 + JITTER_US + STRAGGLER_DELAY_US + TRANSFER_US
    for r in range(n):
        meta = copy.deepcopy(t.meta)
        meta.update(rank=r, world_size=n, path=f"synthetic/rank-{r}.json.gz")
        if meta.get("pg_config"):
            meta["pg_config"][0].update(pg_size=n, ranks=list(range(n)))
        delay = STRAGGLER_DELAY_US if r == n // 3 else 0.0
        start = start0 + pl.Series([rng.uniform(0, JITTER_US) + delay for _ in range(len(start0))])
        dur = end - start
        colls = t.colls.with_columns(
            pg_ranks=pl.lit(ranks_text),
            group_size=pl.lit(n, dtype=pl.Int64),
            start_us=start,
            end_us=end,
            duration_us=dur,
            free_us=pl.concat_list(pl.struct(start_us=pl.lit(0.0), end_us=dur).alias("seg")),
            free_total_us=dur,
        )
        yield RankSummary(meta, t.steps, colls, t.kernels, t.opsig).to_bytes()


def blobs_file(n: int, copies: int = 1) -> Path:
    """``n`` synthetic summaries (``synth_summaries``), written once as length-prefixed bytes."""
    tail = f"x{copies}" if copies > 1 else ""
    path = OUT / f"scale-summaries-{GENERATOR_VERSION}-{n}{tail}.bin"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            for blob in synth_summaries(n, template_summary(), copies):
                f.write(len(blob).to_bytes(8, "little") + blob)
        tmp.replace(path)
    return path


def _read_blobs(path: Path):
    with open(path, "rb") as f:
        while head := f.read(8):
            yield f.read(int.from_bytes(head, "little"))


def run_reduce(n: int, profile: str | None = None, copies: int = 1) -> dict:
    """The driver's side alone for ``n`` synthetic ranks: each summary's bytes read from
    ``blobs_file`` and decoded one after another, as they arrive from workers
    (``executor._decode_summary``), then ``assemble_job``, ``diagnose_job`` and the JSON;
    times, this process's resident set after each stage and its peak."""
    import inspect

    import tracedx
    import tracedx.job.summary  # noqa: F401  (imported before the clock starts)
    from tracedx.job import executor as ex
    from tracedx.job.load import assemble_job

    path = blobs_file(n, copies)
    rss0 = _rss_bytes()
    decode_s = 0.0
    results = []
    # as map_ranks decodes them: with one dict the job's summaries share (where it exists)
    kw = {"shared": {}} if "shared" in inspect.signature(ex._decode_summary).parameters else {}
    for r, blob in enumerate(_read_blobs(path)):
        t = time.perf_counter()
        results.append((f"synthetic/rank-{r}.json.gz", ex._decode_summary(blob, **kw), None))
        decode_s += time.perf_counter() - t
    rss_held = _rss_bytes()
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    job = assemble_job(results)
    del results
    t1 = time.perf_counter()
    rss_job = _rss_bytes()
    jd = tracedx.diagnose(job)
    t2 = time.perf_counter()
    rss_diag = _rss_bytes()
    text = jd.to_json()
    t3 = time.perf_counter()
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile)
    doc = json.loads(text)
    return {
        "ranks": n,
        "collectives_per_rank": 20 * copies,
        "decode_s": decode_s,
        "assemble_s": t1 - t0,
        "diagnose_s": t2 - t1,
        "json_s": t3 - t2,
        "reduce_s": decode_s + t3 - t0,
        "rss_start_bytes": rss0,
        "rss_summaries_held_bytes": rss_held,
        "rss_job_bytes": rss_job,
        "rss_diagnosed_bytes": rss_diag,
        "json_bytes": len(text),
        "driver_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "json_sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
        "straggler": (doc.get("straggler") or {}).get("rank"),
    }


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reduce_table(sizes: list[int], timeout: float, copies: int = 1) -> list[dict]:
    """``run_reduce`` at each size, each in a fresh process; the log-log slopes of the time."""
    sys.path.insert(0, str(HERE))
    from bench import _run_wait4

    out = []
    for n in sizes:
        blobs_file(n, copies)  # made once, outside the timed processes
        cmd = [sys.executable, str(Path(__file__).resolve()), "_reduce", str(n), "-", str(copies)]
        r = _run_wait4(cmd, timeout)
        m = re.search(rb"REDUCE_RESULT (.*)", r["stdout"])
        res = json.loads(m.group(1)) if m else {"ranks": n, "error": r["stderr"][-300:].decode()}
        print(json.dumps(res), flush=True)
        out.append(res)
    ok = [x for x in out if "reduce_s" in x]
    if len(ok) >= 2:
        xs = [math.log(x["ranks"]) for x in ok]
        ys = [math.log(x["reduce_s"]) for x in ok]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        k = sum((a - mx) * (b - my) for a, b in zip(xs, ys, strict=True)) / sum(
            (a - mx) ** 2 for a in xs
        )
        print(f"reduce time ~ N^{k:.2f} (least squares over {[x['ranks'] for x in ok]})")
    return out


# --------------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------------

CONFIGS = [("local", 1), ("local", 2), ("dask-local", 2)]


def _measure(folder: Path, mode: str, workers: int, timeout: float, pin: bool = False) -> dict:
    """One configuration in a fresh process; with ``pin``, under ``taskset -c 0,..,workers-1``
    (the driver shares those cores with its workers)."""
    sys.path.insert(0, str(HERE))
    from bench import _run_wait4

    cmd = [sys.executable, str(Path(__file__).resolve()), "_one", str(folder), mode, str(workers)]
    if pin:
        cmd = ["taskset", "-c", ",".join(str(c) for c in range(workers)), *cmd]
    r = _run_wait4(cmd, timeout)
    m = re.search(rb"SCALE_RESULT (.*)", r["stdout"])
    if r["rc"] != 0 or not m:
        err = r["stderr"].decode(errors="replace").strip().splitlines()
        return {
            "ok": False,
            "mode": mode,
            "workers": workers,
            "wall_s": r["wall_s"],
            "error": (err[-1] if err else f"exit {r['rc']}")[:300],
            "timed_out": r["timed_out"],
        }
    out = json.loads(m.group(1))
    out["wall_s"] = r["wall_s"]
    out["tree_peak_bytes"] = r["peak_bytes"]
    return out


def _hta(folder: Path, timeout: float) -> dict:
    sys.path.insert(0, str(HERE))
    from bench import _run_wait4, ensure_hta

    py, version = ensure_hta()
    if py is None:
        return {"ok": False, "error": f"HTA not installed: {version}"}
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    r = _run_wait4([str(py), str(HERE / "hta_run.py"), str(folder)], timeout)
    m = re.search(rb"HTA_RESULT (.*)", r["stdout"])
    out = json.loads(m.group(1)) if m else {"ok": False, "error": f"exit {r['rc']}"}
    out.update(
        version=version,
        wall_s=r["wall_s"],
        tree_peak_bytes=r["peak_bytes"],
        timed_out=r["timed_out"],
    )
    return out


def _gib(b) -> str:
    return "-" if b is None else f"{b / 2**30:.2f}"


def render(results: list[dict]) -> str:
    rows = [
        "| ranks | JSON total | engine | wall s | map s | reduce s | driver peak GiB "
        "| largest worker GiB | process tree GiB |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for job in results:
        for run in job["runs"]:
            name = run.get("engine") or f"{run['mode']} x{run['workers']}"
            if not run.get("ok"):
                rows.append(
                    f"| {job['ranks']} | {job['json_bytes'] / MB:.0f} MB | {name} | "
                    f"failed: {run.get('error', '?')} | | | | | |"
                )
                continue
            rows.append(
                f"| {job['ranks']} | {job['json_bytes'] / MB:.0f} MB | {name} | "
                f"{run['wall_s']:.1f} | {run.get('map_s', 0):.1f} | {run.get('reduce_s', 0):.2f} | "
                f"{_gib(run.get('driver_peak_bytes'))} | {_gib(run.get('worker_peak_bytes'))} | "
                f"{_gib(run.get('tree_peak_bytes'))} |"
            )
    return "\n".join(rows)


def growth(results: list[dict]) -> dict:
    """Per configuration: the slope of log(time) on log(N) between successive sizes, the map's
    cost per rank and per JSON byte, and the reduce's time per rank (largest N)."""
    out = {}
    for mode, workers in CONFIGS:
        pts = []
        for job in results:
            run = next(
                (
                    r
                    for r in job["runs"]
                    if r.get("mode") == mode and r.get("workers") == workers and r.get("ok")
                ),
                None,
            )
            if run:
                pts.append((job["ranks"], job["json_bytes"], run["map_s"], run["reduce_s"]))
        if len(pts) < 2:
            continue
        slopes = [
            round(math.log(b[2] / a[2]) / math.log(b[0] / a[0]), 2)
            for a, b in zip(pts, pts[1:], strict=False)
            if a[2] > 0 and b[2] > 0
        ]
        n, nbytes, map_s, reduce_s = pts[-1]
        out[f"{mode} x{workers}"] = {
            "map_loglog_slopes": slopes,
            "map_s_per_rank": map_s / n,
            "map_s_per_json_mb_per_worker": map_s * workers / (nbytes / MB),
            "reduce_s_per_rank": reduce_s / n,
        }
    return out


def projection(results: list[dict], g: dict) -> str:
    """4,096 ranks of 1 GB on 64 nodes, on paper, from the measured costs.

    Per byte: README's single-trace benchmark on this machine (a 1 GB trace in 11.45 s with two
    cores: tracedx's reader uses a second process). Per rank: this benchmark's 1-worker map
    time per rank at the largest N (its traces are small, so this is the fixed cost of a rank:
    process work, diagnosis, summary). Nodes assumed: 32 cores and 256 GB each, so 16 workers
    of 2 cores (memory allows 0.8 x 256 / 1.5 = 136). Reduce: the largest measured reduce
    grown by the exponent measured between the two largest N, and by N log N for comparison.
    """
    one = g.get("local x1")
    runs = [
        (job["ranks"], r)
        for job in results
        for r in job["runs"]
        if r.get("mode") == "local" and r.get("workers") == 1 and r.get("ok")
    ]
    if not one or len(runs) < 2:
        return "no projection: the 1-worker local runs did not finish at two sizes"
    per_gb_s, ranks, nodes, workers_per_node = 11.45, 4096, 64, 16
    per_rank_s = one["map_s_per_rank"]
    rounds = math.ceil(ranks / (nodes * workers_per_node))
    map_s = rounds * (per_gb_s + per_rank_s)
    (n1, r1), (n2, r2) = runs[-2], runs[-1]
    k = math.log(r2["reduce_s"] / r1["reduce_s"]) / math.log(n2 / n1)
    reduce_k = r2["reduce_s"] * (ranks / n2) ** k
    reduce_nlogn = r2["reduce_s"] * ranks * math.log(ranks) / (n2 * math.log(n2))
    mem_per_rank = (r2["driver_peak_bytes"] - r1["driver_peak_bytes"]) / (n2 - n1)
    mem = r2["driver_peak_bytes"] + (ranks - n2) * mem_per_rank
    return (
        f"4,096 ranks x 1 GB on 64 nodes of 16 workers (2 cores each): map = {rounds} rounds x "
        f"({per_gb_s:.0f} s per GB + {per_rank_s:.2f} s per rank) = {map_s:.0f} s if storage "
        f"delivers {ranks / map_s:.0f} GB/s (at 10 GB/s it is storage-bound: "
        f"{ranks / 10 / 60:.0f} min); reduce = {reduce_k:.0f} s at the measured growth "
        f"(N^{k:.2f} from {n1} to {n2} ranks) or {reduce_nlogn:.0f} s if it grew as N log N; "
        f"driver memory {mem / 2**30:.1f} GiB at {mem_per_rank / 2**20:.2f} MiB per rank "
        "(these ranks hold 20 collectives each; real ranks with 10^3-10^4 hold more)"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_reduce"]:
        # _reduce N [PROFILE_OUT or -] [COPIES]
        profile = argv[2] if len(argv) > 2 and argv[2] != "-" else None
        out = run_reduce(int(argv[1]), profile, int(argv[3]) if len(argv) > 3 else 1)
        print("REDUCE_RESULT " + json.dumps(out), flush=True)
        return 0
    if argv[:1] == ["_one"]:
        out = run_one(Path(argv[1]), argv[2], int(argv[3]))
        print("SCALE_RESULT " + json.dumps(out), flush=True)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 256, 1024])
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--hta-max", type=int, default=64)
    ap.add_argument("--make-only", action="store_true")
    ap.add_argument(
        "--pin",
        action="store_true",
        help="run each configuration under taskset on as many cores as it has workers",
    )
    ap.add_argument(
        "--reduce-only",
        action="store_true",
        help="time the driver's side alone on synthetic summaries of --sizes ranks",
    )
    ap.add_argument(
        "--copies",
        type=int,
        default=1,
        help="--reduce-only: each rank's 20 collectives repeated this many times",
    )
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args(argv)
    if args.reduce_only:
        sys.path.insert(0, str(ROOT))
        reduce_table(args.sizes, args.timeout, args.copies)
        return 0
    results = []
    for n in args.sizes:
        t = time.perf_counter()
        folder = make_job(n)
        files = sorted(folder.glob("rank-*.json.gz"))
        sys.path.insert(0, str(ROOT))
        from tracedx.job.executor import json_size

        job = {
            "ranks": n,
            "folder": str(folder),
            "json_bytes": sum(json_size(str(f)) for f in files),
            "gz_bytes": sum(f.stat().st_size for f in files),
            "runs": [],
        }
        print(
            f"N={n}: {job['json_bytes'] / MB:.0f} MB JSON ({job['gz_bytes'] / MB:.0f} MB gz) "
            f"ready in {time.perf_counter() - t:.1f} s",
            flush=True,
        )
        if args.make_only:
            continue
        for mode, workers in CONFIGS:
            if mode == "dask-local" and importlib.util.find_spec("distributed") is None:
                job["runs"].append({"ok": False, "mode": mode, "workers": workers,
                                    "error": "Dask is not installed"})  # fmt: skip
                continue
            run = _measure(folder, mode, workers, args.timeout, pin=args.pin)
            job["runs"].append(run)
            print(
                f"  {mode} x{workers}: "
                + json.dumps({k: v for k, v in run.items() if k != "answer"}),
                flush=True,
            )
        if not args.no_hta and n <= args.hta_max:
            run = _hta(folder, args.timeout)
            run["engine"] = f"HTA {run.get('version', '')}".strip()
            if run.get("ok"):
                run["map_s"], run["reduce_s"] = (
                    run.get("load_s", 0),
                    run["total_s"] - run.get("load_s", 0) - run.get("import_s", 0),
                )
                run["driver_peak_bytes"] = None
                run["worker_peak_bytes"] = None
            job["runs"].append(run)
            print(f"  HTA: {json.dumps(run)}", flush=True)
        results.append(job)
    if args.make_only:
        return 0
    g = growth(results)
    doc = {
        "machine": f"{platform.node()} {os.cpu_count()} CPUs, {_mem_gib():.0f} GiB, "
        f"load {os.getloadavg()[0]:.1f} at the end",
        "python": platform.python_version(),
        "results": results,
        "growth": g,
        "projection": projection(results, g),
    }
    (OUT / "scale.json").write_text(json.dumps(doc, indent=1))
    md = render(results)
    md += "\n\n" + json.dumps(g, indent=1) + "\n\n" + doc["projection"] + "\n"
    (OUT / "scale.md").write_text(md)
    print(md)
    return 0


def _mem_gib() -> float:
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) / 2**20


if __name__ == "__main__":
    sys.exit(main())
