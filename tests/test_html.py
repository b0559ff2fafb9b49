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


# ---------------------------------------------------------------------------------------------
# palette, roofline labels, roofs (issue 17)
# ---------------------------------------------------------------------------------------------


def _lab(hex_color: str) -> tuple[float, float, float]:
    """sRGB hex -> CIELAB (D65), the standard formulas (IEC 61966-2-1, CIE 15)."""
    rgb = [int(hex_color[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb)
    xyz = (
        (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047,
        0.2126 * r + 0.7152 * g + 0.0722 * b,
        (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883,
    )
    fx, fy, fz = (t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116 for t in xyz)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def test_one_palette_distinct_and_readable_in_greyscale():
    import math

    from tracedx.analysis.kernels import KINDS
    from tracedx.analysis.timeline import CAUSES
    from tracedx.report.figures import CAUSE_COLORS, CAUSE_PATTERNS, HOST_COLORS, KIND_COLORS

    kinds = {k: KIND_COLORS[k] for k in (*KINDS, "memcpy", "memset")}
    causes = {c: CAUSE_COLORS[c] for c in CAUSES}
    every = {**{f"kind {k}": v for k, v in kinds.items()},
             **{f"idle {k}": v for k, v in causes.items()},
             **{f"host {k}": v for k, v in HOST_COLORS.items()}}  # fmt: skip
    labs = {k: _lab(v) for k, v in every.items()}
    names = list(labs)
    close = [
        (a, b, round(math.dist(labs[a], labs[b]), 1))
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        if math.dist(labs[a], labs[b]) < 15
    ]
    assert close == []  # e.g. elementwise and 'idle: kernel launch' were one orange
    # in greyscale: kinds on a lightness ladder, causes each with their own hatch
    light = sorted(labs[f"kind {k}"][0] for k in kinds)
    assert min(b - a for a, b in zip(light, light[1:], strict=False)) >= 5
    shapes = [CAUSE_PATTERNS[c] for c in CAUSES]
    assert all(shapes) and len(set(shapes)) == len(shapes)


def test_breakdown_and_timeline_hatch_idle_causes(small):
    from tracedx.report.figures import CAUSE_PATTERNS, breakdown_figure, timeline_figure

    diag = diagnose(tracedx.load(small))
    for fig in (breakdown_figure(diag), timeline_figure(diag)):
        idle = [t for t in fig.data if (t.name or "").startswith("idle: ")]
        assert idle
        for t in idle:
            assert t.marker.pattern.shape == CAUSE_PATTERNS[t.name.removeprefix("idle: ")]


def test_equal_roofs_are_drawn_and_labelled_once(small):
    from tracedx.report.figures import roof_groups, roofline_figure

    diag = diagnose(tracedx.load(small))  # an H100: bf16 and fp16 share one peak
    spec = diag.device
    assert spec.peak_tflops["bf16"] == spec.peak_tflops["fp16"]
    groups = roof_groups(spec)
    assert any(g[0][:2] == ["bf16", "fp16"] for g in groups)
    assert all(len({spec.peak_tflops[k] for k in g[0]}) == 1 for g in groups)
    names = [t.name for t in roofline_figure(diag).data if t.name]
    assert sum("fp16" in n for n in names) == 1
    assert any(n.startswith("bf16 = fp16 ") for n in names)


def test_roofline_labels_never_overlap_and_extra_ones_are_hover_only():
    from tracedx.report.figures import _clear, _label_box, place_labels

    axes = ([-1.0, 4.0], [9.0, 16.0])
    # twelve ops at nearly one point: only those that fit get a label
    pts = [((100.0 * (1 + i / 1000), 1e13), 8.0, f"aten::op_number_{i}") for i in range(12)]
    offs = place_labels(pts, axes)
    placed = [
        _label_box(p, o, t, axes) for (p, _, t), o in zip(pts, offs, strict=True) if o is not None
    ]
    assert 0 < len(placed) < 12 and offs[0] == (0, -(8.0 + 7.5 + 3))  # the largest: above
    for i, a in enumerate(placed):
        assert all(_clear(a, b) for b in placed[i + 1 :])
    # an op far from the rest is labelled
    assert place_labels([((1.0, 1e10), 4.0, "x")], axes)[0] is not None
    # and keeps off another op's marker: a big one right above pushes the label below
    from tracedx.report.figures import _marker_box

    big = _marker_box((1.0, 10**10.4), 20.0, axes)
    off = place_labels([((1.0, 1e10), 4.0, "x")], axes, [big])[0]
    assert off is not None and off[1] > 0
    assert _clear(_label_box((1.0, 1e10), off, "x", axes), big)


def test_diff_html_command(tmp_path):
    before = make_trace(tmp_path / "before.json")
    after = make_trace(
        tmp_path / "after.json", steps=3, elementwise_kernel="triton_poi_fused_relu_0"
    )
    out = tmp_path / "diff.html"
    r = CliRunner().invoke(main, ["diff", str(before), str(after), "--html", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text(encoding="utf-8")
    for key in ("prediction", "fig-estimate", "before-verdict", "after-verdict", "fig-sides",
                "metrics"):  # fmt: skip
        assert f"id='{key}'" in page
    order = [page.index(f"id='{k}'") for k in ("prediction", "estimate", "before-verdict",
                                                "after-verdict", "sides", "metrics")]  # fmt: skip
    assert order == sorted(order)
    r = CliRunner().invoke(
        main, ["diff", str(before), str(after), "--html", str(tmp_path / "no" / "d.html")]
    )
    assert r.exit_code == 2 and "cannot write the HTML report" in r.output


def test_diff_estimate_figure_puts_the_estimate_on_its_clock(tmp_path):
    from tracedx.analysis.diff import diff
    from tracedx.report.diff_html import estimate_figure

    before = make_trace(tmp_path / "before.json")
    after = make_trace(tmp_path / "after.json", steps=3)
    td = diff(tracedx.load(before), tracedx.load(after), fix="remove-host-sync")
    fig = estimate_figure(td)
    traced = next(t for t in fig.data if t.name == "traced")
    p = td.prediction
    assert list(traced.x) == [p.before_step_ms, p.estimated_step_ms, p.after_step_ms]
    assert [t.name for t in fig.data] == ["traced"]  # no unprofiled timing in either trace


# ---------------------------------------------------------------------------------------------
# layout at 1,400 px in Chromium
# ---------------------------------------------------------------------------------------------


def figs_drawn(n: int) -> str:
    return (
        "(() => { const d = [...document.querySelectorAll('div.fig')];"
        f" return d.length === {n} && d.every(x => x.classList.contains('js-plotly-plot')"
        " && x.querySelector('svg.main-svg')); })()"
    )


LAYOUT = """(() => {
  const de = document.documentElement;
  const boxes = [...document.querySelectorAll('section')].filter(s => s.scrollWidth > s.clientWidth + 1).map(s => s.id);
  const scrolls = [...document.querySelectorAll('div.scroll')].map(s => {
    const t = s.querySelector('table'); return [t.id, Math.round(t.getBoundingClientRect().width), s.clientWidth]; });
  const labels = [...document.querySelectorAll('#fig-roofline g.annotation-text-g')].map(a => {
    const r = a.getBoundingClientRect(); return [a.textContent, r.left, r.top, r.right, r.bottom]; });
  return {inner: window.innerWidth, page: de.scrollWidth, client: de.clientWidth, boxes, scrolls, labels};
})()"""


def _check_layout(browser) -> dict:
    lay = browser.eval(LAYOUT)
    assert lay["inner"] == 1400
    assert lay["page"] <= lay["client"], "the page scrolls sideways at 1,400 px"
    assert lay["boxes"] == [], "sections wider than their box"
    return lay


def _overlaps(labels: list) -> list:
    out = []
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            if a[1] < b[3] - 0.5 and b[1] < a[3] - 0.5 and a[2] < b[4] - 0.5 and b[2] < a[4] - 0.5:
                out.append((a[0], b[0]))
    return out


@pytest.mark.parametrize("name", ["decode-eager", "convnet_dataloader-main", "mlp_train-eager"])
def test_report_fits_1400px_with_clear_roofline_labels(browser, tmp_path, name):
    trace = SAMPLES / f"{name}.json.gz"
    if not trace.exists():
        pytest.skip(f"{trace} is not in this checkout")
    out = tmp_path / "r.html"
    assert CliRunner().invoke(main, ["report", str(trace), "-o", str(out)]).exit_code == 0
    browser.errors.clear()
    browser.open(out, figs_drawn(4))
    assert browser.errors == []
    lay = _check_layout(browser)
    ops = next(s for s in lay["scrolls"] if s[0] == "ops")
    assert ops[1] <= ops[2], f"the op table ({ops[1]} px) is wider than its box ({ops[2]} px)"
    labels = [x for x in lay["labels"] if not x[0].startswith("NVIDIA")]  # the spec's source line
    assert len(labels) >= 3  # the ridge and at least two ops
    assert _overlaps(labels) == []
    assert sum(x[0].startswith("ridge ") for x in labels) == 1
    legend = browser.eval(
        "[...document.querySelectorAll('#fig-roofline .legendtext')].map(t => t.textContent)"
    )
    assert sum("fp16" in t for t in legend) == 1


def test_diff_report_loads_in_chromium_and_fits_1400px(browser, tmp_path):
    pair = [SAMPLES / "mlp_train-eager.json.gz", SAMPLES / "mlp_train-cudagraph.json.gz"]
    if not all(p.exists() for p in pair):
        pair = [make_trace(tmp_path / "b.json"), make_trace(tmp_path / "a.json", steps=4)]
    out = tmp_path / "diff.html"
    r = CliRunner().invoke(main, ["diff", *map(str, pair), "--html", str(out)])
    assert r.exit_code == 0, r.output
    browser.errors.clear()
    browser.open(out, figs_drawn(2))
    assert browser.errors == [] and browser.dialogs == []
    _check_layout(browser)
    # BEFORE and AFTER side by side: two cards on one row
    tops = browser.eval(
        "['before-verdict', 'after-verdict'].map(i => document.getElementById(i)"
        ".getBoundingClientRect()).map(r => [Math.round(r.top), Math.round(r.left)])"
    )
    assert tops[0][0] == tops[1][0] and tops[0][1] < tops[1][1]
    assert browser.eval("document.querySelectorAll('#fig-estimate .bars .point').length") >= 2


# ---------------------------------------------------------------------------------------------
# the job report (issue 14): per-rank table, rank-by-step wait heatmap
# ---------------------------------------------------------------------------------------------

LATE = [[0.0, 300.0], [100.0, 0.0], [0.0, 500.0], [250.0, 250.0]]
"""Per step, how late each of 2 ranks joins the step's all-reduce (us)."""


def late_job():
    """One all-reduce (tau = 200 us) per step; rank r computes 1000 + LATE[k][r] us, then
    joins; both end at 1000 + max(LATE[k]) + 200. No compute under the kernels, so rank r's
    exposed wait in step k is max(LATE[k]) - LATE[k][r]."""
    from tests import summarybuilder as sb
    from tracedx.job.diagnosis import Job, diagnose_job

    steps, colls = [[], []], [[], []]
    for k, row in enumerate(LATE):
        t0, end = k * 10_000.0, 1000 + max(row) + 200
        for r in (0, 1):
            d = end - (1000 + row[r])
            steps[r].append(sb.step(k, start=t0, time=end, compute=1000 + row[r], comm=d))
            colls[r].append(sb.coll(k, t0 + 1000 + row[r], d, seq=k))
    return diagnose_job(Job([sb.summary(r, steps[r], colls[r]) for r in (0, 1)]))


def test_job_wait_heatmap_is_each_ranks_exposed_wait():
    from tracedx.report.job_html import wait_heatmap

    fig = wait_heatmap(late_job())
    hm = fig.data[0]
    assert list(hm.y) == ["rank 0", "rank 1"] and list(hm.x) == ["0", "1", "2", "3"]
    want = [[(max(row) - row[r]) / 1e3 for row in LATE] for r in (0, 1)]
    assert [list(z) for z in hm.z] == [pytest.approx(w) for w in want]
    assert "exposed wait 0.300 ms (20% of the step)" in hm.hovertext[0][0]  # 300 of 1500 us


def test_job_html_has_rank_table_heatmap_and_verdict():
    jd = late_job()
    page = jd.to_html()
    for key in ("verdict", "ranks", "fig-waits", "fig-rank-steps", "collectives"):
        assert f"id='{key}'" in page
    rows = re.findall(r"<tr(?: class='straggler')?><td data-v='(\d)'", page)
    assert rows == ["0", "1"]
    # the rank table's wait column: totals over the steps (rank 0: 300 + 0 + 500 + 0 us)
    r0 = jd.ranks.filter(jd.ranks["rank"] == 0).row(0, named=True)
    assert r0["wait_total_us"] == 800.0
    assert "<td data-v='0.8' class='n'>0.800</td>" in page


def test_job_report_loads_in_chromium_and_fits_1400px(browser, tmp_path):
    out = late_job().write_html(tmp_path / "job.html")
    browser.errors.clear()
    browser.open(out, figs_drawn(2))
    assert browser.errors == [] and browser.dialogs == []
    lay = _check_layout(browser)
    assert all(s[1] <= s[2] for s in lay["scrolls"]), lay["scrolls"]
    assert browser.eval("document.querySelectorAll('#fig-waits .hm, #fig-waits image').length") > 0


def test_diagnose_job_html_on_a_captured_gloo_job(tmp_path):
    from tracedx.job.diagnosis import diagnose_job
    from tracedx.job.load import load_job

    files = sorted(str(p) for p in (Path(__file__).parent / "data" / "gloo_ddp_cpu").glob("vm_*"))
    out = tmp_path / "job.html"
    r = CliRunner().invoke(main, ["diagnose", *files, "--html", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text(encoding="utf-8")
    assert "tracedx job report" in page and "id='fig-waits'" in page
    jd = diagnose_job(load_job(files))
    heat = json.loads(re.search(r"id='fig-waits-data'>(.*?)</script>", page, re.S).group(1))[
        "data"
    ][0]
    want = [
        [jd.steps.filter((jd.steps["rank"] == r) & (jd.steps["step"] == k))["exposed_wait_us"][0]
         / 1e3 for k in (1, 2, 3)]
        for r in (0, 1)
    ]  # fmt: skip
    assert heat["z"] == [pytest.approx(w) for w in want]
