"""Which files make a job, and which rank each file is: inputs expanded, ranks checked.

:func:`expand_inputs` turns what a user typed (one file, several, a directory, a quoted glob,
fsspec URLs) into the list of trace files. :func:`resolve_ranks` takes each file's summary
metadata (``RankSummary.meta``: ``rank`` and ``rank_source`` from ``distributedInfo`` or a
default-group ``record_param_comms``, ``world_size``, ``steps``) and decides the job's rank set:
the rank of a file that says nothing comes from its name (:func:`rank_from_filename`), and every
irregularity is a note, never a silent drop: two files of one rank, missing ranks, files that
disagree about the world size, ranks that cover different ``ProfilerStep`` numbers (the job is
analysed on the common ones), a file whose rank cannot be told. Before that,
:func:`check_one_job` decides that the files are one job at all: a folder of single-GPU traces,
two runs side by side, or single traces beside a job are refused in one line that names them.

File-name layouts, with their sources:

- torchtitan writes ``.../iteration_{n}/rank{r}_trace.json`` (torchtitan's
  ``torchtitan/tools/profiling.py``); HolisticTraceAnalysis' test data
  and many users ``rank-{r}.json`` or ``rank_{r}...``; ``tracedx capture`` under torchrun
  ``<script>-<time>-rank{r}.json.gz``: ``rank{r}``, ``rank-{r}``, ``rank_{r}`` anywhere in the
  file name, else in the nearest parent folder's name (``rank3/trace.json``).
- ``torch.profiler.tensorboard_trace_handler`` writes ``{worker_name}.{time_ns}.pt.trace.json``
  with ``worker_name = "{hostname}_{pid}"`` by default (PyTorch docs,
  ``torch.profiler.tensorboard_trace_handler``): the host name, not a rank (the summary reads
  the host name, ``tracedx.job.summary.TB_NAME_RE``).

Nothing here reads a trace: this is pure bookkeeping over paths and metadata (the summaries',
or the files' heads for :func:`check_heads`).
"""

from __future__ import annotations

import errno
import glob
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tracedx.console import plural
from tracedx.errors import TraceError

__all__ = [
    "RankSet",
    "check_heads",
    "check_one_job",
    "expand_inputs",
    "is_url",
    "rank_from_filename",
    "resolve_ranks",
]

TRACE_SUFFIXES = (".json", ".json.gz")
_GLOB_CHARS = re.compile(r"[*?\[]")
_RANK_RE = re.compile(r"(?<![A-Za-z0-9])rank[-_]?(\d+)(?!\d)", re.IGNORECASE)


def is_url(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an fsspec URL (``s3://``, ``gs://``, ``file://``, ...)."""
    head, sep, _ = os.fspath(path).partition("://")
    return bool(sep) and head.isidentifier()


def _is_trace_name(name: str) -> bool:
    return not name.startswith(".") and name.lower().endswith(TRACE_SUFFIXES)


def _dir_traces(folder: str) -> list[str]:
    """The trace files below ``folder``, sorted (summaries folders skipped)."""
    return sorted(
        str(Path(root) / name)
        for root, _dirs, files in os.walk(folder)
        for name in files
        if _is_trace_name(name) and not _skipped_below(Path(root), Path(folder))
    )


def expand_inputs(inputs: Iterable[str | os.PathLike]) -> list[str]:
    """The trace files named by ``inputs``, each once, as strings.

    Each input is one of: an fsspec URL (passed through unchanged, read by whoever opens it);
    an existing file (kept whatever its name); an existing directory (searched recursively for
    ``*.json`` and ``*.json.gz``, which covers ``*.pt.trace.json[.gz]``; hidden files and
    folders, such as a capture's temporary ``.tracedx-*.json``, and the ``*.rank-summary``
    folders of a ``--summaries`` directory are skipped); a glob pattern (``*``, ``?``,
    ``[...]``; ``**`` spans folders), expanded here so that a quoted pattern works on every
    shell, a matching directory searched as above. Directories and globs give their files in
    sorted order; the same file named twice is kept once (the first time).

    Raises :class:`~tracedx.errors.TraceError` (exit status 2 in the CLI) when there is no
    input, an input does not exist, a glob matches nothing or a directory holds no trace file.
    """
    out: list[str] = []
    seen: set[str] = set()

    def add(p: str) -> None:
        key = p if is_url(p) else os.path.realpath(p)
        if key not in seen:
            seen.add(key)
            out.append(p)

    items = [os.fspath(i) for i in inputs]
    if not items:
        raise TraceError("no trace given")
    for item in items:
        if is_url(item):
            add(item)
        elif os.path.isdir(item):
            found = _dir_traces(item)
            if not found:
                raise TraceError(f"{item}: no trace files (*.json, *.json.gz) in this directory")
            for f in found:
                add(f)
        elif os.path.exists(item):
            add(item)
        elif _GLOB_CHARS.search(item):
            # a matching directory is searched as a directory given by name would be
            found = [
                f
                for m in sorted(glob.glob(item, recursive=True))
                for f in (_dir_traces(m) if os.path.isdir(m) else [m] if os.path.isfile(m) else [])
            ]
            if not found:
                raise TraceError(f"{item}: no file or directory of traces matches this pattern")
            for f in found:
                add(f)
        else:
            try:  # why it cannot be seen: missing, or a name the system refuses (too long)
                os.stat(item)
                reason = "no such file or directory"
            except OSError as e:
                reason = "no such file or directory" if e.errno == errno.ENOENT else e.strerror
            raise TraceError(f"{item}: {reason}")
    return out


def _skipped_below(folder: Path, top: Path) -> bool:
    """Whether a folder strictly below ``top`` on the way to ``folder`` is hidden or a rank
    summary (``*.rank-summary``: its ``meta.json`` is no trace)."""
    try:
        parts = folder.relative_to(top).parts
    except ValueError:
        return False
    return any(
        (p.startswith(".") and p not in (".", "..")) or p.endswith(".rank-summary") for p in parts
    )


def rank_from_filename(path: str | os.PathLike) -> int | None:
    """The rank written in a trace's file name (``rank3_trace.json``, ``rank-0.json``,
    ``x-rank_12.json.gz``), else in its parent folder's name (``rank3/trace.json``), else None.

    ``rank`` must not follow a letter or digit (``frank1`` is not rank 1); the number is the
    whole run of digits after it. A ``tensorboard_trace_handler`` name carries no rank.
    """
    p = Path(os.fspath(path).rstrip("/"))
    for part in (p.name, p.parent.name):
        m = _RANK_RE.search(part)
        if m:
            return int(m.group(1))
    return None


@dataclass(frozen=True)
class RankSet:
    """The job's ranks after the checks.

    ``ranks``: the global ranks analysed, ascending; ``index[r]``: the position in the input
    list of rank ``r``'s file; ``paths[r]``, ``sources[r]``: its file and where its rank came
    from (``"distributedInfo"``, ``"record_param_comms"``, ``"file name"``, ``"file order"``);
    ``world_size``: the job's world size (the traces' value; when they disagree, the most
    common one, the larger on a tie; None when no trace says); ``steps``: the ``ProfilerStep``
    numbers every analysed rank covers, ascending (the steps to analyse); ``left_out``: input
    positions not analysed (a duplicate of a rank); ``notes``: one sentence per irregularity.
    """

    ranks: tuple[int, ...]
    index: Mapping[int, int]
    paths: Mapping[int, str]
    sources: Mapping[int, str]
    world_size: int | None
    steps: tuple[int, ...]
    left_out: tuple[int, ...]
    notes: tuple[str, ...]


def _ranges(values: Iterable[int]) -> str:
    """``0-3, 5, 7-8`` for {0, 1, 2, 3, 5, 7, 8}."""
    vs = sorted(set(values))
    parts: list[str] = []
    i = 0
    while i < len(vs):
        j = i
        while j + 1 < len(vs) and vs[j + 1] == vs[j] + 1:
            j += 1
        parts.append(str(vs[i]) if i == j else f"{vs[i]}-{vs[j]}")
        i = j + 1
    return ", ".join(parts)


def _as_int(v) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.strip().isdigit():
        return int(v)
    return None


def resolve_ranks(
    entries: Sequence[tuple[str, Mapping]],
    unreadable: Sequence[str] = (),
    *,
    collectives: Sequence[int | None] | None = None,
) -> RankSet:
    """Decide the job's ranks from ``(path, meta)`` pairs, one per readable trace.

    ``unreadable``: the paths of traces that could not be read; a missing rank that one of
    their file names carries (:func:`rank_from_filename`) is said to be unreadable, not
    without a trace. ``collectives``: per entry, how many collectives its summary holds
    (None: unknown), which tells a single trace from a rank (:func:`check_one_job`).

    Raises :class:`~tracedx.errors.TraceError` when the entries are not one job
    (:func:`check_one_job`: several jobs, or single traces, alone or beside a job).

    ``meta`` is a ``RankSummary.meta`` (keys ``rank``, ``rank_source``, ``world_size``,
    ``steps``, ``steps_synthetic``; missing keys read as unknown). A file's rank is
    ``meta["rank"]``, else :func:`rank_from_filename`. The result does not depend on the order
    of ``entries``: every choice is made in the order of the file paths.

    - A file whose rank cannot be told: with one file, it is rank 0 and nothing is said; with
      several, it takes the lowest rank no other file has (a missing rank of the world size
      first), and a note names the file and the rank assumed.
    - Two files with one rank: the one whose folder holds the most ranks (the first by path on
      a tie) is analysed; a note names both (:func:`_first_per_rank`).
    - Traces disagreeing about the world size: a note lists each value with its files.
    - Missing ranks (world size known): a note lists them; a rank at or above the world size
      is noted too. With no world size, a gap in the ranks present is noted as possibly missing.
    - Ranks covering different step numbers: the job is analysed on the steps every rank
      covers, and a note says which; a rank whose steps are tracedx's own split (no
      ``ProfilerStep`` ranges) is noted, since its step numbers only count steps.
    """
    check_one_job(entries, collectives)
    order = sorted(range(len(entries)), key=lambda i: (str(entries[i][0]), i))
    notes: list[str] = []
    rank_of, source_of, unknown = _told_ranks(entries, order)
    world_size, note = _world_size(entries, order)
    notes += [note] if note else []
    if unknown:
        notes += _assume_ranks(entries, unknown, rank_of, source_of, world_size)
    index, left_out, dup_notes = _first_per_rank(entries, order, rank_of)
    notes += dup_notes
    ranks = tuple(sorted(index))
    notes += _missing_notes(ranks, world_size, unreadable)
    common, step_notes = _common_steps(entries, index, ranks)
    notes += step_notes
    return RankSet(
        ranks=ranks,
        index=index,
        paths={r: str(entries[index[r]][0]) for r in ranks},
        sources={r: source_of[index[r]] for r in ranks},
        world_size=world_size,
        steps=tuple(sorted(common)),
        left_out=tuple(sorted(left_out)),
        notes=tuple(notes),
    )


def _told_ranks(
    entries: Sequence[tuple[str, Mapping]], order: list[int]
) -> tuple[dict[int, int], dict[int, str], list[int]]:
    """The ranks the files tell (their meta, else their name): ``(rank_of, source_of,
    unknown)``, keyed by input position; ``unknown``: positions whose rank cannot be told."""
    rank_of: dict[int, int] = {}
    source_of: dict[int, str] = {}
    unknown: list[int] = []
    for i in order:
        path, meta = entries[i]
        r = _as_int(meta.get("rank"))
        if r is not None and r >= 0:
            rank_of[i], source_of[i] = r, str(meta.get("rank_source") or "trace")
            continue
        r = rank_from_filename(path)
        if r is not None:
            rank_of[i], source_of[i] = r, "file name"
        else:
            unknown.append(i)
    return rank_of, source_of, unknown


def _world_size(
    entries: Sequence[tuple[str, Mapping]], order: list[int]
) -> tuple[int | None, str | None]:
    """The job's world size (the most common value the traces give, the larger on a tie;
    None when none does) and a note when they disagree."""
    sizes: dict[int, list[str]] = {}
    for i in order:
        ws = _as_int(entries[i][1].get("world_size"))
        if ws is not None and ws > 0:
            sizes.setdefault(ws, []).append(str(entries[i][0]))
    if not sizes:
        return None, None
    counts = Counter({ws: len(files) for ws, files in sizes.items()})
    world_size = max(counts, key=lambda ws: (counts[ws], ws))
    if len(sizes) == 1:
        return world_size, None
    listed = "; ".join(
        f"{ws} in {', '.join(sizes[ws])}" for ws in sorted(sizes, key=lambda w: -counts[w])
    )
    return world_size, (
        f"the traces disagree about the world size ({listed}): the job is taken as "
        f"{world_size} ranks; are these files from one job?"
    )


def _assume_ranks(
    entries: Sequence[tuple[str, Mapping]],
    unknown: list[int],
    rank_of: dict[int, int],
    source_of: dict[int, str],
    world_size: int | None,
) -> list[str]:
    """Give each file whose rank cannot be told the lowest rank no other file has (a missing
    rank of the world size first), in ``rank_of``/``source_of``; the note that says so (none
    for a lone file, which is rank 0)."""
    if len(entries) == 1:
        rank_of[unknown[0]], source_of[unknown[0]] = 0, "file order"
        return []
    taken = set(rank_of.values())
    free = [r for r in range(world_size or 0) if r not in taken]
    nxt = 0
    assumed = []
    for i in unknown:
        if free:
            r = free.pop(0)
        else:
            while nxt in taken:
                nxt += 1
            r = nxt
        taken.add(r)
        rank_of[i], source_of[i] = r, "file order"
        assumed.append(f"{entries[i][0]} as rank {r}")
    return [
        f"the rank of {plural(len(unknown), 'file')} cannot be told (no "
        "distributedInfo, no record_param_comms Rank, no rank in the file name): "
        f"taken in file-name order, {'; '.join(assumed)}; per-rank results for "
        f"{'it' if len(unknown) == 1 else 'them'} may be attributed to the wrong rank"
    ]


def _first_per_rank(
    entries: Sequence[tuple[str, Mapping]], order: list[int], rank_of: dict[int, int]
) -> tuple[dict[int, int], list[int], list[str]]:
    """Per rank one of its files: ``(index, left_out, notes)``, a note per rank with several
    files. Of a rank's files, the one whose job folder (:func:`_job_folder`) holds the most
    ranks is analysed, the first by path on a tie: beside a crashed run's lone ``rank0``, the
    whole run's ``rank0`` is taken with its peers, never a rank from each run."""
    ranks_in: dict[str, set[int]] = {}
    for i in order:
        ranks_in.setdefault(_job_folder(str(entries[i][0])), set()).add(rank_of[i])
    by_rank: dict[int, list[int]] = {}
    for i in sorted(order, key=lambda i: -len(ranks_in[_job_folder(str(entries[i][0]))])):
        by_rank.setdefault(rank_of[i], []).append(i)
    index: dict[int, int] = {}
    left_out: list[int] = []
    notes: list[str] = []
    for r in sorted(by_rank):
        files = by_rank[r]
        index[r] = files[0]
        if len(files) > 1:
            left_out.extend(files[1:])
            others = ", ".join(str(entries[i][0]) for i in files[1:])
            notes.append(
                f"rank {r} has {len(files)} files: {entries[files[0]][0]} (analysed) and "
                f"{others} (left out); give one file per rank (two runs or two profiling "
                "windows in one folder?)"
            )
    return index, left_out, notes


def _missing_notes(
    ranks: tuple[int, ...], world_size: int | None, unreadable: Sequence[str]
) -> list[str]:
    """Notes on the ranks of the world size with no trace (or an unreadable one), ranks
    outside it, and, with no world size, gaps between the ranks present."""
    notes: list[str] = []
    if world_size is None:
        if len(ranks) > 1 and ranks != tuple(range(ranks[0], ranks[0] + len(ranks))):
            gaps = [r for r in range(ranks[0], ranks[-1]) if r not in ranks]
            notes.append(
                f"the traces do not give the world size, and rank {_ranges(gaps)} "
                f"{'is' if len(gaps) == 1 else 'are'} absent between the ranks present "
                f"({_ranges(ranks)}): possibly missing"
            )
        return notes
    missing = [r for r in range(world_size) if r not in ranks]
    outside = [r for r in ranks if r >= world_size]
    bad = {rank_from_filename(p) for p in unreadable} - {None}
    lost = [r for r in missing if r in bad]
    missing = [r for r in missing if r not in bad]
    if lost:
        notes.append(
            f"{plural(len(lost), 'rank')} of the {world_size} in the job "
            f"{'is' if len(lost) == 1 else 'are'} unreadable (rank {_ranges(lost)}: its "
            f"trace could not be read): the job is analysed on {plural(len(ranks), 'rank')}"
        )
    if missing:
        notes.append(
            f"{plural(len(missing), 'rank')} of the {world_size} in the job "
            f"{'has' if len(missing) == 1 else 'have'} no trace (rank "
            f"{_ranges(missing)}): the job is analysed on {plural(len(ranks), 'rank')}, "
            "and a straggler among the missing ones cannot be seen"
        )
    if outside:
        notes.append(
            f"rank {_ranges(outside)} is outside the world size {world_size} the traces give"
        )
    return notes


def _common_steps(
    entries: Sequence[tuple[str, Mapping]], index: Mapping[int, int], ranks: tuple[int, ...]
) -> tuple[frozenset[int], list[str]]:
    """The ``ProfilerStep`` numbers every analysed rank covers, and notes when the ranks
    cover different ones or some have only tracedx's own step split."""
    notes: list[str] = []
    step_sets = {r: _steps(entries[index[r]][1]) for r in ranks}
    known = {r: s for r, s in step_sets.items() if s is not None}
    common: frozenset[int] = frozenset.intersection(*known.values()) if known else frozenset()
    if known and any(s != common for s in known.values()):
        covered = "; ".join(
            f"rank {_ranges(rs)}: steps {_ranges(s) or 'none'}"
            for s, rs in _group_by_value(known).items()
        )
        if common:
            notes.append(
                f"the ranks cover different ProfilerStep numbers ({covered}): the job is "
                f"analysed on the {plural(len(common), 'step')} all ranks cover "
                f"({_ranges(common)})"
            )
        else:
            notes.append(
                f"the ranks cover different ProfilerStep numbers ({covered}) and no step is "
                "common to all: steps cannot be compared across ranks (were the files "
                "captured in one run?)"
            )
    synthetic = [r for r in ranks if entries[index[r]][1].get("steps_synthetic")]
    if synthetic and len(ranks) > 1:
        notes.append(
            f"rank {_ranges(synthetic)} has no ProfilerStep ranges: its steps are tracedx's "
            "own split of the trace, so its step numbers only count steps"
        )
    return common, notes


def _steps(meta: Mapping) -> frozenset[int] | None:
    steps = meta.get("steps")
    if steps is None:
        return None
    out = {_as_int(s) for s in steps}
    return frozenset(s for s in out if s is not None)


def _group_by_value(d: Mapping[int, frozenset[int]]) -> dict[frozenset[int], list[int]]:
    groups: dict[frozenset[int], list[int]] = {}
    for r in sorted(d):
        groups.setdefault(d[r], []).append(r)
    return groups


def _is_single(meta: Mapping, collectives: int | None) -> bool:
    """Whether a trace is of one process, not a rank of a job: no ``distributedInfo`` world
    size above 1, no process group of several ranks, and no collective (``collectives`` None:
    unknown, then it cannot be told and the trace is taken as a rank)."""
    ws = _as_int(meta.get("world_size"))
    if ws is not None and ws > 1:
        return False
    pgs = meta.get("pg_config")
    for pg in pgs if isinstance(pgs, list) else ():  # a crafted non-list is no group
        size = _as_int(pg.get("pg_size")) if isinstance(pg, Mapping) else None
        if size is not None and size > 1:
            return False
    return collectives == 0


def _job_folder(path: str) -> str:
    """The folder that holds a rank's trace as part of its job: the trace's folder, or the
    one above when that folder is the rank's own (``rank3/trace.json``)."""
    folder = os.path.dirname(path) or "."
    return (os.path.dirname(folder) or ".") if _RANK_RE.search(os.path.basename(folder)) else folder


def _complete(group: list[tuple[str, Mapping]]) -> bool:
    """Whether the traces of one folder and world size are a whole job by themselves: each
    tells its rank, no rank twice, and the ranks are 0..N-1 (N the world size, else the
    number of traces), N >= 2."""
    ranks = []
    for path, meta in group:
        r = _as_int(meta.get("rank"))
        r = r if r is not None and r >= 0 else rank_from_filename(path)
        if r is None:
            return False
        ranks.append(r)
    n = _as_int(group[0][1].get("world_size")) or len(ranks)
    return n >= 2 and sorted(ranks) == list(range(n))


def _common(paths: Sequence[str]) -> str | None:
    """The longest common folder of ``paths``; None when there is none (absolute and
    relative paths mixed, URLs of different schemes or buckets, URLs mixed with paths). URLs
    keep their ``scheme://`` (``os.path.commonpath`` alone would make ``s3:/bucket``)."""
    urls = {is_url(p) for p in paths}
    if urls == {True}:
        schemes = {p.partition("://")[0] for p in paths}
        rest = _common([p.partition("://")[2] for p in paths]) if len(schemes) == 1 else None
        return f"{schemes.pop()}://{rest}" if rest else None
    if len(urls) > 1:
        return None
    try:
        return os.path.commonpath(paths)
    except ValueError:
        return None


def check_one_job(
    entries: Sequence[tuple[str, Mapping]], collectives: Sequence[int | None] | None = None
) -> None:
    """Raise unless ``(path, meta)`` entries are the traces of one job (or one trace).

    ``collectives``: per entry, its number of collectives (None, or a None item: unknown).
    A trace is a rank of a job when its ``distributedInfo`` world size or a process group of
    its ``pg_config`` has more than one rank, or it has collectives (else it is a single
    trace: :func:`_is_single`). The ranks are one job unless their folders (a rank's own
    ``rank{N}/`` folder counted as its parent) and world sizes split them into two rank sets
    or more that are each whole (:func:`_complete`): two runs side by side. Two files of one
    rank that do not split that way stay one job (:func:`resolve_ranks` notes the duplicate).

    Raises :class:`~tracedx.errors.TraceError` (one line, exit 2 in the CLI) for several
    single traces, several jobs, or single traces mixed with a job, naming what was found.
    """
    if len(entries) < 2:
        return
    counts = list(collectives) if collectives is not None else [None] * len(entries)
    singles = [e for e, n in zip(entries, counts, strict=True) if _is_single(e[1], n)]
    ranks = [e for e, n in zip(entries, counts, strict=True) if not _is_single(e[1], n)]
    if not ranks:
        raise TraceError(
            f"these {len(entries)} traces share no collective and no distributedInfo: they are "
            "not one job; diagnose each alone"
        )
    jobs = _rank_sets(ranks)
    if len(jobs) == 1 and not singles:
        return
    others = ""
    if singles:
        gpu = all(m.get("device_name") for _, m in singles)
        kind = "single-GPU" if gpu else "single-process"
        others = plural(len(singles), f"{kind} trace")
    raise TraceError(_refusal(jobs, others, [p for p, _ in entries]))


def check_heads(entries: Sequence[tuple[str, Mapping]], files: Sequence[str]) -> None:
    """Raise before any trace is read when ``(path, meta)`` entries, from the files' heads
    (:func:`tracedx.trace.head.head_metadata`: ``rank``, ``world_size``, ``pg_config`` of
    their ``distributedInfo``), already hold two whole rank sets or more: :func:`check_one_job`
    would refuse them after summarising every rank. ``files``: every file given, head read or
    not; those outside the rank sets are named as a count. Entries that are not surely ranks
    (no world size or process group above 1) are left to the full check.

    Raises :class:`~tracedx.errors.TraceError` as :func:`check_one_job` does."""
    ranks = [(str(p), m) for p, m in entries if not _is_single(m, 0)]
    jobs = _rank_sets(ranks)
    if len(jobs) < 2:
        return
    rest = len(files) - len(ranks)
    others = plural(rest, "other file") if rest else ""
    raise TraceError(_refusal(jobs, others, files))


def _rank_sets(ranks: Sequence[tuple[str, Mapping]]) -> list[list[tuple[str, Mapping]]]:
    """The ranks' traces split by folder (a rank's own ``rank{N}/`` folder counted as its
    parent) and world size when two of those groups or more are whole (:func:`_complete`);
    else all of them as one job."""
    groups: dict[tuple[str, int | None], list[tuple[str, Mapping]]] = {}
    for path, meta in sorted(ranks, key=lambda e: str(e[0])):
        key = (_job_folder(str(path)), _as_int(meta.get("world_size")))
        groups.setdefault(key, []).append((str(path), meta))
    whole = sum(1 for g in groups.values() if _complete(g))
    return list(groups.values()) if whole >= 2 else [[(str(p), m) for p, m in ranks]]


def _refusal(jobs: list[list[tuple[str, Mapping]]], others: str, paths: Sequence) -> str:
    """The one line refusing ``jobs`` (rank sets) beside ``others`` (a count of other
    traces, or ""), found among ``paths``."""
    top = _common([os.path.dirname(str(p)) or "." for p in paths])
    names = ", ".join(_job_name(job, top) for job in jobs)
    # whole rank sets side by side: two runs, or two profiling windows of one run
    # (torchtitan's iteration_10/, iteration_20/); the traces cannot tell which
    if len(jobs) == 1:
        folder = _common([_job_folder(p) for p, _ in jobs[0]])
        apart = folder and top and os.path.normpath(folder) != os.path.normpath(top)
        # the job's own folder, unless that is the folder given: then its files
        found, one = f"1 job ({names})", "the job's folder" if apart else "the job's files"
    else:
        found = f"{len(jobs)} whole rank sets, separate jobs or profiling windows ({names})"
        one = "one of these folders"
    if others:
        found += f" and {others}"
    where = "the inputs hold" if not top else f"{'this folder' if top == '.' else top + '/'} holds"
    return f"{where} {found}; diagnose {one}, or one trace"


def _job_name(job: list[tuple[str, Mapping]], top: str | None) -> str:
    """A job as the refusal names it: its folder relative to ``top`` when its traces share
    one below it, else its first file names."""
    folder = _common([_job_folder(p) for p, _ in job])
    if folder and top and os.path.normpath(folder) != os.path.normpath(top):
        return os.path.relpath(folder, top) + "/"
    files = [os.path.relpath(p, top) if top else p for p, _ in job]
    return ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
