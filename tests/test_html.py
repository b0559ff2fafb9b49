"""The HTML report and the notebook figures.

Browser tests start Debian's headless Chromium themselves and drive it over the DevTools
protocol (``websocket-client``): the page must load with no console error, no uncaught
exception and no CSP or network error, and the four figures must be drawn. They skip, saying
why, where Chromium or websocket-client is missing (CI installs both: see .ci/run).
"""

from __future__ import annotations

import contextlib
import gzip
import html
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import plotly.graph_objects as go
import pytest
from click.testing import CliRunner

import tracedx
from tests.conftest import PUBLIC, SAMPLES
from tracedx.analysis.diagnosis import diagnose
from tracedx.cli import main
from tracedx.report.html import render_html, script_json, write_html
from tracedx.report.text import short_name

T0 = 5_000_000
XSS_KERNEL = "<script>alert(1)</script>"
XSS_OP = '"><img src=x onerror=alert(1)>'
LONG_KERNEL = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
    "launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar)::{lambda()#1}"
    "::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, std::array<char*, 2ul>)"
)


# ---------------------------------------------------------------------------------------------
# a small hand-made trace: 3 steps of mm -> elementwise -> .item() sync
# ---------------------------------------------------------------------------------------------


def make_trace(
    path: Path,
    *,
    gemm_kernel: str = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
    elementwise_op: str = "aten::relu",
    elementwise_kernel: str = LONG_KERNEL,
    device_name: str = "NVIDIA H100 80GB HBM3",
    steps: int = 3,
) -> Path:
    """Write a Kineto-shaped trace (times in us) and return its path."""
    ev: list[dict] = []
    pid, tid = 4242, 4242
    corr = 100

    def x(cat, name, ts, dur, p=pid, t=tid, **args):
        ev.append(
            {"ph": "X", "cat": cat, "name": name, "pid": p, "tid": t, "ts": ts, "dur": dur,
             "args": args}
        )  # fmt: skip

    def launched(op, shapes, dtypes, ts, kernel, k_ts, k_dur, ext, api="cudaLaunchKernel"):
        nonlocal corr
        corr += 1
        x("cpu_op", op, ts, 30, **{"External id": ext, "Input Dims": shapes, "Input type": dtypes})
        x("cuda_runtime", api, ts + 5, 10, **{"External id": ext, "correlation": corr})
        x("kernel", kernel, k_ts, k_dur, p=0, t=7,
          **{"External id": ext, "device": 0, "stream": 7, "correlation": corr,
             "grid": [1024, 1, 1], "block": [256, 1, 1]})  # fmt: skip

    for i in range(steps):
        t = T0 + i * 1000
        x("user_annotation", f"ProfilerStep#{i + 1}", t, 900, **{"External id": 1000 + i})
        launched("aten::mm", [[4096, 4096], [4096, 4096]], ["c10::BFloat16"] * 2, t + 10,
                 gemm_kernel, t + 40, 300, 10 * i + 1)  # fmt: skip
        launched(elementwise_op, [[4096, 4096]], ["c10::BFloat16"], t + 60, elementwise_kernel,
                 t + 345, 40, 10 * i + 2)  # fmt: skip
        x("cpu_op", "aten::item", t + 100, 700, **{"External id": 10 * i + 3})
        x("cuda_runtime", "cudaStreamSynchronize", t + 110, 680, **{"External id": 10 * i + 3})
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": device_name, "computeMajor": 9, "numSms": 132}],
        "traceEvents": ev,
    }
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    return make_trace(tmp_path_factory.mktemp("html") / "small.json")


def real_trace(tmp_path_factory) -> Path:
    """A real H200 sample trace when present, else a public trace, else the hand-made one."""
    preferred = SAMPLES / "mlp_train-eager.json.gz"  # the README's example trace
    if preferred.exists():
        return preferred
    samples = sorted(SAMPLES.glob("*.json.gz"), key=lambda p: p.stat().st_size)
    if samples:
        return samples[0]
    public = PUBLIC / "hta" / "trace_diff__control__control.json.gz"
    if public.exists():
        return public
    return make_trace(tmp_path_factory.mktemp("real") / "fallback.json")


# ---------------------------------------------------------------------------------------------
# without a browser
# ---------------------------------------------------------------------------------------------


def test_figures_are_plotly_figures_with_dicts(small):
    figs = diagnose(tracedx.load(small)).figures()
    assert list(figs) == ["roofline", "timeline", "breakdown", "fixes"]
    for name, fig in figs.items():
        assert isinstance(fig, go.Figure), name
        d = fig.to_dict()
        assert d["data"], f"{name} has no traces"
        json.dumps(fig.to_plotly_json(), default=str)


def test_roofline_draws_roofs_ridge_and_points(small):
    from tracedx.report.figures import roofline_figure

    diag = diagnose(tracedx.load(small))
    fig = roofline_figure(diag)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    names = [t.name for t in fig.data]
    assert any(n and n.startswith("memory") for n in names)
    assert any(n and n.startswith("bf16") for n in names)
    ridge = diag.device.ridge_point("bf16")
    assert any(list(t.x) == [ridge] for t in fig.data if t.mode == "markers")
    gemm = next(t for t in fig.data if t.name == "gemm")
    row = diag.op_table.filter(diag.op_table["name"] == "aten::mm").row(0, named=True)
    assert gemm.x[0] == pytest.approx(row["intensity"])
    assert gemm.y[0] == pytest.approx(row["achieved_tflops"] * 1e12)  # FLOP/s
    assert "of its roofline bound" in gemm.hovertext[0]


def test_roofline_without_device_spec_says_so(tmp_path):
    p = make_trace(tmp_path / "t.json", device_name="Mystery GPU 9000")
    diag = diagnose(tracedx.load(p))
    assert diag.device is None
    from tracedx.report.figures import roofline_figure

    fig = roofline_figure(diag)
    texts = " ".join(a.text for a in fig.layout.annotations)
    assert "no device spec known" in texts
    assert not any((t.name or "").startswith("memory") for t in fig.data)


def test_timeline_rows_are_relative_ms_and_gaps_labelled(small):
    from tracedx.report.figures import timeline_figure

    diag = diagnose(tracedx.load(small))
    fig = timeline_figure(diag, step=2)
    rows = set()
    for t in fig.data:
        rows.update(t.y)
    assert {"CPU 4242 ops", "CPU 4242 launches", "CPU 4242 syncs", "GPU 0 stream 7"} <= rows
    assert "GPU idle" in rows
    mm = next(t for t in fig.data if t.name == "gemm")
    assert mm.base[0] == pytest.approx(0.040)  # kernel 40 us after the step start, in ms
    assert mm.x[0] == pytest.approx(0.300)
    assert any((t.name or "").startswith("idle: ") for t in fig.data)


def test_html_is_self_contained_and_json_is_script_safe(small, tmp_path):
    diag = diagnose(tracedx.load(small))
    page = render_html(diag)
    assert page.count("plotly.js v") >= 1
    assert len(re.findall(r"<script nonce=", page)) == 2  # plotly.js once, the page script
    plotly_js = re.search(r"<script nonce='[^']+'>(.*?)</script>", page, re.S).group(1)
    assert len(plotly_js) > 1_000_000  # plotly.js itself, inlined
    ours = page.replace(plotly_js, "")
    assert "<script src" not in ours and "<link" not in ours
    assert not re.search(r"(src|href)\s*=\s*['\"]?(https?:)?//", ours)
    blocks = re.findall(r"<script type='application/json' id='fig-(\w+)-data'>(.*?)</script>", page)
    assert [b[0] for b in blocks] == ["roofline", "timeline", "breakdown", "fixes"]
    for _, body in blocks:
        assert "<" not in body and ">" not in body
        assert json.loads(body)["data"]
    # verdict first, then the figures in order, then the op table
    order = [page.index(s) for s in ("id='verdict'", "id='roofline'", "id='timeline'",
                                     "id='breakdown'", "id='fixes'", "id='ops'")]  # fmt: skip
    assert order == sorted(order)
    assert write_html(diag, tmp_path / "r.html").read_text(encoding="utf-8").startswith("<!DOCTYPE")


def test_script_json_escapes_closing_tags():
    s = script_json(json.dumps({"n": "</script><b>&amp;"}))
    assert "</" not in s and "<" not in s and ">" not in s and "&" not in s
    assert json.loads(s) == {"n": "</script><b>&amp;"}


def test_long_names_are_shortened_with_full_name_on_hover(small):
    diag = diagnose(tracedx.load(small))
    page = render_html(diag)
    from tracedx.report.figures import timeline_figure

    fig = timeline_figure(diag)
    hover = " ".join(h for t in fig.data if t.hovertext is not None for h in t.hovertext)
    assert html.escape(LONG_KERNEL) in hover.replace("<br>", "")  # the full name, wrapped
    short = short_name(LONG_KERNEL, 60)
    assert short.endswith("…") and len(short) == 60
    assert "aten::mm" in page


def test_report_command_and_diagnose_html(small, tmp_path):
    out = tmp_path / "report.html"
    r = CliRunner().invoke(main, ["report", str(small), "-o", str(out), "--steps", "2..3"])
    assert r.exit_code == 0, r.output
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    out2 = tmp_path / "d.html"
    r = CliRunner().invoke(main, ["diagnose", str(small), "--html", str(out2)])
    assert r.exit_code == 0, r.output
    assert out2.exists()
    r = CliRunner().invoke(main, ["report", str(small), "-o", str(out), "--steps", "9"])
    assert r.exit_code == 2 and "no such steps" in r.output


def test_no_gpu_trace_still_renders(tmp_path):
    doc = {
        "traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
             "ts": T0, "dur": 100, "args": {}},
            {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": T0 + 5,
             "dur": 50, "args": {}},
        ]
    }  # fmt: skip
    p = tmp_path / "cpu.json.gz"
    p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    diag = diagnose(tracedx.load(p))
    page = render_html(diag)
    assert "no GPU activity" in page


def test_crafted_names_are_escaped_in_the_html(tmp_path):
    p = make_trace(tmp_path / "xss.json", gemm_kernel=XSS_KERNEL, elementwise_op=XSS_OP)
    page = render_html(diagnose(tracedx.load(p)))
    head, _, _ = page.partition("<script nonce=")  # everything before plotly.js
    assert XSS_KERNEL not in page
    assert "<img src=x" not in head
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in head  # shown, as text


# ---------------------------------------------------------------------------------------------
# in a real browser
# ---------------------------------------------------------------------------------------------


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    pytest.skip(
        "Chromium is not installed (Debian: apt-get install -y chromium); .ci/run installs it"
    )


class Browser:
    """Headless Chromium driven over the DevTools protocol: console errors, dialogs, evaluate."""

    def __init__(self, exe: str):
        websocket = pytest.importorskip(
            "websocket", reason="websocket-client is not installed (pip install -e '.[test]')"
        )
        self.profile = tempfile.mkdtemp(prefix="tracedx-chromium-")
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", "--disable-dev-shm-usage", f"--user-data-dir={self.profile}",
             "--remote-debugging-port=0", "--window-size=1400,2400", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: close() ends Chromium's children
        )  # fmt: skip
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.time() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.time() > deadline or self.proc.poll() is not None:
                self.close()
                pytest.fail("Chromium did not start (no DevToolsActivePort)")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.load(r) if t["type"] == "page"]
        self.ws = websocket.create_connection(
            pages[0]["webSocketDebuggerUrl"], timeout=60, suppress_origin=True
        )
        self.next_id = 0
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.loaded = False
        for m in ("Runtime.enable", "Log.enable", "Page.enable"):
            self.call(m)

    def _event(self, msg: dict) -> None:
        m, p = msg.get("method"), msg.get("params", {})
        if m == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            self.errors.append(f"exception: {d.get('exception', {}).get('description') or d}")
        elif m == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
            self.errors.append(f"console.{p['type']}: {[a.get('value') for a in p['args']]}")
        elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
            self.errors.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        elif m == "Page.javascriptDialogOpening":
            self.dialogs.append(p.get("message", ""))
            self.send("Page.handleJavaScriptDialog", accept=False)
        elif m == "Page.loadEventFired":
            self.loaded = True

    def send(self, method: str, **params) -> int:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        return self.next_id

    def call(self, method: str, **params) -> dict:
        i = self.send(method, **params)
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg)

    def pump(self, seconds: float) -> None:
        """Read events for ``seconds``."""
        end = time.time() + seconds
        self.ws.settimeout(0.2)
        try:
            while time.time() < end:
                with contextlib.suppress(Exception):
                    self._event(json.loads(self.ws.recv()))
        finally:
            self.ws.settimeout(60)

    def eval(self, expr: str):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        return r.get("result", {}).get("value")

    def open(self, path: Path, wait_for: str, timeout: float = 90) -> None:
        self.loaded = False
        self.call("Page.navigate", url=path.resolve().as_uri())
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.pump(0.5)
            if self.loaded and self.eval(wait_for):
                self.pump(0.5)  # late errors
                return
        pytest.fail(f"page did not finish: {wait_for} still false; errors {self.errors}")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)  # the group this test started, by its id
            try:
                self.proc.wait(10)
                break
            except subprocess.TimeoutExpired:
                continue
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    b = Browser(_chromium())
    yield b
    b.close()


FIGS_DRAWN = (
    "(() => { const d = [...document.querySelectorAll('div.fig')];"
    " return d.length === 4 && d.every(x => x.classList.contains('js-plotly-plot')"
    " && x.querySelector('svg.main-svg')); })()"
)


def test_report_of_a_real_trace_loads_in_chromium(browser, tmp_path_factory, tmp_path):
    trace = real_trace(tmp_path_factory)
    out = tmp_path / "report.html"
    r = CliRunner().invoke(main, ["report", str(trace), "-o", str(out)])
    assert r.exit_code == 0, r.output
    browser.errors.clear()
    browser.open(out, FIGS_DRAWN)
    assert browser.errors == []
    assert browser.dialogs == []
    ids = browser.eval("[...document.querySelectorAll('div.fig.js-plotly-plot')].map(d => d.id)")
    assert ids == ["fig-roofline", "fig-timeline", "fig-breakdown", "fig-fixes"]
    # plotly drew data: bars in the timeline, points or a message in the roofline
    assert browser.eval("document.querySelectorAll('#fig-timeline .bars .point').length") > 0
    assert browser.eval("document.querySelector('#verdict .regime') !== null")
    # the op table sorts on a header click (calls, then again the other way)
    n = browser.eval("document.querySelectorAll('#ops tbody tr').length")
    assert n > 0
    col = browser.eval(
        "[...document.querySelectorAll('#ops thead th')].findIndex(t => t.textContent === 'calls')"
    )
    get = f"[...document.querySelectorAll('#ops tbody tr')].map(r => +r.cells[{col}].dataset.v)"
    browser.eval(f"document.querySelectorAll('#ops thead th')[{col}].click()")
    desc = browser.eval(get)
    assert desc == sorted(desc, reverse=True)
    browser.eval(f"document.querySelectorAll('#ops thead th')[{col}].click()")
    asc = browser.eval(get)
    assert asc == sorted(asc)
    assert browser.errors == []


def test_crafted_kernel_name_runs_no_script_in_chromium(browser, tmp_path):
    p = make_trace(tmp_path / "xss.json", gemm_kernel=XSS_KERNEL, elementwise_op=XSS_OP)
    out = write_html(diagnose(tracedx.load(p)), tmp_path / "xss.html")
    browser.errors.clear()
    browser.dialogs.clear()
    browser.open(out, FIGS_DRAWN)
    browser.pump(1.0)
    assert browser.dialogs == []
    assert browser.errors == []
    assert browser.eval("document.querySelectorAll('img').length") == 0
    assert browser.eval("document.querySelectorAll('script:not([type])').length") == 2
    # the names are there, as text
    assert XSS_OP in browser.eval("document.getElementById('ops').innerText")
    # hovering shows the kernel name literally (plotly decodes the escaped entities as text)
    texts = browser.eval(
        "JSON.parse(document.getElementById('fig-timeline-data').textContent)"
        ".data.map(t => (t.hovertext || []).join(' ')).join(' ')"
    )
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in texts
    where = browser.eval(
        "(() => { const out = []; document.getElementById('fig-timeline').data.forEach((t, i) =>"
        " (t.hovertext || []).forEach((h, j) => { if (h.includes('alert')) out.push([i, j]); }));"
        " return out; })()"
    )
    labels = []
    for c, p in where:
        browser.eval(
            f"Plotly.Fx.hover(document.getElementById('fig-timeline'), "
            f"[{{curveNumber: {c}, pointNumber: {p}}}])"
        )
        browser.pump(0.3)
        labels.append(
            browser.eval("document.querySelector('#fig-timeline .hoverlayer').textContent")
        )
    # drawn as text in the hover labels, exactly as the trace spells them
    assert any(XSS_KERNEL in x for x in labels) and any(XSS_OP in x for x in labels)
    assert browser.eval("document.querySelectorAll('.hoverlayer script, img').length") == 0
    assert browser.dialogs == [] and browser.errors == []


def test_the_browser_harness_sees_errors_and_dialogs(browser, tmp_path):
    """The checks above are only as good as the harness: it must see errors and alerts."""
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><script>console.error('boom'); alert('hi'); undefinedFn();</script>"
        "<img src='missing.png'>",
        encoding="utf-8",
    )
    browser.errors.clear()
    browser.dialogs.clear()
    browser.open(page, "document.readyState === 'complete'")
    text = " ".join(browser.errors)
    assert "boom" in text and "undefinedFn" in text and "missing.png" in text
    assert browser.dialogs == ["hi"]
    browser.errors.clear()
    browser.dialogs.clear()
