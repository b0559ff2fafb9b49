"""Issue 7: every unusable input -> exit 2 and ONE line on stderr saying what and where.

The inputs are the small files in ``tests/data/bad/`` (see the README there), plus a missing
path and a directory. Each is run twice: in-process through click's CliRunner, and as a real
``python -m tracedx.cli`` subprocess (what a user sees, traceback included if one escaped).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracedx.cli import main

BAD = Path(__file__).resolve().parent / "data" / "bad"


def _offset(name: str, token: bytes) -> int:
    return (BAD / name).read_bytes().index(token)


# (path, words the message must hold: what is wrong and where)
def cases() -> list[tuple[str, Path, list[str]]]:
    return [
        ("missing", BAD / "does_not_exist.json", ["no such file"]),
        ("directory", BAD, ["directory"]),
        ("empty", BAD / "empty.json", ["empty", "0 bytes"]),
        # no JSON at all, and no `traceEvents` for --repair to find: no --repair hint
        ("not-json", BAD / "not_json.json", ["not a trace: not JSON (it starts with `<!DOCTYPE"]),
        # the file is 90 bytes, cut inside the first event
        ("truncated", BAD / "truncated.json", ["truncated", "90 bytes"]),
        (
            "cut-gzip",
            BAD / "cut.json.gz",
            ["truncated gzip", "`--repair` (repair=True in Python) loads"],
        ),
        ("no-traceEvents", BAD / "no_trace_events.json", ["traceEvents"]),
        # a JSON array of other objects (a results list) is not the legacy array format
        ("array-not-events", BAD / "not_events.json", ["not a chrome trace", "2 objects", "`ph`"]),
        (
            "non-utf8",
            BAD / "non_utf8.json",
            ["UTF-8", "0xFF", f"byte {_offset('non_utf8.json', bytes([0xFF]))}", "line 2"],
        ),
        ("nan", BAD / "nan.json", ["NaN", f"byte {_offset('nan.json', b'NaN')}", "line 2"]),
        (
            "infinity",
            BAD / "infinity.json",
            ["Infinity", f"byte {_offset('infinity.json', b'Infinity')}", "line 2"],
        ),
        ("top-level-number", BAD / "number.json", ["chrome trace", "int"]),
        ("top-level-string", BAD / "string.json", ["chrome trace", "str"]),
    ]


CASES = cases()
IDS = [c[0] for c in CASES]
# `diagnose` takes a directory as a job's traces: every file in this one is unreadable
DIAGNOSE_CASES = [
    (n, p, ["none of the", "traces could be read"] if n == "directory" else w) for n, p, w in CASES
]


def check_one_line(stderr: str, path: Path, words: list[str]) -> None:
    assert "Traceback" not in stderr
    lines = stderr.strip("\n").split("\n")
    assert len(lines) == 1, stderr
    line = lines[0]
    assert line.startswith("tracedx: error: "), line
    assert str(path) in line, line  # names the file
    for w in words:
        assert w in line, (w, line)


@pytest.mark.parametrize("name,path,words", DIAGNOSE_CASES, ids=IDS)
def test_bad_input_in_process(name, path, words):
    r = CliRunner().invoke(main, ["diagnose", str(path)])
    assert isinstance(r.exception, SystemExit) and r.exit_code == 2, (r.exception, r.output)
    assert r.stdout == ""  # no partial report
    check_one_line(r.stderr, path, words)


@pytest.mark.parametrize("name,path,words", DIAGNOSE_CASES, ids=IDS)
def test_bad_input_subprocess(name, path, words):
    r = subprocess.run(
        [sys.executable, "-m", "tracedx.cli", "diagnose", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    check_one_line(r.stderr, path, words)


@pytest.mark.parametrize("fmt", ["text", "json", "md"])
def test_format_does_not_change_the_error(fmt):
    p = BAD / "nan.json"
    r = CliRunner().invoke(main, ["diagnose", str(p), "--format", fmt])
    assert r.exit_code == 2 and r.stdout == ""
    check_one_line(r.stderr, p, ["NaN"])


@pytest.mark.parametrize("name,path,words", CASES, ids=IDS)
def test_bad_input_with_repair_answers_or_exits_2(name, path, words):
    """Salvage mode may recover a trace (exit 0, repairs listed) or still refuse (exit 2)."""
    r = CliRunner().invoke(main, ["diagnose", "--repair", str(path)])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code in (0, 2), r.stderr
    assert "Traceback" not in r.output + r.stderr
    if r.exit_code == 2:
        assert len(r.stderr.strip().split("\n")) == 1 and r.stderr.startswith("tracedx: error:")
    else:
        assert "repaired" in r.stdout


def test_repair_refusal_names_the_file():
    p = BAD / "not_json.json"
    r = CliRunner().invoke(main, ["diagnose", "--repair", str(p)])
    assert r.exit_code == 2
    check_one_line(r.stderr, p, [])


def test_utf8_bom_is_accepted_or_named(tmp_path):
    p = tmp_path / "bom.json"
    body = (BAD.parent / "tiny.json").read_bytes()
    p.write_bytes(b"\xef\xbb\xbf" + body)
    r = CliRunner().invoke(main, ["diagnose", str(p)])
    assert r.exit_code == 0 or "BOM" in r.stderr or "byte-order" in r.stderr, r.stderr


def test_valid_tiny_trace_exits_0():
    """The control: the same kernel as the bad files, written correctly."""
    p = BAD.parent / "tiny.json"
    r = CliRunner().invoke(main, ["diagnose", str(p)])
    assert r.exit_code == 0, r.stderr
    # one 40 us kernel, no ProfilerStep: one synthetic step of 40 us, busy 100 %
    assert "no ProfilerStep markers" in r.stdout
    assert "GPU busy       0.040 ms" in r.stdout


def test_bad_option_is_a_usage_error_not_a_traceback():
    r = CliRunner().invoke(main, ["diagnose", str(BAD.parent / "tiny.json"), "--steps", "x..y"])
    assert r.exit_code == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().split("\n")) == 1


def test_steps_outside_the_trace_exit_2():
    r = CliRunner().invoke(main, ["diagnose", str(BAD.parent / "tiny.json"), "--steps", "5..9"])
    assert r.exit_code == 2 and "no such steps" in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["diagnose", "{tiny}", "--html", "{bad}"],
        ["report", "{tiny}", "-o", "{bad}"],
    ],
    ids=["diagnose--html", "report-o"],
)
def test_unwritable_html_path_exits_2(args, tmp_path):
    bad = tmp_path / "no_such_dir" / "r.html"
    argv = [a.format(tiny=BAD.parent / "tiny.json", bad=bad) for a in args]
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 2, (r.exception, r.stderr)
    assert r.stderr.strip().split("\n")[-1] == (
        f"tracedx: error: cannot write the HTML report to {bad}: No such file or directory"
    )


def test_internal_error_is_one_line_exit_1(monkeypatch):
    """A bug in tracedx is never a traceback either: one line, exit 1, TRACEDX_DEBUG re-raises."""
    import tracedx.analysis.diagnosis as dx

    def boom(*a, **k):
        raise ValueError("multi\nline\nmessage")

    monkeypatch.setattr(dx, "diagnose", boom)
    monkeypatch.delenv("TRACEDX_DEBUG", raising=False)
    r = CliRunner().invoke(main, ["diagnose", str(BAD.parent / "tiny.json")])
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith("tracedx: internal error: ValueError: multi line message")
    monkeypatch.setenv("TRACEDX_DEBUG", "1")
    r = CliRunner().invoke(main, ["diagnose", str(BAD.parent / "tiny.json")])
    assert isinstance(r.exception, ValueError)


class PanicException(BaseException):
    """Stands for pyo3's PanicException (a BaseException), what a Rust panic in polars raises."""


@pytest.mark.parametrize(
    "message, code, line",
    [
        # Ctrl-C while polars called back into Python: the interrupt is in the panic's message
        (
            "called `Result::unwrap()` on an `Err` value: PyErr { type: <class "
            "'KeyboardInterrupt'>, value: KeyboardInterrupt() }",
            130,
            "tracedx: interrupted",
        ),
        ("index out of bounds", 1, "tracedx: internal error: PanicException: index out of"),
    ],
)
def test_a_polars_panic_is_an_interrupt_or_one_line(monkeypatch, message, code, line):
    import tracedx.analysis.diagnosis as dx

    def boom(*a, **k):
        raise PanicException(message)

    monkeypatch.setattr(dx, "diagnose", boom)
    monkeypatch.delenv("TRACEDX_DEBUG", raising=False)
    r = CliRunner().invoke(main, ["diagnose", str(BAD.parent / "tiny.json"), "--no-cache"])
    assert r.exit_code == code, r.output
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith(line), r.stderr


@pytest.mark.parametrize("name,path,words", CASES, ids=IDS)
def test_bad_input_to_report_and_diff_exits_2(name, path, words, tmp_path):
    """The other commands that read traces refuse the same inputs the same way."""
    tiny = str(BAD.parent / "tiny.json")
    for argv in (
        ["report", str(path), "-o", str(tmp_path / "r.html")],
        ["diff", str(path), tiny],
        ["diff", tiny, str(path)],
    ):
        r = CliRunner().invoke(main, argv)
        assert r.exit_code == 2, (argv, r.exception, r.stderr)
        check_one_line(r.stderr, path, words)


def test_an_unwritable_html_path_is_refused_before_the_trace_is_read(tmp_path):
    # the report is not printed first: the path is checked before anything is read
    target = tmp_path / "nodir" / "sub" / "x.html"
    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "elementwise-eager.json.gz"
    for args in (["diagnose", str(sample)], ["diff", str(sample), str(sample)]):
        r = CliRunner().invoke(main, [*args, "--html", str(target)])
        assert r.exit_code == 2, r.output
        assert r.stdout == "", r.stdout
        assert r.stderr.strip().splitlines() == [
            f"tracedx: error: cannot write the HTML report to {target}: No such file or directory"
        ]


TINY = BAD.parent / "tiny.json"


@pytest.mark.parametrize(
    "args,line",
    [
        (
            ["diagnose", "--nope", "x"],
            "No such option '--nope'. Did you mean '--no-cache'? (see 'tracedx diagnose --help')",
        ),
        (["diagnose"], "Missing argument 'TRACE...' (see 'tracedx diagnose --help')"),
        (
            ["diagnose", "--format", "xml", str(TINY)],
            "Invalid value for '--format': 'xml' is not one of 'text', 'json', 'md', "
            "'markdown' "
            "(see 'tracedx diagnose --help')",
        ),
        (["nosuchcmd"], "No such command 'nosuchcmd' (see 'tracedx --help')"),
        (["--nope"], "No such option '--nope' (see 'tracedx --help')"),
        (["diff", str(TINY)], "Missing argument 'AFTER' (see 'tracedx diff --help')"),
    ],
    ids=["unknown-option", "missing-argument", "bad-choice", "no-command", "group-option", "diff"],
)
def test_a_usage_error_is_one_line_exit_2(args, line):
    """click's usage block (Usage / Try / blank / Error) is one line, for every command."""
    r = CliRunner().invoke(main, args, prog_name="tracedx")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr == f"tracedx: error: {line}\n"


def test_a_usage_error_is_one_line_in_a_real_process():
    r = subprocess.run(
        [sys.executable, "-m", "tracedx", "diagnose", "--format", "xml", str(TINY)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (
        "tracedx: error: Invalid value for '--format': 'xml' is not one of 'text', 'json', 'md', "
        "'markdown' "
        "(see 'tracedx diagnose --help')\n"
    )


def test_help_and_no_command_still_print_the_help():
    r = CliRunner().invoke(main, ["diagnose", "--help"], prog_name="tracedx")
    assert r.exit_code == 0 and r.stdout.startswith("Usage: tracedx diagnose [OPTIONS] TRACE...")
    r = CliRunner().invoke(main, [], prog_name="tracedx")
    assert r.exit_code == 2 and r.stderr.startswith("Usage: tracedx [OPTIONS] COMMAND [ARGS]...")
    assert "\nCommands:\n" in r.stderr


@pytest.mark.parametrize(
    "content,what",
    [
        (None, "a chrome trace"),
        ("{}", 'a JSON object with no "schema" key'),
        ('{"schema": "tracedx.diagnosis/1"}', "a JSON object with schema 'tracedx.diagnosis/1'"),
    ],
    ids=["a-trace", "empty-object", "another-schema"],
)
def test_a_json_file_that_is_not_a_calibration_file_says_what_was_expected(content, what, tmp_path):
    cal = TINY if content is None else tmp_path / "cal.json"
    if content is not None:
        cal.write_text(content)
    r = CliRunner().invoke(main, ["diagnose", str(TINY), "--calibration", str(cal)])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr == (
        f"tracedx: error: calibration file {str(cal)!r} is {what}, not a calibration file "
        "(expected schema 'tracedx.calibration/1', as `tracedx calibrate` writes)\n"
    )


def test_plain_json_named_gz_is_read_with_a_note(tmp_path):
    gz = tmp_path / "renamed.json.gz"
    gz.write_bytes(TINY.read_bytes())
    r = CliRunner().invoke(main, ["diagnose", "--no-cache", str(gz)])
    assert r.exit_code == 0, r.stderr
    assert "GPU busy       0.040 ms" in r.stdout  # the same answer as tiny.json's
    # one note (fitted to stderr's width: continuation lines indented)
    assert r.stderr.startswith("tracedx: ") and "\ntracedx" not in r.stderr
    assert " ".join(r.stderr.split()) == (
        f"tracedx: {gz} is not gzip-compressed (named .gz): it was read as plain JSON"
    )


def test_bytes_named_gz_that_are_neither_gzip_nor_json_say_so(tmp_path):
    gz = tmp_path / "noise.json.gz"
    gz.write_bytes(bytes([0x06, 0xE7, 0xFF, 0x74, 0xC2, 0x22, 0xF1, 0x8A]) * 40)
    r = CliRunner().invoke(main, ["diagnose", str(gz)])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr == (
        f"tracedx: error: {gz}: named .gz but is not gzip (it does not start with the gzip "
        "bytes 1f 8b) nor JSON: it starts with 06 e7 ff 74 c2 22 f1 8a\n"
    )
    r = CliRunner().invoke(main, ["diagnose", "--repair", str(gz)])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr == (  # nothing to repair: what it is not, not "nothing to salvage"
        f"tracedx: error: {gz}: not a trace: a binary file, not JSON (it starts with 06 e7 ff "
        "74 c2 22 f1 8a)\n"
    )


def test_a_file_that_is_no_json_says_what_it_is_not_and_suggests_no_repair(tmp_path):
    """No JSON at all and no `traceEvents` array: --repair reads nothing of it, so the error
    does not suggest it; it says what the file is not."""
    cases = {
        "page.json": (b"<!DOCTYPE html><html><body>404</body></html>", "not JSON (it starts "
                      "with `<!DOCTYPE html><html`)"),
        "notes.json": (b"  \n hello\nworld\n", "not JSON (it starts with `hello world`)"),
        "image.json": (b"\x89PNG\r\n\x1a\n" + bytes(24), "a binary file, not JSON (it "
                       "starts with 89 50 4e 47 0d 0a 1a 0a)"),
        "elf.json": (b"\x7fELF\x02\x01\x01\x00" + b"\xd0" * 24, "a binary file, not JSON (it "
                     "starts with 7f 45 4c 46 02 01 01 00)"),
    }  # fmt: skip
    for name, (body, what) in cases.items():
        p = tmp_path / name
        p.write_bytes(body)
        for repair in ([], ["--repair"]):  # the same words with --repair: nothing to repair
            r = CliRunner().invoke(main, ["diagnose", "--no-cache", *repair, str(p)])
            assert r.exit_code == 2 and r.stdout == ""
            assert r.stderr == f"tracedx: error: {p}: not a trace: {what}\n", (name, repair)
    # a gzip stream cut before any JSON: nothing to salvage, with or without --repair
    gz = tmp_path / "head.json.gz"
    gz.write_bytes(gzip.compress(TINY.read_bytes())[:12])
    for repair in ([], ["--repair"]):
        r = CliRunner().invoke(main, ["diagnose", "--no-cache", *repair, str(gz)])
        assert r.exit_code == 2 and r.stderr == (
            f"tracedx: error: {gz}: truncated gzip: the compressed stream ends early (after 12 "
            "compressed bytes, 0 bytes of JSON); the file was cut short\n"
        )
    # junk before a `traceEvents` array: --repair keeps its events, so the hint stays
    p = tmp_path / "logged.json"
    p.write_bytes(b"junk " + (BAD.parent / "tiny.json").read_bytes())
    r = CliRunner().invoke(main, ["diagnose", str(p)])
    assert r.exit_code == 2 and r.stderr.startswith(
        f"tracedx: error: {p}: not valid JSON at line 1, column 1 (byte 0), near `junk "
    )
    assert r.stderr.endswith("; `--repair` (repair=True in Python) loads what can be salvaged\n")
    assert CliRunner().invoke(main, ["diagnose", "--no-cache", "--repair", str(p)]).exit_code == 0


def test_repair_still_salvages_plain_json_named_gz_behind_a_log_line(tmp_path):
    """--repair skips junk before the JSON whether or not the file is named .gz."""
    gz = tmp_path / "logged.json.gz"
    gz.write_bytes(b"WARNING: log line\n" + TINY.read_bytes())
    r = CliRunner().invoke(
        main, ["diagnose", "--no-cache", "--repair", "--format", "json", str(gz)]
    )
    assert r.exit_code == 0, r.stderr
    ref = CliRunner().invoke(main, ["diagnose", "--no-cache", "--format", "json", str(TINY)])
    assert json.loads(r.stdout)["per_device"] == json.loads(ref.stdout)["per_device"]


def test_a_usage_error_without_click_context_points_at_the_subcommand_help():
    r = CliRunner().invoke(main, ["diagnose", "--steps"], prog_name="tracedx")
    assert r.exit_code == 2 and r.stderr == (
        "tracedx: error: Option '--steps' requires an argument (see 'tracedx diagnose --help')\n"
    )


def test_a_usage_error_escapes_what_the_user_typed():
    r = CliRunner().invoke(main, ["diagnose", "--\x1b[31mred"], prog_name="tracedx")
    assert r.exit_code == 2 and "\x1b" not in r.stderr and "\\x1b[31mred" in r.stderr


def test_format_markdown_is_md():
    """``--format markdown`` is the markdown report ``--format md`` prints."""
    md = CliRunner().invoke(main, ["diagnose", "--no-cache", "--format", "md", str(TINY)])
    long = CliRunner().invoke(main, ["diagnose", "--no-cache", "--format", "markdown", str(TINY)])
    assert md.exit_code == 0 and long.exit_code == 0
    assert long.stdout == md.stdout and md.stdout.startswith("# tracedx diagnosis")


def test_repair_is_suggested_only_where_it_salvages_something(tmp_path):
    """A truncated legacy array and NUL bytes after no `traceEvents` key: --repair can read
    nothing of them (its salvage needs the key; a legacy array only whole), so no hint; NUL
    bytes after the key and some events: the hint, and --repair reads them."""
    hint = "; `--repair` (repair=True in Python) loads what can be salvaged"
    ev = b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2}'
    cases = {
        "legacy-cut.json": (b"[" + ev + b", " + ev[:30], False),
        "head-zeros.json": (b'{"schemaVersion": 1, ' + bytes(4096), False),
        "events-zeros.json": (b'{"traceEvents": [' + ev + b", " + ev + b", " + bytes(4096), True),
    }
    for name, (body, hinted) in cases.items():
        p = tmp_path / name
        p.write_bytes(body)
        r = CliRunner().invoke(main, ["diagnose", "--no-cache", str(p)])
        assert r.exit_code == 2 and r.stderr.startswith(f"tracedx: error: {p}: "), name
        assert r.stderr.endswith(hint + "\n") == hinted, (name, r.stderr)
        fixed = CliRunner().invoke(main, ["diagnose", "--no-cache", "--repair", str(p)])
        assert (fixed.exit_code == 0) == hinted, (name, fixed.stderr)
