"""Build small Kineto-shaped chrome traces in Python, for tests.

Every event is written the way ``torch.profiler`` writes it (``ph``/``cat``/``name``/``pid``/
``tid``/``ts``/``dur``/``args``), so a test can state a timeline in a few lines and compute the
expected numbers by hand. Times are microseconds; ``T0`` is the usual trace origin.

Options reproduce the variants seen across PyTorch versions and platforms:

- ``legacy=True``: 2021-era categories (``Operator``, ``Runtime``, ``Kernel``, ``Memcpy``,
  ``Memset``), lower-case ``external id``, ``ProfilerStep#N`` as an ``Operator``, GPU ``tid`` as
  ``"stream 7"``, host ``tid`` as a string, flows ``async``/``launch``.
- ``hip=True``: ROCm runtime names (``hipLaunchKernel``, ``hipMemcpyAsync``, ...).
- ``flows=False``: no ``ac2g`` flow events (linking must use ``correlation``).
- ``ts_as_string=True``: ``ts`` and ``dur`` written as numeric strings.
- :meth:`TraceBuilder.legacy_autograd` builds the pre-Kineto ``cuda_time``-era array format.

Example::

    b = TraceBuilder()
    b.step(1, T0, 100)
    ext = b.op("aten::mm", T0 + 5, 20)
    corr = b.launch(T0 + 10, 5, ext=ext)
    b.kernel(T0 + 20, 40, corr, name="gemm")
    path = b.write(tmp_path / "t.json")
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

T0 = 5_000_000.0

_MODERN = {
    "cpu_op": "cpu_op",
    "runtime": "cuda_runtime",
    "driver": "cuda_driver",
    "kernel": "kernel",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "flow": "ac2g",
}
_LEGACY = {
    "cpu_op": "Operator",
    "runtime": "Runtime",
    "driver": "Runtime",
    "kernel": "Kernel",
    "memcpy": "Memcpy",
    "memset": "Memset",
    "flow": "async",
}
_HIP_NAMES = {
    "cudaLaunchKernel": "hipLaunchKernel",
    "cudaMemcpyAsync": "hipMemcpyAsync",
    "cudaMemsetAsync": "hipMemsetAsync",
    "cudaStreamSynchronize": "hipStreamSynchronize",
    "cudaDeviceSynchronize": "hipDeviceSynchronize",
    "cudaGraphLaunch": "hipGraphLaunch",
    "cuLaunchKernelEx": "hipExtModuleLaunchKernel",
}


class TraceBuilder:
    """Accumulates events; ``write`` dumps them as a chrome trace (plain or gzip)."""

    def __init__(
        self,
        *,
        pid: int = 4242,
        tid: int = 4242,
        legacy: bool = False,
        hip: bool = False,
        flows: bool = True,
        ts_as_string: bool = False,
        device_name: str | None = "NVIDIA H100 80GB HBM3",
        devices: int = 1,
    ) -> None:
        self.pid, self.tid = pid, tid
        self.legacy, self.hip, self.flows, self.ts_as_string = legacy, hip, flows, ts_as_string
        self.cats = _LEGACY if legacy else _MODERN
        self.events: list[dict[str, Any]] = []
        self.top: dict[str, Any] = {"schemaVersion": 1}
        if device_name:
            self.top["deviceProperties"] = [
                {"id": i, "name": device_name, "computeMajor": 9, "computeMinor": 0, "numSms": 132}
                for i in range(devices)
            ]
        self._corr = 100
        self._ext = 1
        self.meta(pid, tid)

    # --- low level -----------------------------------------------------------------------
    def _num(self, v: float) -> Any:
        return str(v) if self.ts_as_string else v

    def _ext_key(self) -> str:
        return "external id" if self.legacy else "External id"

    def _host_tid(self, tid: int | None) -> Any:
        t = self.tid if tid is None else tid
        return str(t) if self.legacy else t

    def add(self, ev: dict[str, Any]) -> dict[str, Any]:
        """Append a raw event dict (for shapes the helpers do not cover)."""
        self.events.append(ev)
        return ev

    def x(self, cat: str, name: str, ts: float, dur: float, pid: Any, tid: Any, **args) -> dict:
        ev = {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": pid,
            "tid": tid,
            "ts": self._num(ts),
            "dur": self._num(dur),
            "args": args,
        }
        return self.add(ev)

    def meta(self, pid: Any, tid: Any, thread_name: str | None = None) -> None:
        self.add(
            {
                "name": "process_name",
                "ph": "M",
                "ts": T0,
                "pid": pid,
                "tid": 0,
                "args": {"name": "python"},
            }
        )
        self.add(
            {
                "name": "thread_name",
                "ph": "M",
                "ts": T0,
                "pid": pid,
                "tid": tid,
                "args": {"name": thread_name or f"thread {tid}"},
            }
        )

    def next_ext(self) -> int:
        self._ext += 1
        return self._ext

    def next_corr(self) -> int:
        self._corr += 1
        return self._corr

    # --- host side ------------------------------------------------------------------------
    def step(self, n: int, ts: float, dur: float, tid: int | None = None) -> dict:
        """A ``ProfilerStep#n`` host annotation (an ``Operator`` in legacy traces)."""
        cat = "Operator" if self.legacy else "user_annotation"
        return self.x(
            cat, f"ProfilerStep#{n}", ts, dur, self.pid, self._host_tid(tid),
            **{"External id": self.next_ext()},
        )  # fmt: skip

    def annotation(self, name: str, ts: float, dur: float, tid: int | None = None) -> dict:
        """A ``record_function`` label (``user_annotation``)."""
        return self.x("user_annotation", name, ts, dur, self.pid, self._host_tid(tid))

    def gpu_annotation(
        self, name: str, ts: float, dur: float, device: int = 0, stream: int = 7
    ) -> dict:
        """The GPU copy of a user annotation (never busy time, never step membership)."""
        return self.x(
            "gpu_user_annotation", name, ts, dur, device, stream, device=device, stream=stream
        )

    def op(
        self,
        name: str,
        ts: float,
        dur: float,
        *,
        tid: int | None = None,
        input_dims: list | None = None,
        input_type: list | None = None,
        ext: int | None = None,
        **args,
    ) -> int:
        """A ``cpu_op``; returns its External id (pass it to :meth:`launch`)."""
        ext = self.next_ext() if ext is None else ext
        a = {"External id": ext, **args}  # cpu ops keep the capitalised key in every era
        if input_dims is not None:
            a["Input Dims"] = input_dims
        if input_type is not None:
            a["Input type"] = input_type
        self.x(self.cats["cpu_op"], name, ts, dur, self.pid, self._host_tid(tid), **a)
        return ext

    def launch(
        self,
        ts: float,
        dur: float,
        name: str = "cudaLaunchKernel",
        *,
        ext: int | None = None,
        tid: int | None = None,
        corr: int | None = None,
        driver: bool = False,
        **args,
    ) -> int:
        """A runtime (or driver) call with a correlation id; returns the correlation id."""
        corr = self.next_corr() if corr is None else corr
        if self.hip:
            name = _HIP_NAMES.get(name, name)
        a: dict[str, Any] = {"correlation": corr, **args}
        if ext is not None:
            a[self._ext_key()] = ext
        # ROCm traces write every hip* call as cuda_runtime
        cat = self.cats["driver" if driver and not self.hip else "runtime"]
        self.x(cat, name, ts, dur, self.pid, self._host_tid(tid), **a)
        if self.flows:
            self.add(
                {"ph": "s", "id": corr, "pid": self.pid, "tid": self._host_tid(tid), "ts": ts,
                 "cat": self.cats["flow"], "name": "launch" if self.legacy else "ac2g"}
            )  # fmt: skip
        return corr

    def driver_launch(self, ts: float, dur: float, *, tid: int | None = None) -> int:
        """``cuLaunchKernelEx`` (cat ``cuda_driver``) with no External id, as Triton launches."""
        return self.launch(ts, dur, "cuLaunchKernelEx", tid=tid, driver=True)

    def sync(self, ts: float, dur: float, name: str = "cudaStreamSynchronize", **kw) -> int:
        return self.launch(ts, dur, name, **kw)

    # --- device side ----------------------------------------------------------------------
    def _gpu(
        self,
        kind: str,
        name: str,
        ts: float,
        dur: float,
        corr: int | None,
        device: int,
        stream: int,
        ext: int | None,
        args: dict,
    ) -> dict:
        a: dict[str, Any] = {"device": device, "context": 1, "stream": stream}
        if corr is not None:
            a["correlation"] = corr
        if ext is not None:
            a[self._ext_key()] = ext
        a.update(args)
        tid = f"stream {stream}" if self.legacy else stream
        ev = self.x(self.cats[kind], name, ts, dur, device, tid, **a)
        if self.flows and corr is not None:
            self.add(
                {"ph": "f", "id": corr, "pid": device, "tid": tid, "ts": ts, "bp": "e",
                 "cat": self.cats["flow"], "name": "launch" if self.legacy else "ac2g"}
            )  # fmt: skip
        return ev

    def kernel(
        self,
        ts: float,
        dur: float,
        corr: int | None,
        name: str = "ampere_sgemm_128x64_nn",
        *,
        device: int = 0,
        stream: int = 7,
        ext: int | None = None,
        grid: list[int] | None = None,
        block: list[int] | None = None,
        **args,
    ) -> dict:
        a = {"grid": grid or [1024, 1, 1], "block": block or [256, 1, 1], **args}
        return self._gpu("kernel", name, ts, dur, corr, device, stream, ext, a)

    def memcpy(
        self,
        ts: float,
        dur: float,
        corr: int | None,
        nbytes: int,
        direction: str = "HtoD",
        src: str = "Pageable",
        dst: str = "Device",
        *,
        device: int = 0,
        stream: int = 7,
        ext: int | None = None,
    ) -> dict:
        name = f"Memcpy {direction} ({src} -> {dst})"
        return self._gpu("memcpy", name, ts, dur, corr, device, stream, ext, {"bytes": nbytes})

    def memset(
        self,
        ts: float,
        dur: float,
        corr: int | None,
        nbytes: int,
        *,
        device: int = 0,
        stream: int = 7,
        ext: int | None = None,
    ) -> dict:
        return self._gpu(
            "memset", "Memset (Device)", ts, dur, corr, device, stream, ext, {"bytes": nbytes}
        )

    def cuda_sync(
        self, ts: float, dur: float, corr: int | None = None, *, device: int = 0, stream: int = 7
    ) -> dict:
        """An ``X cuda_sync`` event (enable_cuda_sync_events): waiting, never busy time."""
        a: dict[str, Any] = {"device": device, "stream": stream, "cuda_sync_kind": "Stream Sync"}
        if corr is not None:
            a["correlation"] = corr
        return self.x("cuda_sync", "Stream Sync", ts, dur, device, stream, **a)

    # --- composites -----------------------------------------------------------------------
    def launched_kernel(
        self,
        op_name: str,
        op_ts: float,
        op_dur: float,
        k_ts: float,
        k_dur: float,
        *,
        kname: str = "ampere_sgemm_128x64_nn",
        tid: int | None = None,
        device: int = 0,
        stream: int = 7,
        launch_offset: float = 1.0,
        launch_dur: float = 3.0,
    ) -> int:
        """cpu_op -> cudaLaunchKernel (at op start + ``launch_offset``) -> kernel. Returns corr."""
        ext = self.op(op_name, op_ts, op_dur, tid=tid)
        corr = self.launch(op_ts + launch_offset, launch_dur, ext=ext, tid=tid)
        self.kernel(k_ts, k_dur, corr, kname, device=device, stream=stream, ext=ext)
        return corr

    def graph_launch(
        self,
        ts: float,
        dur: float,
        kernels: list[tuple[float, float]],
        *,
        stream: int = 7,
        ext: int | None = None,
    ) -> int:
        """One ``cudaGraphLaunch`` correlated with every kernel of the graph (same corr id)."""
        corr = self.launch(ts, dur, "cudaGraphLaunch", ext=ext)
        for i, (kts, kdur) in enumerate(kernels):
            self.kernel(
                kts, kdur, corr, f"graph_kernel_{i}", stream=stream, **{"graph node id": 11 + i}
            )
        return corr

    def collective(
        self,
        op_ts: float,
        op_dur: float,
        k_ts: float | None,
        k_dur: float = 0.0,
        *,
        collective: str = "allreduce",
        dtype: str = "Float",
        in_nelems: int = 1024,
        out_nelems: int | None = None,
        group_size: int = 2,
        pg_name: str = "0",
        pg_desc: str = "default_pg",
        pg_ranks: str = "[0, 1]",
        rank: int | None = None,
        seq: int | None = None,
        comms_id: int | None = None,
        on_kernel: bool = True,
        kname: str = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        stream: int = 20,
        device: int = 0,
        tid: int | None = None,
        **extra,
    ) -> int:
        """A ProcessGroupNCCL collective: a ``record_param_comms`` cpu op with its args, a
        launch inside it and (when ``k_ts`` is given) the NCCL kernel, which carries the core
        args too when ``on_kernel`` (Kineto copies them). ``Rank``, ``Seq`` and ``Comms Id`` go
        on the op (and ``Seq``/``Comms Id`` on the kernel) only when given. Returns the op's
        External id."""
        args: dict[str, Any] = {
            "Collective name": collective,
            "dtype": dtype,
            "In msg nelems": in_nelems,
            "Out msg nelems": in_nelems if out_nelems is None else out_nelems,
            "Group size": group_size,
            "Process Group Name": pg_name,
            "Process Group Description": pg_desc,
            "Process Group Ranks": pg_ranks,
        }
        if seq is not None:
            args["Seq"] = seq
        if comms_id is not None:
            args["Comms Id"] = comms_id
        op_args = dict(args)
        if rank is not None:
            op_args["Rank"] = rank
        op_args.update(extra)
        ext = self.op("record_param_comms", op_ts, op_dur, tid=tid, **op_args)
        if k_ts is not None:
            corr = self.launch(op_ts + min(1.0, op_dur / 2), min(2.0, op_dur / 2), ext=ext, tid=tid)
            self.kernel(
                k_ts, k_dur, corr, kname, device=device, stream=stream, ext=ext,
                grid=[2, 1, 1], block=[640, 1, 1], **(args if on_kernel else {}),
            )  # fmt: skip
        return ext

    def gloo(
        self,
        name: str,
        ts: float,
        dur: float,
        *,
        tid: int = 7001,
        dims: list | None = None,
        dtype: str | None = None,
    ) -> dict:
        """A ``gloo:<op>`` annotation on a gloo worker thread, as torch 2.13 writes one per
        collective on CPU (no record_param_comms, no kernel)."""
        a: dict[str, Any] = {"External id": self.next_ext(), "Record function id": 0}
        if dims is not None:
            a["Input Dims"] = dims
            a["Input type"] = [dtype or "float"]
        return self.x("user_annotation", name, ts, dur, self.pid, tid, **a)

    # --- output ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {**self.top, "traceEvents": list(self.events)}

    def dumps(self) -> str:
        return json.dumps(self.to_dict())

    def write(self, path: str | Path, *, gz: bool | None = None) -> Path:
        """Write the trace; gzip when ``gz`` or when the name ends in ``.gz``."""
        p = Path(path)
        data = self.dumps().encode()
        if gz or (gz is None and p.name.endswith(".gz")):
            data = gzip.compress(data)
        p.write_bytes(data)
        return p

    # --- the pre-Kineto format ------------------------------------------------------------
    @staticmethod
    def legacy_autograd(
        cpu: list[tuple[str, float, float]], cuda: list[tuple[str, float, float]]
    ) -> list[dict[str, Any]]:
        """The ``torch.autograd.profiler`` (``cuda_time`` era) array: no ``cat``, lanes by pid."""
        out: list[dict[str, Any]] = []
        for name, ts, dur in cpu:
            out.append(
                {
                    "name": name,
                    "ph": "X",
                    "ts": ts,
                    "dur": dur,
                    "tid": 1,
                    "pid": "CPU functions",
                    "args": {},
                }
            )
        for name, ts, dur in cuda:
            out.append(
                {
                    "name": name,
                    "ph": "X",
                    "ts": ts,
                    "dur": dur,
                    "tid": 0,
                    "pid": "CUDA functions",
                    "args": {},
                }
            )
        return out


def write_json(path: str | Path, obj: Any) -> Path:
    p = Path(path)
    p.write_text(json.dumps(obj))
    return p


def steps_trace(path: str | Path, step_us: float = 100.0, n: int = 4) -> Path:
    """n steps of ``step_us`` of host window, one 10 us op launching one 40 us kernel each: GPU
    busy 40 us of each step (median step ``step_us``; with 100 us, idle 60%, so larger-batch is
    the one finding)."""
    b = TraceBuilder()
    t = T0
    for i in range(1, n + 1):
        b.step(i, t, step_us)
        ext = b.op("aten::add", t + 1, 10)
        corr = b.launch(t + 2, 5, ext=ext)
        b.kernel(t + 10, 40, corr, name="elementwise_kernel")
        t += step_us
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return b.write(path)
