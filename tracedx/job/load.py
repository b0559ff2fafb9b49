"""``load_job(paths) -> Job``: every rank's trace summarised, the rank set checked, one Job.

The flow (docs/multirank.md): inputs expanded (:func:`tracedx.job.discover.expand_inputs`) ->
one ``summarize_path`` per file (the map: :func:`tracedx.job.executor.map_ranks`, on a local
process pool, a Dask cluster or any executor) ->
ranks resolved and checked (:func:`tracedx.job.discover.resolve_ranks`) -> a
:class:`tracedx.job.diagnosis.Job` holding the analysed ranks' summaries and every note.

A file that cannot be read or summarised is a note naming it and the reason; the other ranks
are still analysed. Only when no file can be read at all is it an error.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import polars as pl

from tracedx.errors import TraceError
from tracedx.job.discover import check_heads, expand_inputs, is_url, resolve_ranks

__all__ = ["load_job"]


def load_job(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    *,
    executor=None,
    client=None,
    summaries_dir: str | os.PathLike | None = None,
    workers: int | None = None,
    progress: bool | Callable[[int, int, str], None] | None = None,
    **options,
):
    """Read the traces of a job into a :class:`~tracedx.job.diagnosis.Job`.

    ``paths``: one path or several: trace files, directories (searched recursively), quoted
    globs or fsspec URLs (:func:`~tracedx.job.discover.expand_inputs`). ``options``: keyword
    arguments of :func:`tracedx.job.summary.summarize_path` (device peaks, ``steps``,
    ``repair``), applied to every rank. ``progress``: a callable ``progress(done, total,
    path)`` called after each file, True for a progress bar on stderr, None for one only when
    stderr is a terminal, False for none.

    Where the map runs (:func:`tracedx.job.executor.map_ranks`): ``executor``, any
    ``concurrent.futures``-style executor; ``client``, a ``distributed.Client`` or a Dask
    scheduler address (``"tcp://host:8786"``; needs ``tracedx[dask]``); neither, a local spawn
    process pool of ``workers`` processes (default: sized from free memory, the trace sizes
    and the CPUs; in this process when one worker is planned). Workers open the files
    themselves; only summaries come back. ``summaries_dir``: each rank's summary is also
    written there and reused by a later run while the trace is unchanged (path, size, mtime,
    tracedx version) and the options are the same
    (:func:`~tracedx.job.executor.summary_name`).

    Each summary's ``meta["rank"]`` is the rank the checks decided (the trace's own, else its
    file name's, else assumed; ``meta["rank_source"]`` says which). When ranks cover different
    step numbers, every summary keeps only the steps all ranks cover (its ``steps`` and
    ``colls`` rows of other steps are dropped, ``meta["steps"]`` updated). The job's notes list
    unreadable files, then the rank-set notes of
    :func:`~tracedx.job.discover.resolve_ranks`.

    Raises :class:`~tracedx.errors.TraceError` when the inputs name no trace (see
    ``expand_inputs``), when no file can be read (with one file, its own error) or for a
    malformed ``steps`` string; TypeError at once for an unknown option or a ``steps`` of the
    wrong type (:func:`~tracedx.job.summary.check_options`).
    """
    from tracedx.job.diagnosis import Job
    from tracedx.job.summary import check_options

    options = check_options(options, "load_job")  # before any file is read or task sent
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files = expand_inputs(items)
    _check_heads(files)
    from tracedx.job.executor import map_ranks

    results = map_ranks(
        files,
        executor=executor,
        client=client,
        summaries_dir=summaries_dir,
        options=options,
        progress=progress,
        workers=workers,
    )
    return assemble_job([(r.path, r.summary, r.note) for r in results], Job)


def _check_heads(files: list[str]) -> None:
    """Refuse two whole rank sets or more from the files' heads, before any summary
    (:func:`~tracedx.job.discover.check_heads`). Two rank sets need at least four files; URLs
    are left to the workers, which read them anyway (a head each from the client would be a
    round trip per rank)."""
    if len(files) < 4 or any(is_url(f) for f in files):
        return
    from tracedx.trace.head import head_metadata

    entries = []
    for path in files:
        head = head_metadata(path)
        dist = head.get("distributedInfo") if head else None
        if isinstance(dist, dict):
            keys = ("rank", "world_size", "pg_config")
            entries.append((path, {k: dist.get(k) for k in keys}))
    check_heads(entries, files)


def assemble_job(results: list[tuple[str, object, str | None]], job_class=None):
    """The Job of ``(path, summary or None, note or None)`` results (one per file).

    Shared by every map (sequential here, executors elsewhere): unreadable files become notes,
    ranks are resolved, duplicates left out, the summaries cut to the common steps.

    Raises :class:`~tracedx.errors.TraceError` when no result holds a summary.
    """
    if job_class is None:
        from tracedx.job.diagnosis import Job as job_class
    notes: list[str] = []
    good = [(p, s) for p, s, _ in results if s is not None]
    bad = [(p, n) for p, s, n in results if s is None]
    if not good:
        if len(bad) == 1:
            raise TraceError(bad[0][1])
        if len({n for _, n in bad}) == 1:  # the same answer for every file: an option's, say
            raise TraceError(f"{bad[0][1]} (each of the {len(bad)} traces)")
        raise TraceError(f"none of the {len(bad)} traces could be read (first: {bad[0][1]})")
    unreadable = []
    for path, note in bad:
        # the reader's message names the path as Path() spells it (./a//b.json -> a/b.json)
        reason = note or ""
        for spelt in (f"{path}: ", f"{Path(path)}: "):
            reason = reason.removeprefix(spelt)
        notes.append(f"left out, cannot be read: {path}: {reason}; the other ranks are analysed")
        unreadable.append((str(path), reason))
    rs = resolve_ranks(
        [(p, s.meta) for p, s in good],
        [str(p) for p, _ in bad],
        collectives=[_collectives(s) for _, s in good],
    )
    summaries = []
    for r in rs.ranks:
        path, s = good[rs.index[r]]
        meta = dict(s.meta)
        meta["rank"], meta["rank_source"] = r, rs.sources[r]
        summaries.append(_with(s, meta, rs.steps))
    notes += rs.notes
    return job_class(summaries=summaries, notes=notes, unreadable=unreadable)


def _collectives(summary) -> int | None:
    """How many collectives a summary holds (None for a stand-in without the table); of a
    ``HeldSummary`` only one column is decoded."""
    table = getattr(summary, "table", None)
    colls = table("colls", ["step"]) if table is not None else getattr(summary, "colls", None)
    return colls.height if isinstance(colls, pl.DataFrame) else None


def _with(summary, meta: dict, steps: tuple[int, ...]):
    """A copy of ``summary`` with ``meta``, its step tables cut to ``steps`` when they differ
    (a ``HeldSummary``'s ``colls`` are cut when decoded)."""
    from tracedx.job.summary import HeldSummary

    own = tuple(meta.get("steps") or ())
    cut = bool(steps) and set(own) != set(steps)
    if isinstance(summary, HeldSummary):
        held = HeldSummary(meta, summary.steps, summary._sources)
        if cut:
            keep = pl.Series(list(steps), dtype=pl.Int64).implode()
            held.steps = held.steps.filter(pl.col("step").is_in(keep))
            held.keep_steps = tuple(steps)
            meta["steps"] = [s for s in own if s in set(steps)]
        return held
    changes: dict = {"meta": meta}
    if cut:
        keep = pl.Series(list(steps), dtype=pl.Int64).implode()
        for name in ("steps", "colls"):
            df = getattr(summary, name, None)
            if isinstance(df, pl.DataFrame) and "step" in df.columns:
                changes[name] = df.filter(pl.col("step").is_in(keep))
        meta["steps"] = [s for s in own if s in set(steps)]
    if dataclasses.is_dataclass(summary):
        return dataclasses.replace(summary, **changes)
    for k, v in changes.items():  # a stand-in summary object
        setattr(summary, k, v)
    return summary
