"""Where moe_triton loses at the moe_experts scenario's narrow width at 520 rows (s14 call C: 575 us against Liger
359 us and torch grouped 446 us; hidden 1024, expert width 256, 384 experts, top-8, 4160 slots). Times, in ABBA
rounds with the L2 flushed, eager: (1) the block plan alone: torch's (what S > 1024 took until s15), the chunked
Triton plan (three launches, what it takes now) and the one-program Triton plan forced past its limit at 4 / 8 / 16
warps, also as graph replays of 8 calls; (2) the routed experts with each launch config of CFG_BY_SLOTS and each of
torch's and the chunked plan; (3) Liger and torch grouped, the peers of the row.
Every layer output is checked against a float64 evaluation on the device (relative L2), before and after timing;
every forced Triton plan against the torch plan, tensor for tensor.
Usage (GPU machine, repo root): python3 reports/h200/moe_narrow_probe.py OUT_DIR [--rows 520 ...] [--plans-only]."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from time_moe import experts64, rel_l2  # noqa: E402

from kdbench import timing  # noqa: E402
from kdbench.model import moe as tmoe  # noqa: E402
from kdbench.model import moe_plan, moe_plan_triton, moe_triton  # noqa: E402

HIDDEN, INTER, EXPERTS, TOPK = 1024, 256, 384, 8
CFGS = {"bm16": (16, 32, 32), "bm32": (32, 64, 128), "bm64": (64, 128, 128)}
WARPS = (4, 8, 16)


def inputs(rows: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, HIDDEN, generator=g, device="cuda").to(torch.bfloat16)
    idx = torch.rand(rows, EXPERTS, generator=g, device="cuda").topk(TOPK, dim=1).indices   # uniform, distinct
    u = torch.rand(rows, TOPK, generator=g, device="cuda") * 0.95 + 0.05
    wts = u / u.sum(1, keepdim=True) * 2.827
    ws = [torch.randn(s, generator=g, device="cuda").mul(s[-1] ** -0.5).to(torch.bfloat16)
          for s in ((EXPERTS, INTER, HIDDEN), (EXPERTS, HIDDEN, INTER), (EXPERTS, INTER, HIDDEN))]
    return x, idx, wts, ws


def forced(cfg: tuple, plan):
    """moe_triton.experts with one launch config for every slot count and the given plan function."""
    def run(x, idx, wts, w1, w2, w3):
        keep = moe_triton.CFG_BY_SLOTS, moe_plan_triton.block_plan
        moe_triton.CFG_BY_SLOTS, moe_plan_triton.block_plan = ((1 << 62, *cfg),), plan
        try:
            return moe_triton.experts(x, idx, wts, w1, w2, w3)
        finally:
            moe_triton.CFG_BY_SLOTS, moe_plan_triton.block_plan = keep
    return run


def plan_rows(rows: int, flat, say) -> list[dict]:
    S, bm, k, recs = flat.numel(), moe_triton.block_rows(flat.numel()), TOPK, []
    want = moe_plan.block_plan(flat, EXPERTS, bm)
    fns = {"plan_torch": lambda: moe_plan_triton.torch_plan(flat, EXPERTS, bm, k)}
    cands = {"plan_chunked": lambda: moe_plan_triton.chunked(flat, EXPERTS, bm, k)}
    cands |= {f"plan_one_w{w}": (lambda w=w: moe_plan_triton.one_program(flat, EXPERTS, bm, k, warps=w)) for w in WARPS}
    for name, fn in cands.items():
        got, token = fn()
        same = all(torch.equal(a, b) for a, b in zip(got, want)) and torch.equal(token.long(), want.order // k)
        say(f"rows {rows} S {S}: {name} equals the torch plan: {same}")
        recs.append({"rows": rows, "what": f"{name}_equal", "equal": same})
        if same:
            fns[name] = fn
    res = timing.rounds({n: timing.Contender(f, "cuda") for n, f in fns.items()}, warmup=3, repeat=24)
    for n, t in res.items():
        graph = timing.graph_replays_s(fns[n], reps=10, inner=8)
        g = sorted(graph)[len(graph) // 2]
        recs.append({"rows": rows, "what": n, "median_s": t.median_s, "p20_s": t.p20_s, "p80_s": t.p80_s,
                     "samples_s": t.samples_s, "graph_per_call_s": g, "graph_samples_s": graph})
        say(f"rows {rows} {n:18s}: eager {t.median_s * 1e6:7.1f} us [{t.p20_s * 1e6:.1f}, {t.p80_s * 1e6:.1f}]"
            f"  graph x8 {g * 1e6:7.1f} us/call")
    return recs


def layer_rows(rows: int, x, idx, wts, ws, say) -> list[dict]:
    want = experts64(x, idx, wts, *ws)
    plans = {"torchplan": moe_plan_triton.torch_plan, "chunked": moe_plan_triton.chunked}
    fns = {f"{c}_{p}": forced(cfg, plan) for c, cfg in CFGS.items() for p, plan in plans.items()}
    fns["shipped"] = moe_triton.experts
    for d in ("liger", "grouped"):
        try:
            fns[d] = tmoe.experts_op(d, x, ws[0])
        except Exception as exc:   # noqa: BLE001 - a missing peer is a line, not the end
            say(f"rows {rows} {d}: skipped: {type(exc).__name__}: {exc}")
    calls = {n: (lambda f=f: f(x, idx, wts, *ws)) for n, f in fns.items()}
    before = {n: rel_l2(c(), want) for n, c in calls.items()}
    res = timing.rounds({n: timing.Contender(c, "cuda") for n, c in calls.items()}, warmup=3, repeat=24)
    recs = []
    for n, t in res.items():
        if isinstance(t, Exception):
            say(f"rows {rows} {n}: ERROR {type(t).__name__}: {str(t)[:200]}")
            continue
        after = rel_l2(calls[n](), want)
        recs.append({"rows": rows, "what": n, "median_s": t.median_s, "p20_s": t.p20_s, "p80_s": t.p80_s,
                     "samples_s": t.samples_s, "rel_l2_before": before[n], "rel_l2_after": after})
        say(f"rows {rows} {n:18s}: {t.median_s * 1e6:7.1f} us [{t.p20_s * 1e6:.1f}, {t.p80_s * 1e6:.1f}] "
            f"rel_l2 {before[n]:.1e}/{after:.1e}")
    return recs


def main(out: str, rows_list: list[int], plans_only: bool) -> None:
    recs, say = [], lambda line: print(line, flush=True)    # noqa: E731
    name = "moe_plan_grid.json" if plans_only else "moe_narrow_probe.json"
    for rows in rows_list:
        x, idx, wts, ws = inputs(rows, 1515 + rows)
        recs += plan_rows(rows, idx.reshape(-1), say)
        if not plans_only:
            recs += layer_rows(rows, x, idx, wts, ws, say)
        Path(out, name).write_text(json.dumps({"rows": recs}, indent=1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, nargs="+", default=[520, 129])
    ap.add_argument("--plans-only", action="store_true", help="the plans alone (where one program and the chunked "
                    "plan cross), no layer rows")
    a = ap.parse_args()
    main(a.out, a.rows, a.plans_only)
