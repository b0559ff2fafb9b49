"""The `tracedx` command line: thin click commands over the library.

Exit codes: 0 success; 2 unusable input (one line on stderr, never a traceback); 1 an
internal error (a tracedx bug: one line on stderr; ``TRACEDX_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys

import click

from tracedx import __version__
from tracedx.alloc import release_promptly
from tracedx.console import columns, fit, plural
from tracedx.errors import TraceError
from tracedx.report.safe import term

# The longest error line printed on stderr (a message quotes paths and bytes of the trace).
_ERROR_CHARS = 1000


HELP_MAX_WIDTH = 120
"""``--help`` uses the terminal's width up to this many columns (prose wider than that reads
poorly); 100 when stdout is not a terminal."""


def _say(message: str, error: bool = False) -> None:
    """One message on stderr, escaped (paths and trace text may hold control characters) and
    fitted to stderr's width (:func:`tracedx.console.columns`): continuation lines are
    indented, so the first line is the only one that starts with ``tracedx``. An ``error``
    (exit 2, an internal error, or a gate's FAIL line: exit 1) is fitted only on a terminal:
    elsewhere (a CI log, ``2>&1 | grep``) it stays the one line that the exit codes promise."""
    text = term(message, _ERROR_CHARS)
    if not error or _isatty(sys.stderr):
        text = fit(text, columns(sys.stderr))
    click.echo(text, err=True)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


_NOTES: list[str] = []
"""Notes for stderr printed once the command has answered (the cache's), and not at all when
it fails, so an error stays one line."""

_CACHE_USED: list[tuple[str, str]] = []
"""What the command took from the cache: ``("diagnosis" | "tables", trace path)``, said in one
note however many traces it read."""


def _cache_note() -> str | None:
    """The one note saying what came from the cache (None when nothing did)."""
    if not _CACHE_USED:
        return None
    from tracedx.cache import cache_dir

    parts, paths = [], []
    for what, verb in (("diagnosis", "reused"), ("tables", "using")):
        mine = list(dict.fromkeys(p for w, p in _CACHE_USED if w == what))
        if mine:
            parts.append(f"{verb} the cached {what} of {' and '.join(mine)}")
            paths += mine
    files = "files" if len(set(paths)) > 1 else "file"
    return f"{'; '.join(parts)} (in {cache_dir()}; --no-cache reads the {files})"


_QUIET = "tracedx.quiet"
"""The key in click's ``Context.meta`` (shared by a command and its group) that ``--quiet``
sets: no progress bar, and the notes are not printed."""


def _quiet() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.meta.get(_QUIET))


def _set_quiet(ctx: click.Context, _param, value: bool) -> None:
    if value:
        ctx.meta[_QUIET] = True


_quiet_option = click.option(
    "--quiet", "-q", is_flag=True, expose_value=False, callback=_set_quiet,
    help="No progress bar, and no notes on stderr (files written, what came from the cache, "
    "its upkeep); errors and FAIL lines still print.",
)  # fmt: skip


def _note(message: str) -> None:
    """An informational line on stderr (a file written), left out under ``--quiet``."""
    if not _quiet():
        _say(message)


def _flush_notes() -> None:
    note = _cache_note()
    if not _quiet():
        for msg in [note] + _NOTES if note else _NOTES:
            _say(f"tracedx: {msg}")
    _NOTES.clear()
    _CACHE_USED.clear()


class _Group(click.Group):
    """Turns TraceError into one message on stderr and exit status 2; help fits the terminal."""

    def make_context(self, info_name, args, parent=None, **extra):
        if parent is None:  # subcommands' contexts inherit the widths
            width = min(columns(sys.stdout), HELP_MAX_WIDTH)
            extra.setdefault("terminal_width", width)
            extra.setdefault("max_content_width", width)
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as e:  # the group's own options, or no such command
            _usage_error(e)

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        if name != "capture":  # capture runs the user's program: its allocator is its own
            release_promptly()
        return name, cmd, rest

    def invoke(self, ctx: click.Context):
        _NOTES.clear()
        _CACHE_USED.clear()
        try:
            out = super().invoke(ctx)
            _flush_notes()
            return out
        except click.exceptions.Exit:
            _flush_notes()
            raise
        except TraceError as e:
            _say(f"tracedx: error: {e}", error=True)
            ctx.exit(e.exit_code)
        except BrokenPipeError:
            # the reader of our output went away (`| head`): not an error of ours
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            ctx.exit(0)
        except KeyboardInterrupt:
            _say("tracedx: interrupted")
            ctx.exit(130)
        except click.UsageError as e:  # a subcommand's: unknown option, missing argument, ...
            sub = ctx.invoked_subcommand
            _usage_error(e, f"{ctx.command_path} {sub}" if sub else None)
        except (click.exceptions.ClickException, click.exceptions.Abort):
            raise
        except Exception as e:  # a bug in tracedx: still one line, never a traceback
            _internal_error(ctx, e)
        except BaseException as e:
            # a Rust panic inside polars is pyo3's PanicException, a BaseException; Ctrl-C
            # landing while polars calls back into Python panics there (the KeyboardInterrupt
            # is in the panic's message) instead of raising KeyboardInterrupt
            if type(e).__name__ != "PanicException":
                raise
            if "KeyboardInterrupt" in str(e):
                _say("tracedx: interrupted")
                ctx.exit(130)
            _internal_error(ctx, e)


def _usage_error(e: click.UsageError, sub: str | None = None) -> None:
    """A usage error (unknown option, missing argument, bad choice) as one line on stderr,
    exit 2, instead of click's usage block; ``tracedx`` with no command still prints the help."""
    if isinstance(e, click.exceptions.NoArgsIsHelpError):
        raise e
    where = e.ctx.command_path if e.ctx else sub or "tracedx"
    _say(f"tracedx: error: {e.format_message().rstrip('.')} (see '{where} --help')", error=True)
    raise click.exceptions.Exit(e.exit_code)


def _internal_error(ctx: click.Context, e: BaseException) -> None:
    """One line for a bug in tracedx (exit 1); ``TRACEDX_DEBUG`` re-raises it."""
    if os.environ.get("TRACEDX_DEBUG"):
        raise e
    msg = term(" ".join(str(e).split()), 300)
    _say(
        f"tracedx: internal error: {type(e).__name__}: {msg} (a tracedx bug; please "
        "report it with the trace; TRACEDX_DEBUG=1 shows the traceback)",
        error=True,
    )
    ctx.exit(1)


def _check_html_path(path) -> None:
    """Refuse an ``--html`` path that cannot be written before any trace is read (exit 2)."""
    if not path:
        return
    parent = os.path.dirname(os.fspath(path)) or "."
    if not os.path.isdir(parent):  # (a directory as the path is click's usage error)
        raise TraceError(f"cannot write the HTML report to {path}: No such file or directory")
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise TraceError(f"cannot write the HTML report to {path}: Permission denied")


def _write_html(diag, path, write=None) -> None:
    """Write the HTML report (``write(obj, path)``, the diagnosis report by default); an
    unwritable path is the user's input error (exit 2), not a bug."""
    from tracedx.report.html import write_html

    try:
        (write or write_html)(diag, path)
    except OSError as e:
        raise TraceError(f"cannot write the HTML report to {path}: {e.strerror or e}") from None


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="tracedx")
def main() -> None:
    """Diagnose PyTorch GPU programs from torch.profiler traces."""


_format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "md", "markdown"]),
    default="text",
    show_default=True,
    callback=lambda ctx, param, value: "md" if value == "markdown" else value,
    help="Report format (md and markdown are the same).",
)


_no_cache_option = click.option(
    "--no-cache",
    is_flag=True,
    help="Read the trace file and diagnose it even when the cache holds its tables and "
    "diagnosis ($TRACEDX_CACHE_DIR, else $XDG_CACHE_HOME/tracedx, else ~/.cache/tracedx; kept under 5 GiB, or "
    "$TRACEDX_CACHE_MAX_MB); nor store them.",
)


def _one_trace(path: str, expects: str, instead: str) -> None:
    """Raise a TraceError saying what the command ``expects`` and what to run ``instead`` when
    ``path`` is a directory or an unmatched glob (a job's traces), not a trace file."""
    if os.path.isdir(path):
        what = "a directory"
    elif any(c in path for c in "*?[") and not os.path.exists(path):
        what = "a pattern"
    else:
        return
    raise TraceError(f"{path} is {what}; {expects} ({instead})")


def _load(path, repair, no_cache, status=None):
    """Load a trace, through the cache of loaded traces unless ``no_cache``; the cache's notes
    go to stderr."""
    progress = status.reading(path) if status else None
    _note_misnamed(path)
    if no_cache:
        from tracedx.trace import load

        return load(path, repair=repair, progress=progress)
    from tracedx import cache

    trace, hit = cache.load(path, repair=repair, progress=progress, on_note=_NOTES.append)
    if hit:
        _CACHE_USED.append(("tables", str(path)))
    return trace


def _note_misnamed(path) -> None:
    """The note (stderr, after the answer) that a ``.gz`` file held plain JSON."""
    from tracedx.files import misnamed_gzip

    note = f"{path} is not gzip-compressed (named .gz): it was read as plain JSON"
    if misnamed_gzip(path) and note not in _NOTES:
        _NOTES.append(note)


def _analysis_options(f):
    """The options every command that diagnoses a trace takes (device peaks, steps, repair)."""
    options = [
        click.option(
            "--device",
            "device_name",
            default=None,
            metavar="NAME",
            help="GPU to take peaks for (overrides the trace's).",
        ),
        click.option(
            "--peak-tflops",
            type=float,
            default=None,
            metavar="TFLOPS",
            help="Override the peak dense TFLOP/s (used for every dtype).",
        ),
        click.option(
            "--bandwidth-gbs",
            type=float,
            default=None,
            metavar="GBS",
            help="Override the device memory bandwidth in GB/s.",
        ),
        click.option(
            "--calibration",
            # checked by tracedx.files (one line, exit 2), not by click (a usage block)
            default=None,
            metavar="FILE",
            help="A file written by `tracedx calibrate` (preferred over the datasheet).",
        ),
        click.option(
            "--steps", "steps", default=None, metavar="N..M", help="Analyse only steps N to M."
        ),
        click.option(
            "--repair", is_flag=True, help="Salvage a broken trace (truncated, NaN, bad bytes)."
        ),
        _no_cache_option,
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


PROGRESS_AFTER_S = 2.0
"""The progress bar shows only once reading and diagnosing have taken this long."""


class _Progress:
    """A rich progress bar on stderr (bytes of the trace read, then the stage), shown only when
    stderr is a terminal and only after :data:`PROGRESS_AFTER_S`, so quick runs print nothing."""

    def __init__(self, enabled: bool, after_s: float = PROGRESS_AFTER_S, console=None):
        self.enabled, self.shown = enabled, False
        self._bar = self._task = self._timer = None
        if not enabled:
            return
        import threading
        from datetime import timedelta

        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.text import Text

        # rich stops the spinner and the clock of a finished task, and the read is finished once
        # its bytes are in; the command is not: both go on through the later stages
        class Spinner(SpinnerColumn):
            def render(self, task):
                return self.spinner.render(task.get_time())

        class Elapsed(TimeElapsedColumn):
            def render(self, task):
                return Text(str(timedelta(seconds=int(task.elapsed or 0))), "progress.elapsed")

        self._bar = Progress(
            Spinner(), TextColumn("{task.description}"), BarColumn(BAR_COLUMNS), DownloadColumn(),
            Elapsed(), console=console or Console(stderr=True), transient=True,
        )  # fmt: skip
        self._task = self._bar.add_task("starting", total=None)
        self._timer = threading.Timer(after_s, self._show)
        self._timer.daemon = True
        self._timer.start()

    def _show(self) -> None:
        self.shown = True
        self._bar.start()

    def reading(self, path):
        """The ``progress`` callback for :func:`tracedx.load` of ``path`` (None when off)."""
        if not self.enabled:
            return None
        import os

        total = os.path.getsize(path) if os.path.isfile(path) else None
        self._bar.update(
            self._task, description=self._label(f"reading {path}"), total=total, completed=0
        )
        return lambda n: self._bar.update(self._task, completed=n)

    def update(self, message: str) -> None:
        if self.enabled:
            self._bar.update(self._task, description=self._label(message))

    def close(self) -> None:
        if self.enabled:
            self._timer.cancel()
            self._bar.stop()

    def _label(self, message: str) -> str:
        """The bar's text, shortened to what the line leaves it (:func:`_label`)."""
        return _label(message, self._bar.console.width - _OTHER_COLUMNS)


BAR_COLUMNS = 20
"""The bar's own width in the progress line."""
_OTHER_COLUMNS = BAR_COLUMNS + 32
"""What the line's other columns take: spinner, bytes read (``0.6/1.1 GB``), elapsed time and
the spaces between them."""


def _label(message: str, width: int = 200) -> str:
    """A progress bar's text: escaped (paths may hold control characters), literal (rich
    markup such as ``[red]`` in a path stays as written) and at most ``width`` characters (at
    least 20), a long path cut at its start: ``reading …-bf16-cl-1000MB.json`` keeps the stage
    and the file name's end, so the line fits an 80-column terminal."""
    from rich.markup import escape

    text = term(message, 200)
    width = max(width, 20)
    if len(text) > width:
        verb, _, rest = text.partition(" ")
        head = verb + " " if rest and len(verb) < width // 2 else ""
        text = head + "…" + text[len(text) - (width - len(head) - 1) :]
    return escape(text)


@contextlib.contextmanager
def _spinner(message: str):
    """A :class:`_Progress` while a command reads and diagnoses (``message`` is its first
    stage), off when stderr is not a terminal or under ``--quiet``."""
    bar = _Progress(sys.stderr.isatty() and not _quiet())
    bar.update(message)
    try:
        yield bar
    finally:
        bar.close()


def _width() -> int:
    """The text report's width: the terminal's when stdout is one, else 100 columns."""
    return columns(sys.stdout)


def _load_and_diagnose(
    trace_path,
    device_name,
    peak_tflops,
    bandwidth_gbs,
    calibration,
    steps,
    repair,
    no_cache,
    status=None,
    document=False,
):
    """The Diagnosis of one trace file. Unless ``no_cache``, through the cache
    (:mod:`tracedx.cache`): a diagnosis made before with the same analysis options is reused
    (with ``document``, as its ``tracedx.diagnosis/1`` dict, which the text, json and md
    reports render from without loading polars); else the tables (cached, or read) are
    diagnosed and the result stored for the next run."""
    options = {
        "device": device_name,
        "peak_tflops": peak_tflops,
        "bandwidth_gbs": bandwidth_gbs,
        "calibration": calibration,
        "steps": steps,
    }
    key = None
    if not no_cache and os.path.isfile(trace_path):
        from tracedx import cache

        key = cache.result_key(trace_path, options)
        try:
            before = cache.entry_path(trace_path, repair=repair)  # the file as it is now
        except OSError:
            before, key = None, None
        if not key:
            hit = None
        elif document:
            hit = cache.read_result_doc(trace_path, key, repair=repair)
        else:
            hit = cache.read_result(trace_path, key, repair=repair, on_note=_NOTES.append)
        if hit is not None:
            _note_misnamed(trace_path)
            _CACHE_USED.append(("diagnosis", str(trace_path)))
            return hit
    trace = _load(trace_path, repair, no_cache, status)
    if status:
        status.update("diagnosing")
    from tracedx.analysis.diagnosis import diagnose as run_diagnosis

    diag = run_diagnosis(trace, **options)
    if key:
        with contextlib.suppress(OSError):  # the tables' note already says the cache is unwritable
            cache.write_result(trace_path, key, diag.to_dict(), diag, repair=repair, entry=before)
    return diag


@main.command()
@click.argument("trace_paths", metavar="TRACE...", nargs=-1, required=True)
@_format_option
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write a self-contained HTML report here.",
)
@click.option(
    "--max-step-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="MS",
    help="Exit 1 when the median step (unprofiled when timed, else traced) is over MS.",
)
@_analysis_options
@click.option(
    "--scheduler",
    default=None,
    metavar="tcp://HOST:PORT",
    help="Summarise a job's ranks on this Dask cluster (pip install 'tracedx[dask]').",
)
@click.option(
    "--summaries",
    "summaries_dir",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="Keep each rank's summary here; a later run reuses them for unchanged traces.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Local worker processes for a job (default: from free memory, trace sizes, CPUs).",
)
@_quiet_option
def diagnose(
    trace_paths, fmt, html_path, max_step_ms, scheduler, summaries_dir, workers, **analysis
):
    """Where the time goes, what binds it, and what each fix is worth.

    TRACE is one trace file, or a job's traces: several files, a directory (searched
    recursively for *.json and *.json.gz) or a quoted glob. One file gets the single-rank
    diagnosis; several get the job diagnosis (ranks matched, stragglers, waiting split from
    transfer). A job's ranks are summarised in parallel: local worker processes by default,
    or a Dask cluster with --scheduler; --summaries DIR keeps the summaries for the next run.

    Exit status: 0; 1 when --max-step-ms is exceeded (one trace); 2 for unusable input.
    """
    from tracedx.job.discover import expand_inputs

    _check_html_path(html_path)
    files = expand_inputs(trace_paths)
    if len(files) > 1:
        if max_step_ms is not None:
            raise TraceError("--max-step-ms checks one trace, not a job's traces")
        analysis.pop("no_cache")  # a job reads its ranks' summaries (--summaries), not this cache
        where = {"client": scheduler, "summaries_dir": summaries_dir, "workers": workers}
        _diagnose_job(files, fmt, html_path, analysis, where)
        return
    from tracedx.report import render

    with _spinner(f"reading {files[0]}") as status:
        # a cached result comes back as its document (a dict), which the report renders from
        diag = _load_and_diagnose(files[0], **analysis, status=status, document=True)
        if isinstance(diag, dict) and (html_path or max_step_ms is not None):
            doc, diag = diag, _load_and_diagnose(files[0], **analysis, status=status)
        else:
            doc = diag
    click.echo(render(doc, fmt, width=_width()), nl=False)
    if html_path:
        _write_html(diag, html_path)
        _note(f"tracedx: wrote {html_path}")
    if max_step_ms is not None:
        st = diag.step_time
        if st["ms"] is None:
            raise TraceError("cannot check --max-step-ms: the trace has no step time")
        if st["ms"] > max_step_ms:
            over = st["ms"] - max_step_ms
            _say(
                f"tracedx: FAIL: the {st['basis']} median step is {st['ms']:.3f} ms, "
                f"{over:.3f} ms ({100 * over / max_step_ms:.1f}%) over --max-step-ms {max_step_ms:g}",
                error=True,
            )
            click.get_current_context().exit(1)


def _load_job(files, options: dict, where: dict | None = None):
    """``load_job`` of a job's expanded ``files`` (no progress bar under ``--quiet``); traces
    that could not be read are left out and said in one note on stderr after the answer."""
    from tracedx.job.load import load_job

    job = load_job(files, progress=False if _quiet() else None, **(where or {}), **options)
    if job.unreadable:
        _NOTES.append(_unreadable_note(job.unreadable, len(files), len(job.summaries)))
    return job


def _unreadable_note(unreadable: list[tuple[str, str]], n_files: int, n_ranks: int) -> str:
    """``1 of 2 rank traces could not be read (rank1.json.gz: truncated gzip); ...``: the
    first file's name and the head of its reason (the job report's NOTES have it whole)."""
    path, reason = unreadable[0]
    reason = re.split(r": | \(|; ", reason, maxsplit=1)[0]
    more = f" and {len(unreadable) - 1} more" if len(unreadable) > 1 else ""
    return (
        f"{len(unreadable)} of {n_files} rank traces could not be read "
        f"({os.path.basename(path) or path}: {reason}{more}); diagnosed from {plural(n_ranks, 'rank')}"
    )


def _diagnose_job(files, fmt, html_path, analysis, where) -> None:
    """The job report of several traces (text, json or md)."""
    from tracedx.job.diagnosis import diagnose_job

    jd = diagnose_job(_load_job(files, _job_options(analysis), where))
    if fmt == "text":
        from tracedx.report.job import render_text

        click.echo(render_text(jd, _width()), nl=False)  # like one trace's report
    else:
        click.echo({"json": jd.to_json, "md": jd.to_markdown}[fmt](), nl=False)
    if html_path:
        from tracedx.report.job_html import write_job_html

        _write_html(jd, html_path, write_job_html)
        _note(f"tracedx: wrote {html_path}")


def _job_options(analysis: dict) -> dict:
    """The analysis options as :func:`tracedx.job.load.load_job` takes them."""
    options = {k: v for k, v in analysis.items() if v not in (None, False)}
    if "device_name" in options:  # summarize_path's name for it
        options["device"] = options.pop("device_name")
    return options


@main.command(
    context_settings={"ignore_unknown_options": False, "allow_interspersed_args": True},
)
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT ARGS]")
@click.option(
    "--out",
    "out_dir",
    default="traces",
    show_default=True,
    metavar="DIR",
    help="Folder for the trace (<script>-<time>.json.gz).",
)
@click.option(
    "--steps", type=int, default=5, show_default=True, metavar="N", help="Active steps to record."
)
@click.option(
    "--warmup",
    type=int,
    default=1,
    show_default=True,
    metavar="N",
    help="Steps with the profiler warming up before recording.",
)
@click.option(
    "--wait",
    type=int,
    default=1,
    show_default=True,
    metavar="N",
    help="Steps to skip first (the first step, setup included, is never recorded).",
)
@click.option("--with-stack", is_flag=True, help="Record Python stacks (file and line of ops).")
@click.option(
    "--time-unprofiled",
    type=int,
    default=0,
    metavar="K",
    help="Also time K steps without the profiler (a first run of the script).",
)
@click.option(
    "--marker",
    type=click.Choice(["auto", "optimizer", "explicit"]),
    default="auto",
    show_default=True,
    help="Step source: optimizer.step(), tracedx.step() (explicit), or auto (explicit wins).",
)
@click.option(
    "--profile-memory",
    is_flag=True,
    help="Record allocator events ([memory]): peak memory per step and larger-batch headroom.",
)
@click.option(
    "--fallback-seconds",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    metavar="S",
    help="Until the active window (or for the whole run of a script without step markers), "
    "record at most S seconds, and stop once the process has grown by 2 GiB; what was recorded "
    "is written (0: no time limit).",
)
@click.option("--diagnose", "then_diagnose", is_flag=True, help="Diagnose the trace once written.")
def capture(
    script,
    script_args,
    out_dir,
    steps,
    warmup,
    wait,
    with_stack,
    time_unprofiled,
    marker,
    profile_memory,
    fallback_seconds,
    then_diagnose,
):
    """Run SCRIPT like `python SCRIPT args` under torch.profiler and write its trace.

    Put the script's own arguments after `--`. Steps are counted at each optimizer.step()
    or tracedx.step(). Exits with the script's exit status (1 when it succeeded but no trace
    was written); 2, before the script runs, when --out cannot hold the trace.
    """
    from tracedx.capture import Schedule, capture_script

    result = capture_script(
        script,
        list(script_args),
        out_dir=out_dir,
        schedule=Schedule(wait=wait, warmup=warmup, active=steps),
        with_stack=with_stack,
        time_unprofiled=time_unprofiled,
        marker=marker,
        profile_memory=profile_memory,
        fallback_seconds=fallback_seconds,
    )
    if then_diagnose and result.path is not None:
        try:
            main(["diagnose", str(result.path)], standalone_mode=False)
        except TraceError as e:
            _say(f"tracedx: error: {e}", error=True)
        except Exception as e:  # diagnosis problems never hide the capture's own status
            _say(f"tracedx: diagnose failed: {e}", error=True)
    click.get_current_context().exit(result.exit_code)


@main.command()
@click.option(
    "--out",
    "out_file",
    default="calibration.json",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="File for the measured ceilings (JSON).",
)
@click.option("--quick", is_flag=True, help="Fewer repeats (a rough figure in seconds).")
def calibrate(out_file, quick):
    """Measure this GPU's real ceilings: copy bandwidth, matmul TFLOP/s, launch cost."""
    from tracedx.calibrate import run_calibration

    run_calibration(out_file, quick=quick)
    click.echo(term(out_file))


@main.command()
@click.argument("trace_path", metavar="TRACE")
@click.option(
    "-o",
    "--output",
    "out_path",
    type=click.Path(dir_okay=False),
    default="report.html",
    show_default=True,
    help="The HTML file to write.",
)
@_analysis_options
@_quiet_option
def report(trace_path, out_path, **analysis):
    """Write a self-contained HTML report (verdict, roofline, timeline, fixes) of TRACE.

    TRACE is one trace file; for a job's traces, `tracedx diagnose DIR --html FILE`.
    """
    _one_trace(
        trace_path,
        "tracedx report takes one trace file",
        f"for a job's traces: `tracedx diagnose {trace_path} --html {out_path}`",
    )
    with _spinner(f"reading {trace_path}") as status:
        diag = _load_and_diagnose(trace_path, **analysis, status=status)
        status.update(f"writing {out_path}")
        _write_html(diag, out_path)
    _note(f"tracedx: wrote {out_path}")


@main.command()
@click.argument("trace_paths", metavar="TRACE...", nargs=-1, required=True)
@click.option(
    "-o",
    "--output",
    "out_path",
    default=None,
    metavar="PATH",
    help="The annotated trace to write (gzip when it ends in .gz) [default: annotated.json.gz]; "
    "for a job's traces, the folder for one annotated trace per rank [default: annotated].",
)
@_analysis_options
@_quiet_option
def annotate(trace_paths, out_path, **analysis):
    """Write TRACE with what tracedx found laid on its timeline, for the Perfetto UI.

    Extra tracks hold the steps and their verdict, idle gaps by cause, host syncs with their
    Python line and fusable chains; the original events are kept as they are.

    Several traces (files, a directory or a quoted glob) are a job: each rank's trace is
    written to the -o folder, with its waits inside collectives on a track of its own.
    """
    from tracedx.job.discover import expand_inputs
    from tracedx.report import perfetto

    files = expand_inputs(trace_paths)
    if len(files) > 1:
        if out_path and out_path.lower().endswith((".json", ".gz")):
            raise TraceError(
                f"-o {out_path} names a trace file, but the {len(files)} traces are a job: "
                "annotate writes one trace per rank into a folder (-o DIR)"
            )
        from tracedx.job.diagnosis import diagnose_job

        options = _job_options(analysis)  # summarize_path and diagnose take the same ones
        jd = diagnose_job(_load_job(files, options))
        done = perfetto.annotate_job(jd, out_path or "annotated", **options)
    else:
        out = out_path or "annotated.json.gz"
        if os.path.exists(out) and os.path.samefile(out, files[0]):
            raise TraceError(f"{out}: is the trace being annotated; write the copy elsewhere (-o)")
        with _spinner(f"reading {files[0]}") as status:
            diag = _load_and_diagnose(files[0], **analysis, repair=False, status=status)
            done = [perfetto.annotate(files[0], out, diag)]
    for res in done:
        _note(
            f"tracedx: wrote {res.path}: {res.original_events} original events, "
            f"{res.added_events} added (open it in the Perfetto UI)"
        )


# annotate copies the original events, so it reads only clean traces: no --repair
annotate.params = [p for p in annotate.params if p.name != "repair"]


@main.command("diff")
@click.argument("before_path", metavar="BEFORE")
@click.argument("after_path", metavar="AFTER")
@_format_option
@click.option(
    "--fix",
    "fix",
    default=None,
    metavar="ID",
    help="The fix AFTER applied (a fix id such as cuda-graphs; several joined by commas when "
    "AFTER applied them all); inferred when omitted.",
)
@click.option("--repair", is_flag=True, help="Salvage broken traces (truncated, NaN, bad bytes).")
@_no_cache_option
@click.option(
    "--fail-if-slower",
    "fail_pct",
    type=click.FloatRange(min=0),
    default=None,
    metavar="PCT",
    help="Exit 1 when AFTER's median step (unprofiled when both were timed, else traced) is "
    "more than PCT percent slower than BEFORE's.",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write an HTML report here (BEFORE and AFTER side by side, estimate vs achieved).",
)
@_quiet_option
def diff_command(before_path, after_path, fmt, fix, repair, html_path, no_cache, fail_pct):
    """Re-measure: BEFORE against AFTER, and the fix's estimate against what it achieved.

    BEFORE and AFTER are two trace files of one program, before and after a fix; BEFORE's
    Amdahl estimate for the fix (given by --fix, else inferred) is checked against the
    measured speedup.

    Exit status: 0; 1 when --fail-if-slower is exceeded; 2 for unusable input.
    """
    _check_html_path(html_path)
    for path in (before_path, after_path):
        _one_trace(
            path,
            "tracedx diff compares two trace files",
            f"for a job's traces: `tracedx diagnose {path}`",
        )
    from tracedx.analysis.diff import diff as run_diff
    from tracedx.report.diff_report import render as render_diff

    with _spinner(f"reading {before_path}") as status:
        before = _load(before_path, repair, no_cache, status)
        after = _load(after_path, repair, no_cache, status)
        if status:
            status.update("comparing")
        td = run_diff(before, after, fix=fix)
    click.echo(render_diff(td, fmt, width=_width()), nl=False)
    if html_path:
        from tracedx.report.diff_html import write_diff_html

        _write_html(td, html_path, write_diff_html)
        _note(f"tracedx: wrote {html_path}")
    if fail_pct is not None:
        c = td.step_change
        if c["basis"] is None:
            raise TraceError("cannot check --fail-if-slower: a side has no step time")
        if c["slower_pct"] > fail_pct:
            _say(f"tracedx: FAIL: {c['summary']}, over --fail-if-slower {fail_pct:g}%", error=True)
            click.get_current_context().exit(1)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
