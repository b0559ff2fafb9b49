"""Generate N-rank jobs as Kineto-shaped trace files, with the ground truth they were built from.

A deterministic simulator of a data- and tensor-parallel training step (a 2-D mesh: ``world =
dp * tp``, rank ``r`` is TP index ``r % tp`` of DP replica ``r // tp``), written one trace per
rank through :class:`tracebuilder.TraceBuilder`. Every number the analysis should find is in
the returned :class:`GeneratedJob`, computed by the simulator, never read back from the files.

The step, identical in structure on every rank (so every collective has one kernel per rank):

1. host: a ``host_work`` cpu op of ``host_us`` (plus ``extra`` on a host straggler) that
   launches nothing: the GPU idles meanwhile (idle cause ``host work``);
2. ``layers`` forward kernels (``fwd_us / layers`` each), each followed, when ``tp > 1``, by a
   TP all-reduce of ``tp_nelems`` bf16 on the rank's TP group (``mesh_tp``); then the same for
   backward (``bwd_us / layers`` each);
3. when ``dp > 1``, a DP all-reduce of ``dp_nelems`` bf16 on the DP group (``mesh_dp``) after
   backward (one bucket, not overlapped: exposed communication), and a host-side ``wait``
   (a ``record_param_comms`` with ``Collective name`` ``wait`` and no kernel, as PyTorch writes);
4. ``aten::item`` with a ``cudaStreamSynchronize`` until the rank's GPU is done (returning
   ``SYNC_RETURN_US`` later), then the optimizer kernel of ``opt_us``; the next step's host
   work starts right after its launch, while it runs: the GPU then idles in ``host work`` for
   ``host_us - 42`` us (host work, minus the optimizer kernel and launch latencies).

A collective on a group starts on each member when its kernel reaches the NCCL stream (its
*arrival*: the end of the member's previous GPU work, or its launch if later) and ends on every
member at ``max(arrival) + transfer_us`` (implicit synchronisation; MULTIRANK.md section 4.2):
a member's kernel lasts its wait (``max(arrival) - arrival``) plus the transfer; the last
arriver's kernel lasts the transfer alone. A compute straggler runs every compute kernel
``1 + pct/100`` times longer; a host straggler does ``host_us * pct/100`` more host work.

Kernels carry the args Kineto copies from ``record_param_comms`` (``Collective name``,
``dtype``, ``In/Out msg nelems``, ``Group size``, ``Process Group Name/Description/Ranks``,
and ``Seq``/``Comms Id`` when asked); the ``record_param_comms`` op (same ``External id``) has
them too, plus ``Rank``. ``distributedInfo`` has ``pg_config`` with the groups the rank is in.
Clock offsets: every event of a rank on host ``h`` is written ``theta_us[h]`` later than the
simulated time (host 0 has 0). Files are named ``rank{r}_trace.json`` (torchtitan),
``rank-{r}.json`` (HTA) or ``{host}_{pid}.{ns}.pt.trace.json`` (tensorboard_trace_handler: the
host name, no rank; the rank is in ``distributedInfo``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
from tracebuilder import T0, TraceBuilder

COMPUTE_STREAM = 7
DP_STREAM = 20
TP_STREAM = 21
LAUNCH_OP_US = 8.0  # host time of each launching op
LAUNCH_US = 4.0  # the cudaLaunchKernel inside it, starting 2 us into the op
SYNC_RETURN_US = 5.0  # cudaStreamSynchronize returns this long after the GPU is done
BASE_TIME_NS = 1_790_000_000_000_000_000
NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM_KERNEL = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
OPT_KERNEL = "void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>>"


@dataclass(frozen=True)
class JobSpec:
    """What to generate. Times in microseconds; ``pct`` in percent.

    ``world``, ``tp``: world size and TP group size (``dp = world // tp``); ``steps`` simulated
    steps numbered from ``first_step``; ``layers`` per pass; ``fwd_us``, ``bwd_us``,
    ``opt_us``: compute per step; ``host_us``: host work before the forward;
    ``dp_transfer_us``/``tp_transfer_us``: the transfer part of each collective;
    ``straggler``/``straggler_kind`` (``"compute"`` or ``"host"``)/``straggler_pct``;
    ``ranks_per_host`` and ``theta_us`` (per host index, host 0 first, µs added to its ranks'
    timestamps); ``windows``: ``{rank: (first, last)}`` steps written (others: all);
    ``missing``: ranks whose file is not written; ``seq``/``comms_id``: write those args;
    ``kernel_args``: copy the collective args onto kernels (else only ``record_param_comms``
    has them); ``shared_pg_name``: all TP groups share one Process Group Name (and all DP
    groups another), as ``split_group`` subgroups can; ``names``: ``"torchtitan"``, ``"hta"``
    or ``"tensorboard"``; ``distributed_info``: write ``distributedInfo``.
    """

    world: int = 4
    tp: int = 1
    steps: int = 4
    first_step: int = 10
    layers: int = 2
    fwd_us: float = 400.0
    bwd_us: float = 800.0
    opt_us: float = 50.0
    host_us: float = 100.0
    dp_transfer_us: float = 300.0
    tp_transfer_us: float = 40.0
    dp_nelems: int = 4_194_304
    tp_nelems: int = 524_288
    straggler: int | None = None
    straggler_kind: str = "compute"
    straggler_pct: float = 0.0
    ranks_per_host: int = 8
    theta_us: tuple[float, ...] = ()
    windows: dict = field(default_factory=dict)
    missing: tuple[int, ...] = ()
    seq: bool = True
    comms_id: bool = True
    kernel_args: bool = True
    shared_pg_name: bool = False
    names: str = "torchtitan"
    distributed_info: bool = True

    @property
    def dp(self) -> int:
        return self.world // self.tp

    def without_straggler(self) -> JobSpec:
        """The same job with the straggler's excess removed (predict-then-verify)."""
        return dataclasses.replace(self, straggler=None, straggler_pct=0.0)


@dataclass
class GeneratedJob:
    """The files written and the ground truth they were built from.

    ``paths``: rank -> file (missing ranks absent); ``hosts``: rank -> host name;
    ``theta_us``: host name -> clock offset written (µs, host of rank 0 is 0);
    ``straggler``, ``cause`` (``"compute"``/``"host"``/None); ``steps``: rank -> step numbers
    written; ``rank_steps``: one row per (rank, step) simulated: ``compute_us`` (compute kernel
    time), ``comm_us`` (communication kernel time), ``wait_us``/``transfer_us`` (its parts),
    ``host_us`` (host work), ``cpu_step_us`` (the ProfilerStep range), ``gpu_end_us``;
    ``collectives``: one row per (rank, collective): ``step``, ``group`` (``"dp"``/``"tp"``),
    ``pg_name``, ``pg_ranks``, ``seq``, ``comms_id``, ``arrival_us``, ``start_us``, ``end_us``
    (simulated clock, no offset), ``wait_us``, ``transfer_us``, ``last_arriver`` (the group's
    rank that arrived last), ``msg_bytes``.
    """

    spec: JobSpec
    paths: dict[int, Path]
    hosts: dict[int, str]
    theta_us: dict[str, float]
    straggler: int | None
    cause: str | None
    steps: dict[int, list[int]]
    rank_steps: pl.DataFrame
    collectives: pl.DataFrame

    @property
    def files(self) -> list[str]:
        return [str(self.paths[r]) for r in sorted(self.paths)]


def _ranks_str(ranks: list[int]) -> str:
    """``Process Group Ranks`` as PyTorch writes it: truncated to 30 entries with ``, ...``."""
    shown = ", ".join(str(r) for r in ranks[:30])
    return f"[{shown}, ...]" if len(ranks) > 30 else f"[{shown}]"


def comms_id(pg_name: str, ranks: list[int], seq: int) -> int:
    """A deterministic unsigned 64-bit id, equal on every member of one operation."""
    h = hashlib.blake2b(f"{pg_name}|{ranks}|{seq}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little")


def _groups(spec: JobSpec) -> dict[str, list[list[int]]]:
    dp, tp = spec.dp, spec.tp
    return {
        "tp": [[d * tp + t for t in range(tp)] for d in range(dp)],
        "dp": [[d * tp + t for d in range(dp)] for t in range(tp)],
    }


def _pg_names(spec: JobSpec) -> dict[tuple[str, int], str]:
    """(group kind, index) -> Process Group Name; "0" is the default group."""
    groups = _groups(spec)
    names: dict[tuple[str, int], str] = {}
    nxt = 1
    for kind in ("tp", "dp"):
        for i in range(len(groups[kind])):
            if spec.shared_pg_name:
                names[(kind, i)] = str(1 if kind == "tp" else 2)
            else:
                names[(kind, i)] = str(nxt)
                nxt += 1
    return names


def generate(spec: JobSpec, out_dir: str | Path) -> GeneratedJob:
    """Simulate ``spec`` and write one trace per rank into ``out_dir``; return the truth."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    world, tp, dp = spec.world, spec.tp, spec.dp
    if world % tp:
        raise ValueError("world must be a multiple of tp")
    groups = _groups(spec)
    pg_name = _pg_names(spec)
    group_of = {(kind, r): i for kind, gs in groups.items() for i, g in enumerate(gs) for r in g}
    slow = 1 + spec.straggler_pct / 100

    def compute_scale(r: int) -> float:
        return slow if spec.straggler == r and spec.straggler_kind == "compute" else 1.0

    def host_extra(r: int) -> float:
        if spec.straggler == r and spec.straggler_kind == "host":
            return spec.host_us * spec.straggler_pct / 100
        return 0.0

    # The segments of one step, the same on every rank.
    segs: list[tuple[str, float]] = []  # ("compute", us) | ("tp", 0) | ("dp", 0) | ("opt", us)
    for phase_us in (spec.fwd_us, spec.bwd_us):
        for _ in range(spec.layers):
            segs.append(("compute", phase_us / spec.layers))
            if tp > 1:
                segs.append(("tp", 0.0))
    if dp > 1:
        segs.append(("dp", 0.0))
    segs.append(("sync", 0.0))
    segs.append(("opt", spec.opt_us))

    host_start = {r: T0 for r in range(world)}
    gpu_t = {r: None for r in range(world)}  # end of the rank's last GPU work
    seq = {(kind, r): 0 for kind in ("tp", "dp") for r in range(world)}
    events: dict[int, list[tuple]] = {r: [] for r in range(world)}  # per rank, per step
    rank_rows: list[dict] = []
    coll_rows: list[dict] = []
    for k in range(spec.steps):
        step = spec.first_step + k
        s0 = dict(host_start)
        h = {r: spec.host_us + host_extra(r) for r in range(world)}
        launch_t = {r: s0[r] + h[r] for r in range(world)}  # host time of the next launch op
        acc = {r: {"compute": 0.0, "comm": 0.0, "wait": 0.0, "transfer": 0.0} for r in range(world)}
        step_ev = {r: [("host_work", s0[r], h[r])] for r in range(world)}
        for kind, us in segs:
            if kind == "sync":  # aten::item: the host waits for its GPU
                for r in range(world):
                    sync_ts = launch_t[r]
                    launch_t[r] = max(gpu_t[r], sync_ts) + SYNC_RETURN_US
                    step_ev[r].append(("sync", sync_ts, launch_t[r] - sync_ts))
                continue
            # every rank launches this segment's kernel from one op
            ready = {}
            for r in range(world):
                op_ts = launch_t[r]
                launch_end = op_ts + 2 + LAUNCH_US
                launch_t[r] = op_ts + LAUNCH_OP_US
                prev = gpu_t[r] if gpu_t[r] is not None else launch_end
                ready[r] = (op_ts, max(prev, launch_end))
            if kind in ("compute", "opt"):
                for r in range(world):
                    op_ts, start = ready[r]
                    dur = us * compute_scale(r)
                    step_ev[r].append((kind, op_ts, start, dur))
                    gpu_t[r] = start + dur
                    acc[r]["compute"] += dur
                continue
            transfer = spec.tp_transfer_us if kind == "tp" else spec.dp_transfer_us
            nelems = spec.tp_nelems if kind == "tp" else spec.dp_nelems
            for gi, members in enumerate(groups[kind]):
                arrivals = {r: ready[r][1] for r in members}
                last = max(members, key=lambda r: (arrivals[r], -r))
                end = arrivals[last] + transfer
                for r in members:
                    seq[(kind, r)] += 1
                    s = seq[(kind, r)]
                    name = pg_name[(kind, gi)]
                    cid = comms_id(name, members, s)
                    wait = arrivals[last] - arrivals[r]
                    step_ev[r].append(
                        (kind, ready[r][0], arrivals[r], end - arrivals[r], gi, s, cid, nelems)
                    )
                    gpu_t[r] = end
                    acc[r]["comm"] += end - arrivals[r]
                    acc[r]["wait"] += wait
                    acc[r]["transfer"] += transfer
                    coll_rows.append(
                        {
                            "rank": r,
                            "step": step,
                            "group": kind,
                            "pg_name": name,
                            "pg_ranks": _ranks_str(members),
                            "seq": s,
                            "comms_id": str(cid),
                            "arrival_us": arrivals[r],
                            "start_us": arrivals[r],
                            "end_us": end,
                            "wait_us": wait,
                            "transfer_us": transfer,
                            "last_arriver": last,
                            "msg_bytes": nelems * 2,
                        }
                    )
        for r in range(world):
            host_start[r] = launch_t[r]  # the next step's host work starts after the last launch
            events[r].append((step, s0[r], launch_t[r], step_ev[r]))
            rank_rows.append(
                {
                    "rank": r,
                    "step": step,
                    "compute_us": acc[r]["compute"],
                    "comm_us": acc[r]["comm"],
                    "wait_us": acc[r]["wait"],
                    "transfer_us": acc[r]["transfer"],
                    "host_us": h[r],
                    "cpu_step_us": launch_t[r] - s0[r],
                    "gpu_end_us": gpu_t[r],
                }
            )

    hosts = {r: f"node{r // spec.ranks_per_host}" for r in range(world)}
    theta = {
        f"node{i}": (spec.theta_us[i] if i < len(spec.theta_us) else 0.0)
        for i in range((world - 1) // spec.ranks_per_host + 1)
    }
    paths: dict[int, Path] = {}
    written_steps: dict[int, list[int]] = {}
    for r in range(world):
        if r in spec.missing:
            continue
        first, last = spec.windows.get(r, (spec.first_step, spec.first_step + spec.steps - 1))
        chosen = [e for e in events[r] if first <= e[0] <= last]
        written_steps[r] = [e[0] for e in chosen]
        b = _write_rank(spec, r, chosen, groups, pg_name, group_of, theta[hosts[r]])
        paths[r] = b.write(out / _file_name(spec, r, hosts[r]))
    return GeneratedJob(
        spec=spec,
        paths=paths,
        hosts=hosts,
        theta_us=theta,
        straggler=spec.straggler if spec.straggler_pct > 0 else None,
        cause=spec.straggler_kind
        if spec.straggler is not None and spec.straggler_pct > 0
        else None,
        steps=written_steps,
        rank_steps=pl.DataFrame(rank_rows),
        collectives=pl.DataFrame(coll_rows),
    )


def _file_name(spec: JobSpec, r: int, host: str) -> str:
    if spec.names == "hta":
        return f"rank-{r}.json"
    if spec.names == "tensorboard":
        return f"{host}_{1000 + r}.{1_790_000_000_000_000_000 + r}.pt.trace.json"
    return f"rank{r}_trace.json"


def _coll_args(spec, kind, gi, s, cid, nelems, groups, pg_name) -> dict:
    members = groups[kind][gi]
    a = {
        "Collective name": "allreduce",
        "dtype": "BFloat16",
        "In msg nelems": nelems,
        "Out msg nelems": nelems,
        "Group size": len(members),
        "In split size": "[]",
        "Out split size": "[]",
        "Process Group Name": pg_name[(kind, gi)],
        "Process Group Description": f"mesh_{kind}",
        "Process Group Ranks": _ranks_str(members),
    }
    if spec.seq:
        a["Seq"] = s
    if spec.comms_id:
        a["Comms Id"] = cid
    return a


def _write_rank(spec, r, chosen, groups, pg_name, group_of, theta) -> TraceBuilder:
    b = TraceBuilder(pid=1000 + r, tid=1000 + r, device_name="NVIDIA H200")
    b.top["baseTimeNanoseconds"] = BASE_TIME_NS
    if spec.distributed_info:
        pgs = [
            {
                "pg_name": "0",
                "pg_desc": "default_pg",
                "backend_config": "cuda:nccl",
                "pg_size": spec.world,
                "ranks": list(range(spec.world)),
            }
        ]
        for kind in ("tp", "dp"):
            members = groups[kind][group_of[(kind, r)]]
            if len(members) > 1:
                pgs.append(
                    {
                        "pg_name": pg_name[(kind, group_of[(kind, r)])],
                        "pg_desc": f"mesh_{kind}",
                        "backend_config": "cuda:nccl",
                        "pg_size": len(members),
                        "ranks": members,
                    }
                )
        b.top["distributedInfo"] = {
            "backend": "nccl",
            "rank": r,
            "world_size": spec.world,
            "pg_count": len(pgs),
            "pg_config": pgs,
            "nccl_version": "2.27.3",
        }
    o = theta
    for step, s0, s1, evs in chosen:
        b.step(step, s0 + o, s1 - s0)
        for ev in evs:
            kind = ev[0]
            if kind == "host_work":
                b.op("host_work", ev[1] + o, ev[2])
            elif kind in ("compute", "opt"):
                _, op_ts, start, dur = ev
                name = "aten::mm" if kind == "compute" else "aten::_foreach_add_"
                ext = b.op(name, op_ts + o, LAUNCH_OP_US)
                corr = b.launch(op_ts + 2 + o, LAUNCH_US, ext=ext)
                b.kernel(
                    start + o,
                    dur,
                    corr,
                    GEMM_KERNEL if kind == "compute" else OPT_KERNEL,
                    stream=COMPUTE_STREAM,
                    ext=ext,
                )
            elif kind in ("tp", "dp"):
                _, op_ts, start, dur, gi, s, cid, nelems = ev
                args = _coll_args(spec, kind, gi, s, cid, nelems, groups, pg_name)
                members = groups[kind][gi]
                b.op("c10d::allreduce_", op_ts + o, LAUNCH_OP_US)
                ext = b.op(
                    "record_param_comms",
                    op_ts + 1 + o,
                    LAUNCH_OP_US - 2,
                    **args,
                    Rank=members.index(r),
                )
                corr = b.launch(op_ts + 2 + o, LAUNCH_US, ext=ext)
                kargs = args if spec.kernel_args else {}
                b.kernel(
                    start + o,
                    dur,
                    corr,
                    NCCL_KERNEL,
                    stream=DP_STREAM if kind == "dp" else TP_STREAM,
                    ext=ext,
                    **kargs,
                )
                if kind == "dp":  # the host-side Work.wait(): a record_param_comms, no kernel
                    wait_args = {**args, "Collective name": "wait", "In msg nelems": 0,
                                 "Out msg nelems": 0}  # fmt: skip
                    b.op("record_param_comms", op_ts + LAUNCH_OP_US - 1 + o, 0.5, **wait_args)
            elif kind == "sync":
                _, ts, dur = ev
                b.op("aten::item", ts + o, dur)
                b.sync(ts + 1 + o, dur - 2)
    return b
