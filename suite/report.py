"""The run report: one self-contained HTML file (jinja2, autoescaped, plots as data: URIs) rendered from a
run directory's saved records.jsonl + meta.json only. Tables are computed here; templates only loop/format.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import jinja2

from kdbench import plots
from kdbench.results import Record, atomic_write_text, load_meta, load_records

STATUS_ORDER = ("pass", "fail", "error", "skipped", "ambiguous", "info")
TEMPLATES = Path(__file__).resolve().parent / "templates"


# ------------------------------------------------------------------------------------------ formatting

def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt_num(x, digits: int = 4) -> str:
    if _missing(x):
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if not isinstance(x, float):
        return str(x)
    if x == 0 or math.isinf(x):
        return str(x).replace("inf", "∞")
    if abs(x) >= 1e5 or abs(x) < 1e-3:
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def fmt_time(seconds) -> str:
    if _missing(seconds):
        return "–"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_pct(x) -> str:
    return "–" if _missing(x) else f"{x:.3g}%"


def fmt_change(pct) -> str:
    """A signed relative change in percent: +20.3%, -4.1%."""
    return "–" if _missing(pct) else f"{pct:+.1f}%"


def cell(value, fmt: str = "text") -> str:
    """The one cell formatter the templates use: text | num | time | pct | int."""
    if fmt == "time":
        return fmt_time(value)
    if fmt == "pct":
        return fmt_pct(value)
    if fmt in ("num", "int"):
        return fmt_num(value)
    return "" if value is None else str(value)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(cell=cell, num=fmt_num, time=fmt_time, pct=fmt_pct, change=fmt_change)
    return env


# ------------------------------------------------------------------------------------------ run state

def is_finished(meta: dict[str, Any]) -> bool:
    """The runner writes status running | finished | interrupted; a killed run never reaches 'finished'."""
    return meta.get("status") == "finished" or meta.get("finished") is True


def torn_lines(run_dir: Path) -> int:
    """records.jsonl lines that do not parse (the record in flight when the process died)."""
    path = Path(run_dir) / "records.jsonl"
    if not path.exists():
        return 0
    bad = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            json.loads(line)
        except json.JSONDecodeError:
            bad += bool(line.strip())
    return bad


def _shape(rec: Record) -> dict[str, Any]:
    try:
        value = json.loads(rec.shape) if rec.shape else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _ratio(a: float, b: float) -> float:
    return a / b if not _missing(a) and not _missing(b) and b > 0 else math.nan


# ------------------------------------------------------------------------------------------ summary

def headline(rec: Record) -> str:
    """The one-line result of a row, whatever its kind."""
    parts = []
    if rec.kind == "kernel" and rec.trials:
        parts.append(f"max_abs {fmt_num(rec.max_abs)}, {fmt_pct(rec.pct_outside)} outside")
    if not _missing(rec.tau):
        parts.append(f"tau {fmt_num(rec.tau)}")
    if not _missing(rec.tokens_per_s):
        parts.append(f"{fmt_num(rec.tokens_per_s)} tok/s")
    if not _missing(rec.speedup_vs_ar):
        parts.append(f"{fmt_num(rec.speedup_vs_ar, 3)}x vs AR")
    if not _missing(rec.time_median_s):
        parts.append(f"median {fmt_time(rec.time_median_s)}")
    if not _missing(rec.pct_of_floor_rate):
        parts.append(f"{fmt_pct(rec.pct_of_floor_rate)} of floor rate")
    return "; ".join(parts)


def summary(records: list[Record]) -> tuple[list[tuple[str, int]], list[dict[str, Any]]]:
    counts = Counter(r.status for r in records)
    ordered = [(s, counts.get(s, 0)) for s in STATUS_ORDER]
    ordered += [(s, n) for s, n in sorted(counts.items()) if s not in STATUS_ORDER]
    rank = {s: i for i, s in enumerate(STATUS_ORDER[:5])}
    rows = [{"rec": r, "headline": headline(r), "note": r.reason or ("" if r.status == "pass" else r.worst)}
            for r in sorted(records, key=lambda r: rank.get(r.status, 9))]
    return ordered, rows


# ------------------------------------------------------------------------------------------ sections

def _varying(shapes: list[dict[str, Any]]) -> tuple[str | None, list[str]]:
    """(x axis, other keys): x is the numeric shape key with the most distinct values; the other keys
    that vary (numeric or not) split the lines so that no line mixes two settings."""
    keys = sorted({k for s in shapes for k in s})
    distinct = {k: len({json.dumps(s.get(k), sort_keys=True) for s in shapes}) for k in keys}
    varying = sorted((k for k in keys if distinct[k] > 1), key=lambda k: (-distinct[k], k))
    numeric = [k for k in varying if all(isinstance(s.get(k), (int, float)) and not isinstance(s.get(k), bool)
                                         for s in shapes)]
    if not numeric:
        return None, varying
    return numeric[0], [k for k in varying if k != numeric[0]]


def _series_label(rec: Record, shape: dict, others: list[str]) -> str:
    return " ".join([rec.backend or rec.kind] + [f"{k}={shape.get(k)}" for k in others])


def _latency_plot(recs: list[Record]) -> dict | None:
    timed = [r for r in recs if not _missing(r.time_median_s)]
    shapes = [_shape(r) for r in timed]
    x, others = _varying(shapes)
    if x is None:
        return None
    series: dict[str, list[tuple]] = {}
    for rec, shape in zip(timed, shapes):     # ms so the axis reads naturally
        series.setdefault(_series_label(rec, shape, others), []).append(
            (shape[x], 1e3 * rec.time_median_s, 1e3 * rec.time_p20_s, 1e3 * rec.time_p80_s))
    uri = plots.lines(series, x, "median time (ms), band p20-p80", logy=True)
    return uri and {"title": f"Latency vs {x}", "uri": uri,
                    "caption": f"median per case with its p20-p80 band; one line per backend"
                               f"{' and ' + ', '.join(others) if others else ''}"}


def _roofline_plot(recs: list[Record], family: str) -> dict | None:
    points, ceilings = [], None
    for r in recs:
        ceilings = ceilings or r.extra.get("ceilings")
        rate = _ratio(r.flops, r.time_median_s)
        points.append({"label": r.backend, "intensity": _ratio(r.flops, r.bytes_moved), "rate": rate})
    uri = plots.roofline(points, ceilings)
    shown = sum(1 for p in points if p["intensity"] > 0 and p["rate"] > 0)
    note = f"{len(points) - shown} timed rows without flops or bytes are not drawn" if shown < len(points) else ""
    return uri and {"title": f"Roofline: {family}", "uri": uri,
                    "caption": "achieved FLOP/s = flops / median time against intensity = flops / bytes_moved; "
                               "the roof is min(matmul rate, intensity x copy bandwidth) measured on this "
                               f"machine{'. ' + note if note else ''}"}


KERNEL_COLUMNS = [
    ("case", "case", "text"), ("backend", "backend", "text"), ("dtype", "dtype", "text"),
    ("status", "status", "text"), ("trials", "trials", "int"), ("NaN/inf", "n_nan", "int"),
    ("max abs", "max_abs", "num"), ("max rel", "max_rel", "num"), ("rel L2", "rel_l2", "num"),
    ("% outside", "pct_outside", "pct"), ("median", "time_median_s", "time"), ("p20", "time_p20_s", "time"),
    ("p80", "time_p80_s", "time"), ("n", "n_samples", "int"), ("GB/s", "gb_per_s", "num"),
    ("TFLOP/s", "tflop_per_s", "num"), ("floor", "floor_s", "time"),
    ("% of floor rate", "pct_of_floor_rate", "pct"), ("SM MHz", "sm_clock_mhz", "num"), ("throttle", "throttle", "text"), ("worst / reason", "note", "text"),
]


def _row(rec: Record, **extra) -> dict[str, Any]:
    row = asdict(rec)
    row["note"] = rec.reason or ("" if rec.status in ("pass", "info") else rec.worst)
    row.update(extra)
    return row


def kernel_section(family: str, recs: list[Record]) -> dict:
    rows = [_row(r, gb_per_s=_ratio(r.bytes_moved, r.time_median_s) / 1e9,
                 tflop_per_s=_ratio(r.flops, r.time_median_s) / 1e12) for r in recs]
    plot_list = [p for p in (_roofline_plot(recs, family), _latency_plot(recs)) if p]
    return {"title": f"kernel: {family}", "columns": KERNEL_COLUMNS, "rows": rows, "plots": plot_list}


GEN_COLUMNS = [
    ("case", "case", "text"), ("backend", "backend", "text"), ("policy", "policy", "text"),
    ("budget", "budget", "int"), ("status", "status", "text"), ("tau", "tau", "num"),
    ("per-depth acceptance", "per_depth", "text"), ("tokens/s", "tokens_per_s", "num"),
    ("speedup vs AR", "speedup_vs_ar", "num"), ("predicted speedup", "predicted_speedup", "num"),
    ("TTFT", "ttft_s", "time"), ("TPOT", "tpot_s", "time"), ("J / token", "energy_j_per_token", "num"),
    ("lossless", "lossless", "text"), ("SM MHz", "sm_clock_mhz", "num"), ("power W", "power_w", "num"),
    ("reason", "note", "text"),
]


def _per_depth(rec: Record) -> str:
    rates = rec.extra.get("per_depth_accept") or []
    text = ", ".join(fmt_num(float(x), 2) for x in rates[:8] if x is not None)
    return text + (", …" if len(rates) > 8 else "")


def _hist_fractions(rec: Record) -> dict[int, float]:
    """extra['accept_len_hist']: {accept length: steps} (or a list indexed by length) -> fractions."""
    raw = rec.extra.get("accept_len_hist") or {}
    items = raw.items() if isinstance(raw, dict) else enumerate(raw)
    hist = {int(k): float(v) for k, v in items if v}
    total = sum(hist.values())
    return {k: v / total for k, v in hist.items()} if total else {}


def generation_section(kind: str, recs: list[Record]) -> dict:
    shapes = [_shape(r) for r in recs]
    rows = [_row(r, policy=s.get("policy", ""), budget=s.get("budget"), per_depth=_per_depth(r))
            for r, s in zip(recs, shapes)]
    plot_list = []
    _, others = _varying(shapes)
    split = [k for k in others if k not in ("budget", "policy")]   # e.g. category, temperature
    tau: dict[str, list[tuple]] = {}
    for r, s in zip(recs, shapes):
        if not _missing(r.tau) and "budget" in s:
            label = " ".join([f"{s.get('policy', '?')} ({r.backend})"] + [f"{k}={s.get(k)}" for k in split])
            tau.setdefault(label, []).append((s["budget"], r.tau))
    uri = plots.lines(tau, "tree budget (nodes)", "tau (tokens per step, bonus included)")
    if uri:
        plot_list.append({"title": "tau vs budget per policy", "uri": uri,
                          "caption": "tau = committed tokens / verify steps, counting the bonus token"})
    hists = {f"{r.case} ({r.backend})": _hist_fractions(r) for r in recs[:8]}
    uri = plots.histogram(hists, "accept length per step (bonus included)")
    if uri:
        plot_list.append({"title": "accept-length histogram", "uri": uri,
                          "caption": "fraction of verify steps committing each number of tokens (first 8 rows)"})
    stages = [(f"{r.case} ({r.backend})", r.extra.get("stage_s") or {}) for r in recs]
    uri = plots.stacked_stages(stages)
    if uri:
        plot_list.append({"title": "step time by stage", "uri": uri,
                          "caption": "mean seconds per speculative step in each stage (Record.extra['stage_s'])"})
    return {"title": kind, "columns": GEN_COLUMNS, "rows": rows, "plots": plot_list}


GENERIC_COLUMNS = [
    ("case", "case", "text"), ("backend", "backend", "text"), ("link", "link", "text"), ("shape", "shape", "text"),
    ("status", "status", "text"), ("median", "time_median_s", "time"), ("reason", "note", "text"),
]


def sections(records: list[Record]) -> list[dict]:
    groups: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        groups.setdefault((r.kind, r.family if r.kind == "kernel" else ""), []).append(r)
    out = []
    for (kind, family), recs in groups.items():
        if kind == "kernel":
            out.append(kernel_section(family, recs))
        elif kind in ("acceptance", "e2e"):
            out.append(generation_section(kind, recs))
        else:
            out.append({"title": kind, "columns": GENERIC_COLUMNS, "rows": [_row(r) for r in recs],
                        "plots": [p for p in (_latency_plot(recs),) if p]})
    return out


# ------------------------------------------------------------------------------------------ environment

def env_rows(fp: dict[str, Any]) -> list[tuple[str, str]]:
    if not fp:
        return [("fingerprint", "not recorded in meta.json")]
    git = fp.get("git", {})
    rows = [("host", fp.get("hostname", "")),
            ("CPU", f"{fp.get('cpu_model', '')} ({fp.get('cpu_cores', '?')} cores), "
                    f"RAM {fmt_num(fp.get('ram_gb'), 3)} GB"),
            ("OS", fp.get("os", "")), ("python", fp.get("python", "")),
            ("packages", ", ".join(f"{k} {v}" for k, v in (fp.get("packages") or {}).items())),
            ("torch CUDA", f"{fp.get('torch_cuda') or 'none'} (available: {fp.get('cuda_available')})"),
            ("git", f"{git.get('sha') or git.get('reason', '')}{' (dirty)' if git.get('dirty') else ''}")]
    for g in fp.get("gpus") or []:
        rows.append((f"GPU {g.get('index')}", f"{g.get('name')}, {fmt_num(g.get('memory_gb'), 3)} GB, "
                     f"{g.get('sm_count', '?')} SMs, driver {g.get('driver')}, max SM clock "
                     f"{g.get('sm_clock_max_mhz')} MHz, power limit {fmt_num(g.get('power_limit_w'), 3)} W"))
    if not fp.get("gpus"):
        rows.append(("GPUs", f"none ({fp.get('gpu_reason', '')})"))
    pairs = fp.get("topology") or []
    rows.append(("topology", "; ".join(f"GPU{p['a']}-GPU{p['b']}: {p['detail']}" for p in pairs)
                 or fp.get("topology_reason", "")))
    return rows


def _ceiling_sources(records: list[Record]) -> list[str]:
    return sorted({str(r.extra["ceilings"].get("source", "")) for r in records
                   if isinstance(r.extra.get("ceilings"), dict)})


def context(run_dir: Path, records: list[Record], meta: dict[str, Any]) -> dict[str, Any]:
    counts, rows = summary(records)
    finished = is_finished(meta)
    return {
        "title": f"kdbench run {run_dir.name}",
        "meta": meta,
        "partial": not finished,
        "run_status": meta.get("status", "no meta.json") if meta else "no meta.json",
        "torn": torn_lines(run_dir),
        "counts": counts,
        "summary_rows": rows,
        "sections": sections(records),
        "env_rows": env_rows(meta.get("fingerprint") or {}),
        "ceiling_sources": _ceiling_sources(records),
        "scenarios": meta.get("scenarios") or [],
    }


def render(run_dir) -> Path:
    """Write run_dir/report.html from the saved records and meta (never re-runs anything)."""
    run_dir = Path(run_dir)
    records, meta = load_records(run_dir), load_meta(run_dir)
    html = environment().get_template("report.html.j2").render(**context(run_dir, records, meta))
    out = run_dir / "report.html"
    atomic_write_text(out, html)
    return out
