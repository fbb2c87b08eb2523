"""The run report: one self-contained HTML file (jinja2, autoescaped, plots as data: URIs) rendered from a
run directory's saved records.jsonl + meta.json only. Tables come from report_tables, plot inputs are
prepared in report_plots; templates only loop and format.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup, escape

from kdbench import e2e_best, paired, report_header, report_plots, tolerances
from kdbench import report_tables as tables
from kdbench.parallel.report_section import topology_section
from kdbench.replay_section import replay_section
from kdbench.report_tables import missing as _missing
from kdbench.errors import DamagedRun
from kdbench.results import Record, atomic_write_text, load_meta, load_records

TEMPLATES = Path(__file__).resolve().parent / "templates"


# ------------------------------------------------------------------------------------------ formatting

def fmt_num(x, digits: int = 4) -> str:
    """`digits` significant digits; integers when the rounded value has no fraction digit left (1440, not
    1.44e+03); exponent form below 1e-3 and from 1e5."""
    if _missing(x):
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if not isinstance(x, float):
        return str(x)
    if x == 0:
        return "0"
    if math.isinf(x):
        return str(x).replace("inf", "∞")
    if abs(x) >= 1e5 or abs(x) < 1e-3:
        return f"{x:.{digits - 1}e}"
    exponent = math.floor(math.log10(abs(x)))
    if exponent >= digits - 1:
        return f"{round(x, digits - 1 - exponent):.0f}"
    return f"{x:.{digits}g}"


def fmt_time(seconds) -> str:
    if _missing(seconds):
        return "–"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_time_range(lo, hi) -> str:
    """p20-p80 in the unit of the high end: '28.4–42.5 µs', '0.968–1.06 ms'."""
    if _missing(lo) or _missing(hi):
        return "–"
    value, unit = fmt_time(hi).split(" ")
    scale = float(hi) / float(value) if float(value) else 1.0
    return f"{lo / scale:.3g}–{value} {unit}"


def fmt_pct(x) -> str:
    return "–" if _missing(x) else f"{fmt_num(float(x), 3)}%"


def fmt_change(pct) -> str:
    """A signed relative change in percent: +20.3%, -4.1%."""
    return "–" if _missing(pct) else f"{pct:+.1f}%"


def fmt_times(x) -> str:
    """A speedup factor: 12.3×."""
    return "–" if _missing(x) else f"{fmt_num(float(x), 3)}×"


def cell(value, fmt: str = "text") -> str:
    """The one cell formatter the templates use: text | note (wrapping text) | num (3 significant digits) |
    time | pct | int | x (a speedup factor)."""
    if fmt == "time":
        return fmt_time(value)
    if fmt == "pct":
        return fmt_pct(value)
    if fmt == "x":
        return fmt_times(value)
    if fmt in ("num", "int"):
        return fmt_num(value, 3)
    return "" if value is None else str(value)


def span(pair, fmt: str = "num") -> str:
    """A (low, high) range as 'low–high', or one value when both ends format alike."""
    lo, hi = (cell(v, fmt) for v in pair)
    return lo if lo == hi else f"{lo}–{hi}"


def breakable(text) -> Markup:
    """A case name that may wrap after its commas ('bench[heads=128,<wbr>nodes=256]'), escaped."""
    return Markup(",<wbr>").join(escape(str(text)).split(","))


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(cell=cell, num=fmt_num, time=fmt_time, pct=fmt_pct, change=fmt_change, span=span,
                       time_range=fmt_time_range, breakable=breakable)
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


# ------------------------------------------------------------------------------------------ sections

def kernel_section(family: str, recs: list[Record], best: dict, peers: dict, tols: dict | None = None) -> dict:
    rows = tables.kernel_rows(recs, best, peers)
    for row in rows:
        row["tolerance"] = tolerances.describe(tolerances.tolerance_of(row["scenario"], row["case"], tols or {}))
    plot_list = [p for p in [report_plots.roofline_plot(recs, family)] + report_plots.latency_plots(recs) if p]
    return {"type": "kernel", "title": f"kernel: {family}", **tables.layout(tables.KERNEL_COLUMNS, rows),
            "rows": rows, "plots": plot_list, "compared": any(r["baseline"] for r in rows),
            "peer_compared": any(r["peer"] for r in rows),
            "legend": tables.legend(recs)}


def generation_section(kind: str, recs: list[Record]) -> dict:
    rows = tables.generation_rows(recs)
    return {"type": "generation", "title": kind, **tables.layout(tables.GEN_COLUMNS, rows), "rows": rows,
            "plots": report_plots.generation_plots(recs)}


def _groups(records: list[Record]) -> dict[tuple[str, str], list[Record]]:
    return tables.grouped(records, lambda r: (r.kind, r.family if r.kind == "kernel" else ""))


def sections(records: list[Record], best: dict, peers: dict, tols: dict | None = None) -> list[dict]:
    out = []
    for (kind, family), recs in _groups(records).items():
        if kind == "kernel":
            out.append(kernel_section(family, recs, best, peers, tols))
        elif kind in ("acceptance", "e2e"):
            out.append(generation_section(kind, recs))
        elif kind == "topology":
            out.append(topology_section(recs))
        elif kind == "replay":
            out.append(replay_section(recs))
        else:
            rows = [tables.row(r) for r in recs]
            out.append({"type": "generic", "title": kind, **tables.layout(tables.GENERIC_COLUMNS, rows),
                        "rows": rows, "plots": report_plots.latency_plots(recs)})
    return out


def headlines(records: list[Record], best: dict, peers: dict) -> dict[str, list[dict]]:
    groups = _groups(records)
    return {"kernel": [tables.kernel_headline(fam, recs, best, peers) for (kind, fam), recs in groups.items()
                       if kind == "kernel"],
            "acceptance": tables.acceptance_headline(groups.get(("acceptance", ""), [])),
            "paired": paired.ddtree_vs_chain(records),
            "e2e": tables.e2e_headline(groups.get(("e2e", ""), [])),
            "best": e2e_best.best_by_batch(records)}


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
            ("git", f"{git.get('sha') or git.get('reason', '')}{' (dirty)' if git.get('dirty') else ''}"),
            ("kernel knobs", ", ".join(f"{k}={v}" for k, v in (fp.get("kernel_knobs") or {}).items())
             or ("none set" if "kernel_knobs" in fp else "not recorded"))]
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


def context(run_dir: Path, records: list[Record], meta: dict[str, Any]) -> dict[str, Any]:
    best, peers = tables.best_baselines(records), tables.best_peers(records)
    safe = dict(meta, **{k: _meta_field(run_dir, meta, k, kind)   # damaged meta: DamagedRun before any use
                         for k, kind in (("fingerprint", dict), ("scenarios", list), ("parts", list))})
    section_list = sections(records, best, peers, tolerances.case_tolerances(safe))
    skipped = tables.skipped_groups(records)
    for g in skipped:
        g["reason"] = report_header.whole_sentences(g["reason"])
    return {
        "verdicts": report_header.kind_verdicts(records),
        "header": report_header.header(safe, records),
        "parts": report_header.parts(safe),
        "toc": report_header.toc(section_list, bool(safe["scenarios"])),
        "title": f"kdbench run {run_dir.name}",
        "meta": meta,
        "partial": not is_finished(meta),
        "run_status": meta.get("status", "no meta.json") if meta else "no meta.json",
        "torn": torn_lines(run_dir),
        "n_records": len(records),
        "counts": tables.verdict_counts(records),
        "attention": tables.attention_rows(records),
        "skipped": skipped,
        "headlines": headlines(records, best, peers),
        "paired_summary": paired.summary(paired.ddtree_vs_chain(records)),
        "sections": section_list,
        "env_rows": env_rows(safe["fingerprint"]),
        "ceilings": tables.ceiling_rows(records),
        "telemetry": tables.telemetry_rows(records),
        "scenarios": [{k: str(sc.get(k, "")) for k in ("name", "kind", "file", "text")}
                      for sc in _meta_field(run_dir, meta, "scenarios", list) if isinstance(sc, dict)],
    }


def _meta_field(run_dir: Path, meta: dict[str, Any], key: str, kind: type):
    """meta[key] when it has the type kdbench writes (empty when absent); else the run is damaged."""
    value = meta.get(key) or kind()
    if not isinstance(value, kind):
        raise DamagedRun(f"{run_dir / 'meta.json'}: {key}: got {type(value).__name__}, expected "
                         f"{'a mapping' if kind is dict else 'a list'}; the run is damaged")
    return value


def render(run_dir) -> Path:
    """Write run_dir/report.html from the saved records and meta (never re-runs anything)."""
    run_dir = Path(run_dir)
    records, meta = load_records(run_dir), load_meta(run_dir)
    html = environment().get_template("report.html.j2").render(**context(run_dir, records, meta))
    out = run_dir / "report.html"
    atomic_write_text(out, html)
    return out
