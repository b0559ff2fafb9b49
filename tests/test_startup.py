"""Start-up stays light: `tracedx --help`, argument errors and `import tracedx` load neither
polars, numpy nor plotly (nor torch); they load with the first command or name that needs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("polars", "numpy", "plotly", "torch", "pyarrow", "rich")

PROBE = """
import json, sys
{setup}
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def _loaded(setup: str) -> list[str]:
    code = PROBE.format(setup=setup, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_tracedx_is_light():
    assert _loaded("import tracedx") == []
    assert _loaded("import tracedx, tracedx.cli; dir(tracedx); tracedx.__version__") == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["diagnose", "--help"],
        ["diff", "--help"],
        ["diagnose"],  # missing argument: click's usage error, exit 2
        ["diagnose", "t.json", "--format", "xml"],  # a bad choice: usage error, exit 2
        ["diagnose", "t.json", "--max-step-ms", "-1"],
        ["--version"],
    ],
)
def test_cli_help_and_argument_errors_are_light(argv):
    setup = (
        "from tracedx.cli import main\n"
        "try:\n"
        f"    main({argv!r}, standalone_mode=True)\n"
        "except SystemExit:\n"
        "    pass\n"
    )
    assert _loaded(setup) == []


def test_lazy_names_still_resolve():
    # the lazy table gives the same objects as the modules
    import tracedx
    from tracedx.trace import Trace, load

    assert tracedx.load is load and tracedx.Trace is Trace
    assert _loaded("import tracedx; tracedx.load") == ["numpy", "polars"]
