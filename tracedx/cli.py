"""The `tracedx` command line: thin click commands over the library.

Exit codes: 0 success; 2 unusable input (one line on stderr, never a traceback).
"""

from __future__ import annotations

import sys

import click

from tracedx import __version__
from tracedx.errors import TraceError


class _Group(click.Group):
    """Turns TraceError into one line on stderr and exit status 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TraceError as e:
            click.echo(f"tracedx: error: {e}", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("tracedx: interrupted", err=True)
            ctx.exit(130)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="tracedx")
def main() -> None:
    """Diagnose PyTorch GPU programs from torch.profiler traces."""


@main.command()
@click.argument("trace_path", metavar="TRACE")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "md"]),
    default="text",
    show_default=True,
    help="Report format.",
)
@click.option(
    "--device", "device_name", default=None, help="GPU to take peaks for (overrides the trace's)."
)
@click.option(
    "--peak-tflops",
    type=float,
    default=None,
    help="Override the peak dense TFLOP/s of the op's dtype.",
)
@click.option(
    "--bandwidth-gbs",
    type=float,
    default=None,
    help="Override the device memory bandwidth in GB/s.",
)
@click.option(
    "--calibration",
    type=click.Path(dir_okay=False),
    default=None,
    help="A file written by `tracedx calibrate` (preferred over the datasheet).",
)
@click.option("--steps", "steps", default=None, metavar="N..M", help="Analyse only steps N to M.")
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write a self-contained HTML report here.",
)
@click.option("--repair", is_flag=True, help="Salvage a broken trace (truncated, NaN, bad bytes).")
def diagnose(
    trace_path, fmt, device_name, peak_tflops, bandwidth_gbs, calibration, steps, html_path, repair
):
    """Where the time goes, what binds it, and what each fix is worth."""
    from tracedx.analysis.diagnosis import diagnose as run_diagnosis
    from tracedx.report import render
    from tracedx.trace import load

    trace = load(trace_path, repair=repair)
    diag = run_diagnosis(
        trace,
        device=device_name,
        peak_tflops=peak_tflops,
        bandwidth_gbs=bandwidth_gbs,
        calibration=calibration,
        steps=steps,
    )
    click.echo(render(diag, fmt), nl=False)
    if html_path:
        from tracedx.report.html import write_html

        write_html(diag, html_path)
        click.echo(f"wrote {html_path}", err=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
