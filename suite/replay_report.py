"""The replay findings: the cost model checked against measured forwards, then the best budget per batch size
for today's eager engine, a serving-grade engine and full-size Kimi-K2 (61 layers), all step times MODELED
and labelled so, tau replayed from a trace. Writes findings.md, findings.html (plots) and findings.json."""
from __future__ import annotations

import dataclasses
import html
import json
from pathlib import Path

from kdbench.references.model_config import get_preset

from . import bestbudget as bb
from . import costfit as cf
from . import costmodel as cm
from .trace import Trace

KINDS = [{"kind": "chain"}, {"kind": "ddtree"}, {"kind": "ddtree_width_capped", "max_width": 4},
         {"kind": "static_kary", "branching": (4, 2, 2, 1, 1, 1, 1, 1)}, {"kind": "adaptive"}]
BUDGETS = [4, 8, 16, 32, 64, 128, 256]
BATCHES = [1, 8, 32]
K2_ASSUMPTIONS = (
    "kimi-k2 = 61 layers (1 dense + 60 MoE of 384 experts), bf16 weights, modeled layer by layer as if each "
    "layer-slice ran on an H200 at the measured ceilings (790 TF/s, 4.2 TB/s); no inter-GPU transfer "
    "(the multi-GPU issue adds links)",
    "distinct experts per MoE layer: the slice's router curve (random weights) in 'router' rows, the uniform "
    "formula E(1-(1-k/E)^rows) in 'uniform' rows (a trained, load-balanced router is closer to uniform)",
    "eager rows: the fitted per-forward overhead split evenly over the calibration model's layers + 1 when "
    "the measurements hold one layer count (slice-4 measurements separate it)",
    "serving rows: efficiencies of costmodel.SERVING (assumed, not measured on this engine)",
    "the drafter: DrafterConfig.for_target (1 layer, d = 7168), its fixed time from the measured slice-2 step",
    "tau from the trace's drafter; context = the ctx given (default 1024 committed rows)")


def settings(eff: cm.Efficiency, curve: cm.ExpertCurve, ctx: int, fitted_layers: int) -> list[tuple[str, bb.CostSetting]]:
    """(title, setting): slice-2 eager (fitted), slice-2 serving, K2 serving (router / uniform), K2 eager."""
    s2, k2 = get_preset("kimi-k2-slice-2"), get_preset("kimi-k2")
    eager_k2 = eff if eff.layer_s > 0 else dataclasses.replace(
        eff, overhead_s=eff.overhead_s / (fitted_layers + 1), layer_s=eff.overhead_s / (fitted_layers + 1))
    return [("kimi-k2-slice-2, today's eager engine (efficiencies fitted)", bb.CostSetting(s2, ctx, eff, curve)),
            ("kimi-k2-slice-2, serving-grade engine", bb.CostSetting(s2, ctx, cm.SERVING, curve)),
            ("kimi-k2 (61 layers), serving-grade, router experts", bb.CostSetting(k2, ctx, cm.SERVING, curve)),
            ("kimi-k2 (61 layers), serving-grade, uniform experts", bb.CostSetting(k2, ctx, cm.SERVING)),
            ("kimi-k2 (61 layers), today's eager engine, router experts", bb.CostSetting(k2, ctx, eager_k2, curve))]


def validation(ms) -> tuple[str, dict, cm.Efficiency, cm.ExpertCurve, int]:
    """Per model: fitted efficiencies, every cell in sample and leave-one-out. Returns the text, the summary,
    and the first model's fit and curve (what the best-budget settings use)."""
    text, summ, first = [], {}, None
    for model in sorted({m.model for m in ms}):
        cells = [m for m in ms if m.model == model]
        curve = cf.expert_curve(cells)
        eff = cf.fit(cells, curve)
        ins, loo = cf.validate(cells, eff, curve), cf.leave_one_out(cells, curve)
        summ[model] = {"efficiency": dataclasses.asdict(eff), "in_sample": cf.summary(ins),
                       "leave_one_out": cf.summary(loo)}
        text += [f"### {model}: {len(cells)} measured forwards ({cells[0].source})", "",
                 f"Fitted: gemm {eff.gemm:.2f}, moe {eff.moe:.2f} of the floor rate, attention {eff.attn:.2f} "
                 f"(fixed, kernel measurement), overhead {eff.overhead_s * 1e3:.2f} ms/forward, drafter fixed "
                 f"{eff.draft_overhead_s * 1e3:.2f} ms. In sample: median |error| "
                 f"{summ[model]['in_sample']['median_abs_error'] * 100:.1f} %, worst "
                 f"{summ[model]['in_sample']['max_abs_error'] * 100:.1f} %; leave-one-out: median "
                 f"{summ[model]['leave_one_out']['median_abs_error'] * 100:.1f} %, worst "
                 f"{summ[model]['leave_one_out']['max_abs_error'] * 100:.1f} %.", "", "Leave-one-out cells:", "",
                 cf.markdown(loo), ""]
        if first is None:
            first = (eff, curve, get_preset(model).n_layers)
    return "\n".join(text), summ, *first


def findings(trace: Trace, out: Path, ms=None, ctx: int = 1024, batches=BATCHES, budgets=BUDGETS,
             kinds=KINDS) -> dict:
    """Everything above into out/; returns the JSON summary."""
    out.mkdir(parents=True, exist_ok=True)
    ms = list(ms) if ms else list(cf.H200_FACTS)
    budgets = [b for b in budgets if b <= trace.k]
    kinds = [k for k in kinds if k["kind"] != "static_kary" or len(k["branching"]) <= trace.depth]
    vtext, vsum, eff, curve, layers = validation(ms)
    md = ["# Replay findings: best budget per batch size (step times MODELED, tau replayed)", "",
          f"Trace: {trace.meta.get('drafter', '?')} on {trace.meta.get('model', '?')}, {trace.n_prompts} prompts x "
          f"{trace.rounds} rounds, top-{trace.k}, L = {trace.depth}; categories "
          f"{', '.join(sorted(set(trace.categories)))}.", "", "## Cost model vs measurement", "", vtext,
          "## Best budget per batch size", ""]
    page, summary = [], {"validation": vsum, "settings": {}}
    for title, cs in settings(eff, curve, ctx, layers):
        preds = bb.sweep(trace, kinds, budgets, batches, cs)
        md += [bb.markdown(preds, title), ""]
        img = bb.plot(preds, title)
        page.append((title, bb.markdown(preds, title), img))
        summary["settings"][title] = {"best": {f"{k}@batch{b}": dataclasses.asdict(p)
                                               for (k, b), p in bb.best(preds).items()},
                                      "points": bb.as_dicts(preds)}
    md += ["## Full-size K2: assumptions (modeled)", ""] + [f"- {a}" for a in K2_ASSUMPTIONS]
    (out / "findings.md").write_text("\n".join(md) + "\n")
    (out / "findings.json").write_text(json.dumps(summary, indent=1, default=float))
    (out / "findings.html").write_text(_html(md, page))
    return summary


def _html(md: list[str], page) -> str:
    body = [f"<h2>{html.escape(t)}</h2><pre>{html.escape(tab)}</pre>" + (f'<img src="{img}">' if img else "")
            for t, tab, img in page]
    return ("<!doctype html><meta charset=utf-8><title>kdbench replay findings</title>"
            "<h1>Replay findings (step times MODELED, tau replayed)</h1>" + "".join(body)
            + f"<h2>All tables</h2><pre>{html.escape(chr(10).join(md))}</pre>")
