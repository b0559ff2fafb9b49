"""The typed shape of one chrome-trace event, as ``torch.profiler`` (Kineto) writes it.

Only the fields the analysis reads are declared; unknown keys and unknown ``args`` from
newer PyTorch versions are skipped by the decoder, so they never break a load.
Numeric fields accept numbers or numeric strings (``msgspec`` non-strict mode), ids
accept ints or strings (``tid: "stream 7"``), and both spellings of ``External id``.

Sources: the Chrome Trace Event Format (Google, "Trace Event Format" document), Kineto's
``output_json.cpp`` field names, and the traces ``torch.profiler`` writes (PyTorch 2.x).
"""

from typing import Any, ClassVar, Union

import msgspec

Num = float | None
Id = int | float | str | None  # a fractional id (stream 7.5) is read, then truncated


class Args(msgspec.Struct, omit_defaults=True, gc=False):
    """The ``args`` object of a complete (X) event (only the keys tracedx uses; the other
    phases' keys are in :data:`AnyArgs`).

    Fields are declared in the order Kineto writes them, which lets the decoder match keys
    without searching. ``gc=False``: decoded events never form reference cycles, so the
    garbage collector need not track millions of them.
    """

    external_id: Id = msgspec.field(default=None, name="External id")
    # GPU activity
    device: Id = None
    stream: Id = None
    correlation: Id = None
    registers_per_thread: Any = msgspec.field(default=None, name="registers per thread")
    shared_memory: Any = msgspec.field(default=None, name="shared memory")
    blocks_per_sm: Any = msgspec.field(default=None, name="blocks per SM")
    warps_per_sm: Any = msgspec.field(default=None, name="warps per SM")
    # Kept as raw JSON: a few distinct launch shapes repeat over millions of kernels, so the
    # reader decodes each distinct value once (tables._interned).
    grid: msgspec.Raw = msgspec.field(default=msgspec.Raw())
    block: msgspec.Raw = msgspec.field(default=msgspec.Raw())
    occupancy: Any = msgspec.field(default=None, name="est. achieved occupancy %")
    bytes: Any = None
    external_id_lc: Id = msgspec.field(default=None, name="external id")
    # host sync events (enable_cuda_sync_events)
    cuda_sync_kind: Any = None
    # cpu_op shapes (record_shapes=True), raw for the same reason as grid and block.
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Concrete Inputs")
    # python_function (with_stack=True)
    python_id: Any = msgspec.field(default=None, name="Python id")
    python_parent_id: Any = msgspec.field(default=None, name="Python parent id")


# The keys of the other phases' args: [memory] instant events (profile_memory=True), and
# metadata events ("M": process_name / thread_name / process_labels). Left out of the complete
# (X) events' :class:`Args`: every declared field is set and freed on every event, and these 7
# made the 10 MB benchmark trace's events 1 ms slower to decode and 3.4 ms slower to free (16.3
# and 8.6 ms against 15.3 and 5.2, best of 15, in one process).
_OTHER_FIELDS = [
    ("total_reserved", Any, msgspec.field(default=None, name="Total Reserved")),
    ("total_allocated", Any, msgspec.field(default=None, name="Total Allocated")),
    ("alloc_bytes", Any, msgspec.field(default=None, name="Bytes")),
    ("device_id", Any, msgspec.field(default=None, name="Device Id")),
    ("device_type", Any, msgspec.field(default=None, name="Device Type")),
    ("name", Any, None),
    ("labels", Any, None),
]


def _with_other_fields(name: str, base: type, doc: str) -> type:
    """``base`` (a Struct of args) plus :data:`_OTHER_FIELDS`, as the Struct ``name``."""
    cls = msgspec.defstruct(
        name, _OTHER_FIELDS, bases=(base,), module=__name__, omit_defaults=True, gc=False
    )
    cls.__doc__ = doc
    return cls


AnyArgs = _with_other_fields(
    "AnyArgs",
    Args,
    """:class:`Args` plus the keys of [memory] instant events and of metadata events: the args
of an event of any phase (the reference reader's :class:`Event`, the fast reader's M and i
events).""",
)


class CommArgs(Args):
    """:class:`Args` plus the collective metadata (``record_param_comms`` cpu ops and the NCCL
    kernels Kineto copies it onto; PyTorch's ``ParamCommsDebugInfo``, Kineto's
    ``appendCollectiveMetadata``).

    A separate type because every declared field costs time on every event: msgspec looks an
    unknown key up through all fields, and Kineto events carry several (``Ev Idx``,
    ``queued``, ...); with these 17 fields in :class:`Args`, decoding an 18 MB sample trace
    without collectives took 12-29 % longer (two runs, fastest of 7 each). The reader decodes
    a chunk with this type only when its bytes contain ``Collective name``
    (:data:`COMM_MARKER`)."""

    # in the order Kineto writes them on kernels
    collective_name: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    in_split_size: Any = msgspec.field(default=None, name="In split size")
    out_split_size: Any = msgspec.field(default=None, name="Out split size")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    rank: Any = msgspec.field(default=None, name="Rank")
    seq: Any = msgspec.field(default=None, name="Seq")
    comms_id: Any = msgspec.field(default=None, name="Comms Id")
    rank_start: Any = msgspec.field(default=None, name="Global rank start")
    rank_stride: Any = msgspec.field(default=None, name="Global rank stride")
    src_rank: Any = msgspec.field(default=None, name="Src Rank")
    dst_rank: Any = msgspec.field(default=None, name="Dst Rank")


CommAnyArgs = _with_other_fields(
    "CommAnyArgs", CommArgs, """:class:`CommArgs` plus the keys of :class:`AnyArgs`."""
)

COMM_MARKER = b"Collective name"


class _Fields(msgspec.Struct, omit_defaults=True, gc=False):
    """The fields of :class:`Event`, shared by every event class below."""

    cat: str | None = None
    name: str | None = None
    pid: Id = None
    tid: Id = None
    ts: Num = None
    dur: Num = None
    id: Any = None
    args: Args | None = None


class Event(_Fields):
    """One entry of ``traceEvents``. ``ts`` and ``dur`` are microseconds."""

    args: AnyArgs | None = None
    ph: str | None = None


class TraceFile(msgspec.Struct):
    """The top-level object of a Kineto trace. Unknown keys are ignored."""

    traceEvents: list[Event] | None = None
    schemaVersion: Any = None
    deviceProperties: Any = None
    distributedInfo: Any = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    cupti_version: Any = None
    displayTimeUnit: Any = None
    baseTimeNanoseconds: Any = None
    traceName: Any = None
    record_shapes: Any = None
    with_flops: Any = None
    with_stack: Any = None
    trace_id: Any = None
    host_name: Any = None  # the profiled host (seen in torch 2.13 traces)
    # written by `tracedx capture` (tracedx version, torch version, schedule, unprofiled timing)
    tracedx: Any = None


# A trace is a top-level object, or (legacy autograd profiler, Chrome format allows it) an array.
TraceDocument = TraceFile | list[Event]

# --- the fast reader's view of an event ----------------------------------------------------
# ``source`` decodes big traces chunk by chunk with a union tagged by ``ph``: complete events
# ("X"), metadata ("M") and instants ("i", for ``[memory]``) are decoded field by field like ``Event``; events of every other
# phase (flows, instants, counters, ...) are skipped without building their fields, which
# saves a third of the decoding time on a Kineto trace. A trace whose events lack ``ph`` or use
# a phase outside the Chrome format is read by the plain ``Event`` decoder instead.


class XEvent(_Fields, tag_field="ph", tag="X"):
    """A complete event (``ph: "X"``); the same fields and types as :class:`Event`."""

    ph: ClassVar[str] = "X"


class MEvent(_Fields, tag_field="ph", tag="M"):
    """A metadata event (``ph: "M"``); the same fields and types as :class:`Event`."""

    args: AnyArgs | None = None
    ph: ClassVar[str] = "M"


class IEvent(_Fields, tag_field="ph", tag="i"):
    """An instant event (``ph: "i"``): ``[memory]`` allocator events carry their sizes here."""

    args: AnyArgs | None = None
    ph: ClassVar[str] = "i"


# Every other phase of the Chrome Trace Event Format: a field-less struct each.
_OTHER_PHASES = "BEICbnestfPNODVvRc()"
_SKIPPED = tuple(
    msgspec.defstruct(
        f"Phase{ord(p)}",
        [],
        tag_field="ph",
        tag=p,
        gc=False,
        namespace={"ph": p, "cat": None, "__doc__": f"An event with ph {p!r}, not read."},
    )
    for p in _OTHER_PHASES
)
FastEvent = Union[(XEvent, MEvent, IEvent, *_SKIPPED)]  # noqa: UP007 (a tuple of types)


class FastPart(msgspec.Struct):
    """One chunk of a trace read by the fast reader: events, and whichever top-level keys the
    chunk holds (``UNSET`` for the others, so the chunks' keys can be merged exactly)."""

    traceEvents: list[FastEvent] | None = None
    schemaVersion: Any = msgspec.UNSET
    deviceProperties: Any = msgspec.UNSET
    distributedInfo: Any = msgspec.UNSET
    cuda_runtime_version: Any = msgspec.UNSET
    cuda_driver_version: Any = msgspec.UNSET
    cupti_version: Any = msgspec.UNSET
    displayTimeUnit: Any = msgspec.UNSET
    baseTimeNanoseconds: Any = msgspec.UNSET
    traceName: Any = msgspec.UNSET
    record_shapes: Any = msgspec.UNSET
    with_flops: Any = msgspec.UNSET
    with_stack: Any = msgspec.UNSET
    trace_id: Any = msgspec.UNSET
    host_name: Any = msgspec.UNSET
    tracedx: Any = msgspec.UNSET


# --- the same types with CommArgs (chunks that hold collective metadata) --------------------


class _CommFields(_Fields):
    args: CommArgs | None = None


class CommEvent(_CommFields):
    """:class:`Event` with :class:`CommAnyArgs`."""

    args: CommAnyArgs | None = None
    ph: str | None = None


class CommTraceFile(TraceFile):
    traceEvents: list[CommEvent] | None = None


class CommXEvent(_CommFields, tag_field="ph", tag="X"):
    ph: ClassVar[str] = "X"


class CommMEvent(_CommFields, tag_field="ph", tag="M"):
    args: CommAnyArgs | None = None
    ph: ClassVar[str] = "M"


class CommIEvent(_CommFields, tag_field="ph", tag="i"):
    # (without it, a chunk with collectives and an instant event failed the fast reader, and
    # the whole trace was read by the reference reader: HTA's nccl_parser_config test trace)
    args: CommAnyArgs | None = None
    ph: ClassVar[str] = "i"


CommFastEvent = Union[(CommXEvent, CommMEvent, CommIEvent, *_SKIPPED)]  # noqa: UP007 (a tuple of types)
CommTraceDocument = CommTraceFile | list[CommEvent]


class CommFastPart(FastPart):
    traceEvents: list[CommFastEvent] | None = None


ANNOTATION_CAT = "tracedx"
"""The ``cat`` of every event `tracedx annotate` adds (read as ``ignore``, names skipped)."""

# --- category normalisation: one table for every spelling seen across Kineto eras ---------
# Keys are lower-cased `cat` values; values are tracedx's canonical kinds.
CATEGORY_ALIASES: dict[str, str] = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "cuda_runtime": "runtime",
    "runtime": "runtime",
    "cuda_driver": "runtime",
    "driver": "runtime",
    "hip_runtime": "runtime",
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "python_function": "python_function",
    "cuda_sync": "cuda_sync",
    "trace": "ignore",
    "overhead": "ignore",
    "ac2g": "flow",
    "fwdbwd": "flow",
    "async": "flow",
    "launch": "flow",
    "cpu_instant_event": "ignore",
    # the tracks `tracedx annotate` adds: a re-read annotated trace diagnoses like the original
    ANNOTATION_CAT: "ignore",
}

# Legacy autograd-profiler array format: no `cat`, lanes named by pid.
LEGACY_PID_KINDS = {"CPU functions": "cpu_op", "CUDA functions": "kernel"}
