"""Collectives of one rank: one row per communication kernel, or per host-side (gloo) collective.

Sources (``shared``-independent; PyTorch's ``ParamCommsDebugInfo`` and Kineto's
``appendCollectiveMetadata`` in ``output_json.cpp``): ``ProcessGroupNCCL`` wraps each
collective in a ``record_param_comms`` cpu op whose args hold ``Collective name``, ``dtype``,
``In/Out msg nelems``, ``Group size``, ``Process Group Name/Description/Ranks``, ``Rank``,
``Seq``, ``Comms Id`` ...; Kineto copies the core fields onto the kernels that op launched.
A kernel's metadata comes from, in order: its own args; the ``record_param_comms`` with its
``External id``; the ``record_param_comms`` open on the launching thread when it was launched;
the ``nccl:<op>`` annotation open there (old traces: the type, and the first input's dims
and type as ``in_nelems`` and ``dtype``: all inputs summed for an all-reduce, which may be
coalesced; ``out_nelems`` equals ``in_nelems`` for the types of :data:`SAME_SIZE_TYPES`, else
it is null).
Host-side ``wait`` entries (``Work.wait()``, no kernel) are never rows.

The collective type comes from ``Collective name`` (or the ``nccl:<op>`` label), never from the
kernel name: one NCCL launch can run several operations and its name only hints at the first
(NCCL maintainers, NVIDIA/nccl#739).

``gloo`` runs collectives on CPU worker threads (``pt_gloo_runloop``) and launches no kernel;
torch 2.13 writes no ``record_param_comms`` for it, only a ``gloo:<op>`` user annotation per
collective (host start and end, the first input's dims and type) on the worker thread. Those
are rows too, with ``host_side`` true; they carry no process-group fields.
"""

from __future__ import annotations

import re

import polars as pl

# Communication kernels, by name (NCCL ``ncclKernel_*``/``ncclDevKernel_*``, RCCL, and the
# usual collective words); the rule of the kernel kinds too (tracedx.analysis.kernels).
COMM_KERNEL_RE = (
    r"^nccl|nccldevkernel|ncclkernel|rccl|all_?reduce|all_?gather|reduce_?scatter|alltoall"
)


def is_comm_kernel(kernels: pl.DataFrame, col: str = "name") -> pl.Expr:
    """Whether each row of ``kernels`` is a communication kernel (:data:`COMM_KERNEL_RE` on the
    lower-cased name), the rule run once per distinct name, not once per kernel."""
    names = kernels.get_column(col).unique()
    comm = names.filter(names.str.to_lowercase().str.contains(COMM_KERNEL_RE))
    return pl.col(col).is_in(comm.implode())


COLL_TYPES = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "all_to_allv",
    "broadcast",
    "reduce",
    "send",
    "recv",
    "gather",
    "scatter",
    "barrier",
    "coalesced",
    "unknown",
)
# types whose output has as many elements as the input on each rank
SAME_SIZE_TYPES = ("all_reduce", "broadcast", "reduce", "all_to_all", "all_to_allv")
_TYPE_OF = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoallv": "all_to_allv",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "send": "send",
    "recv": "recv",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
    "coalesced": "coalesced",
}
_SUFFIXES = re.compile(r"(_coalesced|_base|_oop|_into_tensor|_tensor|_single)+$")


META_COLUMNS = (
    "collective_name",
    "pg_name",
    "pg_desc",
    "pg_ranks",
    "group_size",
    "rank",
    "seq",
    "comms_id",
    "rank_start",
    "rank_stride",
    "dtype",
    "in_nelems",
    "out_nelems",
    "in_split_size",
    "out_split_size",
    "src_rank",
    "dst_rank",
)
SCHEMA: dict[str, pl.DataType] = {
    "device": pl.Int64,
    "stream": pl.Int64,
    "tid": pl.Int64,
    "start_us": pl.Float64,
    "end_us": pl.Float64,
    "duration_us": pl.Float64,
    "kernel_name": pl.Utf8,
    "correlation": pl.Int64,
    "external_id": pl.Int64,
    "step": pl.Int64,
    "host_side": pl.Boolean,
    "meta_source": pl.Utf8,
    "coll_type": pl.Utf8,
    "collective_name": pl.Utf8,
    "pg_name": pl.Utf8,
    "pg_desc": pl.Utf8,
    "pg_ranks": pl.Utf8,
    "group_size": pl.Int64,
    "rank": pl.Int64,
    "seq": pl.Int64,
    "comms_id": pl.Utf8,
    "rank_start": pl.Int64,
    "rank_stride": pl.Int64,
    "dtype": pl.Utf8,
    "in_nelems": pl.Int64,
    "out_nelems": pl.Int64,
    "in_split_size": pl.Utf8,
    "out_split_size": pl.Utf8,
    "src_rank": pl.Int64,
    "dst_rank": pl.Int64,
}


def coll_type(name: str | None) -> str:
    """Normalise a ``Collective name`` (``allreduce``, ``_allgather_base``,
    ``reduce_scatter_tensor_coalesced``, ``all_to_allv``, ...) to one of :data:`COLL_TYPES`.

    ``*_coalesced`` forms of one operation keep its type; a bare ``coalesced`` (a group of
    different operations) is ``coalesced``; anything else is ``unknown``.
    """
    if not name:
        return "unknown"
    n = name.strip().lower().lstrip("_")
    if n == "coalesced":
        return "coalesced"
    n = _SUFFIXES.sub("", n).replace("_", "")
    return _TYPE_OF.get(n, "unknown")


def parse_ranks(
    text: str | None,
    group_size: int | None = None,
    rank_start: int | None = None,
    rank_stride: int | None = None,
) -> list[int] | None:
    """The global ranks of a group from ``Process Group Ranks`` (``"[0, 1, 2]"``).

    PyTorch truncates the list after 30 ranks with ``", ..."`` (``format_list``,
    ``kTruncatLength``); a truncated list is completed from ``Global rank start`` and
    ``Global rank stride`` (ranks ``start + i * stride``) and ``Group size`` when those are
    given and agree with the listed prefix, else None (unknown). None for text that is not a
    list of integers.
    """
    if not isinstance(text, str):
        return None
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        return None
    items = [x.strip() for x in body[1:-1].split(",") if x.strip()]
    truncated = bool(items) and items[-1] == "..."
    if truncated:
        items = items[:-1]
    try:
        ranks = [int(x) for x in items]
    except ValueError:
        return None
    if not truncated:
        return ranks
    if group_size is None or rank_start is None or not rank_stride:
        return None
    full = [rank_start + i * rank_stride for i in range(group_size)]
    return full if full[: len(ranks)] == ranks else None


def _metadata_in_force(
    rows: pl.DataFrame, host: pl.DataFrame, by: str, at: str, key: str
) -> pl.DataFrame:
    """For each row, the ``host`` entry open on thread ``rows[by]`` at time ``rows[at]``
    (the latest one starting at or before it that has not ended), joined on ``_i``."""
    r = rows.select("_i", by, at).drop_nulls([by, at]).sort(at)
    h = host.select(
        pl.col("tid").alias(by),
        pl.col("start_us").alias(at),
        pl.col("end_us").alias("_h_end"),
        *META_COLUMNS,
    ).sort(at)
    j = r.join_asof(h, on=at, by=by, strategy="backward", check_sortedness=False)
    return (
        j.filter(pl.col(at) <= pl.col("_h_end"))
        .select("_i", *META_COLUMNS)
        .with_columns(meta_source=pl.lit(key))
    )


def build_collectives(kernels: pl.DataFrame, comm_args: pl.DataFrame, steps) -> pl.DataFrame:
    """The collectives table (columns :data:`SCHEMA`), sorted by start.

    ``kernels`` is ``Trace.kernels`` (linked: ``step``, ``launch_tid``, ``launch_start_us``),
    ``comm_args`` the reader's side table of collective args, ``steps`` ``Trace.steps``.
    ``meta_source`` says where a row's metadata came from: ``kernel``, ``record_param_comms``
    (by External id), ``record_param_comms open`` (open at the launch), ``annotation``, or null.
    """
    k = _with_metadata(_comm_kernels(kernels), comm_args)
    k = k.with_columns(tid=pl.lit(None, pl.Int64), host_side=pl.lit(False))
    out = pl.concat(
        [
            k.with_columns(coll_type=pl.lit(None, pl.Utf8)).select(list(SCHEMA)),
            _gloo_rows(comm_args, steps)
            .with_columns(coll_type=pl.lit(None, pl.Utf8))
            .select(list(SCHEMA)),
        ],
        how="vertical_relaxed",
    ).cast(SCHEMA)
    names = [n for n in out["collective_name"].unique().to_list() if n is not None]
    out = out.with_columns(
        coll_type=pl.col("collective_name").replace_strict(
            {n: coll_type(n) for n in names}, default="unknown", return_dtype=pl.Utf8
        )
    )
    # a label's inputs are this rank's: the output has as many elements only where the
    # operation keeps the size (an all-gather's output is n times its input, n unknown here)
    return out.with_columns(
        out_nelems=pl.when(
            (pl.col("meta_source") == "annotation")
            & pl.col("coll_type").is_in(list(SAME_SIZE_TYPES))
        )
        .then(pl.col("in_nelems"))
        .otherwise(pl.col("out_nelems"))
    ).sort("start_us", "device", "stream", "tid", nulls_last=True, maintain_order=True)


def _comm_kernels(kernels: pl.DataFrame) -> pl.DataFrame:
    """The communication kernels of ``Trace.kernels``, with a row index ``_i``."""
    return (
        kernels.filter(is_comm_kernel(kernels))
        .select(
            "device",
            "stream",
            "start_us",
            "end_us",
            "duration_us",
            pl.col("name").alias("kernel_name"),
            "correlation",
            "external_id",
            "step",
            "launch_tid",
            "launch_start_us",
        )
        .with_row_index("_i")
    )


def _metadata_candidates(k: pl.DataFrame, ca: pl.DataFrame) -> list[pl.DataFrame]:
    """Per source, in order of preference (the module docstring), the metadata it gives each
    kernel row (``_i``, :data:`META_COLUMNS`, ``meta_source``)."""
    own = (
        ca.filter(pl.col("source") == "kernel")
        .select(
            "device",
            "stream",
            "start_us",
            pl.col("correlation").fill_null(-1).alias("_corr"),
            *META_COLUMNS,
        )
        .unique(["device", "stream", "start_us", "_corr"], keep="first", maintain_order=True)
    )
    rpc = ca.filter(
        (pl.col("source") == "cpu_op") & (pl.col("collective_name").str.to_lowercase() != "wait")
    )
    ann = ca.filter((pl.col("source") == "annotation") & ~pl.col("name").str.starts_with("gloo:"))
    cands = [
        k.with_columns(_corr=pl.col("correlation").fill_null(-1))
        .join(own, on=["device", "stream", "start_us", "_corr"], how="inner")
        .filter(pl.col("collective_name").is_not_null())
        .select("_i", *META_COLUMNS)
        .with_columns(meta_source=pl.lit("kernel")),
        k.filter(pl.col("external_id").is_not_null())
        .select("_i", "external_id")
        .join(
            rpc.unique("external_id", keep="first", maintain_order=True).select(
                "external_id", *META_COLUMNS
            ),
            on="external_id",
            how="inner",
        )
        .select("_i", *META_COLUMNS)
        .with_columns(meta_source=pl.lit("record_param_comms")),
    ]
    if rpc.height:
        cands.append(
            _metadata_in_force(k, rpc, "launch_tid", "launch_start_us", "record_param_comms open")
        )
    if ann.height:
        cands.append(_metadata_in_force(k, ann, "launch_tid", "launch_start_us", "annotation"))
    return cands


def _with_metadata(k: pl.DataFrame, comm_args: pl.DataFrame) -> pl.DataFrame:
    """``k`` (:func:`_comm_kernels`) with :data:`META_COLUMNS` and ``meta_source``: field by
    field, the first source that has it (``Rank`` and the global rank layout are written on
    the op only); ``meta_source`` names the best source found."""
    if k.height == 0:
        return k.with_columns(
            *(pl.lit(None, SCHEMA[m]).alias(m) for m in META_COLUMNS),
            meta_source=pl.lit(None, pl.Utf8),
        )
    cands = _metadata_candidates(k, comm_args)
    meta = (
        pl.concat(
            [
                c.cast({m: SCHEMA[m] for m in META_COLUMNS}).with_columns(_prio=pl.lit(i))
                for i, c in enumerate(cands)
            ],
            how="vertical",
        )
        .sort("_i", "_prio")
        .group_by("_i", maintain_order=True)
        .agg(
            *(pl.col(m).drop_nulls().first() for m in META_COLUMNS),
            pl.col("meta_source").first(),
        )
    )
    return k.join(meta, on="_i", how="left")


def _gloo_rows(comm_args: pl.DataFrame, steps) -> pl.DataFrame:
    """One row per host-side gloo collective (its ``gloo:<op>`` annotation), step assigned."""
    from tracedx.trace.link import assign_step

    gloo = comm_args.filter(
        (pl.col("source") == "annotation") & pl.col("name").str.starts_with("gloo:")
    )
    return assign_step(
        gloo.select(
            pl.lit(None, pl.Int64).alias("device"),
            pl.lit(None, pl.Int64).alias("stream"),
            "tid",
            "start_us",
            "end_us",
            "duration_us",
            pl.col("name").alias("kernel_name"),
            "correlation",
            "external_id",
            *META_COLUMNS,
        ),
        steps,
        "start_us",
    ).with_columns(host_side=pl.lit(True), meta_source=pl.lit("annotation"))
