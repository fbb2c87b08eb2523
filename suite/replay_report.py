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
    "eager rows: a joint fit of slice-2 and slice-4 separates the per-layer fixed time; with one layer count "
    "the fitted per-forward device overhead and host issue time are each split evenly over its layers + 1 "
    "(an assumption)",
    "serving rows: efficiencies of costmodel.SERVING (assumed, not measured on this engine)",
    "the drafter: DrafterConfig.for_target (1 layer, d = 7168), its fixed time from the measured slice-2 step",
    "tau from the trace's drafter; context = the ctx given (default 1024 committed rows)")


def settings(fits: dict, ms, ctx: int, trace_model: str = "") -> list[tuple[str, bb.CostSetting]]:
    """(title, setting): the kimi-k2 slice's eager fit and serving-grade, K2 serving (router / uniform experts),
    K2 eager (a joint fit when the slices measured span two layer counts: per-layer time separated, else the
    slice fit with its overhead split evenly over its layers + 1), and the trained pair's own eager fit when
    the trace is the pair's."""
    slices = sorted((m for m in fits if m.startswith("kimi-k2-slice-")), key=lambda m: get_preset(m).n_layers)
    name = "kimi-k2-slice-2" if "kimi-k2-slice-2" in fits else (slices or sorted(fits))[0]
    eff, curve = fits[name]
    deepest = slices[-1] if slices else name
    k2_curve = fits[deepest][1]
    if len({get_preset(m).n_layers for m in slices}) > 1:
        cells = [m for m in ms if m.model in slices]
        eager_k2 = cf.fit(cells, k2_curve, label=f"joint fit of {', '.join(slices)}")
    else:
        cfg = get_preset(name)
        n, nh = cfg.n_layers + 1, sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers)) + 1
        eager_k2 = dataclasses.replace(eff, overhead_s=eff.overhead_s / n, layer_s=eff.overhead_s / n,
                                       host_s=eff.host_s / nh, host_layer_s=eff.host_s / nh)
    s2, k2 = get_preset(name), get_preset("kimi-k2")
    out = [(f"{name}, today's eager engine (efficiencies fitted)", bb.CostSetting(s2, ctx, eff, curve)),
           (f"{name}, serving-grade engine", bb.CostSetting(s2, ctx, cm.SERVING, curve)),
           (f"kimi-k2 (61 layers), serving-grade, router experts of {deepest}",
            bb.CostSetting(k2, ctx, cm.SERVING, k2_curve)),
           ("kimi-k2 (61 layers), serving-grade, uniform experts", bb.CostSetting(k2, ctx, cm.SERVING)),
           (f"kimi-k2 (61 layers), today's eager engine ({eager_k2.label or 'split overhead'})",
            bb.CostSetting(k2, ctx, eager_k2, k2_curve))]
    if trace_model == "kdbench-pair" and "kdbench-pair" in fits:
        peff, pcurve = fits["kdbench-pair"]
        out.insert(0, ("kdbench-pair, today's eager engine (efficiencies fitted)",
                       bb.CostSetting(get_preset("kdbench-pair"), ctx, peff, pcurve)))
    return out


def validation(ms) -> tuple[str, dict, dict]:
    """Per model: fitted efficiencies, every cell in sample and leave-one-out. Returns the text, the summary
    and {model: (efficiency, expert curve)}."""
    text, summ, fits = [], {}, {}
    for model in sorted({m.model for m in ms}):
        cells = [m for m in ms if m.model == model]
        curve = cf.expert_curve(cells)
        eff = cf.fit(cells, curve)
        ins, loo = cf.validate(cells, eff, curve), cf.leave_one_out(cells, curve)
        summ[model] = {"efficiency": dataclasses.asdict(eff), "in_sample": cf.summary(ins),
                       "leave_one_out": cf.summary(loo)}
        text += [f"### {model}: {len(cf.forwards(cells))} measured forwards ({cells[0].source})", "",
                 f"Fitted: gemm {eff.gemm:.2f}, moe {eff.moe:.2f} of the floor rate, attention {eff.attn:.2f} "
                 f"(fixed, kernel measurement), device overhead {eff.overhead_s * 1e3:.2f} ms/forward, host issue "
                 f"time {eff.host_s * 1e3:.2f} ms/forward (a forward takes max(host, device)), drafter fixed "
                 f"{eff.draft_overhead_s * 1e3:.2f} ms + {eff.draft_request_s * 1e6:.0f} us per request. In sample: "
                 "median |error| "
                 f"{summ[model]['in_sample']['median_abs_error'] * 100:.1f} %, worst "
                 f"{summ[model]['in_sample']['max_abs_error'] * 100:.1f} %; leave-one-out: median "
                 f"{summ[model]['leave_one_out']['median_abs_error'] * 100:.1f} %, worst "
                 f"{summ[model]['leave_one_out']['max_abs_error'] * 100:.1f} %.", "", "Leave-one-out cells:", "",
                 cf.markdown(loo), ""]
        fits[model] = (eff, curve)
    return "\n".join(text), summ, fits


def findings(trace: Trace, out: Path, ms=None, ctx: int = 1024, batches=BATCHES, budgets=BUDGETS,
             kinds=KINDS, source: str = "") -> dict:
    """Everything above into out/; returns the JSON summary. ms: measured cells (default: the shipped fit's);
    source: where they come from (said in the findings)."""
    out.mkdir(parents=True, exist_ok=True)
    if not ms:
        ms, source = list(cf.shipped().measurements), cf.shipped().label()
    ms = list(ms)
    budgets = [b for b in budgets if b <= trace.k]
    kinds = [k for k in kinds if k["kind"] != "static_kary" or len(k["branching"]) <= trace.depth]
    vtext, vsum, fits = validation(ms)
    md = ["# Replay findings: best budget per batch size (step times MODELED, tau replayed)", "",
          f"Trace: {trace.meta.get('drafter', '?')} on {trace.meta.get('model', '?')}, {trace.n_prompts} prompts x "
          f"{trace.rounds} rounds, top-{trace.k}, L = {trace.depth}; categories "
          f"{', '.join(sorted(set(trace.categories)))}.", "",
          f"Cost fit: {len(ms)} measured cells from {source or 'the given measurements'}.", "",
          "## Cost model vs measurement", "", vtext,
          "## Best budget per batch size", ""]
    page, summary, cache = [], {"validation": vsum, "settings": {}, "cost_fit": source}, {}
    for title, cs in settings(fits, ms, ctx, trace.meta.get("model", "")):
        preds = bb.sweep(trace, kinds, budgets, batches, cs, cache=cache)
        md += [bb.markdown(preds, title), ""]
        img = bb.plot(preds)
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
