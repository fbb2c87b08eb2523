"""Issue 13 item 5's live check: record a trace on the target itself (the trained pair's own drafter on its
held-out text prompts, or the keyed synthetic drafter on a random slice's greedy continuation), predict
tokens/s vs DDTree budget per batch size with the cost model fitted to the measured cells of THIS model, then
run generate() live (eager) at the predicted best budget and its two neighbours (and AR) per batch, and put
measured step time, tokens/s, tau and speedup beside the predictions. Batch 1 runs --b1-prompts prompts one
after another (one prompt's ~16 rounds make a noisy tau). --invariant: the trained pair's batch-invariant target
(plans/0010) and a trace recorded at each batch size, so replay == live must hold round by round on the GPU too
(in default bf16 the verify rows' numerics move the drafter's features and the target's near-ties). Usage:
  python3 reports/h200/replay_live_check.py OUT_DIR --measured M.jsonl [--model kdbench-pair] [--batches 1,8,32]
Writes OUT_DIR/live_check_<model>.json and .md."""
import argparse
import json
import time
import types
from pathlib import Path

import numpy as np
import torch

from kdbench import bestbudget as bb
from kdbench import pair
from kdbench import costfit, costmeasure
from kdbench import replay as rp
from kdbench import trace as tr
from kdbench.backends import cuda_build
from kdbench.costmeasure import ExpertCounter
from kdbench.engine.engine import generate, greedy_oracle
from kdbench.engine.stages import Policy
from kdbench.kinds.replay import ranks
from kdbench.model.keyed import KeyedSyntheticDrafter
from kdbench.prompts import token_prompts
from kdbench.references.model_config import get_preset

BUDGETS = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
TEXT = ("code", "prose", "structured")


def step_median(results: list) -> float:
    """Median step time (s) over the steps of the given generate() results, each one's first step left out."""
    return float(np.median([sum(s.stage_ns.values()) * 1e-9 for res in results for s in res.steps[1:]]))


def setup(a, device, backend):
    """(model, drafter_for, prompts, categories) for the largest batch (or batch 1's prompts)."""
    if a.invariant and a.model != "kdbench-pair":
        raise SystemExit("--invariant: only the trained pair (kdbench-pair) has a batch-invariant target here")
    model = (pair.load_target(device, torch.bfloat16 if device == "cuda" else torch.float32, batch_invariant=True)
             if a.invariant else costmeasure.load_target(a.model, device))
    n = max(max(a.batches), a.b1_prompts)
    if a.model == "kdbench-pair":
        per = -(-n // len(TEXT))
        prompts = [p for c in TEXT for p in token_prompts(c, per, a.prompt_len)]
        cats = [c for c in TEXT for _ in range(per)]
        order = [i for j in range(per) for i in range(j, len(prompts), per)][:n]   # interleave the categories
        drafter = costmeasure.drafter_of(model)
        return model, (lambda first, last: drafter), [prompts[i] for i in order], [cats[i] for i in order]
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, model.cfg.vocab_size, a.prompt_len).tolist() for _ in range(n)]
    oracle = greedy_oracle(model, prompts, a.rounds + 17, backend=backend)

    def keyed(first, last):
        return KeyedSyntheticDrafter(oracle[first:last], model.cfg.vocab_size, quality=a.quality,
                                     rank_probs=ranks(a.quality), seed=3, device=device, keys=range(first, last))
    return model, keyed, prompts, ["random"] * n


def head(t: tr.Trace, b: int) -> tr.Trace:
    """The trace of the first b prompts."""
    return tr.Trace(t.prompts[:b], t.categories[:b], t.continuation[:b], t.top_lp[:b], t.top_tok[:b], t.meta)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--measured", required=True)
    ap.add_argument("--model", default="kdbench-pair")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=47)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--quality", type=float, default=0.8)
    ap.add_argument("--deadline-s", type=float, default=1e9, help="skip the remaining batches after this")
    ap.add_argument("--b1-prompts", type=int, default=1, help="prompts batch 1 runs one after another")
    ap.add_argument("--invariant", action="store_true", help="batch-invariant target, a trace per batch size")
    a = ap.parse_args()
    a.batches = [int(x) for x in a.batches.split(",")]
    t0 = time.time()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    backend = "cuda" if cuda and cuda_build.unavailable_reason() is None else "torch"
    model, drafter_for, prompts, cats = setup(a, device, backend)
    k = min(max(BUDGETS), model.cfg.vocab_size)
    def record(n, batch):
        return tr.record(model, prompts[:n], a.rounds, k, drafter_for, batch=batch, backend=backend,
                         categories=cats[:n])
    n_of = {b: a.b1_prompts if b == 1 else b for b in a.batches}
    big = None if a.invariant else record(len(prompts), max(a.batches))
    traces = {b: record(n_of[b], b) if a.invariant else head(big, n_of[b]) for b in a.batches}
    eff, curve = costfit.fit_model(costfit.load(a.measured), a.model)
    cs = bb.CostSetting(get_preset(a.model), a.prompt_len + a.rounds // 2, eff, curve)
    print(f"trace recorded at {time.time() - t0:.0f} s; fit {eff}")
    env = types.SimpleNamespace(model=model, drafter_for=drafter_for, a=a, backend=backend)
    rows = []
    for b in a.batches:
        if time.time() - t0 > a.deadline_s:
            print(f"deadline: batch {b} skipped")
            continue
        rows += check_batch(env, traces[b], prompts[:n_of[b]], cs, b)
        write(Path(a.out), env, traces[b], rows)
        print(f"batch {b} done at {time.time() - t0:.0f} s")


def check_batch(env, trace, prompts, cs, b: int) -> list[dict]:
    budgets = [x for x in BUDGETS if x <= trace.k]
    replays = {}                              # Policy -> ReplayResult: live_row compares against the same ones
    preds = {p.budget: p for p in bb.sweep(trace, [{"kind": "ddtree"}], budgets, [b], cs, cache=replays)}
    best = max(preds.values(), key=lambda p: p.tokens_per_s).budget
    chosen = bb.live_check_budgets(budgets, best)
    groups = [(i, i + b) for i in range(0, len(prompts), b)]       # batch 1: one prompt after another
    for x in chosen:   # warm-up of every timed shape (batch 1 came first and ran 40 % slow with one warm-up)
        run(env, prompts, groups[:1], 8, Policy("ddtree", x))
    run(env, prompts, groups[:1], 8, Policy("ar"))
    t_ar = step_median(run(env, prompts, groups, trace.rounds + 1, Policy("ar")))
    job = types.SimpleNamespace(trace=trace, prompts=prompts, groups=groups, batch=b, t_ar=t_ar)
    return [live_row(env, job, x, x == best, preds[x], replays[Policy("ddtree", x)]) for x in chosen]


def run(env, prompts, groups, n: int, policy: Policy) -> list:
    """generate() per group of prompts (first, last), each with its own drafter."""
    return [generate(env.model, env.drafter_for(f, l) if policy.kind != "ar" else None, prompts[f:l], n, policy,
                     backend=env.backend) for f, l in groups]


def live_row(env, job, budget: int, is_best: bool, p, replayed) -> dict:
    """The live generate()s of job (one batch size: its trace, prompts, groups and AR step time) at `budget`:
    step time, tau, tokens/s, replay == live (replayed: the sweep's replay of this budget), the router's experts;
    p is the budget's prediction."""
    model, prompts, groups, b, t_ar = env.model, job.prompts, job.groups, job.batch, job.t_ar
    n_moe = sum(model.cfg.is_moe_layer(i) for i in range(model.cfg.n_layers))
    lives = run(env, prompts, groups, job.trace.rounds + 1, Policy("ddtree", budget))
    t = step_median(lives)
    with ExpertCounter() as counter:   # a second, short run: the counter syncs the host, so it is not timed
        run(env, prompts, groups[:1], 8, Policy("ddtree", budget))
    taus = [x for live in lives for x in rp.live_taus(live)]
    same = taus == [list(x.tau) for x in replayed.prompts]
    tau = float(np.mean([x for per in taus for x in per]))
    verify_counts = counter.counts[n_moe:]                          # the first n_moe calls are the prefill's
    return {"batch": b, "prompts": len(prompts), "budget": budget, "predicted_best": is_best, "tau_replayed": p.tau,
            "tau_live": tau, "replay_equals_live": same, "step_predicted_s": p.step_s,
            "step_measured_s": t, "step_error": p.step_s / t - 1, "tokens_per_s_predicted": p.tokens_per_s,
            "tokens_per_s_measured": b * tau / t, "speedup_predicted": p.speedup,
            "speedup_measured": tau * t_ar / t, "ar_step_predicted_s": p.ar_step_s,
            "ar_step_measured_s": t_ar, "experts_modeled": p.experts,
            "experts_live": float(np.mean(verify_counts)) if verify_counts else float("nan"),
            "mode": "eager", "batch_invariant": bool(getattr(model, "batch_invariant", False))}


def write(out: Path, env, trace, rows: list[dict]) -> None:
    a, backend = env.a, env.backend
    out.mkdir(parents=True, exist_ok=True)
    (out / f"live_check_{a.model}.json").write_text(json.dumps(
        {"model": a.model, "backend": backend, "mode": "eager", "batch_invariant": a.invariant, "drafter": trace.meta["drafter"],
         "rounds": trace.rounds, "prompt_len": a.prompt_len, "rows": rows}, indent=1))
    inv = ", batch-invariant target, a trace per batch" if a.invariant else ""
    lines = [f"# Live check at the predicted best DDTree budget ({a.model}, {backend} backend, eager{inv}, "
             f"{trace.meta['drafter']}, {trace.rounds + 1} new tokens)", "",
             "| batch | prompts | budget | tau replayed | tau live | replay == live | step ms modeled | step ms measured | "
             "error | tokens/s modeled | tokens/s measured | speedup modeled | speedup measured | AR ms modeled | "
             "AR ms measured | experts modeled | experts live |", "|" + " ---: |" * 17]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['prompts']} | {r['budget']}{' (best)' if r['predicted_best'] else ''} | "
                     f"{r['tau_replayed']:.2f} | {r['tau_live']:.2f} | {r['replay_equals_live']} | "
                     f"{r['step_predicted_s'] * 1e3:.2f} | {r['step_measured_s'] * 1e3:.2f} | "
                     f"{r['step_error'] * 100:+.1f} % | {r['tokens_per_s_predicted']:.0f} | "
                     f"{r['tokens_per_s_measured']:.0f} | {r['speedup_predicted']:.2f}x | "
                     f"{r['speedup_measured']:.2f}x | {r['ar_step_predicted_s'] * 1e3:.2f} | "
                     f"{r['ar_step_measured_s'] * 1e3:.2f} | {r['experts_modeled']:.0f} | {r['experts_live']:.0f} |")
    lines.append("\nStep times: medians over the run's steps (CUDA events per stage, eager, no CUDA graph). bf16 "
                 "runs can leave the replayed continuation at a near-tie (plans/0009), then tau live != tau replayed.")
    (out / f"live_check_{a.model}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
