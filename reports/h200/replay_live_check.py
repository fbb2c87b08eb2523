"""Issue 13 item 5's live check: record a trace on the target itself (keyed synthetic drafter on its greedy
continuation), predict tokens/s vs DDTree budget at one batch with the cost model fitted to the measured cells,
then run generate() live at the predicted best budget and its two neighbours (and AR) and put measured step
time, tau and speedup beside the predictions. Usage:
  python3 reports/h200/replay_live_check.py OUT_DIR --measured M.jsonl [--model kimi-k2-slice-2] [--batch 8]
Writes OUT_DIR/live_check.json and OUT_DIR/live_check.md."""
import argparse
import json
import types
from pathlib import Path

import numpy as np
import torch

from kdbench import bestbudget as bb
from kdbench import costfit
from kdbench.costmeasure import ExpertCounter
from kdbench import replay as rp
from kdbench import trace as tr
from kdbench.backends import cuda_build
from kdbench.engine.engine import generate, target_from_preset
from kdbench.engine.stages import Policy
from kdbench.kinds.replay import ranks
from kdbench.model.keyed import KeyedSyntheticDrafter
from kdbench.model.synthetic import greedy_oracle
from kdbench.references.model_config import get_preset

BUDGETS = [4, 8, 16, 32, 64, 128, 256]


def step_median(res) -> float:
    return float(np.median([sum(s.stage_ns.values()) * 1e-9 for s in res.steps]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--measured", required=True)
    ap.add_argument("--model", default="kimi-k2-slice-2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=63)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--quality", type=float, default=0.8)
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    backend = "cuda" if cuda and cuda_build.unavailable_reason() is None else "torch"
    model = target_from_preset(a.model, seed=1, device=device, dtype=dtype)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, model.cfg.vocab_size, a.prompt_len).tolist() for _ in range(a.batch)]
    oracle = greedy_oracle(model, prompts, a.rounds + 17, backend=backend)

    def keyed(first, last):
        return KeyedSyntheticDrafter(oracle[first:last], model.cfg.vocab_size, quality=a.quality,
                                     rank_probs=ranks(a.quality), seed=3, device=device, keys=range(first, last))
    k = min(max(BUDGETS), model.cfg.vocab_size)
    trace = tr.record(model, prompts, a.rounds, k, keyed, batch=a.batch, backend=backend)
    ms = [m for m in costfit.load(a.measured) if m.model == a.model] or list(costfit.H200_FACTS)
    curve = costfit.expert_curve(ms)
    cs = bb.CostSetting(get_preset(a.model), a.prompt_len + a.rounds // 2, costfit.fit(ms, curve), curve)
    budgets = [b for b in BUDGETS if b <= k]
    preds = {p.budget: p for p in bb.sweep(trace, [{"kind": "ddtree"}], budgets, [a.batch], cs)}
    best = max(preds.values(), key=lambda p: p.tokens_per_s).budget
    i = budgets.index(best)
    chosen = budgets[max(i - 1, 0):i + 2]
    generate(model, keyed(0, a.batch), prompts, 4, Policy("ddtree", best), backend=backend)     # warm-up
    ar = generate(model, None, prompts, a.rounds + 1, Policy("ar"), backend=backend)
    t_ar = step_median(ar)
    env = types.SimpleNamespace(model=model, keyed=keyed, prompts=prompts, a=a, trace=trace, t_ar=t_ar,
                                backend=backend)
    rows = [live_row(env, b, b == best, preds[b]) for b in chosen]
    write(Path(a.out), env, rows)


def live_row(env, budget: int, is_best: bool, p) -> dict:
    """One live generate() at `budget`: step time, tau, replay == live, and the router's experts per verify."""
    model, keyed, prompts, a, trace, t_ar, backend = (env.model, env.keyed, env.prompts, env.a, env.trace, env.t_ar,
                                                      env.backend)
    n_moe = sum(model.cfg.is_moe_layer(i) for i in range(model.cfg.n_layers))
    live = generate(model, keyed(0, a.batch), prompts, a.rounds + 1, Policy("ddtree", budget), backend=backend)
    t = step_median(live)
    with ExpertCounter() as counter:   # a second, short run: the counter syncs the host, so it is not timed
        generate(model, keyed(0, a.batch), prompts, min(a.rounds + 1, 16), Policy("ddtree", budget), backend=backend)
    same = rp.live_taus(live) == [list(x.tau) for x in rp.replay(trace, Policy("ddtree", budget)).prompts]
    verify_counts = counter.counts[n_moe:]                          # the first n_moe calls are the prefill's
    return {"budget": budget, "predicted_best": is_best, "tau_replayed": p.tau, "tau_live": live.mean_tau,
            "replay_equals_live": same, "step_predicted_s": p.step_s, "step_measured_s": t,
            "step_error": p.step_s / t - 1, "speedup_predicted": p.speedup,
            "speedup_measured": live.mean_tau * t_ar / t,
            "ar_step_predicted_s": p.ar_step_s, "ar_step_measured_s": t_ar, "experts_modeled": p.experts,
            "experts_live": float(np.mean(verify_counts)) if verify_counts else float("nan")}


def write(out: Path, env, rows: list[dict]) -> None:
    a, backend, trace, t_ar = env.a, env.backend, env.trace, env.t_ar
    out.mkdir(parents=True, exist_ok=True)
    (out / "live_check.json").write_text(json.dumps({"model": a.model, "batch": a.batch, "backend": backend,
                                                     "drafter": trace.meta["drafter"], "rows": rows}, indent=1))
    lines = [f"# Live check at the predicted best DDTree budget ({a.model}, batch {a.batch}, {backend}, "
             f"{trace.meta['drafter']})", "", "| budget | tau replayed | tau live | replay == live | step ms "
             "modeled | step ms measured | error | speedup modeled | speedup measured | experts modeled | "
             "experts live (router, real trees) |", "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: "
             "| ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['budget']}{' (best)' if r['predicted_best'] else ''} | {r['tau_replayed']:.2f} | "
                     f"{r['tau_live']:.2f} | {r['replay_equals_live']} | {r['step_predicted_s'] * 1e3:.2f} | "
                     f"{r['step_measured_s'] * 1e3:.2f} | {r['step_error'] * 100:+.1f} % | "
                     f"{r['speedup_predicted']:.2f}x | {r['speedup_measured']:.2f}x | {r['experts_modeled']:.0f} | "
                     f"{r['experts_live']:.0f} |")
    lines.append(f"\nAR step: modeled {rows[0]['ar_step_predicted_s'] * 1e3:.2f} ms, measured {t_ar * 1e3:.2f} ms. "
                 "Step times are medians over the run's steps (CUDA events, eager); bf16 runs can leave the "
                 "replayed continuation at a near-tie (plans/0009), then tau live != tau replayed.")
    (out / "live_check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
