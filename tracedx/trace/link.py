"""Link GPU work to the host: kernel -> launch (correlation) -> op -> step.

The rules (read off torch.profiler traces of PyTorch 2.x on NVIDIA GPUs): link by ``correlation`` id, never by flows; a
``cudaGraphLaunch`` correlates with every kernel of its graph; the op that issued a launch is
the cpu_op with the launch's ``External id``, else the innermost cpu_op on the launching thread
whose interval holds the launch; the step is the ``ProfilerStep#N`` whose host window holds the
launch, whatever the thread (backward kernels are launched from the autograd thread).
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from tracedx.trace.tables import DataWarning

# A step number: ASCII digits only, at most 18 (within int64). Unicode or full-width digits,
# or a longer number, are not a number torch.profiler writes: such a step is skipped, with a note.
STEP_RE = re.compile(r"^ProfilerStep#([0-9]{1,18})$")
_STEP_NUMBER = r"^ProfilerStep#([0-9]{1,18})$"

# Host API names -> kind. Matched case-sensitively on substrings, CUDA and HIP spellings.
# First match wins. A host function (cudaLaunchHostFunc / cuLaunchHostFunc) runs on the host:
# it never has a GPU event, so it is not a kernel launch.
_API_KINDS = [
    ("other", ("LaunchHostFunc",)),
    ("graph", ("GraphLaunch",)),
    (
        "kernel",
        (
            "LaunchKernel",
            "cuLaunch",
            "LaunchCooperativeKernel",
            "hipExtLaunch",
            "hipModuleLaunch",
        ),
    ),
    ("sync", ("Synchronize",)),
    ("memcpy", ("Memcpy",)),
    ("memset", ("Memset",)),
]


def api_kind_expr(col: str = "name") -> pl.Expr:
    """Polars expression: the kind of a runtime/driver call (kernel, graph, memcpy, memset, sync, other)."""
    expr = pl.lit("other")
    for kind, needles in reversed(_API_KINDS):
        cond = pl.any_horizontal([pl.col(col).str.contains(n, literal=True) for n in needles])
        expr = pl.when(cond).then(pl.lit(kind)).otherwise(expr)
    return expr


def starts_with(s: pl.Series, prefix: str) -> pl.Series:
    """``s.str.starts_with(prefix)`` for a ``prefix`` ending in an ASCII character below
    U+007F, as two comparisons (a fraction of its cost): strings compare by their UTF-8
    bytes, so those starting with ``prefix`` are exactly those from ``prefix`` up to (not
    including) ``prefix`` with its last character the next one."""
    assert prefix and prefix[-1] < "\x7f"
    upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    return (s >= prefix) & (s < upper)


def api_kind(name: str) -> str:
    """:func:`api_kind_expr` of one name."""
    for kind, needles in _API_KINDS:
        if any(n in name for n in needles):
            return kind
    return "other"


def op_tree(ops: pl.DataFrame) -> tuple[pl.DataFrame, int, tuple | None]:
    """Add ``op_id`` (the row number), ``parent_id``, ``top_op_id`` and ``depth`` to the
    cpu_op table.

    Parents are found per (pid, tid) with a stack over ops sorted by start (longer first on
    ties, then in table order). An op that starts inside another but ends after it
    (non-nesting ranges, seen in real traces) keeps that parent and is counted. Returns (ops,
    number of non-nesting ops, the :func:`thread_order` it used: None for no ops), the order
    being what :func:`link_launches_to_ops` would compute again for the same ops."""
    ops = ops.clone()  # a new frame (the columns are shared): the row number goes in front
    ops.insert_column(0, pl.Series("op_id", np.arange(ops.height), dtype=pl.Int64))
    if ops.height == 0:
        return (
            ops.with_columns(
                parent_id=pl.lit(None, pl.Int64),
                top_op_id=pl.lit(None, pl.Int64),
                depth=pl.lit(0, pl.Int32),
            ),
            0,
            None,
        )
    thread = thread_order(ops)
    order, new, start, end = thread
    parent, depth, root = _nest(new, start, end)
    has = parent >= 0
    pp = np.where(has, parent, 0)
    bad = int(np.count_nonzero(has & (end > end[pp] + 1e-6)))
    if order is not None:  # positions in stack order -> op_id (the row number)
        parent = np.where(has, order[pp], -1)
        root = order[root]
        n = len(order)
        parent_of, top_of, depth_of = (
            np.empty(n, np.int64),
            np.empty(n, np.int64),
            np.empty(n, np.int32),
        )
        parent_of[order], top_of[order], depth_of[order] = parent, root, depth
        parent, root, depth = parent_of, top_of, depth_of
    return (
        _with(
            ops,
            [
                _with_nulls(parent).alias("parent_id"),
                pl.Series("top_op_id", root, dtype=pl.Int64),
                pl.Series("depth", depth, dtype=pl.Int32),
            ],
        ),
        bad,
        thread,
    )


def thread_order(
    ops: pl.DataFrame,
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]:
    """The ops in the op tree's order: by (pid, tid) (nulls last), then start, then longer first.

    Returns (order, new, start, end): the row numbers in that order (None when the table is in
    it already), where each (pid, tid) begins in it (a null id reads as -1, so it joins an
    adjacent -1), and the ops' start_us and end_us in it. Equal keys keep table order.

    Real traces list each thread's ops by start, in a few runs of rows of one thread: the runs
    are put in (pid, tid) order (a sort of the runs, not of the rows) and the result is checked
    to be in order; anything else takes a full sort.
    """
    n = ops.height
    ids = [ops[c] for c in ("pid", "tid")]
    key = [_ints(s, -1) for s in ids]
    start = ops["start_us"].to_numpy()
    end = ops["end_us"].to_numpy()
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for k, s in zip(key, ids, strict=True):
        change[1:] |= k[1:] != k[:-1]
        if s.null_count():
            null = s.is_null().to_numpy()
            change[1:] |= null[1:] != null[:-1]
    heads = np.flatnonzero(change)
    if len(heads) <= max(n // 16, 1):
        nulls = [
            s.is_null().to_numpy()[heads] if s.null_count() else np.zeros(len(heads), bool)
            for s in ids
        ]
        runs = np.lexsort((key[1][heads], nulls[1], key[0][heads], nulls[0]))
        lengths = np.diff(np.r_[heads, n])[runs]
        if len(runs) == 1:
            order = None
            s, e = start, end
        else:
            offset = np.repeat(heads[runs] - np.r_[0, np.cumsum(lengths)[:-1]], lengths)
            order = offset + np.arange(n)
            s, e = start[order], end[order]
        # a group begins where the (filled) ids differ from the run before
        rk = [k[heads][runs] for k in key]
        new = np.zeros(n, dtype=bool)
        new[np.r_[0, np.cumsum(lengths)[:-1]]] = np.r_[
            True, (rk[0][1:] != rk[0][:-1]) | (rk[1][1:] != rk[1][:-1])
        ]
        ok = (s[1:] > s[:-1]) | ((s[1:] == s[:-1]) & (e[1:] <= e[:-1]))
        if (ok | new[1:]).all():
            return order, new, s, e
    srt = ops.select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("row"), "pid", "tid", "start_us", "end_us"
    ).sort(
        ["pid", "tid", "start_us", "end_us"],
        descending=[False, False, False, True],
        nulls_last=True,
        maintain_order=True,
    )
    order = srt["row"].to_numpy()
    pid = srt["pid"].fill_null(-1).to_numpy()
    tid = srt["tid"].fill_null(-1).to_numpy()
    new = np.ones(n, dtype=bool)
    new[1:] = (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])
    return order, new, srt["start_us"].to_numpy(), srt["end_us"].to_numpy()


def _nest(
    new: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parent position, depth and root position of each interval (sorted by group, start, -end;
    ``new`` marks each group's first row).

    The answer of a stack walked in order (pop while the top ends at or before the start; the
    top left is the parent), without a Python loop. Ranges that nest (the usual case) take a
    linear-time path, :func:`_nest_forest`, whose answer is checked; the groups (pid, tid) it
    cannot vouch for (ranges that overlap without nesting, non-finite times) take
    :func:`_nest_lifting`, which handles any intervals. Returns parent positions (-1 for
    none), depths, roots.
    """
    n = len(start)
    if n == 0:
        return np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, np.int64)
    if n <= _WALK_ROWS:
        return _nest_walk(new, start, end)
    return _nest_vector(new, start, end)


# Up to this many ops the stack walk itself, in Python, is cheaper than the ~50 numpy calls
# of the vectorised paths.
_WALK_ROWS = 200


def _nest_walk(
    new: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_nest` as the stack walk it is defined by, in Python (for a few intervals)."""
    n = len(start)
    parent, depth, root = [-1] * n, [0] * n, list(range(n))
    stack: list[int] = []
    s, e = start.tolist(), end.tolist()
    for i, head in enumerate(new.tolist()):
        if head:
            stack = []
        while stack and e[stack[-1]] <= s[i]:
            stack.pop()
        if stack:
            parent[i], depth[i], root[i] = stack[-1], len(stack), stack[0]
        stack.append(i)
    return np.array(parent, np.int64), np.array(depth, np.int32), np.array(root, np.int64)


def _nest_vector(
    new: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_nest` without a Python loop (see there)."""
    parent, depth, root, bad = _nest_forest(new, start, end)
    if bad.any():
        rows = np.flatnonzero(bad[np.cumsum(new) - 1])
        p, d, r = _nest_lifting(new[rows], start[rows], end[rows])
        parent[rows] = np.where(p >= 0, rows[np.maximum(p, 0)], -1)
        depth[rows] = d
        root[rows] = rows[r]
    return parent, depth, root


def _nest_forest(
    new: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The stack walk's answer for groups whose ranges nest, and which groups it holds for.

    Within a group, the stack before interval i holds exactly the earlier intervals still open
    at its start when ranges nest, so depth[i] = (earlier intervals) - (earlier intervals
    ending at or before start[i]), and the parent is the last earlier interval one level up
    (the intervals in between are its descendants). The answer is then checked: each parent
    ends after its child starts and no earlier than the child ends, and the previous sibling
    ends at or before the child starts. With those, every interval between a parent and its
    child ends at or before the child's start, so the stack walk gives the same parent. A
    group failing any check is flagged (``bad``, one bool per group) and its rows are not to be
    used.

    The parent comes without a search: where depths never step up by more than one (checked),
    an interval one level below the one before it is a first child, whose parent is the one
    before it; the parent of any other is that of its first sibling, the last first child at
    its depth before it. In (depth, position) order, which one stable sort of the depths gives,
    that is a running maximum. Linear after a sort of each group's ends and one of the depths.
    """
    n = len(start)
    pos = np.arange(n)
    heads = np.flatnonzero(new)
    tails = np.r_[heads[1:], n]
    # first row of each row's group
    first: np.ndarray | int = np.repeat(heads, tails - heads) if len(heads) > 1 else 0
    # intervals of the group ending at or before start[i] (starts are sorted in a group)
    closed = np.empty(n, np.int64)
    for lo, hi in zip(heads, tails, strict=True):
        closed[lo:hi] = np.searchsorted(np.sort(end[lo:hi]), start[lo:hi], side="right")
    # less the ones not earlier than i: length-0 intervals at start[i] from i on (they sort
    # last among the intervals starting there)
    zero = end == start
    if zero.any():
        run_head = new.copy()
        run_head[1:] |= start[1:] != start[:-1]
        run = np.cumsum(run_head) - 1
        run_end = np.r_[np.flatnonzero(run_head)[1:], n][run]
        zeros_in_run = np.bincount(run, weights=zero)[run].astype(np.int64)
        closed -= np.where(zero, run_end - pos, zeros_in_run)
    depth = pos - first
    depth -= closed
    del closed
    bad_row = ~(np.isfinite(start) & np.isfinite(end)) | (depth < 0) | (new & (depth != 0))
    np.maximum(depth, 0, out=depth)
    # first children: one level below the row before (in the group); more is a step up
    first_child = np.zeros(n, dtype=bool)
    step = depth[1:] - depth[:-1]
    first_child[1:] = (step == 1) & ~new[1:]
    bad_row[1:] |= (step > 1) & ~new[1:]
    del step
    top = int(depth.max())
    small = depth.astype(np.int8 if top < 2**7 else np.int16 if top < 2**15 else np.int64)
    by_depth = np.argsort(small, kind="stable")
    d = small[by_depth]
    del small
    fc = first_child[by_depth]
    # each row's first sibling (the last first child at or before it, in (depth, position) order)
    k = np.maximum.accumulate(np.where(fc, pos, 0))
    sib0 = by_depth[k]
    has = (d > 0) & fc[k] & (d[k] == d)
    sorted_parent = np.where(has, sib0 - 1, -1)
    first_s = first[by_depth] if len(heads) > 1 else 0
    has &= sorted_parent >= first_s
    bad_row[by_depth[(d > 0) & ~has]] = True
    # the previous sibling (the row before in that order, not a first child) ends by the start
    start_s = start[by_depth]
    prev_end = end[by_depth[:-1]]
    sib = (d[1:] == d[:-1]) & ~fc[1:]
    if len(heads) > 1:
        sib &= by_depth[:-1] >= first_s[1:]
    bad_row[by_depth[1:][sib & ~(prev_end <= start_s[1:])]] = True
    parent = np.empty(n, np.int64)
    parent[by_depth] = np.where(has, sorted_parent, -1)
    has = parent >= 0
    pp = np.maximum(parent, 0)
    bad_row |= has & ~((end[pp] > start) & (end <= end[pp]))
    root = np.maximum.accumulate(np.where(depth == 0, pos, 0))
    bad = np.zeros(len(heads), dtype=bool)
    if bad_row.any():
        bad[np.cumsum(new)[bad_row] - 1] = True
    return parent, depth.astype(np.int32), root, bad


def _nest_lifting(
    new: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stack walk's answer for any intervals (``new`` marks each group's first row).

    The top left is always the last earlier interval of the group that ends after the start,
    found for all intervals at once by binary lifting over a sparse table of running maxima of
    ``end`` (O(n log n) time and memory). Depth and root then come from pointer jumping along
    the parents. Returns parent positions (-1 for none), depths, roots.
    """
    n = len(start)
    group = np.cumsum(new)
    # levels[k][j] = max(end[j : j + 2**k])
    levels = [end]
    while (1 << len(levels)) <= n:
        h = 1 << (len(levels) - 1)
        prev = levels[-1]
        levels.append(np.maximum(prev[:-h], prev[h:]))
    p = np.arange(n)  # exclusive bound: all of [p, i) end at or before start[i]
    for k in range(len(levels) - 1, -1, -1):
        cand = p - (1 << k)
        ok = cand >= 0
        skip = ok & (levels[k][np.where(ok, cand, 0)] <= start)
        p = np.where(skip, cand, p)
    del levels
    j = p - 1
    jj = np.maximum(j, 0)
    has = (j >= 0) & (group[jj] == group)
    parent = np.where(has, j, -1)
    up = np.where(has, j, np.arange(n))
    depth = has.astype(np.int32)
    while True:
        nxt = up[up]
        if np.array_equal(nxt, up):
            break
        depth = depth + depth[up]
        up = nxt
    return parent, depth, up


def extract_steps(annotations: pl.DataFrame, warnings: list[DataWarning]) -> pl.DataFrame:
    """One row per ``ProfilerStep#N`` host annotation: step, start_us, end_us, duration_us.

    Repeated step numbers keep the first; steps nested inside another step are dropped; both
    are reported as data-quality warnings.

    The step annotations are few (one per step): one polars filter finds them, and the rules
    run on their rows as arrays (the table's rows are sorted by start, stably, so equal starts
    keep table order). Times that are null or not finite take :func:`_extract_steps_polars`.
    """
    is_step = (annotations["category"] == "user_annotation") & starts_with(
        annotations["name"], "ProfilerStep#"
    )
    if is_step.null_count():
        is_step = is_step.fill_null(False)
    start, end = annotations["start_us"], annotations["end_us"]
    if start.null_count() or end.null_count():
        return _extract_steps_polars(annotations.filter(is_step), warnings)
    marked = np.flatnonzero(is_step.to_numpy())
    s_all, e_all = start.to_numpy()[marked], end.to_numpy()[marked]
    if not (np.isfinite(s_all).all() and np.isfinite(e_all).all()):
        return _extract_steps_polars(annotations.filter(is_step), warnings)
    names = annotations["name"][marked].to_list()
    numbers = [_step_number(x) for x in names]
    bad = [x for x, v in zip(names, numbers, strict=True) if v is None]
    if bad:
        _bad_step_warning(bad, warnings)
    rows = np.array([i for i, v in enumerate(numbers) if v is not None], np.int64)
    step = np.array([v for v in numbers if v is not None], np.int64)
    order = np.argsort(s_all[rows], kind="stable")
    rows, step = rows[order], step[order]
    if len(rows):
        # the first row of each step number (in start order)
        _, first = np.unique(step, return_index=True)
        if len(first) < len(rows):
            first.sort()
            _step_warning(warnings, "repeated_step", len(rows) - len(first))
            rows, step = rows[first], step[first]
        # Nested: a step that starts before the previous step's end and ends inside it.
        s, e = s_all[rows], e_all[rows]
        prev_end = np.maximum.accumulate(e)[:-1]
        nested = np.r_[False, (s[1:] < prev_end) & (e[1:] <= prev_end)]
        if nested.any():
            _step_warning(warnings, "nested_step", int(np.count_nonzero(nested)))
            rows, step, s, e = rows[~nested], step[~nested], s[~nested], e[~nested]
        # Overlapping: a step that starts before the previous one ends (and ends after it).
        over = s[1:] - e[:-1]
        if (over < 0).any():
            n_over = int(np.count_nonzero(over < 0))
            _step_warning(warnings, "overlapping_step", n_over, -float(over.min()))
    rows = marked[rows]
    return pl.DataFrame(
        [pl.Series("step", step, dtype=pl.Int64)]
        + [
            annotations[c][rows]
            for c in ("name", "pid", "tid", "start_us", "end_us", "duration_us")
        ]
    )


_STEP_FULL = re.compile(r"ProfilerStep#([0-9]{1,18})")


def _step_number(name: str) -> int | None:
    """The N of ``ProfilerStep#N`` (ASCII digits, at most 18), else None (the whole name must
    match, as polars' ``^...$`` does: no trailing newline)."""
    m = _STEP_FULL.fullmatch(name)
    return int(m[1]) if m else None


def _step_warning(warnings: list[DataWarning], rule: str, k: int, overlap_us: float = 0.0) -> None:
    """The data-quality warning of a step rule (``repeated_step``, ``nested_step``,
    ``overlapping_step``: by up to ``overlap_us``) that ``k`` step annotations broke."""
    msg = {
        "repeated_step": f"{k} ProfilerStep annotations repeat a step number; the first of each is kept",
        "nested_step": f"{k} ProfilerStep annotations lie inside another step and were ignored",
        "overlapping_step": f"{k} ProfilerStep annotation(s) start inside the previous step (by up to "
        f"{overlap_us / 1e3:.3f} ms): events in the overlap count in both steps",
    }[rule]
    warnings.append(DataWarning(rule, k, msg))


def _bad_step_warning(bad: list[str], warnings: list[DataWarning]) -> None:
    shown = ", ".join(repr(x) for x in list(dict.fromkeys(bad))[:3])
    warnings.append(
        DataWarning(
            "bad_step_number",
            len(bad),
            f"{len(bad)} ProfilerStep annotation(s) without a step number of ASCII digits "
            f"(at most 18) were skipped: {shown}",
        )
    )


def _extract_steps_polars(marked: pl.DataFrame, warnings: list[DataWarning]) -> pl.DataFrame:
    """:func:`extract_steps` of the step annotations ``marked``, as polars operations (for
    null or non-finite times, where polars' sort and running maximum rules apply)."""
    st = marked.with_columns(
        step=pl.col("name").str.extract(_STEP_NUMBER, 1).cast(pl.Int64, strict=False)
    )
    bad = st.filter(pl.col("step").is_null())
    if bad.height:
        _bad_step_warning(bad["name"].to_list(), warnings)
    st = (
        st.filter(pl.col("step").is_not_null())
        .select("step", "name", "pid", "tid", "start_us", "end_us", "duration_us")
        .sort("start_us")
    )
    if st.height == 0:
        return st
    n0 = st.height
    st = st.unique(subset="step", keep="first", maintain_order=True)
    if st.height < n0:
        _step_warning(warnings, "repeated_step", n0 - st.height)
    # Nested: a step that starts before the previous step's end and ends inside it.
    prev_end = st["end_us"].cum_max().shift(1)
    nested = (st["start_us"] < prev_end) & (st["end_us"] <= prev_end)
    nested = nested.fill_null(False)
    if nested.any():
        _step_warning(warnings, "nested_step", int(nested.sum()))
        st = st.filter(~nested)
    # Overlapping: a step that starts before the previous one ends (and ends after it).
    over = (st["start_us"] - st["end_us"].shift(1)).fill_null(0)
    if (over < 0).any():
        _step_warning(warnings, "overlapping_step", int((over < 0).sum()), -float(over.min()))
    return st.sort("start_us")


def step_windows(steps: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The step windows :func:`assign_step` places times in: (starts, ends, step numbers) as
    arrays sorted by start, the rows without a start or a number left out; None for none.
    Steps that are sorted by start already (:func:`extract_steps`' are) are not sorted again."""
    if steps.height == 0:
        return None
    start, number = steps["start_us"], steps["step"]
    if not (start.null_count() or number.null_count()):
        s = start.to_numpy()
        if (s[1:] >= s[:-1]).all():
            return s, steps["end_us"].to_numpy(), number.to_numpy()
    win = (
        steps.select("start_us", "end_us", "step").drop_nulls(["start_us", "step"]).sort("start_us")
    )
    if win.height == 0:
        return None
    return win["start_us"].to_numpy(), win["end_us"].to_numpy(), win["step"].to_numpy()


_STEPS = object()  # assign_step's windows: not given


def assign_step(
    df: pl.DataFrame, steps: pl.DataFrame, time_col: str, out: str = "step", windows=_STEPS
) -> pl.DataFrame:
    """Add column ``out``: the step whose [start_us, end_us) window holds ``time_col`` (null if none).

    Where windows overlap, the step that started last wins. ``steps`` are few (one row per
    ProfilerStep), so each time is placed by a binary search over the sorted step starts.
    ``windows``: :func:`step_windows` of ``steps`` when the caller has it (else computed).
    """
    win = step_windows(steps) if windows is _STEPS else windows
    if win is None or df.height == 0:
        return df.with_columns(pl.lit(None, pl.Int64).alias(out))
    starts, ends, numbers = win
    t = df[time_col]
    t = (t if t.dtype == pl.Float64 else t.cast(pl.Float64)).to_numpy()  # null -> nan: never inside
    i = np.searchsorted(starts, t, side="right") - 1
    j = np.maximum(i, 0)
    inside = (i >= 0) & (t < ends[j])
    col = pl.Series(out, np.ma.masked_array(numbers[j], ~inside), dtype=pl.Int64)
    return _with(df, [col])


def _with(df: pl.DataFrame, cols: list[pl.Series]) -> pl.DataFrame:
    """``df.with_columns(cols)`` (Series of its height): appended without polars' expression
    engine when none of the names is taken (a column of that name is replaced otherwise)."""
    if any(c.name in df.columns for c in cols):
        return df.with_columns(cols)
    return df.hstack(cols)


def link_launches_to_ops(
    launches: pl.DataFrame,
    ops: pl.DataFrame,
    index: pl.DataFrame | None = None,
    thread: tuple | None = None,
) -> tuple[pl.DataFrame, int]:
    """Add ``op_id`` to launches: by External id, else innermost op on the thread holding the launch.

    ``index``: :func:`external_id_index` of ``ops`` when the caller has it (else computed);
    ``thread``: :func:`thread_order` of ``ops`` likewise (:func:`op_tree` gives it).
    Returns (launches, number linked by time containment).
    """
    if launches.height == 0:
        return launches.with_columns(op_id=pl.lit(None, pl.Int64)), 0
    if index is None:
        index = external_id_index(ops)
    # An External id that several ops share (a corrupt or reused id) does not say which op
    # launched: the op holding the launch in time does, else the first op of the id.
    row = _find(index["external_id"], launches["external_id"])
    ext_first = _take(index["first_op_id"].to_numpy(), row)
    op = np.where(_take(index["n_ops"].to_numpy(), row) == 1, ext_first, -1)
    missing = np.flatnonzero(op < 0)
    by_time = 0
    if len(missing) and ops.height:
        time_op = _holding_op(launches, ops, missing, thread)
        op[missing] = np.where(time_op >= 0, time_op, ext_first[missing])
        by_time = int(np.count_nonzero(time_op >= 0))
    return _with(launches, [_with_nulls(op).alias("op_id")]), by_time


def _find(keys: pl.Series, queries: pl.Series) -> np.ndarray:
    """For each query, the first row of ``keys`` equal to it, -1 for none; a null matches
    nothing (:func:`find_rows` over the integer ids)."""
    (k, k_null), (q, q_null) = _ids(keys, 0), _ids(queries, 0)
    rows = find_rows(k, q, valid=None if k_null is None else ~k_null)
    if q_null is not None:
        rows[q_null] = -1
    return rows


def find_rows(
    keys: np.ndarray, queries: np.ndarray, *, valid: np.ndarray | None = None
) -> np.ndarray:
    """For each of ``queries`` (shape (m,)), the first row of ``keys`` (shape (n,)) equal to
    it, -1 for none: an int64 array of shape (m,). Rows of ``keys`` where ``valid`` (bool,
    shape (n,)) is False, and NaN in float keys or queries, match nothing. A binary search over
    ``keys`` sorted stably (no sort when they are strictly increasing: row numbers, op ids).
    Ids are compared as given: floats are exact for ids under 2**53."""
    keys, queries = np.asarray(keys), np.asarray(queries)
    if len(keys) < 2 or np.all(keys[1:] > keys[:-1]):
        order = np.arange(len(keys))
    else:
        order = np.argsort(keys, kind="stable")
    if valid is not None:
        order = order[valid[order]]
    if keys.dtype.kind == "f":
        order = order[~np.isnan(keys[order])]
    if len(order) == 0:
        return np.full(len(queries), -1, np.int64)
    k = keys[order]
    i = np.minimum(np.searchsorted(k, queries), len(k) - 1)
    return np.where(k[i] == queries, order[i], -1)  # NaN equals nothing


def _ints(s: pl.Series, fill: int) -> np.ndarray:
    """An integer Series as an array, nulls as ``fill`` (no copy when it has no nulls)."""
    return _ids(s, fill)[0]


def _take(values: np.ndarray, row: np.ndarray) -> np.ndarray:
    """``values[row]`` as int64, -1 where ``row`` is -1 (``values`` may be unsigned, e.g. a
    polars count: NumPy 2.5 refuses to put -1 beside a uint32 in ``np.where``)."""
    if len(values) == 0:
        return np.full(len(row), -1, np.int64)
    return np.where(row >= 0, values.astype(np.int64, copy=False)[np.maximum(row, 0)], -1)


# Up to this many rows a few numpy passes beat a polars call (its fixed cost is ~30-60 us).
_NUMPY_ROWS = 100_000


def _ids(s: pl.Series, fill: int = -1) -> tuple[np.ndarray, np.ndarray | None]:
    """An integer column as (its values with nulls as ``fill``, where it is null or None for
    nowhere). Polars gives an integer column with nulls as float64 with NaN: read back as
    int64 when every value is under 2**53 (exact in float64), else (and for long columns,
    where polars' threads win over numpy's passes) by two polars calls."""
    if not s.null_count():
        return s.to_numpy(), None
    if len(s) > _NUMPY_ROWS:
        return s.fill_null(fill).to_numpy(), s.is_null().to_numpy()
    f = s.to_numpy()
    if f.dtype.kind == "f" and s.dtype.is_integer() and abs(fill) < 2**53:
        null = np.isnan(f)
        v = np.where(null, fill, f)
        if np.abs(v).max() < 2**53:
            return v.astype(np.int64), null
    return s.fill_null(fill).to_numpy(), s.is_null().to_numpy()


def _holding_op(
    launches: pl.DataFrame, ops: pl.DataFrame, rows: np.ndarray, thread: tuple | None = None
) -> np.ndarray:
    """The op_id of the innermost op on the (pid, tid) of each launch of ``rows`` whose
    [start, end) holds the launch's start, -1 for none (or a null pid or tid): the op that
    started last at or before it (the shorter one on a tie), then up its parents until one
    still runs at the launch. ``thread``: :func:`thread_order` of ``ops`` (else computed)."""
    order, new, start, _ = thread_order(ops) if thread is None else thread
    # the rows of one (pid, tid) are contiguous in that order: a group of thread_order's, cut
    # where an id turns null (it reads a null as -1)
    (op_pid, pid_null), (op_tid, tid_null) = _ids(ops["pid"]), _ids(ops["tid"])
    if order is not None:
        op_pid, op_tid = op_pid[order], op_tid[order]
        pid_null = None if pid_null is None else pid_null[order]
        tid_null = None if tid_null is None else tid_null[order]
    null = np.zeros(len(new), bool)
    for n in (pid_null, tid_null):
        if n is not None:
            new = new.copy()
            new[1:] |= n[1:] != n[:-1]
            null |= n
    heads = np.flatnonzero(new)
    bounds = np.r_[heads, len(new)]
    # the groups with both ids, and the launches' group among them (-1 for none)
    g = np.flatnonzero(~null[heads])
    g_pid, g_tid = op_pid[heads[g]], op_tid[heads[g]]
    (l_pid, l_pnull), (l_tid, l_tnull) = _ids(launches["pid"]), _ids(launches["tid"])
    l_pid, l_tid = l_pid[rows], l_tid[rows]
    pids, tids = np.unique(g_pid), np.unique(g_tid)
    pc = np.minimum(np.searchsorted(pids, l_pid), max(len(pids) - 1, 0))
    tc = np.minimum(np.searchsorted(tids, l_tid), max(len(tids) - 1, 0))
    ok = np.ones(len(rows), bool)
    for n in (l_pnull, l_tnull):
        if n is not None:
            ok &= ~n[rows]
    if len(g):
        ok &= (pids[pc] == l_pid) & (tids[tc] == l_tid)
        code = np.searchsorted(pids, g_pid) * len(tids) + np.searchsorted(tids, g_tid)
        group = np.where(ok, find_rows(code, pc * len(tids) + tc), -1)
    else:
        group = np.full(len(rows), -1, np.int64)
    sorted_ids = ops["op_id"].to_numpy()
    if order is not None:
        sorted_ids = sorted_ids[order]
    t = launches["start_us"].to_numpy()[rows]
    oid = np.full(len(t), -1, np.int64)
    by_group = np.argsort(group, kind="stable")
    cut = np.flatnonzero(np.r_[True, group[by_group][1:] != group[by_group][:-1]])
    for lo_i, hi_i in zip(cut, np.r_[cut[1:], len(t)], strict=True):
        k = group[by_group[lo_i]]
        if k < 0:
            continue
        i = by_group[lo_i:hi_i]
        lo, hi = bounds[g[k]], bounds[g[k] + 1]
        j = np.searchsorted(start[lo:hi], t[i], side="right") - 1
        oid[i] = np.where(j >= 0, sorted_ids[lo + np.maximum(j, 0)], -1)
    # walk up from the op that started last until one still runs at the launch
    op_ids = ops["op_id"].to_numpy()
    size = int(op_ids.max()) + 1
    parent_of = np.full(size, -1, dtype=np.int64)
    parent_of[op_ids] = _ids(ops["parent_id"])[0]
    end_of = np.full(size, np.nan)
    end_of[op_ids] = ops["end_us"].to_numpy()
    live = np.flatnonzero(oid >= 0)
    while len(live):
        up = end_of[oid[live]] <= t[live]  # [start, end): an op ending at t is over
        live = live[up]
        oid[live] = parent_of[oid[live]]
        live = live[oid[live] >= 0]
    return oid


def _with_nulls(a: np.ndarray) -> pl.Series:
    """An Int64 Series of ``a``, null where it is negative."""
    return pl.Series(np.ma.masked_array(a, a < 0), dtype=pl.Int64)


def external_id_index(ops: pl.DataFrame) -> pl.DataFrame:
    """One row per External id that ops carry, by id: ``external_id``, ``first_op_id`` (the
    first op in table order carrying it), ``n_ops`` (how many do: each op should have its own,
    so more than 1 is a reused id). One stable sort of the ids (they come in a few ascending
    runs, one per thread)."""
    ext, op_id = ops["external_id"], ops["op_id"]
    if ext.null_count():
        has = ext.is_not_null()
        ext, op_id = ext.filter(has), op_id.filter(has)
    e = ext.to_numpy()
    order = np.argsort(e, kind="stable")
    e = e[order]
    head = np.flatnonzero(np.r_[True, e[1:] != e[:-1]]) if len(e) else np.empty(0, np.int64)
    return pl.DataFrame(
        [
            pl.Series("external_id", e[head], dtype=pl.Int64),
            pl.Series("first_op_id", op_id.to_numpy()[order[head]], dtype=pl.Int64),
            pl.Series("n_ops", np.diff(np.r_[head, len(e)]), dtype=pl.UInt32),
        ]
    )


_LAUNCH_COLS = {
    "correlation": "correlation",
    "name": "launch_name",
    "pid": "launch_pid",
    "tid": "launch_tid",
    "start_us": "launch_start_us",
    "duration_us": "launch_duration_us",
    "op_id": "op_id",
    "step": "step",
}


def launch_table(launches: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """What :func:`link_gpu_tables` adds to a GPU event, one row per correlation id of
    ``launches``."""
    if launches["correlation"].null_count():
        launches = launches.filter(launches["correlation"].is_not_null())
    info = pl.DataFrame([launches[c].alias(a) for c, a in _LAUNCH_COLS.items()])
    op_id = ops["op_id"]
    if (
        ops.height
        and not op_id.null_count()
        and np.array_equal(op_id.to_numpy(), np.arange(ops.height))
    ):
        # op_id is the row number (op_tree's): look the names up by position
        top = ops["top_op_id"].gather(info["op_id"])
        return info.hstack(
            [
                ops["name"].gather(info["op_id"]).alias("op_name"),
                top.alias("top_op_id"),
                ops["name"].gather(top).alias("top_op_name"),
            ]
        )
    names = ops.select("op_id", pl.col("name").alias("op_name"), "top_op_id")
    tops = ops.select(pl.col("op_id").alias("top_op_id"), pl.col("name").alias("top_op_name"))
    return info.join(names, on="op_id", how="left", maintain_order="left").join(
        tops, on="top_op_id", how="left", maintain_order="left"
    )


def link_gpu_tables(tables: list[pl.DataFrame], launch_info: pl.DataFrame) -> list[pl.DataFrame]:
    """Add launch and op columns to each GPU table (kernels, memcpys, memsets, syncs) by
    correlation id.

    ``launch_info`` is :func:`launch_table` (one row per correlation id). Adds
    ``launch_name``, ``launch_pid``, ``launch_tid``, ``launch_start_us``,
    ``launch_duration_us``, ``op_id``, ``step`` (the launch's step), ``op_name``,
    ``top_op_id``, ``top_op_name``: null where no launch has the event's correlation id. The
    left join by correlation id, as lookups: the GPU tables' own columns are not copied, and
    the rows of ``launch_info`` are gathered once for all of them (a gather of a frame costs
    the same for 10 rows as for 10,000).
    """
    corr = [t["correlation"] for t in tables if t.height]
    if corr:  # one search for the events of all the tables
        at = _find(launch_info["correlation"], corr[0] if len(corr) == 1 else pl.concat(corr))
    else:
        at = np.empty(0, np.int64)
    cols = launch_info.columns[1:]
    if len(at) and (at >= 0).all():
        rows = launch_info[cols][at]
    else:  # a null row for each event without a launch
        rows = launch_info.select(pl.col(cols).gather(_with_nulls(at)))
    out, lo = [], 0
    for t in tables:
        part = rows.slice(lo, t.height)
        lo += t.height
        out.append(_with(t, part.get_columns()))
    return out
