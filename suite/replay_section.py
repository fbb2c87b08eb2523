"""The report's replay section, from saved rows only (no torch): replayed tau and the cost model's MODELED step
time, tokens/s, speedup, experts and bytes per step per case, the best budget per (cost model, drafter,
policy, batch) and modeled tokens/s vs budget per batch (plans/0008, plans/0009)."""
from __future__ import annotations

from kdbench import plots
from kdbench import report_tables as tables
from kdbench.results import Record

COLUMNS = [   # (header, key, format): every modeled column says so
    ("case", "case", "text"), ("policy", "policy", "text"), ("cost model", "cost_model", "text"),
    ("drafter", "drafter", "text"), ("batch", "batch", "int"), ("status", "status", "text"),
    ("tau (replayed)", "tau", "num"), ("rows / request", "mean_rows", "num"),
    ("step (MODELED)", "modeled_step_s", "time"), ("verify (MODELED)", "modeled_verify_s", "time"),
    ("AR step (MODELED)", "modeled_ar_step_s", "time"), ("tokens/s (MODELED)", "modeled_tokens_per_s", "num"),
    ("speedup vs AR (MODELED)", "modeled_speedup", "x"), ("experts / MoE layer (MODELED)", "experts_per_layer", "num"),
    ("verify GB (MODELED)", "verify_gb", "num"),
]
KEYS = ("cost_model", "drafter", "batch", "budget", "mean_rows", "modeled_step_s", "modeled_verify_s",
        "modeled_ar_step_s", "modeled_tokens_per_s", "modeled_speedup", "experts_per_layer", "verify_gb")


def kind_of(r: Record) -> str:
    return r.policy.split("(")[0]


def _usable(recs: list[Record]) -> list[Record]:
    return [r for r in recs if r.status in tables.USABLE and r.extra.get("modeled")
            and not tables.missing(r.extra.get("modeled_tokens_per_s"))]


def best_rows(recs: list[Record]) -> list[list[str]]:
    """Per (cost model, drafter, policy kind, batch): the budget with the highest modeled tokens/s."""
    best: dict[tuple, Record] = {}
    tried: dict[tuple, set] = {}
    for r in _usable(recs):
        key = (r.extra["cost_model"], r.extra.get("drafter", ""), kind_of(r), r.extra["batch"])
        tried.setdefault(key, set()).add(r.extra["budget"])
        if key not in best or r.extra["modeled_tokens_per_s"] > best[key].extra["modeled_tokens_per_s"]:
            best[key] = r
    out = []
    for key, r in sorted(best.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][3], kv[0][2])):
        e = r.extra
        budget = "static tree" if key[2] == "static_kary" else str(e["budget"])
        out.append([key[0], key[1], key[2], str(key[3]), budget, f"{len(tried[key])}", tables_num(r.tau),
                    f"{e['modeled_step_s'] * 1e3:.2f} ms", f"{e['modeled_ar_step_s'] * 1e3:.2f} ms",
                    f"{e['modeled_tokens_per_s']:.0f}", f"{e['modeled_speedup']:.2f}x",
                    f"{e['experts_per_layer']:.0f}", f"{e['verify_gb']:.1f}"])
    return out


def tables_num(x) -> str:
    return "–" if tables.missing(x) else f"{x:.2f}"


def budget_plots(recs: list[Record]) -> list[dict]:
    """One figure per (cost model, drafter): a panel per batch, modeled tokens/s vs budget per policy kind
    (static k-ary has no budget: left out), AR's modeled tokens/s as a line."""
    out = []
    for (cost, drafter), group in tables.grouped(_usable(recs), lambda r: (r.extra["cost_model"],
                                                                          r.extra.get("drafter", ""))).items():
        panels = []
        for batch, rows in sorted(tables.grouped(group, lambda r: (r.extra["batch"],)).items()):
            series: dict[str, list] = {}
            for r in rows:
                if kind_of(r) != "static_kary":
                    series.setdefault(kind_of(r), []).append((r.extra["budget"], r.extra["modeled_tokens_per_s"]))
            series = {k: sorted(v) for k, v in series.items() if len({x for x, _ in v}) > 1}
            if series:
                xs = sorted({x for v in series.values() for x, _ in v})
                series["AR (modeled)"] = [(x, batch[0] / rows[0].extra["modeled_ar_step_s"]) for x in xs]
                panels.append({"title": f"batch {batch[0]}", "xlabel": "tree budget", "series": series})
        uri = panels and plots.panels(panels, "tokens/s (MODELED)", logy=True, logx=True)
        if uri:
            out.append({"title": f"tokens/s vs tree budget, MODELED: {cost}, tau replayed ({drafter})",
                        "uri": uri, "wide": True,
                        "caption": "step times from the cost model (plans/0008), not measured; tau replayed "
                                   "exactly from the trace (plans/0009); tokens/s = batch x tau / modeled step"})
    return out


def replay_section(recs: list[Record]) -> dict:
    rows = [tables.row(r, **{k: r.extra.get(k) for k in KEYS}) for r in recs]
    fits = sorted({str(r.extra.get("cost_fit", "")) for r in recs if r.extra.get("cost_fit")})
    best = {"title": "best budget per batch size (MODELED step times, tau replayed)",
            "headers": ["cost model", "drafter", "policy", "batch", "best budget", "budgets tried", "tau (replayed)",
                        "step (MODELED)", "AR step (MODELED)", "tokens/s (MODELED)", "speedup vs AR (MODELED)",
                        "experts / MoE layer (MODELED)", "verify GB (MODELED)"],
            "rows": best_rows(recs),
            "caption": "MODELED, not measured: step times from the verify-cost model. Cost fits used: "
                       + ("; ".join(fits) if fits else "none recorded")}
    return {"type": "generic", "title": "replay (step times MODELED)", **tables.layout(COLUMNS, rows), "rows": rows,
            "plots": budget_plots(recs), "tables": [best] if best["rows"] else []}
