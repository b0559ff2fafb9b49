"""The terminal report: verdict first, then where the time goes, then the top fixes."""

from __future__ import annotations

import math
import os
import re

from tracedx.analysis import HOST_DEVICE_COPY, UNDERFILLED_FRACTION
from tracedx.console import WIDTH, fit
from tracedx.report.json import as_doc
from tracedx.report.safe import HEADER_CHARS, _escape_char, safe_strings, term


def _ms(v) -> str:
    return "n/a" if v is None else f"{v:.3f} ms"


def _pct(v) -> str:
    return "n/a" if v is None else f"{v:.0%}"


def _rng(d: dict, key: str, scale: float = 1e-3) -> str:
    r = d.get(key) or {}
    if r.get("min") is None or r.get("min") == r.get("max"):
        return ""
    return f"  (min {r['min'] * scale:.3f}, max {r['max'] * scale:.3f})"


def _per(v: float) -> str:
    """A per-step count: whole numbers without decimals (100, not 100.0), else one decimal."""
    return f"{v:.0f}" if abs(v - round(v)) < 1e-9 else f"{v:.1f}"


def _unplaced(o: dict) -> str:
    """What an op row without a roofline regime shows: host-device copies are not bounded by
    the device memory roofline (their bandwidth is in the copies line); others are unmodelled."""
    return HOST_DEVICE_COPY if o.get("kernel_kind") == HOST_DEVICE_COPY else "unmodelled"


def _visible(name: str) -> str:
    """``name`` with each unprintable character written as an escape (``\\n``, ``\\x1b``,
    ``\\u202e``: :mod:`tracedx.report.safe`'s forms)."""
    name = name.replace("\n", "\\n").replace("\t", "\\t")
    return "".join(c if c.isprintable() else _escape_char(c) for c in name)


def rate(v: float) -> str:
    """A rate or size for display: ``1,728`` from 1,000 up (not ``1.73e+03``), else three
    significant digits (``512``, ``0.25``)."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def short_name(name: str, width: int = 48) -> str:
    """Shorten a long C++ template kernel/op name for display (the full name is kept in data)."""
    name = _visible(name)
    if len(name) <= width:
        return name
    # "autograd::engine::evaluate_function: AddmmBackward0": what follows the last ": " tells
    # such names apart, so it is kept and the common prefix is cut
    head, sep, tail = name.rpartition(": ")
    keep = width - 1 - len(sep) - len(tail)  # of the head, beside "…" and the tail
    if sep and tail and 0 < keep < len(head):
        return name[:keep] + "…" + sep + tail
    return name[: width - 1] + "…"


_BREAK = re.compile(r"[\W_]+")


def distinct_names(names: list[str], width: int) -> list[str]:
    """``names`` (a name given twice comes out numbered, as below), each as :func:`short_name` cuts it to ``width``, except names that
    it would cut to the same text: those keep their start (a third of the width; to where they
    differ from the other such names where that is later), ``…``, then the part where each
    differs from the names cut like it, from a word's start shortly before, to the end where
    that fits (``sm90_xmma_wgrad_…nhwc_tilesize128x128x32_warpgrou…`` beside
    ``sm90_xmma_wgrad_…nhwc_tilesize64x64x32_warpgroups…``); names that still read the same
    (they differ in several places) end in ``#1``, ``#2``, ... At most ``width`` characters
    each; distinct names in, distinct texts out (unless ``width`` is under 3)."""
    names = [_visible(n) for n in names]
    cut = [short_name(n, width) for n in names]
    clash = {c for c in cut if cut.count(c) > 1}
    out = []
    for n, c in zip(names, cut, strict=True):
        if c not in clash:
            out.append(c)
            continue
        # for each other clashing name: how long a start n shares with it, and whether it was
        # cut like n. n[p] tells n from those cut like it; the head reaches past where n
        # parts from the others (so that their heads differ)
        shared = [
            (len(os.path.commonprefix([n, m])), o == c)
            for m, o in zip(names, cut, strict=True)
            if o in clash and m != n
        ]
        p = max((k for k, same in shared if same), default=len(n))  # len(n): n twice
        head = max([width // 3] + [k + 1 for k, same in shared if not same])
        if head > width // 3 and (w := _BREAK.search(n, head)) and w.start() <= 2 * width // 3:
            head = w.start()  # to the end of that word
        room = width - 1 - head  # after the "…"
        start = max(head + 1, min(p - room // 2, len(n) - room))
        if w := _BREAK.search(n, start - 1, p):  # start at a word
            start = w.end()
        c = n[:head] + "…" + n[start:] if start <= p else n  # else the plain cut shows n[p]
        out.append(c if len(c) <= width else c[: width - 1].rstrip("…") + "…")
    return _numbered(out, width)


def _numbered(shown: list[str], width: int) -> list[str]:
    """``shown`` with every text that still repeats (names that differ in several places)
    told apart by a number at its end, ``#1``, ``#2``, ... counted over all of them in order."""
    out = list(shown)
    taken = set(shown)
    k = 0
    for i in [i for i, c in enumerate(shown) if shown.count(c) > 1]:
        while True:  # one count over all of them, past any text already shown
            k += 1
            c, tag = shown[i], f"#{k}"
            t = c + tag if len(c) + len(tag) <= width else c[: width - len(tag)] + tag
            if t not in taken:
                break
        out[i] = t
        taken.add(t)
    return out


# evidence lines the WHERE THE TIME GOES section shows with their scope: not repeated
_SHOWN_BELOW = ("idle by cause", "device time by kind")


def speedup_label(f: dict) -> str:
    """A finding's (dict) estimated speedup: ``7.88x``; ``2.00x per sample`` for larger-batch,
    whose step holds more samples (its speedup is in throughput, not in step time); ``1.00x
    (the model predicts 0.86x, a slowdown)`` when the model's step grows (the estimate is
    clamped at 1.00x)."""
    per = " per sample" if f.get("batch_factor") else ""
    slow = f.get("unclamped_speedup")
    why = f" (the model predicts {slow:.2f}x, a slowdown)" if slow is not None else ""
    return f"{f['estimated_speedup']:.2f}x{per}{why}"


def estimate_label(f: dict, unit: str = " ms") -> str:
    """A finding's (dict) estimated time with its scope: ``0.167 ms per step``; for larger-batch
    ``0.658 ms per today's batch; the 2x step 1.316 ms``: the time per sample times today's
    batch, comparable with the step it is against, then the larger step's own time."""
    k = f.get("batch_factor")
    ms = f.get("estimated_ms_per_batch", f["estimated_step_ms"])
    if k:
        return f"{ms:.3f}{unit} per today's batch; the {k:g}x step {k * ms:.3f}{unit}"
    return f"{ms:.3f}{unit} per step"


def shape_tag(shapes) -> str:
    """``[[1024], [1, 1024], [1024, 3072], []]`` -> ``1024,1x1024,1024x3072`` (tensor inputs)."""
    try:
        return ",".join("x".join(str(x) for x in s) for s in shapes or [] if s)
    except TypeError:
        return ""


def render_text(diag, width: int = WIDTH) -> str:
    """The terminal report, wrapped to ``width`` columns (:func:`fit`)."""
    return fit(_render(diag, width), width)


def _render(diag, width: int) -> str:
    doc = as_doc(diag)
    d = safe_strings(doc)  # every string escaped once; the header's names, cut shorter, from doc
    nsteps = d["steps"]["count"]
    every = f"the {nsteps} analysed step{'s' if nsteps != 1 else ''}"
    out = _header(doc) + [""] + _verdict_lines(d) + [""] + _time_lines(d, every)
    out += _top_level_op_lines(d, width) + _op_lines(d, every, width, doc["trace"]["device"])
    out += [""] + _fix_lines(d)
    notes = d["notes"] + d["trace"]["device_notes"] + [w["message"] for w in d["warnings"]]
    if notes:
        out += ["", "NOTES"] + [f"  - {n}" for n in notes]
    return "\n".join(out) + "\n"


def _header(d: dict) -> list[str]:
    """The trace's path, then its GPU, steps and PyTorch version on one line (``d``: the
    document before :func:`safe_strings`; each name is escaped here)."""
    st = d["steps"]
    name = d["trace"]["device_name"] or ("unnamed GPU" if d["trace"]["devices"] else "no GPU")
    head = [term(name, HEADER_CHARS)]
    if st["synthetic"]:
        head.append("no ProfilerStep markers: whole trace as one step")
    else:
        nums = st["numbers"]
        head.append(f"{st['count']} step{'s' if st['count'] != 1 else ''} ({nums[0]}..{nums[-1]})")
    if d["trace"]["pytorch_version"]:
        head.append(f"PyTorch {term(d['trace']['pytorch_version'], HEADER_CHARS)}")
    return [f"tracedx · {term(d['trace']['path'], HEADER_CHARS)}", " · ".join(head)]


def _verdict_lines(d: dict) -> list[str]:
    """The verdict and its evidence, less the lines the next section shows with their scope."""
    if d["regime"]:
        out = [f"VERDICT: {d['regime'].upper()}, bottleneck: {d['bottleneck']}"]
    else:
        out = ["VERDICT: no regime (see below)"]
    return out + [f"  - {e}" for e in d["evidence"] if not e.startswith(_SHOWN_BELOW)]


def _time_lines(d: dict, every: str) -> list[str]:
    """WHERE THE TIME GOES: the median step's figures, then device time by kind, the largest
    copies, idle gaps and sync sites."""
    st = d["steps"]
    out = [f"WHERE THE TIME GOES (median per step, over {every}, unless marked)"]
    rng = st["range"]
    out.append(f"  step time      {_ms(st['step_time_ms'])}{_rng(rng, 'step_time_us')}")
    out.append(f"  CPU time       {_ms(st['cpu_time_ms'])}  (host window of the step)")
    if st["gpu_busy_ms"] is not None:
        out.append(f"  GPU busy       {_ms(st['gpu_busy_ms'])}{_rng(rng, 'gpu_busy_us')}")
        causes = sorted(d["idle_causes"].items(), key=lambda kv: -(kv[1]["ms_per_step"] or 0))
        cs = ", ".join(f"{k} {v['ms_per_step']:.3f} ms" for k, v in causes if v["ms_per_step"])
        out.append(
            f"  GPU idle       {_pct(st['idle_fraction'])} of the step"
            + (f"; by cause (each its median): {cs}" if cs else "")
        )
        out.append(f"  kernels        {st['kernels_per_step']:.0f}")
        out.append(
            f"  memcpy         {_ms(st['memcpy_ms'])}, {int(st['memcpy_bytes'] or 0):,} bytes"
        )
    else:
        out.append("  GPU            n/a: no GPU activity in the trace")
    out.append(f"  host blocked   {_ms(st['sync_ms'])} in sync calls and pageable copies")
    if "unprofiled_step_ms" in st:
        u = st["unprofiled_step_ms"]
        out.append(
            f"  unprofiled     {u.get('median'):.3f} ms, timed without the profiler by tracedx "
            f"capture ({u.get('n') or '?'} steps)"
            + ("; cannot be right, not used: see the notes" if u.get("implausible") else "")
        )
    kk = [k for k in d["kernel_kinds"] if (k["share"] or 0) >= 0.01]
    if kk:
        out.append(
            "  device time    "
            + ", ".join(f"{k['kind']} {k['share']:.0%}" for k in kk)
            + f" (share over {every})"
        )
    for m in d["memcpy"][:3]:
        gbs = "" if m["achieved_gbs"] is None else f" at {rate(m['achieved_gbs'])} GB/s"
        out.append(
            f"  copies         {m['direction']} ({m['host_memory']}): {m['count']} x, "
            f"{int(m['bytes'] or 0):,} bytes, {m['device_time_us'] / 1e3:.3f} ms{gbs} "
            f"(total over {every})"
        )
    for g in d["largest_gaps"][:3]:
        out.append(
            f"  largest gap    {g['duration_us'] / 1e3:.3f} ms in step {g['step']}: {g['cause']} "
            "(a single gap, not a median)"
        )
    n = max(st["count"], 1)
    for s in d["sync_sites"][:3]:
        where = f" at {s['site']}" if s["site"] else ""
        out.append(
            f"  sync site      {s['op']} -> {s['call']}{where}: {_per(s['count'] / n)} x, "
            f"{s['blocked_us'] / n / 1e3:.3f} ms (mean per step)"
        )
    return out


def _top_level_op_lines(d: dict, width: int) -> list[str]:
    """The five costliest top-level ops, mean per step: host against device time, or host time
    alone when the trace has no GPU activity (the device columns would be all zeros)."""
    tops = [t for t in d["top_level_ops"][:5] if t["host_time_us"] or t["device_time_us"]]
    if not tops:
        return []
    n = max(d["steps"]["count"], 1)
    if not d["trace"]["devices"]:
        w = max(12, min(60, width - 12))  # the op column takes the width the numbers leave
        out = ["", "HOST TIME BY TOP-LEVEL OP (mean per step; the trace has no GPU activity)"]
        out.append(f"  {'op':<{w}} {'host ms':>9}")
        for t in tops:
            out.append(f"  {short_name(t['name'], w):<{w}} {t['host_time_us'] / n / 1e3:>9.3f}")
        return out
    w = max(12, min(80, width - 48))  # the op column takes what the numbers leave
    out = ["", "CPU VS DEVICE TIME (top-level ops, mean per step)"]
    out.append(
        f"  {'op':<{w}} {'host ms':>9} {'device ms':>10} {'kernels':>8} {'host us/kernel':>15}"
    )
    for t in tops:
        per = "-" if t["host_us_per_kernel"] is None else f"{t['host_us_per_kernel']:.1f}"
        out.append(
            f"  {short_name(t['name'], w):<{w}} {t['host_time_us'] / n / 1e3:>9.3f} "
            f"{t['device_time_us'] / n / 1e3:>10.3f} {_per(t['kernels'] / n):>8} {per:>15}"
        )
    return out


def _cell(v, fmt: str) -> str:
    """A number of the ops table, ``-`` where it is missing (None or NaN)."""
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _op_lines(d: dict, every: str, width: int, dev: dict | None) -> list[str]:
    """The six op groups with the most device time, on the roofline of the device's peaks
    (``dev``: the document's device before :func:`safe_strings`; its name is escaped here)."""
    ops = d["ops"][:6]
    if not ops:
        return []
    out = ["", f"TOP OPS BY DEVICE TIME (count and ms: totals over {every})"]
    if dev:
        bf = dev["peak_tflops"].get("bf16")
        f32 = dev["peak_tflops"].get("fp32")
        bw = dev["bandwidth_gbs"]
        ridge = f"  [{term(dev['name'], HEADER_CHARS)}: {bw:.0f} GB/s"
        if bf:
            ridge += f"; ridge bf16 {bf * 1e3 / bw:.0f}"
        if f32:
            ridge += f", fp32 {f32 * 1e3 / bw:.0f}"
        out.append(ridge + (" FLOP/B]" if (bf or f32) else "]"))
    names = [o["name"] for o in ops]
    # the op column takes what the fixed columns (54) and the longest regime leave
    reg_w = max(len(o["regime"] or _unplaced(o)) for o in ops)
    op_w = max(12, min(40, width - 54 - reg_w))
    head = "op (inputs where names repeat)" if op_w >= 30 else "op"
    out.append(
        f"  {head:<{op_w}} {'count':>6} {'dev ms':>8} {'FLOP/B':>8} "
        f"{'TFLOP/s':>8} {'GB/s':>7} {'of roof':>7}  regime"
    )
    labels = [
        f"{o['name']} {shape_tag(o['input_shapes'])}"
        if names.count(o["name"]) > 1 and shape_tag(o["input_shapes"])
        else o["name"]
        for o in ops
    ]
    for o, label in zip(ops, distinct_names(labels, op_w), strict=True):
        out.append(
            f"  {label:<{op_w}} {o['count']:>6} {o['device_time_ms']:>8.3f} "
            f"{_cell(o['intensity'], '8.1f'):>8} {_cell(o['achieved_tflops'], '8.1f'):>8} "
            f"{_cell(o['achieved_gbps'], '7.0f'):>7} {_cell(o['bound_fraction'], '7.0%'):>7}  {o['regime'] or _unplaced(o)}"
        )
    if any(o["regime"] == "under-filled" for o in ops):
        out.append(
            f"  (under-filled: under {UNDERFILLED_FRACTION:.0%} of its roof with fewer thread "
            "blocks than SMs: too little work per kernel to fill the GPU)"
        )
    return out


def _fix_lines(d: dict) -> list[str]:
    """FIXES: the three first recommended fixes with their Amdahl estimates, then the others."""
    rec = [f for f in d["findings"] if f["recommended"]]
    ref = d["estimates_against"] or {}
    if not d["findings"]:
        return ["FIXES", "  no estimate (see the notes)"]
    if ref.get("kind") == "unprofiled":
        out = [
            "FIXES, in the order to apply them (Amdahl estimate against the unprofiled median "
            f"step, {ref['step_ms']:.3f} ms, profiler cost taken out: see the notes)"
        ]
    else:
        out = ["FIXES, in the order to apply them (Amdahl estimate against the traced median step)"]
    if not rec:
        out.append("  none worth 5% or more")
    for i, f in enumerate(rec[:3], 1):
        s = "∞" if f["local_speedup_unbounded"] else f"{f['local_speedup']:.2f}x"
        out.append(f"  {i}. {f['fix']}: {speedup_label(f)} -> {estimate_label(f)}")
        out.append(f"     {f['title']}")
        out.append(
            f"     acts on f = {f['fraction']:.1%} of the step, local speedup s = {s}: 1/((1-f)+f/s)"
        )
        out.append(f"     how: {f['derivation']}")
        for e in f["evidence"][:3]:
            out.append(f"     - {e}")
    for i, f in enumerate(rec[3:], 4):
        out.append(f"  {i}. {f['fix']}: {speedup_label(f)} -> {estimate_label(f)} ({f['title']})")
    low = [f for f in d["findings"] if not f["recommended"]]
    if low:
        out.append(
            "  not worth it (< 5%): " + ", ".join(f"{f['fix']} {speedup_label(f)}" for f in low)
        )
    return out


__all__ = ["estimate_label", "render_text", "short_name", "speedup_label"]
