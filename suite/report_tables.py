"""The run report's tables, computed from saved Records: verdict counts, rows needing attention, skips by
reason, one headline line per family, the per-family rows, the ceilings used and a telemetry summary.
Cells stay numbers (NaN when absent); the templates format them with report.cell.
"""
from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import asdict
from typing import Any, Iterable

from kdbench.backends import registry
from kdbench.intervals import ci_text, speedup_interval, speedup_unsure
from kdbench.results import Record

STATUS_ORDER = ("pass", "fail", "error", "skipped", "ambiguous", "info")
ATTENTION = ("fail", "error", "ambiguous")
USABLE = ("pass", "info")                # rows whose timing may enter a speedup: checked, or measured only


# ------------------------------------------------------------------------------------------ helpers

def missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def shape_of(rec: Record) -> dict[str, Any]:
    try:
        value = json.loads(rec.shape) if rec.shape else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def ratio(a: float, b: float) -> float:
    return a / b if not missing(a) and not missing(b) and b > 0 else math.nan


def median(values: Iterable) -> float:
    xs = [float(x) for x in values if not missing(x)]
    return statistics.median(xs) if xs else math.nan


def low_high(values: Iterable) -> tuple[float, float]:
    xs = [float(x) for x in values if not missing(x)]
    return (min(xs), max(xs)) if xs else (math.nan, math.nan)


def note(rec: Record) -> str:
    """Why a row is not a plain pass: the reason, else the worst element of a failing check."""
    return rec.reason or ("" if rec.status in USABLE else rec.worst)


def grouped(recs: list[Record], key) -> dict[tuple, list[Record]]:
    """Rows by key(row), in order of first appearance."""
    groups: dict[tuple, list[Record]] = {}
    for r in recs:
        groups.setdefault(key(r), []).append(r)
    return groups


def hist_fractions(rec: Record) -> dict[int, float]:
    """extra['accept_len_hist']: {accept length: steps} (or a list indexed by length) -> fractions of steps."""
    raw = rec.extra.get("accept_len_hist") or {}
    items = raw.items() if isinstance(raw, dict) else enumerate(raw)
    hist = {int(k): float(v) for k, v in items if v}
    total = sum(hist.values())
    return {k: v / total for k, v in hist.items()} if total else {}


def policy_label(rec: Record) -> str:
    """The generation policy of a row, e.g. 'ddtree(B=64)' or 'ar': its policy column; the shape's policy
    comes last because an e2e case also times its AR baseline under the case's shape, and an error or skipped
    row has no policy of its own."""
    return str(rec.policy or rec.extra.get("policy") or shape_of(rec).get("policy", ""))


# ------------------------------------------------------------------------------------------ summary

def verdict_counts(records: list[Record]) -> list[tuple[str, int]]:
    counts = Counter(r.status for r in records)
    ordered = [(s, counts.get(s, 0)) for s in STATUS_ORDER]
    return ordered + [(s, n) for s, n in sorted(counts.items()) if s not in STATUS_ORDER]


PREDICTION_OFF = 0.25   # e2e: predicted / measured speedup further than this from 1 needs a look


def e2e_flags(rec: Record) -> list[str]:
    """Why an e2e speculative row needs a look though no check failed: slower than AR, a predicted speedup off
    the measured one by more than PREDICTION_OFF, or greedy output that differs from AR (issue 11 item 7)."""
    if rec.kind != "e2e" or missing(rec.speedup_vs_ar):
        return []
    out = []
    if rec.speedup_vs_ar < 1:
        out.append(f"speedup {rec.speedup_vs_ar:.2f}x < 1 vs AR")
    elif speedup_unsure(rec):
        lo, hi = speedup_interval(rec)
        out.append(f"speedup {rec.speedup_vs_ar:.2f}x, but its 95% interval over {rec.extra.get('speedup_batches')} "
                   f"batches ({lo:.2f}-{hi:.2f}x) reaches below 1")
    if not missing(rec.predicted_speedup) and abs(rec.predicted_speedup / rec.speedup_vs_ar - 1) > PREDICTION_OFF:
        eff = rec.extra.get("slot_efficiency")   # kinds/e2e.slot_efficiency: finished requests keep their slots
        why = f"; slot efficiency {eff:.2f}: predicted x it = {rec.predicted_speedup * eff:.2f}x" if eff else ""
        out.append(f"predicted {rec.predicted_speedup:.2f}x vs measured {rec.speedup_vs_ar:.2f}x "
                   f"(off by more than {PREDICTION_OFF:.0%}{why})")
    if (rec.lossless or "").startswith("no"):
        out.append("greedy output differs from AR")
    return out


def attention_rows(records: list[Record]) -> list[dict[str, Any]]:
    """fail / error / ambiguous rows, failures first, then e2e rows with e2e_flags; other pass, info and
    skipped rows are not listed."""
    rank = {s: i for i, s in enumerate(ATTENTION)}
    bad = sorted((r for r in records if r.status in ATTENTION), key=lambda r: rank[r.status])
    flagged = [r for r in records if r.status not in ATTENTION and e2e_flags(r)]
    return [{"rec": r, "note": "; ".join(x for x in e2e_flags(r) + [note(r)] if x)} for r in bad + flagged]


def skipped_groups(records: list[Record]) -> list[dict[str, Any]]:
    """Skipped rows grouped by reason: {reason, count, where: 'family/backend (n), ...'}, largest first."""
    groups: dict[str, Counter] = {}
    for r in records:
        if r.status == "skipped":
            groups.setdefault(r.reason or "no reason recorded", Counter())[f"{r.family or r.kind}/{r.backend}"] += 1
    out = []
    for reason, where in sorted(groups.items(), key=lambda kv: -sum(kv[1].values())):
        top = ", ".join(f"{k} ({n})" for k, n in where.most_common(4))
        out.append({"reason": reason, "count": sum(where.values()),
                    "where": top + (", …" if len(where) > 4 else "")})
    return out


# ------------------------------------------------------------------------------------------ speedups

def case_key(rec: Record) -> tuple:
    """Rows of one case and dtype: the backends compared against each other."""
    return (rec.scenario, rec.family, rec.case, rec.dtype, rec.device, rec.link)


def _timed(rec: Record) -> bool:
    return rec.status in USABLE and not missing(rec.time_median_s) and rec.time_median_s > 0


def best_of(records: list[Record], role: str) -> dict[tuple, Record]:
    """Per case key, the fastest timed kernel row of a backend with this registry role that does the case's
    whole work (flashinfer_prefix does less: it is never the best peer)."""
    best: dict[tuple, Record] = {}
    for r in records:
        entry = registry.BACKENDS.get(r.backend)
        if r.kind == "kernel" and entry is not None and entry.role == role and entry.same_work and _timed(r):
            k = case_key(r)
            if k not in best or r.time_median_s < best[k].time_median_s:
                best[k] = r
    return best


def best_baselines(records: list[Record]) -> dict[tuple, Record]:
    """The torch (and host) baselines: what a plain model runs."""
    return best_of(records, "baseline")


def best_peers(records: list[Record]) -> dict[tuple, Record]:
    """The public kernels a serving stack could run instead (FlashInfer)."""
    return best_of(records, "peer")


def speedup(rec: Record, best: dict[tuple, Record]) -> tuple[float, str]:
    """(baseline median / ours median, baseline backend) for a timed row of the family's shipped backend
    (registry.shipped: cuda, or moe_triton for moe_experts); (NaN, '') otherwise."""
    base = best.get(case_key(rec))
    if rec.backend != registry.shipped(rec.family) or base is None or not _timed(rec):
        return math.nan, ""
    return base.time_median_s / rec.time_median_s, base.backend


# ------------------------------------------------------------------------------------------ headlines

def kernel_headline(family: str, recs: list[Record], best: dict[tuple, Record],
                    peers: dict[tuple, Record] | None = None) -> dict[str, Any]:
    statuses = Counter(r.status for r in recs)
    ours = registry.shipped(family)
    mine = [r for r in recs if r.backend == ours]
    sp = [(v, r.case) for r in mine for v in [speedup(r, best)[0]] if not missing(v)]
    lowest = min(sp) if sp else (math.nan, "")
    vs_peer = [(v, r.case) for r in mine for v in [speedup(r, peers or {})[0]] if not missing(v)]
    peer_low = min(vs_peer) if vs_peer else (math.nan, "")
    return {"family": family, "ours": ours, "cases": len({(r.scenario, r.case, r.dtype) for r in recs}),
            "rows": len(recs),
            "pass": statuses["pass"], "bad": statuses["fail"] + statuses["error"],
            "skipped": statuses["skipped"], "ours_rows": len(mine),
            "floor_pct": median(r.pct_of_floor_rate for r in mine if r.status in USABLE),
            "speedup_median": median(v for v, _ in sp), "speedup_min": lowest[0],
            "speedup_min_case": lowest[1], "compared": len(sp),
            "peer_median": median(v for v, _ in vs_peer), "peer_min": peer_low[0], "peer_min_case": peer_low[1],
            "peer_compared": len(vs_peer)}


def acceptance_headline(recs: list[Record]) -> list[dict[str, Any]]:
    """One line per (policy, backend, dtype): the tau range over its budgets; lossless = greedy output equal
    to AR token for token."""
    out = []
    for (policy, backend, dtype), g in grouped(
            recs, lambda r: (policy_label(r).split("(")[0], r.backend, r.dtype)).items():
        checked = [r for r in g if r.lossless]
        out.append({"policy": policy, "backend": backend, "dtype": dtype, "rows": len(g),
                    "budget": low_high(shape_of(r).get("budget") for r in g), "tau": low_high(r.tau for r in g),
                    "lossless": f"{sum(r.lossless.startswith('yes') for r in checked)}/{len(checked)}"
                    if checked else "–"})
    return out


def e2e_headline(recs: list[Record]) -> list[dict[str, Any]]:
    """One line per (policy, backend, dtype, graph mode): tokens/s and speedup vs AR (ranges over its cases)."""
    return [{"policy": f"{policy} [{mode}]" if mode else policy, "backend": backend, "dtype": dtype, "rows": len(g),
             "tokens_per_s": low_high(r.tokens_per_s for r in g), "speedup": low_high(r.speedup_vs_ar for r in g),
             "tau": low_high(r.tau for r in g)}
            for (policy, backend, dtype, mode), g in grouped(recs, lambda r: (
                policy_label(r), r.backend, r.dtype, graph_mode(r).split(":")[0])).items()]


# ------------------------------------------------------------------------------------------ section rows

def registry_label(backend: str) -> str:
    """The registry's few words on a backend (e.g. that flashinfer_prefix does less work, or that nccl rows
    time the collective library); '' if unknown."""
    return registry.label(backend)


def legend(recs: list[Record]) -> list[tuple[str, str]]:
    """(backend, its few words) for each backend of these rows, in first-seen order."""
    return [(b, registry_label(b)) for b in dict.fromkeys(r.backend for r in recs)]


def row(rec: Record, **extra) -> dict[str, Any]:
    out = asdict(rec)
    out["note"] = note(rec)
    out.update(extra)
    return out


KERNEL_COLUMNS = [   # (header, key, format) after the case cell; p20-p80, speedup, note and repro follow
    ("backend", "backend", "text"), ("dtype", "dtype", "text"), ("status", "status", "text"),
    ("median", "time_median_s", "time"), ("n", "n_samples", "int"), ("% of floor rate", "pct_of_floor_rate", "pct"),
    ("GB/s", "gb_per_s", "num"), ("TFLOP/s", "tflop_per_s", "num"), ("rel L2", "rel_l2", "num"),
    ("max abs", "max_abs", "num"),
]

GEN_COLUMNS = [
    ("case", "case", "text"), ("policy", "policy", "text"), ("backend", "backend", "text"),
    ("dtype", "dtype", "text"), ("budget", "budget", "int"), ("status", "status", "text"), ("tau", "tau", "num"),
    ("tau 95% interval", "tau_ci", "note"), ("tokens/s", "tokens_per_s", "num"), ("speedup vs AR", "speedup_vs_ar", "x"),
    ("speedup 95% interval", "speedup_ci", "note"),
    ("predicted speedup", "predicted_speedup", "x"), ("slot efficiency", "slot_eff", "num"),
    ("graph mode", "graph_mode", "text"),
    ("TTFT", "ttft_s", "time"), ("TPOT", "tpot_s", "time"),
    ("J / token", "energy_j_per_token", "num"), ("lossless", "lossless", "note"),
    ("forward", "fwd_s", "time"), ("forward floor", "fwd_floor_s", "time"), ("% of floor", "fwd_pct", "pct"),
    ("% of floor by stage", "fwd_stages", "note"),
]
FLOOR_STAGES = (("attention", "attn"), ("dense_mlp", "mlp"), ("moe", "moe"), ("lm_head", "lm_head"),
                ("others", "other"))

GENERIC_COLUMNS = [   # policy: replay rows; phase: topology rows (filled() drops a column no row has)
    ("case", "case", "text"), ("policy", "policy", "text"), ("phase", "phase", "text"), ("backend", "backend", "text"),
    ("link", "link", "text"), ("shape", "shape", "text"),
    ("status", "status", "text"), ("median", "time_median_s", "time"),
]


def filled(columns: list[tuple], rows: list[dict]) -> list[tuple]:
    """The columns that hold a value in some row (acceptance rows have no tokens/s, e.g.)."""
    return [c for c in columns if any(not missing(r[c[1]]) and r[c[1]] != "" for r in rows)]


def layout(columns: list[tuple], rows: list[dict]) -> dict[str, Any]:
    """Columns to draw, and the text columns with one value in every row (dtype, usually), which are named
    once above the table instead; case, backend and status always stay."""
    columns = filled(columns, rows)
    common = [(h, rows[0][k]) for h, k, f in columns
              if f == "text" and k not in ("case", "backend", "status") and len(rows) > 1
              and len({str(r[k]) for r in rows}) == 1]
    shared = {h for h, _ in common}
    return {"columns": [c for c in columns if c[0] not in shared], "common": common,
            "noted": any(r["note"] for r in rows)}


def kernel_rows(recs: list[Record], best: dict[tuple, Record],
                peers: dict[tuple, Record] | None = None) -> list[dict[str, Any]]:
    """One row per (case, backend), the rows of a case together; the first row of a case carries
    span = its row count and the case's distinct repro commands (the template's rowspan), the others span 0."""
    out = []
    for group in grouped(recs, case_key).values():
        repros = list(dict.fromkeys(r.repro for r in group if r.repro))
        for i, r in enumerate(group):
            value, base = speedup(r, best)
            vs_peer, peer = speedup(r, peers or {})
            out.append(row(r, span=0 if i else len(group), repros=repros if i == 0 else [],
                           gb_per_s=ratio(r.bytes_moved, r.time_median_s) / 1e9,
                           tflop_per_s=ratio(r.flops, r.time_median_s) / 1e12, speedup=value, baseline=base,
                           speedup_peer=vs_peer, peer=peer, label=registry_label(r.backend),
                           ours=r.backend == registry.shipped(r.family)))
    return out


def generation_rows(recs: list[Record], depths: int = 4) -> list[dict[str, Any]]:
    out = []
    for r in recs:
        rates = [float(x) for x in (r.extra.get("per_depth_accept") or []) if x is not None]
        extra_note = "" if r.lossless and r.lossless in r.reason else note(r)   # lossless text is its own column
        policy = policy_label(r)
        budget = r.extra.get("budget", None if policy == "ar" else shape_of(r).get("budget"))  # AR has no tree
        out.append(row(r, policy=policy, budget=budget, per_depth=rates[:depths],
                       more_depths=len(rates) > depths, note=extra_note, graph_mode=graph_mode(r),
                       slot_eff=r.extra.get("slot_efficiency"), **forward_cells(r),
                       tau_ci=ci_text(r.extra.get("tau_ci95"), r.extra.get("tau_prompts"), "prompt"),
                       speedup_ci=ci_text(speedup_interval(r), r.extra.get("speedup_batches"), "batch", "x")))
    return out


def graph_mode(rec: Record) -> str:
    """An e2e row's graph mode ("graph" | "eager"), both arms named when they differ, the reason when eager."""
    mode, ar = rec.extra.get("graph_mode", ""), rec.extra.get("ar_graph_mode", "")
    text = f"{mode} (AR {ar})" if ar and ar != mode else mode
    why = rec.extra.get("graph_reason", "")
    return f"{text}: {why[:80]}" if text == "eager" and why else text


def forward_cells(rec: Record) -> dict[str, Any]:
    """The forward's time, floor and % of floor (Record.extra['forward'], engine/floor.py), and per stage
    'name share-of-time % floor%' (the forward's mode and rows in front)."""
    f = rec.extra.get("forward")
    if not isinstance(f, dict):
        return {"fwd_s": None, "fwd_floor_s": None, "fwd_pct": None, "fwd_stages": rec.extra.get("forward_error", "")}
    parts = []
    for key, short in FLOOR_STAGES:
        st = f["stages"].get(key, {})
        if st.get("bytes"):   # pct None: a stage whose time came out <= 0 (others = whole - the stage graphs)
            pct = "n/a" if st.get("pct_of_floor") is None else f"{st['pct_of_floor']:.0f}%"
            parts.append(f"{short} {100 * st['time_s'] / f['time_s']:.0f}% of time, at {pct} of floor")
    head = f"{f['mode']}, {f['batch']}x{f['rows']} rows over {f['past']} keys: "
    return {"fwd_s": f["time_s"], "fwd_floor_s": f["floor_s"], "fwd_pct": f["pct_of_floor"],
            "fwd_stages": head + "; ".join(parts)}


# ------------------------------------------------------------------------------------------ conventions

def where_timed(rec: Record) -> str:
    """The device a row was timed on: 'CPU' for host-timed rows (the numpy reference on a GPU run, or a CPU
    run), else the row's GPU; its ceilings come from there."""
    timed_on = rec.extra.get("timed_on") or ("cpu" if rec.device == "cpu" else "cuda")
    return "CPU" if timed_on == "cpu" else (rec.device or "GPU")


def ceiling_rows(records: list[Record]) -> list[dict[str, Any]]:
    """The distinct roofline ceilings the rows were scored against (Record.extra['ceilings']), labelled with
    the device each row was timed on."""
    seen: dict[tuple, dict[str, Any]] = {}
    for r in records:
        c = r.extra.get("ceilings")
        if not isinstance(c, dict):
            continue
        bw, peak, source = c.get("copy_bytes_per_s"), c.get("matmul_flops_per_s"), str(c.get("source", ""))
        entry = seen.setdefault((where_timed(r), bw, peak), {
            "device": where_timed(r), "copy_tb_per_s": ratio(bw, 1e12), "matmul_tflop_per_s": ratio(peak, 1e12),
            "ridge": ratio(peak, bw), "source": source, "rows": 0})
        entry["rows"] += 1
        if len(source) < len(entry["source"]):   # the same figures read back from the cache say so at length
            entry["source"] = source
    return list(seen.values())


def telemetry_rows(records: list[Record]) -> list[dict[str, Any]]:
    """Per device: clocks, power, temperature and throttle reasons over the rows that recorded telemetry."""
    out = []
    for device, g in grouped(records, lambda r: r.device).items():
        sampled = [r for r in g if not missing(r.sm_clock_mhz) or not missing(r.power_w)]
        if not sampled:
            continue
        reasons = Counter(t.strip() for r in sampled for t in r.throttle.split(",") if t.strip())
        out.append({"device": device, "rows": len(sampled), "of": len(g),
                    "sm_clock": low_high(r.sm_clock_mhz for r in sampled),
                    "sm_clock_median": median(r.sm_clock_mhz for r in sampled),
                    "mem_clock_median": median(r.mem_clock_mhz for r in sampled),
                    "power_median": median(r.power_w for r in sampled),
                    "power_max": low_high(r.power_w for r in sampled)[1],
                    "temp_max": low_high(r.temp_c for r in sampled)[1],
                    "throttle": ", ".join(f"{k} ({n} rows)" for k, n in reasons.most_common()) or "none"})
    return out
