"""ddtree against chain, paired per prompt (issue 11 item 4): for every acceptance record of ddtree, the chain
record with the same prompts (same model, drafter, category, sizes, temperature, backend, dtype) at the same
budget, or at its longest chain when the budget exceeds the drafter's L; the per-prompt tau differences and
whether ddtree's tau falls below chain's."""
from __future__ import annotations

from typing import Any

import numpy as np

from kdbench.report_tables import shape_of
from kdbench.results import Record

PAIRING_KEYS = ("model", "drafter", "category", "prompts", "prompt_len", "max_new_tokens", "temperature", "batch",
                "quality", "draft_len")


def _key(rec: Record) -> tuple:
    s = shape_of(rec)
    return (rec.backend, rec.dtype) + tuple(s.get(k) for k in PAIRING_KEYS)


def ddtree_vs_chain(records: list[Record]) -> list[dict[str, Any]]:
    """One row per ddtree record with a paired chain record: budget, both taus, the mean per-prompt difference,
    the share of prompts where ddtree's tau is lower, and below = ddtree's mean tau < chain's."""
    acc = [r for r in records if r.kind == "acceptance" and r.tau is not None and "tau_per_prompt" in r.extra]
    chains: dict[tuple, dict[int, Record]] = {}
    for r in acc:
        if shape_of(r).get("policy") == "chain":
            chains.setdefault(_key(r), {})[int(shape_of(r)["budget"])] = r
    rows = []
    for r in acc:
        s = shape_of(r)
        if s.get("policy") != "ddtree" or _key(r) not in chains:
            continue
        by_budget = chains[_key(r)]
        length = min(int(s["budget"]), int(s.get("draft_len", 15)))
        chain = by_budget.get(length) or by_budget[max(by_budget)]
        a, b = np.asarray(r.extra["tau_per_prompt"], float), np.asarray(chain.extra["tau_per_prompt"], float)
        if a.shape != b.shape:
            continue
        rows.append({"case": r.case, "budget": int(s["budget"]), "chain_budget": int(shape_of(chain)["budget"]),
                     "temperature": s.get("temperature"), "category": s.get("category"),
                     "tau_ddtree": r.tau, "tau_chain": chain.tau, "diff_mean": float(np.nanmean(a - b)),
                     "prompts_lower": f"{int(np.sum(a < b))}/{len(a)}", "below": bool(r.tau < chain.tau)})
    return sorted(rows, key=lambda x: (str(x["temperature"]), str(x["category"]), x["budget"]))


def summary(rows: list[dict[str, Any]]) -> str:
    """One sentence for the report."""
    if not rows:
        return ""
    below = [r for r in rows if r["below"]]
    if not below:
        return f"ddtree's tau is at or above chain's at every one of the {len(rows)} paired budgets."
    where = ", ".join(f"budget {r['budget']} (T={r['temperature']}, {r['category']}: {r['tau_ddtree']:.3f} < "
                      f"{r['tau_chain']:.3f})" for r in below)
    return f"ddtree's tau falls below chain's at {len(below)} of {len(rows)} paired budgets: {where}."
