"""The ``tracedx.diagnosis/1`` JSON document. Non-finite numbers are written as null."""

from __future__ import annotations

import json
import math
from typing import Any

from tracedx.analysis import CAUSES

SCHEMA = "tracedx.diagnosis/1"
CAUSE_ORDER = {c: i for i, c in enumerate(CAUSES)}


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v / 1e3, 6)


def _records(df, limit: int | None = None) -> list[dict]:
    if limit is not None:
        df = df.head(limit)
    return df.to_dicts()


def _ops(diag, limit: int = 20) -> list[dict]:
    t = diag.op_table
    out = []
    for r in t.head(limit).iter_rows(named=True):
        out.append(
            {
                "name": r["name"],
                "input_shapes": r.get("input_shapes"),
                "input_dtypes": r.get("input_dtypes"),
                "count": r["count"],
                "device_time_ms": _ms(r["device_time_us"]),
                "flops": r.get("flops"),
                "bytes": r.get("bytes"),
                "intensity": r.get("intensity"),
                "achieved_tflops": r.get("achieved_tflops"),
                "achieved_gbps": r.get("achieved_gbps"),
                "bound_fraction": r.get("bound_fraction"),
                "regime": r.get("regime"),
                "family": r.get("family"),
                "math_mode": r.get("math_mode"),
                "kernel_kind": r.get("kernel_kind"),
            }
        )
    return out


def _reference(diag) -> dict[str, Any] | None:
    m = diag.model
    if m is None:
        return None
    if m.unprofiled_step_us:
        return {
            "kind": "unprofiled",
            "step_ms": _ms(m.unprofiled_step_us),
            "profiler_cost_us_per_host_event": m.tax_us,
            "host_events_per_step": m.host_events,
        }
    return {
        "kind": "traced",
        "step_ms": _ms(m.step_us),
        "profiler_cost_us_per_host_event": None,
        "host_events_per_step": m.host_events,
    }


def diagnosis_dict(diag) -> dict[str, Any]:
    """The JSON contract as a dict (see README "JSON output")."""
    tr = diag.trace
    spec = diag.device
    dev = None
    if spec is not None:
        dev = {
            "name": spec.name,
            "peak_tflops": spec.peak_tflops,
            "bandwidth_gbs": spec.bandwidth_gbs,
            "num_sms": spec.num_sms,
            "source": spec.source,
            "sources": spec.sources,
        }
    key = str(diag.primary_device)
    d = diag.summary["devices"].get(key) or next(iter(diag.summary["devices"].values()), {})

    def med(c):
        return (d.get(c) or {}).get("median")

    steps = {
        "count": diag.summary["steps"],
        "numbers": diag.steps,
        "synthetic": tr.steps_synthetic,
        "device": diag.primary_device,
        "step_time_ms": _ms(med("step_time_us")),
        "cpu_time_ms": _ms(med("cpu_time_us")),
        "gpu_busy_ms": _ms(med("gpu_busy_us")),
        "idle_fraction": med("idle_fraction"),
        "kernels_per_step": med("kernels"),
        "sync_ms": _ms(med("sync_us")),
        "memcpy_ms": _ms(med("memcpy_us")),
        "memcpy_bytes": med("memcpy_bytes"),
        "range": {
            c: {k: v for k, v in (d.get(c) or {}).items()}
            for c in ("step_time_us", "cpu_time_us", "gpu_busy_us", "idle_fraction", "kernels")
        },
    }
    if "unprofiled_step_ms" in diag.summary:
        steps["unprofiled_step_ms"] = diag.summary["unprofiled_step_ms"]
    causes = diag.idle_causes
    if diag.primary_device is not None and causes.height:
        import polars as pl

        per = (
            causes.filter(pl.col("device") == diag.primary_device)
            .group_by("cause", maintain_order=True)  # the same key order on every run
            .agg(pl.col("idle_us").sum(), pl.col("gaps").sum())
            # in CAUSES order: group_by's order changes from run to run
            .sort(pl.col("cause").replace_strict(CAUSE_ORDER, default=len(CAUSE_ORDER)), "cause")
        )
        med = diag.model.idle_us if diag.model is not None else {}
        idle = {
            r["cause"]: {
                # median over the analysed steps (the step model's figure), and totals
                "ms_per_step": _ms(med.get(r["cause"], r["idle_us"] / len(diag.steps))),
                "total_ms": _ms(r["idle_us"]),
                "gaps": r["gaps"],
            }
            for r in per.iter_rows(named=True)
        }
    else:
        idle = {}
    doc = {
        "schema": SCHEMA,
        "trace": {
            "path": tr.path,
            "pytorch_version": tr.metadata.get("pytorch_version"),
            "device_name": tr.device_name,
            "device": dev,
            "device_notes": diag.device_notes,
            "devices": tr.devices,
            "rank": tr.metadata.get("rank"),
        },
        "steps": steps,
        "regime": diag.regime,
        "bottleneck": diag.bottleneck,
        "evidence": diag.evidence,
        "findings": [f.to_dict() for f in diag.findings],
        "estimates_against": _reference(diag),
        "decode": diag.decode,
        "ops": _ops(diag),
        "idle_causes": idle,
        "largest_gaps": _records(diag.largest_gaps),
        "kernel_kinds": _records(diag.kernel_kinds),
        "memcpy": _records(diag.memcpy),
        "top_level_ops": _records(diag.top_ops, 20),
        "sync_sites": _records(diag.sync_sites, 20),
        "per_device": diag.summary["devices"],
        "warnings": [{"kind": w.kind, "count": w.count, "message": w.message} for w in tr.warnings],
        "notes": diag.notes,
    }
    return _clean(doc)


def as_doc(diag) -> dict[str, Any]:
    """The document of a Diagnosis (:func:`diagnosis_dict`), or ``diag`` itself when it is
    already one (a dict: a cached result, read back without polars)."""
    return diag if isinstance(diag, dict) else diagnosis_dict(diag)


def render_json(diag) -> str:
    """The JSON report of a Diagnosis or of its document (:func:`as_doc`)."""
    return json.dumps(as_doc(diag), indent=2, allow_nan=False, default=str) + "\n"
