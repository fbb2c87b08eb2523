"""Best budget per batch size: replayed tau x the cost model's step time -> predicted tokens/s per policy,
budget and batch, the best budget and its predicted speedup over AR (all MODELED; plans/0008 §best budget).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kdbench import plots
from kdbench.engine.stages import Policy
from kdbench.intervals import overlaps
from kdbench.model.drafter import DrafterConfig

from . import costmodel as cm
from .replay import replay
from .trace import Trace

REF_BUDGET = 64   # the adaptive policy's row_cost is the cost model's slope from a root-only tree to this one


@dataclass(frozen=True)
class Prediction:
    policy: str          # the policy kind (adaptive: its label names the row cost)
    label: str
    budget: int
    batch: int
    tau: float           # replayed (exact for the trace's drafter)
    rows: float          # verify rows per request (adaptive: the mean of its per-round trees)
    step_s: float        # modeled
    ar_step_s: float     # modeled
    tokens_per_s: float  # batch * tau / step_s, modeled
    speedup: float       # tau * ar_step_s / step_s, modeled
    experts: float       # distinct routed experts per MoE layer in the verify
    verify_gb: float     # bytes the verify forward moves, GB
    verify_s: float = math.nan          # modeled verify forward
    outside_verify_s: float = math.nan  # modeled draft + build + accept + compact
    tau_lo: float = math.nan            # tau's 95 % interval over the trace's prompts (replay.tau_interval)
    tau_hi: float = math.nan
    prompts: int = 0

    def speedup_interval(self) -> tuple[float, float] | None:
        """The speedup at the modeled step times over tau's interval: speedup x [lo, hi] / tau, or None."""
        if math.isnan(self.tau_lo) or not self.tau > 0:
            return None
        return self.speedup * self.tau_lo / self.tau, self.speedup * self.tau_hi / self.tau


CostSetting = cm.CostSetting


def row_cost(cs: CostSetting, batch: int, depth: int) -> float:
    """Marginal verify cost of one tree row over a root-only speculative step (the adaptive policy's unit)."""
    dc = _drafter(cs, depth)
    t0 = cm.spec_step(cs, batch, 0, dc).seconds
    t1 = cm.spec_step(cs, batch, REF_BUDGET, dc).seconds
    return (t1 - t0) / (REF_BUDGET * t0)


def _drafter(cs: CostSetting, depth: int) -> DrafterConfig:
    return cm.default_drafter(cs.cfg, depth)


def sweep(trace: Trace, kinds: list[dict], budgets: list[int], batches: list[int], cs: CostSetting,
          max_new_tokens: int | None = None, cache: dict | None = None) -> list[Prediction]:
    """kinds: Policy keyword dicts without budget ({"kind": "ddtree"}, {"kind": "ddtree_width_capped",
    "max_width": 4}, {"kind": "adaptive"}: without a row_cost it comes from the cost model per batch).
    cache: Policy -> ReplayResult, shared between sweeps over the same trace and max_new_tokens."""
    dc = _drafter(cs, trace.depth)
    cache = {} if cache is None else cache
    out = []
    for batch in batches:
        ar = cm.ar_step(cs, batch)
        rc = row_cost(cs, batch, trace.depth)
        for spec in kinds:
            for budget in budgets:
                kw = {"row_cost": rc, **spec} if spec["kind"] == "adaptive" else dict(spec)
                kw["budget"] = budget
                policy = Policy(**kw)
                if policy not in cache:
                    cache[policy] = replay(trace, policy, max_new_tokens)
                r = cache[policy]
                rows = r.mean_nodes
                nodes = max(int(round(rows)) - 1, 0)
                step = cm.spec_step(cs, batch, nodes, dc)
                iv = r.tau_interval()
                out.append(Prediction(spec["kind"], policy.label, budget, batch, r.mean_tau, rows, step.seconds,
                                      ar.seconds, batch * r.mean_tau / step.seconds,
                                      r.mean_tau * ar.seconds / step.seconds, step.experts, step.bytes / 1e9,
                                      step.verify_s, step.seconds - step.verify_s,
                                      math.nan if iv.lo is None else iv.lo, math.nan if iv.hi is None else iv.hi,
                                      iv.n))
    return out


def best(preds: list[Prediction]) -> dict[tuple[str, int], Prediction]:
    """(policy kind, batch) -> the budget with the highest predicted tokens/s."""
    out: dict[tuple[str, int], Prediction] = {}
    for p in preds:
        key = (p.policy, p.batch)
        if key not in out or p.tokens_per_s > out[key].tokens_per_s:
            out[key] = p
    return out


def live_check_budgets(budgets: list[int], best_budget: int) -> list[int]:
    """The budgets a live check runs: the predicted best and its two nearest grid budgets (both below it when the
    best is the grid's largest, both above when it is the smallest; fewer only when the grid has fewer)."""
    grid = sorted(budgets)
    i = grid.index(best_budget)
    lo = min(max(i - 1, 0), max(len(grid) - 3, 0))
    return grid[lo:lo + 3]


def ties(preds: list[Prediction], top: Prediction) -> list[int]:
    """Budgets of top's policy and batch whose speedup interval overlaps top's: not told apart from it on the
    trace's prompts (plans/0016-tau-intervals.md). None for static k-ary: its budget does not change its tree."""
    if top.policy == "static_kary":
        return []
    a = top.speedup_interval()
    return sorted(p.budget for p in preds if (p.policy, p.batch) == (top.policy, top.batch) and p is not top
                  and overlaps(a, p.speedup_interval()))


def markdown(preds: list[Prediction], title: str) -> str:
    """The best-budget table (one row per policy and batch), with tau's interval over the trace's prompts, the
    speedup's at the modeled step times and the budgets not told apart from the best; all step times MODELED."""
    b = best(preds)
    lines = [f"### {title} (modeled)", "", "| policy | batch | best budget | tau (replayed) | tau 95% | step ms (modeled) "
             "| AR step ms (modeled) | tokens/s (modeled) | speedup vs AR (modeled) | speedup 95% | budgets not told "
             "apart | experts/layer | verify GB |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for (kind, batch), p in sorted(b.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        budget = "static" if kind == "static_kary" else str(p.budget)
        iv = p.speedup_interval()
        tau_ci = f"{p.tau_lo:.2f}-{p.tau_hi:.2f} ({p.prompts})" if iv else "-"
        sp_ci = f"{iv[0]:.2f}-{iv[1]:.2f}x" if iv else "-"
        near = ", ".join(map(str, ties(preds, p))) or "-"
        lines.append(f"| {kind} | {batch} | {budget} | {p.tau:.2f} | {tau_ci} | {p.step_s * 1e3:.2f} | "
                     f"{p.ar_step_s * 1e3:.2f} | {p.tokens_per_s:.0f} | {p.speedup:.2f}x | {sp_ci} | {near} | "
                     f"{p.experts:.0f} | {p.verify_gb:.1f} |")
    return "\n".join(lines)


def plot(preds: list[Prediction]) -> str | None:
    """One panel per batch: predicted tokens/s vs budget, one line per policy (a data: URI; the caller
    titles it)."""
    panels = []
    for batch in sorted({p.batch for p in preds}):
        series: dict[str, list[tuple]] = {}
        for p in preds:
            if p.batch == batch:
                series.setdefault(p.policy, []).append((p.budget, p.tokens_per_s))
        ar = next(p for p in preds if p.batch == batch)
        series["AR (modeled)"] = [(x, batch / ar.ar_step_s) for x, _ in next(iter(series.values()))]
        panels.append({"title": f"batch {batch}", "xlabel": "tree budget", "series": series})
    return plots.panels(panels, "tokens/s (MODELED)", logy=True, logx=True)


def as_dicts(preds: list[Prediction]) -> list[dict]:
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in dataclasses.asdict(p).items()} for p in preds]
